#include "IgiNpcDialogueComponent.h"

#include "Engine/GameInstance.h"
#include "Engine/World.h"
#include "IgiSaveGame.h"
#include "IgiSdkSubsystem.h"

DEFINE_LOG_CATEGORY_STATIC(LogIgiNpc, Log, All);

namespace
{
	constexpr int32 MaxHistory = 256;  // open_session's history holds at most 256 turns

	FIgiError MakeError(const TCHAR* Code, const TCHAR* Message, bool bRetryable = false)
	{
		FIgiError Error;
		Error.Code = Code;
		Error.Message = Message;
		Error.bRetryable = bRetryable;
		return Error;
	}
}

UIgiSdkSubsystem* UIgiNpcDialogueComponent::Sdk() const
{
	const UWorld* World = GetWorld();
	UGameInstance* GameInstance = World ? World->GetGameInstance() : nullptr;
	return GameInstance ? GameInstance->GetSubsystem<UIgiSdkSubsystem>() : nullptr;
}

bool UIgiNpcDialogueComponent::IsStale() const
{
	// a session of a sidecar that has since died: its id means nothing to the new one
	const UIgiSdkSubsystem* Subsystem = Sdk();
	return Subsystem != nullptr && !Session.IsEmpty()
		&& (Subsystem->IsSidecarRestarting() || SessionGeneration != Subsystem->GetSidecarGeneration());
}

void UIgiNpcDialogueComponent::BeginPlay()
{
	Super::BeginPlay();
	bEndedPlay = false;
	if (UIgiSdkSubsystem* Subsystem = Sdk())
	{
		Subsystem->OnConnectionChanged.AddDynamic(this, &UIgiNpcDialogueComponent::HandleConnectionChanged);
		if (Subsystem->GetConnectionState() == EIgiConnectionState::Ready)
		{
			OpenSession();
		}
	}
}

void UIgiNpcDialogueComponent::EndPlay(const EEndPlayReason::Type Reason)
{
	bEndedPlay = true;
	if (UIgiSdkSubsystem* Subsystem = Sdk())
	{
		Subsystem->OnConnectionChanged.RemoveDynamic(this, &UIgiNpcDialogueComponent::HandleConnectionChanged);
		CancelReply();
		Subsystem->Forget(CurrentChat);
		if (!bKeepSessionOnEndPlay && !Session.IsEmpty() && !IsStale())
		{
			// its slot goes back to the model: 8 NPCs that came and went leave 8 slots free
			Subsystem->CloseSession(Session, FIgiCallbacks());
		}
	}
	CurrentChat = 0;
	if (!bKeepSessionOnEndPlay)
	{
		Session.Empty();
		Transcript.Empty();
	}
	WhenOpen.Empty();
	WhenOpenFails.Empty();
	Super::EndPlay(Reason);
}

void UIgiNpcDialogueComponent::HandleConnectionChanged(EIgiConnectionState State)
{
	UIgiSdkSubsystem* Subsystem = Sdk();
	if (State == EIgiConnectionState::Ready && Subsystem != nullptr)
	{
		if (IsStale())
		{
			// the sidecar was started again: this NPC's conversation comes back in a new session
			Session.Empty();
			bRecovering = true;
		}
		if (Session.IsEmpty() && !bOpening)
		{
			OpenSession();
		}
	}
	else if (State == EIgiConnectionState::Refused)
	{
		FailQueued(Subsystem != nullptr && !Subsystem->LastError.Code.IsEmpty()
			? Subsystem->LastError : MakeError(TEXT("unavailable"), TEXT("the sidecar cannot be used")));
	}
}

