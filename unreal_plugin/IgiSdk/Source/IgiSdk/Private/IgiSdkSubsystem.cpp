#include "IgiSdkSubsystem.h"

#include "Engine/GameInstance.h"
#include "HAL/FileManager.h"
#include "HAL/PlatformMisc.h"
#include "HAL/PlatformProcess.h"
#include "IgiUnrealSocket.h"
#include "Misc/App.h"
#include "Misc/FileHelper.h"
#include "Misc/Guid.h"
#include "Misc/Paths.h"

DEFINE_LOG_CATEGORY_STATIC(LogIgiSdk, Log, All);

namespace
{
	// The sidecar this process started. It outlives a game instance (the next PIE session
	// reuses it) and ends with this process, which it watches (--game-pid).
	struct FIgiSidecarProcess
	{
		FProcHandle Handle;
		FString Endpoint;
		FString Instance;
		FString Token;
		FString EndpointFile;
	};
	FIgiSidecarProcess GSidecar;

	constexpr double EndpointWaitSeconds = 120.0;  // the sidecar binds before it loads its model

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
		// 64 hex digits: a launch token / owner key of [A-Za-z0-9]
		return FGuid::NewGuid().ToString(EGuidFormats::Digits) + FGuid::NewGuid().ToString(EGuidFormats::Digits);
	}
}

