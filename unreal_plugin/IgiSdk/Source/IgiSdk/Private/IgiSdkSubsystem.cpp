#include "IgiSdkSubsystem.h"

#include "Engine/GameInstance.h"
#include "HAL/FileManager.h"
#include "HAL/PlatformMisc.h"
#include "HAL/PlatformProcess.h"
#include "IgiSidecarHost.h"
#include "Misc/App.h"
#include "Misc/FileHelper.h"
#include "Misc/Guid.h"
#include "Misc/Paths.h"

// 0: the core's own BSD sockets instead of FSocket (the layer built without the engine's socket
// subsystem, as its tests do)
#ifndef IGI_SDK_ENGINE_SOCKETS
#define IGI_SDK_ENGINE_SOCKETS 1
#endif
#if IGI_SDK_ENGINE_SOCKETS
#include "IgiUnrealSocket.h"
#endif

DEFINE_LOG_CATEGORY_STATIC(LogIgiSdk, Log, All);

namespace
{
	EIgiConnectionState ToState(igi::ConnectionState State)
	{
		switch (State)
		{
		case igi::ConnectionState::Ready: return EIgiConnectionState::Ready;
		case igi::ConnectionState::Unavailable: return EIgiConnectionState::Unavailable;
		case igi::ConnectionState::Refused: return EIgiConnectionState::Refused;
		case igi::ConnectionState::Closed: return EIgiConnectionState::Closed;
		default: return EIgiConnectionState::Connecting;
		}
	}

	FString NewSecret()
	{
		// 64 hex digits: an owner key of [A-Za-z0-9]
		return FGuid::NewGuid().ToString(EGuidFormats::Digits) + FGuid::NewGuid().ToString(EGuidFormats::Digits);
	}

	FIgiError MakeError(const TCHAR* Code, const FString& Message, bool bRetryable)
	{
		FIgiError Error;
		Error.Code = Code;
		Error.Message = Message;
		Error.bRetryable = bRetryable;
		return Error;
	}
}