void UIgiNpcDialogueComponent::OpenSession()
{
	UIgiSdkSubsystem* Subsystem = Sdk();
	if (Subsystem == nullptr || bOpening)
	{
		return;
	}
	if (bRecovering && !bTranscriptComplete && !RecoverySave.IsEmpty())
	{
		RestoreForRecovery();
		return;
	}
	bOpening = true;
	igi::MsgValue Body = igi::MsgValue::Map();
	Body.Set("system_prompt", igi::MsgValue::Str(IgiUnreal::ToUtf8(SystemPrompt)));
	if (!SessionName.IsEmpty())
	{
		Body.Set("name", igi::MsgValue::Str(IgiUnreal::ToUtf8(SessionName)));
	}
	Body.Set("priority", igi::MsgValue::Int(FMath::Clamp(Priority, -100, 100)));
	igi::MsgValue SamplingMap = UIgiSdkSubsystem::SamplingBody(Sampling);
	if (SamplingMap.Size() > 0)
	{
		Body.Set("sampling", MoveTemp(SamplingMap));
	}
	if (Transcript.Num() > 0)
	{
		// the turns this component kept: the model reads them with the next line
		igi::MsgValue History = igi::MsgValue::Array();
		for (const FTurn& Turn : Transcript)
		{
			igi::MsgValue Item = igi::MsgValue::Map();
			Item.Set("role", igi::MsgValue::Str(Turn.bPlayer ? "user" : "assistant"));
			Item.Set("content", igi::MsgValue::Str(IgiUnreal::ToUtf8(Turn.Text)));
			History.Push(MoveTemp(Item));
		}
		Body.Set("history", MoveTemp(History));
	}
	TWeakObjectPtr<UIgiNpcDialogueComponent> WeakThis(this);
	TWeakObjectPtr<UIgiSdkSubsystem> WeakSdk(Subsystem);
	FIgiCallbacks Callbacks;
	Callbacks.OnOk = [WeakThis, WeakSdk](const igi::MsgValue& Answer)
	{
		const FString Id = IgiUnreal::FromUtf8(Answer.GetString("session"));
		UIgiNpcDialogueComponent* Self = WeakThis.Get();
		if (Self == nullptr || (Self->bEndedPlay && !Self->bKeepSessionOnEndPlay))
		{
			// it left the world while its session opened: nobody will talk to it
			if (UIgiSdkSubsystem* Subsystem = WeakSdk.Get())
			{
				Subsystem->CloseSession(Id, FIgiCallbacks());
			}
			if (Self != nullptr)
			{
				Self->bOpening = false;
			}
			return;
		}
		Self->bOpening = false;
		Self->UseSession(Id, Self->bRecovering);
	};
	Callbacks.OnError = [WeakThis](const FIgiError& Error)
	{
		UIgiNpcDialogueComponent* Self = WeakThis.Get();
		if (Self == nullptr)
		{
			return;
		}
		Self->bOpening = false;
		if (Error.Code == TEXT("session_exists") && !Self->bEndedPlay)
		{
			// left by an earlier run with this owner key, or kept at EndPlay: take it over
			Self->Adopt();
			return;
		}
		Self->FailQueued(Error);
	};
	Subsystem->Send("open_session", MoveTemp(Body), MoveTemp(Callbacks));
}

void UIgiNpcDialogueComponent::Adopt()
{
	UIgiSdkSubsystem* Subsystem = Sdk();
	if (Subsystem == nullptr)
	{
		return;
	}
	bOpening = true;
	igi::MsgValue Body = igi::MsgValue::Map();
	Body.Set("session", igi::MsgValue::Str(IgiUnreal::ToUtf8(SessionName)));
	TWeakObjectPtr<UIgiNpcDialogueComponent> WeakThis(this);
	FIgiCallbacks Callbacks;
	Callbacks.OnOk = [WeakThis](const igi::MsgValue& Answer)
	{
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			Self->bOpening = false;
			// the sidecar holds the conversation: what this component kept is not needed
			Self->UseSession(IgiUnreal::FromUtf8(Answer.GetString("session")), false);
		}
	};
	Callbacks.OnError = [WeakThis](const FIgiError& Error)
	{
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			Self->bOpening = false;
			Self->FailQueued(Error);
		}
	};
	Subsystem->Send("adopt_session", MoveTemp(Body), MoveTemp(Callbacks));
}