void UIgiSdkSubsystem::Initialize(FSubsystemCollectionBase& Collection)
{
	Super::Initialize(Collection);
	igi::ClientOptions Options;
	Options.engine = "unreal";
	Options.client_name = IgiUnreal::ToUtf8(FApp::GetProjectName());
	Options.game_pid = static_cast<int64_t>(FPlatformProcess::GetCurrentProcessId());
	Options.lease_s = LeaseSeconds;
	Options.owner_key = IgiUnreal::ToUtf8(LoadOrCreateOwnerKey());
	Options.socket_factory = []() { return std::unique_ptr<igi::ISocket>(new FIgiUnrealSocket()); };

	if (!Endpoint.IsEmpty())
	{
		// a sidecar someone else started: whatever answers there, without an instance check
		Options.endpoint = IgiUnreal::ToUtf8(Endpoint);
		Options.launch_token = IgiUnreal::ToUtf8(FPlatformMisc::GetEnvironmentVariable(TEXT("IGI_SDK_TOKEN")));
		Client.reset(new igi::Client(Options));
		bStarted = Client->Start();
	}
	else
	{
		const bool bReuse = GSidecar.Handle.IsValid() && FPlatformProcess::IsProcRunning(GSidecar.Handle) && !GSidecar.Endpoint.IsEmpty();
		if (!bReuse && !LaunchSidecar())
		{
			return;
		}
		Options.launch_token = IgiUnreal::ToUtf8(GSidecar.Token);
		Options.expected_instance = IgiUnreal::ToUtf8(GSidecar.Instance);
		Client.reset(new igi::Client(Options));
		// requests queue in the client until the sidecar reports its endpoint
		bWaitingForEndpoint = GSidecar.Endpoint.IsEmpty();
		WaitingSince = FPlatformTime::Seconds();
		if (!bWaitingForEndpoint)
		{
			Client->SetEndpoint(IgiUnreal::ToUtf8(GSidecar.Endpoint), Options.expected_instance);
			bStarted = Client->Start();
		}
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
	Pending.Empty();
	Super::Deinitialize();
}

bool UIgiSdkSubsystem::LaunchSidecar()
{
	const FString Exe = FPaths::ConvertRelativePathToFull(FPaths::Combine(FPaths::ProjectDir(), SidecarExecutable));
	FString Path = Exe;
#if PLATFORM_WINDOWS
	if (!Path.EndsWith(TEXT(".exe")))
	{
		Path += TEXT(".exe");
	}
#endif
	if (!FPaths::FileExists(Path))
	{
		LastError.Code = TEXT("sidecar_missing");
		LastError.Message = FString::Printf(TEXT("no igi-sdk sidecar at %s (SidecarExecutable)"), *Path);
		UE_LOG(LogIgiSdk, Error, TEXT("%s"), *LastError.Message);
		return false;
	}
	GSidecar.Instance = FGuid::NewGuid().ToString(EGuidFormats::Digits);
	GSidecar.Token = NewSecret();
	GSidecar.Endpoint.Empty();
	GSidecar.EndpointFile = FPaths::Combine(FPaths::ProjectSavedDir(), TEXT("IgiSdk"), GSidecar.Instance + TEXT(".endpoint"));
	IFileManager::Get().MakeDirectory(*FPaths::GetPath(GSidecar.EndpointFile), true);
	// a free port per launch: the sidecar binds port 0 and writes the port it got
	FString Args = FString::Printf(TEXT("serve --game-pid %u --endpoint tcp://127.0.0.1:0 --endpoint-file \"%s\" --instance %s"),
		FPlatformProcess::GetCurrentProcessId(), *GSidecar.EndpointFile, *GSidecar.Instance);
	if (!ModelDir.IsEmpty())
	{
		Args += FString::Printf(TEXT(" --model-dir \"%s\""), *FPaths::ConvertRelativePathToFull(FPaths::Combine(FPaths::ProjectDir(), ModelDir)));
	}
	if (!Model.IsEmpty())
	{
		Args += FString::Printf(TEXT(" --model \"%s\""), *Model);
	}
	// the launch token goes by environment only (a command line is readable by other processes)
	FPlatformMisc::SetEnvironmentVar(TEXT("IGI_SDK_TOKEN"), *GSidecar.Token);
	uint32 Pid = 0;
	GSidecar.Handle = FPlatformProcess::CreateProc(*Path, *Args, false, true, true, &Pid, 0, nullptr, nullptr);
	FPlatformMisc::SetEnvironmentVar(TEXT("IGI_SDK_TOKEN"), TEXT(""));
	if (!GSidecar.Handle.IsValid())
	{
		LastError.Code = TEXT("sidecar_start_failed");
		LastError.Message = FString::Printf(TEXT("could not start %s"), *Path);
		UE_LOG(LogIgiSdk, Error, TEXT("%s"), *LastError.Message);
		return false;
	}
	UE_LOG(LogIgiSdk, Log, TEXT("started the igi-sdk sidecar (pid %u, instance %s)"), Pid, *GSidecar.Instance);
	return true;
}

void UIgiSdkSubsystem::PollEndpointFile()
{
	FString Text;
	// one short line: a longer file is not the sidecar's, and is not read
	const int64 Size = IFileManager::Get().FileSize(*GSidecar.EndpointFile);
	if (Size > 0 && Size <= 256 && FFileHelper::LoadFileToString(Text, *GSidecar.EndpointFile))
	{
		Text.TrimStartAndEndInline();
		// written atomically by the sidecar: a whole endpoint or nothing
		if (Text.StartsWith(TEXT("tcp://")))
		{
			GSidecar.Endpoint = Text;
			bWaitingForEndpoint = false;
			Client->SetEndpoint(IgiUnreal::ToUtf8(Text), IgiUnreal::ToUtf8(GSidecar.Instance));
			bStarted = Client->Start();
			return;
		}
	}
	if (!FPlatformProcess::IsProcRunning(GSidecar.Handle) || FPlatformTime::Seconds() - WaitingSince > EndpointWaitSeconds)
	{
		bWaitingForEndpoint = false;
		LastError.Code = TEXT("sidecar_start_failed");
		LastError.Message = TEXT("the igi-sdk sidecar exited or never reported its endpoint");
		UE_LOG(LogIgiSdk, Error, TEXT("%s"), *LastError.Message);
		OnConnectionChanged.Broadcast(EIgiConnectionState::Refused);
	}
}

bool UIgiSdkSubsystem::Tick(float DeltaSeconds)
{
	if (!Client)
	{
		return true;
	}
	if (bWaitingForEndpoint)
	{
		PollEndpointFile();
	}
	if (!bStarted)
	{
		return true;
	}
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
	return true;
}

void UIgiSdkSubsystem::Dispatch(igi::Event& Event)
{
	if (Event.kind == igi::EventKind::State)
	{
		if (Event.state == igi::ConnectionState::Refused)
		{
			LastError = IgiUnreal::ToError(Event.error);
			UE_LOG(LogIgiSdk, Warning, TEXT("sidecar refused: %s"), *LastError.Message);
		}
		OnConnectionChanged.Broadcast(ToState(Event.state));
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
	case igi::EventKind::Done:
		if (Callbacks->OnDone)
		{
			Callbacks->OnDone(IgiUnreal::FromUtf8(Event.text), IgiUnreal::FromUtf8(Event.finish_reason));
		}
		break;
	case igi::EventKind::Ok:
		if (Callbacks->OnOk)
		{
			Callbacks->OnOk(Event.body);
		}
		break;
	case igi::EventKind::Error:
		if (Callbacks->OnError)
		{
			Callbacks->OnError(IgiUnreal::ToError(Event.error));
		}
		break;
	default:
		break;
	}
	Pending.Remove(Event.id);  // terminal
}

uint64 UIgiSdkSubsystem::Send(const char* Type, igi::MsgValue Body, FIgiCallbacks Callbacks)
{
	if (!Client)
	{
		if (Callbacks.OnError)
		{
			Callbacks.OnError(LastError);
		}
		return 0;
	}
	const uint64 Id = Client->Request(Type, MoveTemp(Body));
	Pending.Add(Id, MakeShared<FIgiCallbacks>(MoveTemp(Callbacks)));
	return Id;
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
	if (!Client)
	{
		return Send("chat", igi::MsgValue::Map(), MoveTemp(Callbacks));
	}
	const uint64 Id = Client->Chat(IgiUnreal::ToUtf8(Session), IgiUnreal::ToUtf8(Text), FMath::Clamp(MaxTokens, 1, 4096));
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
	return Client ? ToState(Client->State()) : EIgiConnectionState::Refused;
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