void UIgiSdkSubsystem::Initialize(FSubsystemCollectionBase& Collection)
{
	Super::Initialize(Collection);
	const UGameInstance* GameInstance = GetGameInstance();
	const bool bDedicated = IsRunningDedicatedServer() || (GameInstance != nullptr && GameInstance->IsDedicatedServerInstance());
	if (bDedicated && !bStartOnDedicatedServer)
	{
		// a server has no player to talk to its NPCs: no sidecar, no client (bStartOnDedicatedServer)
		LastError = MakeError(TEXT("disabled_on_server"), TEXT("no igi-sdk sidecar on a dedicated server (bStartOnDedicatedServer)"), false);
		UE_LOG(LogIgiSdk, Log, TEXT("%s"), *LastError.Message);
		return;
	}
	igi::ClientOptions Options;
	Options.engine = "unreal";
	Options.client_name = IgiUnreal::ToUtf8(FApp::GetProjectName());
	Options.game_pid = static_cast<int64_t>(FPlatformProcess::GetCurrentProcessId());
	Options.lease_s = LeaseSeconds;
#if IGI_SDK_ENGINE_SOCKETS
	Options.socket_factory = []() { return std::unique_ptr<igi::ISocket>(new FIgiUnrealSocket()); };
#endif
	FString OwnerKey = LoadOrCreateOwnerKey();

	if (!Endpoint.IsEmpty())
	{
		// a sidecar someone else started: whatever answers there, without an instance check
		Options.owner_key = IgiUnreal::ToUtf8(OwnerKey);
		Options.endpoint = IgiUnreal::ToUtf8(Endpoint);
		Options.launch_token = IgiUnreal::ToUtf8(FPlatformMisc::GetEnvironmentVariable(TEXT("IGI_SDK_TOKEN")));
		Client.reset(new igi::Client(Options));
		bStarted = Client->Start();
	}
	else
	{
		FIgiSidecarSettings Settings;
		Settings.Executable = FPaths::IsRelative(SidecarExecutable)
			? FPaths::ConvertRelativePathToFull(FPaths::Combine(FPaths::ProjectDir(), SidecarExecutable))
			: SidecarExecutable;
		if (!ModelDir.IsEmpty())
		{
			const FString Dir = FPaths::IsRelative(ModelDir) ? FPaths::ConvertRelativePathToFull(FPaths::Combine(FPaths::ProjectDir(), ModelDir)) : ModelDir;
			Settings.Arguments += FString::Printf(TEXT(" --model-dir \"%s\""), *Dir);
		}
		if (!Model.IsEmpty())
		{
			Settings.Arguments += FString::Printf(TEXT(" --model \"%s\""), *Model);
		}
		if (!ExtraArguments.IsEmpty())
		{
			Settings.Arguments += TEXT(" ");
			Settings.Arguments += ExtraArguments;
		}
		Settings.RestartMinSeconds = RestartMinSeconds;
		Settings.RestartMaxSeconds = RestartMaxSeconds;
		Settings.MaxRestarts = bRestartOnCrash ? FMath::Max(0, MaxRestarts) : 0;
		FIgiSidecarHost& Host = FIgiSidecarHost::Get();
		HostSlot = Host.AddUser(Settings);
		if (HostSlot > 1)
		{
			// PIE's other players: a scope of their own, so the same NPC in two worlds is two
			// conversations (the first player keeps the plain key: a game's leftovers are its)
			OwnerKey = OwnerKey.Left(120) + FString::Printf(TEXT("-p%d"), HostSlot);
		}
		Options.owner_key = IgiUnreal::ToUtf8(OwnerKey);
		// every game instance of this process is the game: the sidecar's one launch token
		Options.launch_token = IgiUnreal::ToUtf8(Host.GetToken());
		Client.reset(new igi::Client(Options));
		SeenDeaths = Host.GetDeaths();
		// requests queue in the client until the sidecar reports its endpoint
		FollowHost();
	}
	TickHandle = FTSTicker::GetCoreTicker().AddTicker(FTickerDelegate::CreateUObject(this, &UIgiSdkSubsystem::Tick), 0.0f);
}

void UIgiSdkSubsystem::Deinitialize()
{
	FTSTicker::GetCoreTicker().RemoveTicker(TickHandle);
	if (Client)
	{
		// goodbye (bounded): the sidecar closes this game instance's sessions at once instead of
		// holding them for a lease; in PIE the sidecar stays up for the next play session
		Client->Stop();
		Client.reset();
	}
	if (HostSlot != 0)
	{
		FIgiSidecarHost::Get().RemoveUser(HostSlot);
		HostSlot = 0;
	}
	Pending.Empty();
	LevelLoads.Empty();
	Super::Deinitialize();
}

void UIgiSdkSubsystem::FollowHost()
{
	FIgiSidecarHost& Host = FIgiSidecarHost::Get();
	Host.Tick();
	if (Host.GetDeaths() != SeenDeaths)
	{
		// nothing sent to that process will be answered: end every request now, typed, instead
		// of after the client's silence limit
		SeenDeaths = Host.GetDeaths();
		bSidecarDown = true;
		FailPending(MakeError(TEXT("unavailable"), TEXT("the igi-sdk sidecar exited; it is being started again"), true));
		BroadcastState(EIgiConnectionState::Unavailable);
	}
	if (Host.GetState() == EIgiSidecarState::Running && Host.GetGeneration() != SeenGeneration)
	{
		// a new sidecar (the first, or one started after a crash): its port and instance
		SeenGeneration = Host.GetGeneration();
		Client->SetEndpoint(IgiUnreal::ToUtf8(Host.GetEndpoint()), IgiUnreal::ToUtf8(Host.GetInstance()));
		if (!bStarted)
		{
			std::string Why;
			bStarted = Client->Start(&Why);
			if (!bStarted)
			{
				LastError = MakeError(TEXT("sidecar_start_failed"), IgiUnreal::FromUtf8(Why), false);
			}
		}
	}
	if (Host.GetState() == EIgiSidecarState::Failed)
	{
		if (!bReportedFailure)
		{
			bReportedFailure = true;
			LastError = Host.GetLastError();
			FailPending(LastError);
			BroadcastState(EIgiConnectionState::Refused);
		}
	}
	else
	{
		bReportedFailure = false;
	}
}