void UIgiNpcDialogueComponent::RestoreForRecovery()
{
	// the conversation came from a save: bring that back (turns said since are not in it)
	UIgiSdkSubsystem* Subsystem = Sdk();
	bOpening = true;
	TWeakObjectPtr<UIgiNpcDialogueComponent> WeakThis(this);
	FIgiCallbacks Callbacks;
	Callbacks.OnOk = [WeakThis](const igi::MsgValue& Answer)
	{
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			Self->bOpening = false;
			Self->UseSession(IgiUnreal::FromUtf8(Answer.GetString("session")), true);
		}
	};
	Callbacks.OnError = [WeakThis](const FIgiError&)
	{
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			// the save is gone: open the NPC with the turns it has
			Self->bOpening = false;
			Self->RecoverySave.Empty();
			Self->OpenSession();
		}
	};
	Subsystem->RestoreSession(RecoverySave, SessionName, MoveTemp(Callbacks));
}

void UIgiNpcDialogueComponent::UseSession(const FString& Id, bool bRecovered)
{
	UIgiSdkSubsystem* Subsystem = Sdk();
	Session = Id;
	SessionGeneration = Subsystem != nullptr ? Subsystem->GetSidecarGeneration() : 0;
	bRecovering = false;
	if (bRecovered)
	{
		UE_LOG(LogIgiNpc, Log, TEXT("%s is back after the sidecar restarted (session %s, %d turns)"), *SessionName, *Session, Transcript.Num());
		++Recoveries;
		OnRecovered.Broadcast();
	}
	TArray<TFunction<void()>> Work = MoveTemp(WhenOpen);
	WhenOpen.Empty();
	WhenOpenFails.Empty();
	for (TFunction<void()>& Item : Work)
	{
		Item();
	}
}

void UIgiNpcDialogueComponent::FailQueued(const FIgiError& Error)
{
	TArray<TFunction<void(const FIgiError&)>> Fails = MoveTemp(WhenOpenFails);
	WhenOpen.Empty();
	WhenOpenFails.Empty();
	for (TFunction<void(const FIgiError&)>& Fail : Fails)
	{
		Fail(Error);
	}
	OnError.Broadcast(Error);
}

void UIgiNpcDialogueComponent::RunWhenOpen(TFunction<void()> Work, TFunction<void(const FIgiError&)> Fail)
{
	if (!Session.IsEmpty() && !IsStale())
	{
		Work();
		return;
	}
	UIgiSdkSubsystem* Subsystem = Sdk();
	const EIgiConnectionState State = Subsystem != nullptr ? Subsystem->GetConnectionState() : EIgiConnectionState::Closed;
	if (State == EIgiConnectionState::Refused || State == EIgiConnectionState::Closed)
	{
		// no sidecar to wait for (a dedicated server, a failed start): the line fails now
		Fail(Subsystem != nullptr && !Subsystem->LastError.Code.IsEmpty()
			? Subsystem->LastError : MakeError(TEXT("unavailable"), TEXT("the sidecar cannot be used")));
		return;
	}
	WhenOpen.Add(MoveTemp(Work));
	WhenOpenFails.Add(MoveTemp(Fail));
	if (Subsystem != nullptr && Subsystem->GetConnectionState() == EIgiConnectionState::Ready && !bOpening)
	{
		if (IsStale())
		{
			Session.Empty();
			bRecovering = true;
		}
		OpenSession();
	}
	// otherwise it opens when the sidecar is ready (HandleConnectionChanged), or the line fails
	// when the sidecar cannot be used
}

void UIgiNpcDialogueComponent::Remember(const FString& Line, const FString& Reply)
{
	const int32 Keep = FMath::Clamp(RecoveryTurns, 0, MaxHistory);
	if (Line.IsEmpty() && Transcript.Num() > 0 && !Transcript[Transcript.Num() - 1].bPlayer)
	{
		// the reply that continued from action results: one NPC turn with the calls' reply
		FTurn& Last = Transcript[Transcript.Num() - 1];
		Last.Text = Last.Text.IsEmpty() ? Reply : Last.Text + TEXT(" ") + Reply;
		return;
	}
	FTurn Player;
	Player.bPlayer = true;
	Player.Text = Line;
	Transcript.Add(MoveTemp(Player));
	FTurn Npc;
	Npc.Text = Reply;
	Transcript.Add(MoveTemp(Npc));
	while (Transcript.Num() > Keep)
	{
		Transcript.RemoveAt(0);
	}
	// a history starts with the player's turn
	while (Transcript.Num() > 0 && !Transcript[0].bPlayer)
	{
		Transcript.RemoveAt(0);
	}
}

void UIgiNpcDialogueComponent::Say(const FString& Line)
{
	SayWithOptions(Line, ChatOptions);
}

void UIgiNpcDialogueComponent::SayWithOptions(const FString& Line, const FIgiChatOptions& Options)
{
	TWeakObjectPtr<UIgiNpcDialogueComponent> WeakThis(this);
	FIgiCallbacks Callbacks;
	Callbacks.OnToken = [WeakThis](const FString& Token)
	{
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			Self->OnToken.Broadcast(Token);
		}
	};
	Callbacks.OnDone = [WeakThis](const FString& Text, const FString& FinishReason)
	{
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			Self->OnDone.Broadcast(Text, FinishReason);
		}
	};
	Callbacks.OnError = [WeakThis](const FIgiError& Error)
	{
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			Self->OnError.Broadcast(Error);
		}
	};
	Say(Line, Options, MoveTemp(Callbacks));
}

// ---- actions (protocol 1.3 tools) ------------------------------------------------------------

FIgiChatOptions UIgiNpcDialogueComponent::WithActions(const FIgiChatOptions& Options, const FString& Choice) const
{
	FIgiChatOptions Out = Options;
	if (Out.Actions.Num() == 0 && Actions.Num() > 0)
	{
		Out.Actions = Actions;
		Out.ActionChoice = Choice == TEXT("auto") ? FString() : Choice;
		Out.bParallelActions = bParallelActions;
	}
	return Out;
}

void UIgiNpcDialogueComponent::BeginReply()
{
	// calls left unanswered belong to the last reply: a new line drops them
	CurrentCalls.Empty();
	Unanswered.Empty();
	Answers.Empty();
}

void UIgiNpcDialogueComponent::EndReply(const TArray<FIgiActionCall>& Calls)
{
	LastCalls = Calls;
	Unanswered = Calls;
	CurrentCalls.Empty();
	// answers given during the reply to calls it did not end with are dropped
	TArray<FIgiActionResult> Kept;
	for (const FIgiActionResult& Answer : Answers)
	{
		for (const FIgiActionCall& Call : Unanswered)
		{
			if (Call.CallId == Answer.CallId)
			{
				Kept.Add(Answer);
				break;
			}
		}
	}
	Answers = Kept;
}

bool UIgiNpcDialogueComponent::IsAnswered(const FString& CallId) const
{
	for (const FIgiActionResult& Answer : Answers)
	{
		if (Answer.CallId == CallId)
		{
			return true;
		}
	}
	return false;
}

bool UIgiNpcDialogueComponent::AnswerAction(const FString& CallId, const FString& Result)
{
	// during the reply its calls so far; afterwards the calls it ended with
	const TArray<FIgiActionCall>& Calls = CurrentChat != 0 ? CurrentCalls : Unanswered;
	bool bWaiting = false;
	for (const FIgiActionCall& Call : Calls)
	{
		bWaiting = bWaiting || Call.CallId == CallId;
	}
	if (!bWaiting || IsAnswered(CallId))
	{
		const FString Why = FString(TEXT("no call ")) + CallId + TEXT(" of this NPC is waiting for an answer");
		OnError.Broadcast(MakeError(TEXT("unknown_action_call"), *Why));
		return false;
	}
	FIgiActionResult Answer;
	Answer.CallId = CallId;
	Answer.Result = Result;
	Answers.Add(Answer);
	if (CurrentChat == 0)
	{
		SendAnswersIfComplete();
	}
	return true;
}