void UIgiSdkSubsystem::FailPending(const FIgiError& Error)
{
	// a callback may send new requests: only those pending now fail
	TArray<uint64> Ids;
	Pending.GenerateKeyArray(Ids);
	for (const uint64 Id : Ids)
	{
		const TSharedPtr<FIgiCallbacks>* Found = Pending.Find(Id);
		if (Found == nullptr)
		{
			continue;
		}
		const TSharedPtr<FIgiCallbacks> Callbacks = *Found;
		Pending.Remove(Id);  // whatever that sidecar's client still reports for it is dropped
		if (Callbacks->OnError)
		{
			Callbacks->OnError(Error);
		}
	}
}

void UIgiSdkSubsystem::BroadcastState(EIgiConnectionState State)
{
	if (State == LastBroadcast && State != EIgiConnectionState::Ready)
	{
		return;
	}
	LastBroadcast = State;
	OnConnectionChanged.Broadcast(State);
}

bool UIgiSdkSubsystem::Tick(float DeltaSeconds)
{
	if (!Client)
	{
		return true;
	}
	if (HostSlot != 0)
	{
		FollowHost();
	}
	if (bStarted)
	{
		if (bReportFrames)
		{
			Client->ReportFrame(FrameNumber++, DeltaSeconds * 1000.0, TargetFrameTimeMs, QueryVramUsedBytes(), -1,
				GameBusyThreads, GameCpuShare);
		}
		Client->Poll(Events);
		for (igi::Event& Event : Events)
		{
			Dispatch(Event);
		}
	}
	TickLevelLoads();
	return true;
}

void UIgiSdkSubsystem::Dispatch(igi::Event& Event)
{
	if (Event.kind == igi::EventKind::State)
	{
		const EIgiConnectionState State = ToState(Event.state);
		ClientState = State;
		if (Event.state == igi::ConnectionState::Refused)
		{
			LastError = IgiUnreal::ToError(Event.error);
			UE_LOG(LogIgiSdk, Warning, TEXT("sidecar refused: %s"), *LastError.Message);
		}
		if (State == EIgiConnectionState::Ready)
		{
			if (HostSlot != 0)
			{
				ConnectedGeneration = SeenGeneration;
			}
			else
			{
				// a sidecar of one's own: a new instance id is a new sidecar
				const std::string Instance = Client->Info().instance;
				if (ConnectedGeneration == 0 || Instance != ConnectedInstance)
				{
					++ConnectedGeneration;
					ConnectedInstance = Instance;
				}
			}
			bSidecarDown = false;
		}
		else if (bSidecarDown)
		{
			return;  // Unavailable was said when it died; the client's own view of it follows
		}
		BroadcastState(State);
		return;
	}
	const TSharedPtr<FIgiCallbacks>* Found = Pending.Find(Event.id);
	if (Found == nullptr)
	{
		return;  // forgotten: its owner is gone
	}
	// held here: a callback may add to Pending (which may move its entries) or Forget this id
	const TSharedPtr<FIgiCallbacks> Callbacks = *Found;
	switch (Event.kind)
	{
	case igi::EventKind::Token:
		if (Callbacks->OnToken)
		{
			Callbacks->OnToken(IgiUnreal::FromUtf8(Event.text));
		}
		return;  // the stream goes on
	case igi::EventKind::ToolCall:
		if (Callbacks->OnAction)
		{
			Callbacks->OnAction(IgiUnreal::ToActionCall(Event.call));
		}
		return;  // the stream goes on
	case igi::EventKind::Done:
		Pending.Remove(Event.id);  // terminal (before the callbacks: they may send again)
		if (Callbacks->OnDoneBody)
		{
			Callbacks->OnDoneBody(Event.body);
		}
		if (Callbacks->OnDoneActions)
		{
			TArray<FIgiActionCall> Calls;
			for (const igi::ToolCall& Call : Event.tool_calls)
			{
				Calls.Add(IgiUnreal::ToActionCall(Call));
			}
			Callbacks->OnDoneActions(Calls);
		}
		if (Callbacks->OnDone)
		{
			Callbacks->OnDone(IgiUnreal::FromUtf8(Event.text), IgiUnreal::FromUtf8(Event.finish_reason));
		}
		return;
	case igi::EventKind::Ok:
		Pending.Remove(Event.id);
		if (Callbacks->OnOk)
		{
			Callbacks->OnOk(Event.body);
		}
		return;
	case igi::EventKind::Error:
		Pending.Remove(Event.id);
		if (Callbacks->OnError)
		{
			Callbacks->OnError(IgiUnreal::ToError(Event.error));
		}
		return;
	default:
		Pending.Remove(Event.id);
		return;
	}
}