TArray<FIgiActionCall> UIgiNpcDialogueComponent::GetUnansweredActions() const
{
	TArray<FIgiActionCall> Left;
	for (const FIgiActionCall& Call : Unanswered)
	{
		if (!IsAnswered(Call.CallId))
		{
			Left.Add(Call);
		}
	}
	return Left;
}

void UIgiNpcDialogueComponent::SendAnswersIfComplete()
{
	if (Unanswered.Num() == 0 || Answers.Num() < Unanswered.Num() || CurrentChat != 0 || bEndedPlay)
	{
		return;
	}
	FIgiChatOptions Options = LastLineOptions;
	// in the order of the calls
	for (const FIgiActionCall& Call : Unanswered)
	{
		for (const FIgiActionResult& Answer : Answers)
		{
			if (Answer.CallId == Call.CallId)
			{
				Options.ActionResults.Add(Answer);
			}
		}
	}
	Options = WithActions(Options, ActionChoiceAfterResults);
	// the continuation is heard like a line said with Say (OnToken, OnAction, OnDone, OnError)
	SayWithOptions(FString(), Options);
}

uint64 UIgiNpcDialogueComponent::Say(const FString& Line, FIgiCallbacks Callbacks)
{
	return Say(Line, ChatOptions, MoveTemp(Callbacks));
}

uint64 UIgiNpcDialogueComponent::Say(const FString& Line, const FIgiChatOptions& Options, FIgiCallbacks Callbacks)
{
	if (Sdk() == nullptr)
	{
		if (Callbacks.OnError)
		{
			Callbacks.OnError(MakeError(TEXT("unavailable"), TEXT("no igi-sdk subsystem in this world")));
		}
		return 0;
	}
	return SendLine(Line, Options, MakeShared<FIgiCallbacks>(MoveTemp(Callbacks)), false);
}

uint64 UIgiNpcDialogueComponent::SendLine(const FString& Line, const FIgiChatOptions& Options, TSharedRef<FIgiCallbacks> Shared, bool bRetried)
{
	UIgiSdkSubsystem* Subsystem = Sdk();
	if (Subsystem == nullptr)
	{
		return 0;
	}
	TWeakObjectPtr<UIgiNpcDialogueComponent> WeakThis(this);
	if (Session.IsEmpty() || IsStale())
	{
		// said before the session opened (or while its sidecar restarts): sent once it is
		RunWhenOpen([WeakThis, Line, Options, Shared, bRetried]()
		{
			if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
			{
				Self->SendLine(Line, Options, Shared, bRetried);
			}
		},
		[Shared](const FIgiError& Error)
		{
			if (Shared->OnError)
			{
				Shared->OnError(Error);
			}
		});
		return 0;
	}
	FIgiCallbacks Callbacks;
	Callbacks.OnToken = Shared->OnToken;
	Callbacks.OnDoneBody = Shared->OnDoneBody;
	Callbacks.OnAction = [WeakThis, Shared](const FIgiActionCall& Call)
	{
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			Self->CurrentCalls.Add(Call);
			Self->OnAction.Broadcast(Call);
		}
		if (Shared->OnAction)
		{
			Shared->OnAction(Call);
		}
	};
	Callbacks.OnDoneActions = [WeakThis, Shared](const TArray<FIgiActionCall>& Calls)
	{
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			// a call done lists whose event was not seen (a resumed stream) is raised now
			for (const FIgiActionCall& Call : Calls)
			{
				bool bSeen = false;
				for (const FIgiActionCall& Seen : Self->CurrentCalls)
				{
					bSeen = bSeen || Seen.CallId == Call.CallId;
				}
				if (!bSeen)
				{
					Self->CurrentCalls.Add(Call);
					Self->OnAction.Broadcast(Call);
				}
			}
			Self->EndReply(Calls);
		}
		if (Shared->OnDoneActions)
		{
			Shared->OnDoneActions(Calls);
		}
	};
	Callbacks.OnDone = [WeakThis, Line, Shared](const FString& Text, const FString& FinishReason)
	{
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			Self->CurrentChat = 0;
			// a reply cancelled before its first token is undone in the session too
			if (!(FinishReason == TEXT("cancelled") && Text.IsEmpty()))
			{
				Self->Remember(Line, Text);
			}
		}
		if (Shared->OnDone)
		{
			Shared->OnDone(Text, FinishReason);
		}
		// every call answered during the reply: it continues from the results now
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			Self->SendAnswersIfComplete();
		}
	};
	const FString Asked = Session;
	Callbacks.OnError = [WeakThis, Line, Options, Shared, bRetried, Asked](const FIgiError& Error)
	{
		UIgiNpcDialogueComponent* Self = WeakThis.Get();
		if (Self != nullptr)
		{
			Self->CurrentChat = 0;
			if (Error.Code == TEXT("unknown_session") && !bRetried && !Self->bEndedPlay && Self->Session == Asked)
			{
				// the sidecar lost the session (restarted under a developer's own endpoint, or
				// closed it for the game's): open it again with the turns kept, then say it again
				Self->Session.Empty();
				Self->bRecovering = true;
				Self->SendLine(Line, Options, Shared, true);
				return;
			}
		}
		if (Shared->OnError)
		{
			Shared->OnError(Error);
		}
	};
	const FIgiChatOptions Sent = WithActions(Options, ActionChoice);
	if (Sent.ActionResults.Num() == 0)
	{
		// what a continuation from action results is sent with (its own actions added then)
		LastLineOptions = Options;
		LastLineOptions.Actions.Empty();
		LastLineOptions.ActionChoice.Empty();
		LastLineOptions.Images.Empty();
	}
	BeginReply();
	CurrentChat = Subsystem->Chat(Session, Line, Sent, MaxTokens, MoveTemp(Callbacks));
	return CurrentChat;
}

void UIgiNpcDialogueComponent::CancelReply()
{
	if (UIgiSdkSubsystem* Subsystem = Sdk())
	{
		Subsystem->Cancel(CurrentChat);
	}
}

void UIgiNpcDialogueComponent::SetPriority(int32 NewPriority)
{
	Priority = FMath::Clamp(NewPriority, -100, 100);
	if (UIgiSdkSubsystem* Subsystem = Sdk())
	{
		if (!Session.IsEmpty() && !IsStale())
		{
			Subsystem->SetPriority(Session, Priority);
		}
	}
}

void UIgiNpcDialogueComponent::SaveToSaveGame(UIgiSaveGame* SaveGame, const FString& SlotName, FIgiCallbacks Callbacks)
{
	UIgiSdkSubsystem* Subsystem = Sdk();
	if (SaveGame == nullptr || Subsystem == nullptr || Session.IsEmpty() || IsStale())
	{
		if (Callbacks.OnError)
		{
			Callbacks.OnError(MakeError(TEXT("invalid_state"), TEXT("no save game, or the NPC has no open session")));
		}
		return;
	}
	// the NPC's stable name keys it in the save game (its session may be the restore pair's)
	const FString Key = SessionName.IsEmpty() ? Session : SessionName;
	// save names are [A-Za-z0-9_.-]: anything else in the slot name becomes '_'
	FString SaveName = SlotName + TEXT(".") + Key;
	for (int32 Index = 0; Index < SaveName.Len(); ++Index)
	{
		const TCHAR C = SaveName[Index];
		const bool bOk = (C >= 'a' && C <= 'z') || (C >= 'A' && C <= 'Z') || (C >= '0' && C <= '9') || C == '_' || C == '.' || C == '-';
		if (!bOk)
		{
			SaveName[Index] = TEXT('_');
		}
	}
	SaveName = SaveName.Left(128);
	TWeakObjectPtr<UIgiSaveGame> WeakSave(SaveGame);
	TFunction<void(const igi::MsgValue&)> Then = MoveTemp(Callbacks.OnOk);
	Callbacks.OnOk = [WeakSave, Key, SaveName, Then](const igi::MsgValue& Body)
	{
		if (UIgiSaveGame* Save = WeakSave.Get())
		{
			Save->NpcSaves.Add(Key, SaveName);
		}
		if (Then)
		{
			Then(Body);
		}
	};
	Subsystem->SaveSession(Session, SaveName, MoveTemp(Callbacks));
}