uint64 UIgiSdkSubsystem::Send(const char* Type, igi::MsgValue Body, FIgiCallbacks Callbacks)
{
	if (!Client)
	{
		if (Callbacks.OnError)
		{
			Callbacks.OnError(LastError.Code.IsEmpty() ? MakeError(TEXT("unavailable"), TEXT("no igi-sdk sidecar"), false) : LastError);
		}
		return 0;
	}
	const uint64 Id = Client->Request(Type, MoveTemp(Body));
	Pending.Add(Id, MakeShared<FIgiCallbacks>(MoveTemp(Callbacks)));
	return Id;
}

igi::MsgValue UIgiSdkSubsystem::SamplingBody(const FIgiSampling& Sampling)
{
	igi::MsgValue Body = igi::MsgValue::Map();
	if (Sampling.Temperature >= 0.f)
	{
		Body.Set("temperature", igi::MsgValue::Float(Sampling.Temperature));
	}
	if (Sampling.TopP >= 0.f)
	{
		Body.Set("top_p", igi::MsgValue::Float(Sampling.TopP));
	}
	if (Sampling.TopK >= 0)
	{
		Body.Set("top_k", igi::MsgValue::Int(Sampling.TopK));
	}
	if (Sampling.MinP >= 0.f)
	{
		Body.Set("min_p", igi::MsgValue::Float(Sampling.MinP));
	}
	if (Sampling.RepeatPenalty >= 0.f)
	{
		Body.Set("repeat_penalty", igi::MsgValue::Float(Sampling.RepeatPenalty));
	}
	if (Sampling.Seed >= 0)
	{
		Body.Set("seed", igi::MsgValue::Int(Sampling.Seed));
	}
	return Body;
}

igi::MsgValue UIgiSdkSubsystem::ChatExtra(const FIgiChatOptions& Options)
{
	// out-of-range values are sent as given: the sidecar answers invalid_body, typed, naming them
	igi::MsgValue Extra = igi::MsgValue::Map();
	if (Options.Stop.Num() > 0)
	{
		igi::MsgValue Stop = igi::MsgValue::Array();
		for (const FString& Item : Options.Stop)
		{
			Stop.Push(igi::MsgValue::Str(IgiUnreal::ToUtf8(Item)));
		}
		Extra.Set("stop", MoveTemp(Stop));
	}
	if (!Options.Grammar.IsEmpty())
	{
		Extra.Set("grammar", igi::MsgValue::Str(IgiUnreal::ToUtf8(Options.Grammar)));
	}
	if (!Options.JsonSchema.IsEmpty())
	{
		// the protocol takes the schema as JSON text too
		Extra.Set("json_schema", igi::MsgValue::Str(IgiUnreal::ToUtf8(Options.JsonSchema)));
	}
	if (Options.Images.Num() > 0)
	{
		igi::MsgValue Images = igi::MsgValue::Array();
		for (const FIgiImage& Image : Options.Images)
		{
			igi::MsgValue Item = igi::MsgValue::Map();
			// the file's bytes as msgpack bin: the sidecar decodes PNG/JPEG itself
			Item.Set("data", igi::MsgValue::Bin(std::string(reinterpret_cast<const char*>(Image.Data.GetData()), static_cast<size_t>(Image.Data.Num()))));
			Images.Push(MoveTemp(Item));
		}
		Extra.Set("images", MoveTemp(Images));
	}
	return Extra;
}