void UIgiNpcDialogueComponent::RestoreFromSaveGame(UIgiSaveGame* SaveGame, FIgiCallbacks Callbacks)
{
	UIgiSdkSubsystem* Subsystem = Sdk();
	const FString* SaveName = SaveGame ? SaveGame->NpcSaves.Find(SessionName.IsEmpty() ? Session : SessionName) : nullptr;
	if (Subsystem == nullptr || SaveName == nullptr)
	{
		if (Callbacks.OnError)
		{
			Callbacks.OnError(MakeError(TEXT("unknown_save"), TEXT("the save game holds no conversation of this NPC")));
		}
		return;
	}
	// Restored into the other name of a pair (SessionName / SessionName.b), beside the live
	// session, which is closed only once the restore succeeded: a failed restore (no such save,
	// another model, a damaged file) leaves the conversation as it was.
	FString Target;
	if (!SessionName.IsEmpty())
	{
		const FString Alternate = SessionName.Left(126) + TEXT(".b");
		Target = Session == SessionName ? Alternate : SessionName;
	}
	CancelReply();
	Restore(*SaveName, Target, MakeShared<FIgiCallbacks>(MoveTemp(Callbacks)), false);
}

void UIgiNpcDialogueComponent::Restore(const FString& Name, const FString& Target, TSharedRef<FIgiCallbacks> Shared, bool bRetried)
{
	UIgiSdkSubsystem* Subsystem = Sdk();
	if (Subsystem == nullptr)
	{
		return;
	}
	TWeakObjectPtr<UIgiNpcDialogueComponent> WeakThis(this);
	FIgiCallbacks Restored;
	Restored.OnOk = [WeakThis, Name, Shared](const igi::MsgValue& Body)
	{
		if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
		{
			const FString Previous = Self->Session;
			const bool bPreviousLive = !Previous.IsEmpty() && !Self->IsStale();
			const FString Id = IgiUnreal::FromUtf8(Body.GetString("session"));
			UIgiSdkSubsystem* Sdk = Self->Sdk();
			if (bPreviousLive && Previous != Id && Sdk != nullptr)
			{
				Sdk->CloseSession(Previous, FIgiCallbacks());
			}
			// the turns kept so far are not the restored conversation's
			Self->Transcript.Empty();
			Self->bTranscriptComplete = false;
			Self->RecoverySave = Name;
			Self->UseSession(Id, false);
		}
		if (Shared->OnOk)
		{
			Shared->OnOk(Body);
		}
	};
	Restored.OnError = [WeakThis, Name, Target, Shared, bRetried](const FIgiError& Error)
	{
		UIgiNpcDialogueComponent* Self = WeakThis.Get();
		UIgiSdkSubsystem* Sdk = Self ? Self->Sdk() : nullptr;
		if (Error.Code == TEXT("session_exists") && !bRetried && Sdk != nullptr && !Target.IsEmpty() && Self->Session != Target)
		{
			// the pair's other name left open (a restore before the game crashed): this owner's,
			// not the live one; close it and restore once more
			FIgiCallbacks Closed;
			Closed.OnOk = [WeakThis, Name, Target, Shared](const igi::MsgValue&)
			{
				if (UIgiNpcDialogueComponent* Again = WeakThis.Get())
				{
					Again->Restore(Name, Target, Shared, true);
				}
			};
			Closed.OnError = [Shared, Error](const FIgiError&)
			{
				if (Shared->OnError)
				{
					Shared->OnError(Error);
				}
			};
			Sdk->CloseSession(Target, MoveTemp(Closed));
			return;
		}
		// the live session was never touched
		if (Shared->OnError)
		{
			Shared->OnError(Error);
		}
	};
	Subsystem->RestoreSession(Name, Target, MoveTemp(Restored));
}