igi::ChatOptions UIgiSdkSubsystem::ToolOptions(const FIgiChatOptions& Options, int32 MaxTokens)
{
	igi::ChatOptions Out;
	Out.max_tokens = MaxTokens;
	Out.extra = ChatExtra(Options);
	for (const FIgiAction& Action : Options.Actions)
	{
		Out.tools.push_back(igi::ToolSpec{IgiUnreal::ToUtf8(Action.Name), IgiUnreal::ToUtf8(Action.Description),
			IgiUnreal::ToUtf8(Action.ParametersJson)});
	}
	Out.tool_choice = IgiUnreal::ToUtf8(Options.ActionChoice);
	if (!Options.bParallelActions && Options.Actions.Num() > 0)
	{
		Out.parallel_tool_calls = 0;
	}
	for (const FIgiActionResult& Result : Options.ActionResults)
	{
		Out.tool_results.push_back(igi::ToolResult{IgiUnreal::ToUtf8(Result.CallId), IgiUnreal::ToUtf8(Result.Result)});
	}
	return Out;
}

uint64 UIgiSdkSubsystem::OpenSession(const FString& SystemPrompt, const FString& Name, int32 Priority, FIgiCallbacks Callbacks)
{
	igi::MsgValue Body = igi::MsgValue::Map();
	Body.Set("system_prompt", igi::MsgValue::Str(IgiUnreal::ToUtf8(SystemPrompt)));
	if (!Name.IsEmpty())
	{
		Body.Set("name", igi::MsgValue::Str(IgiUnreal::ToUtf8(Name)));
	}
	Body.Set("priority", igi::MsgValue::Int(FMath::Clamp(Priority, -100, 100)));
	return Send("open_session", MoveTemp(Body), MoveTemp(Callbacks));
}

uint64 UIgiSdkSubsystem::Chat(const FString& Session, const FString& Text, int32 MaxTokens, FIgiCallbacks Callbacks)
{
	return Chat(Session, Text, FIgiChatOptions(), MaxTokens, MoveTemp(Callbacks));
}

uint64 UIgiSdkSubsystem::Chat(const FString& Session, const FString& Text, const FIgiChatOptions& Options, int32 DefaultMaxTokens, FIgiCallbacks Callbacks)
{
	if (!Client)
	{
		return Send("chat", igi::MsgValue::Map(), MoveTemp(Callbacks));
	}
	const int32 MaxTokens = Options.MaxTokens > 0 ? Options.MaxTokens : DefaultMaxTokens;
	uint64 Id = 0;
	if (Options.Actions.Num() > 0 || Options.ActionResults.Num() > 0 || !Options.ActionChoice.IsEmpty())
	{
		// protocol 1.3 actions: the core checks them and refuses a broken line unsent (invalid_body)
		Id = Client->Chat(IgiUnreal::ToUtf8(Session), IgiUnreal::ToUtf8(Text), ToolOptions(Options, FMath::Clamp(MaxTokens, 1, 4096)));
	}
	else
	{
		Id = Client->Chat(IgiUnreal::ToUtf8(Session), IgiUnreal::ToUtf8(Text), FMath::Clamp(MaxTokens, 1, 4096), ChatExtra(Options));
	}
	Pending.Add(Id, MakeShared<FIgiCallbacks>(MoveTemp(Callbacks)));
	return Id;
}

void UIgiSdkSubsystem::Cancel(uint64 ChatId)
{
	if (Client && ChatId != 0)
	{
		Client->Cancel(ChatId);  // the stream still ends with done (finish_reason "cancelled")
	}
}

uint64 UIgiSdkSubsystem::SaveSession(const FString& Session, const FString& SaveName, FIgiCallbacks Callbacks)
{
	igi::MsgValue Body = igi::MsgValue::Map();
	Body.Set("session", igi::MsgValue::Str(IgiUnreal::ToUtf8(Session)));
	Body.Set("name", igi::MsgValue::Str(IgiUnreal::ToUtf8(SaveName)));
	return Send("save_session", MoveTemp(Body), MoveTemp(Callbacks));
}

uint64 UIgiSdkSubsystem::RestoreSession(const FString& SaveName, const FString& Session, FIgiCallbacks Callbacks)
{
	igi::MsgValue Body = igi::MsgValue::Map();
	Body.Set("name", igi::MsgValue::Str(IgiUnreal::ToUtf8(SaveName)));
	if (!Session.IsEmpty())
	{
		Body.Set("session", igi::MsgValue::Str(IgiUnreal::ToUtf8(Session)));
	}
	return Send("restore_session", MoveTemp(Body), MoveTemp(Callbacks));
}

uint64 UIgiSdkSubsystem::CloseSession(const FString& Session, FIgiCallbacks Callbacks)
{
	igi::MsgValue Body = igi::MsgValue::Map();
	Body.Set("session", igi::MsgValue::Str(IgiUnreal::ToUtf8(Session)));
	return Send("close_session", MoveTemp(Body), MoveTemp(Callbacks));
}

uint64 UIgiSdkSubsystem::ReserveVram(int64 Bytes, int32 DeadlineFrames, FIgiCallbacks Callbacks)
{
	igi::MsgValue Body = igi::MsgValue::Map();
	Body.Set("bytes", igi::MsgValue::Int(FMath::Max<int64>(Bytes, 0)));
	Body.Set("deadline_frames", igi::MsgValue::Int(FMath::Clamp(DeadlineFrames, 0, 100000)));
	return Send("reserve_vram", MoveTemp(Body), MoveTemp(Callbacks));
}

void UIgiSdkSubsystem::BeginLevelLoad(int64 Bytes, int32 DeadlineFrames, TFunction<void(const FIgiLevelLoadResult&)> Then)
{
	if (!Client || GetConnectionState() != EIgiConnectionState::Ready)
	{
		// nobody to make room: the level loads now
		FIgiLevelLoadResult Result;
		Result.Outcome = EIgiLevelLoadOutcome::NoSidecar;
		Result.Error = LastError.Code.IsEmpty() ? MakeError(TEXT("unavailable"), TEXT("the igi-sdk sidecar is not connected"), true) : LastError;
		if (Then)
		{
			Then(Result);
		}
		return;
	}
	const int32 Frames = FMath::Clamp(DeadlineFrames, 1, 100000);
	TWeakObjectPtr<UIgiSdkSubsystem> WeakThis(this);
	TSharedRef<uint64> IdBox = MakeShared<uint64>(0);
	FIgiCallbacks Callbacks;
	Callbacks.OnOk = [WeakThis, IdBox](const igi::MsgValue&)
	{
		if (UIgiSdkSubsystem* Self = WeakThis.Get())
		{
			Self->FinishLevelLoad(*IdBox, EIgiLevelLoadOutcome::Granted, FIgiError());
		}
	};
	Callbacks.OnError = [WeakThis, IdBox](const FIgiError& Error)
	{
		if (UIgiSdkSubsystem* Self = WeakThis.Get())
		{
			const EIgiLevelLoadOutcome Outcome = Error.Code == TEXT("deadline_missed") ? EIgiLevelLoadOutcome::DeadlinePassed
				: Error.Code == TEXT("unavailable") ? EIgiLevelLoadOutcome::NoSidecar : EIgiLevelLoadOutcome::Refused;
			Self->FinishLevelLoad(*IdBox, Outcome, Error);
		}
	};
	FLevelLoad Load;
	Load.Id = ReserveVram(Bytes, Frames, MoveTemp(Callbacks));
	*IdBox = Load.Id;
	Load.FramesLeft = Frames;
	Load.Then = MakeShared<TFunction<void(const FIgiLevelLoadResult&)>>(MoveTemp(Then));
	LevelLoads.Add(MoveTemp(Load));
}

void UIgiSdkSubsystem::TickLevelLoads()
{
	TArray<uint64> Expired;
	for (FLevelLoad& Load : LevelLoads)
	{
		++Load.FramesWaited;
		if (--Load.FramesLeft <= 0)
		{
			Expired.Add(Load.Id);
		}
	}
	for (const uint64 Id : Expired)
	{
		FinishLevelLoad(Id, EIgiLevelLoadOutcome::DeadlinePassed,
			MakeError(TEXT("deadline_missed"), TEXT("the VRAM was not granted within the frame deadline"), true));
	}
}

void UIgiSdkSubsystem::FinishLevelLoad(uint64 Id, EIgiLevelLoadOutcome Outcome, const FIgiError& Error)
{
	for (int32 Index = 0; Index < LevelLoads.Num(); ++Index)
	{
		if (LevelLoads[Index].Id != Id)
		{
			continue;
		}
		const FLevelLoad Load = LevelLoads[Index];
		LevelLoads.RemoveAt(Index);
		Forget(Id);  // a late grant is dropped: the game has moved on
		FIgiLevelLoadResult Result;
		Result.Outcome = Outcome;
		Result.Error = Error;
		Result.FramesWaited = Load.FramesWaited;
		if (Load.Then.IsValid() && *Load.Then)
		{
			(*Load.Then)(Result);
		}
		return;
	}
}

void UIgiSdkSubsystem::Forget(uint64 Id)
{
	Pending.Remove(Id);
}

void UIgiSdkSubsystem::SetPriority(const FString& Session, int32 Priority)
{
	igi::MsgValue Body = igi::MsgValue::Map();
	Body.Set("session", igi::MsgValue::Str(IgiUnreal::ToUtf8(Session)));
	Body.Set("priority", igi::MsgValue::Int(FMath::Clamp(Priority, -100, 100)));
	Send("set_priority", MoveTemp(Body), FIgiCallbacks());
}

void UIgiSdkSubsystem::SetGameCpuUse(int32 BusyThreads, float CpuShare)
{
	// kept for the next frame reports (igi::FrameBody clamps and leaves out what is not given)
	GameBusyThreads = BusyThreads < 0 ? -1 : BusyThreads;
	GameCpuShare = CpuShare;
}

EIgiConnectionState UIgiSdkSubsystem::GetConnectionState() const
{
	if (!Client)
	{
		return HostSlot == 0 && LastError.Code == TEXT("disabled_on_server") ? EIgiConnectionState::Closed : EIgiConnectionState::Refused;
	}
	if (HostSlot != 0 && FIgiSidecarHost::Get().GetState() == EIgiSidecarState::Failed)
	{
		return EIgiConnectionState::Refused;
	}
	if (bSidecarDown)
	{
		return EIgiConnectionState::Unavailable;
	}
	return ClientState;
}

int32 UIgiSdkSubsystem::GetSidecarRestarts() const
{
	return HostSlot != 0 ? FIgiSidecarHost::Get().GetRestarts() : 0;
}

FString UIgiSdkSubsystem::GetModelName() const
{
	return Client ? IgiUnreal::FromUtf8(Client->Info().model) : FString();
}

FString UIgiSdkSubsystem::LoadOrCreateOwnerKey() const
{
	// one owner key per install: the sidecar's sessions (and orphans after a crash) belong to it
	const FString Path = FPaths::Combine(FPaths::ProjectSavedDir(), TEXT("IgiSdk"), TEXT("owner.key"));
	FString Key;
	if (FFileHelper::LoadFileToString(Key, *Path))
	{
		Key.TrimStartAndEndInline();
		if (Key.Len() >= 16 && Key.Len() <= 128)
		{
			return Key;
		}
	}
	Key = NewSecret();
	IFileManager::Get().MakeDirectory(*FPaths::GetPath(Path), true);
	FFileHelper::SaveStringToFile(Key, *Path);
	return Key;
}
