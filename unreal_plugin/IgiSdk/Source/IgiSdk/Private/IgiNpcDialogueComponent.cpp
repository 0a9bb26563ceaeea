#include "IgiNpcDialogueComponent.h"

#include "Engine/GameInstance.h"
#include "Engine/World.h"
#include "IgiSaveGame.h"
#include "IgiSdkSubsystem.h"

UIgiSdkSubsystem* UIgiNpcDialogueComponent::Sdk() const
{
	const UWorld* World = GetWorld();
	UGameInstance* GameInstance = World ? World->GetGameInstance() : nullptr;
	return GameInstance ? GameInstance->GetSubsystem<UIgiSdkSubsystem>() : nullptr;
}

void UIgiNpcDialogueComponent::BeginPlay()
{
	Super::BeginPlay();
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
	if (UIgiSdkSubsystem* Subsystem = Sdk())
	{
		Subsystem->OnConnectionChanged.RemoveDynamic(this, &UIgiNpcDialogueComponent::HandleConnectionChanged);
		CancelReply();
		Subsystem->Forget(CurrentChat);
	}
	WhenOpen.Empty();
	WhenOpenFails.Empty();
	Super::EndPlay(Reason);
}

void UIgiNpcDialogueComponent::HandleConnectionChanged(EIgiConnectionState State)
{
	if (State == EIgiConnectionState::Ready && Session.IsEmpty())
	{
		OpenSession();
	}
	else if (State == EIgiConnectionState::Refused)
	{
		FIgiError Error;
		Error.Code = TEXT("unavailable");
		Error.Message = TEXT("the sidecar cannot be used");
		FailQueued(Error);
	}
}

void UIgiNpcDialogueComponent::OpenSession()
{
	UIgiSdkSubsystem* Subsystem = Sdk();
	if (Subsystem == nullptr || bOpening)
	{
		return;
	}
	bOpening = true;
	TWeakObjectPtr<UIgiNpcDialogueComponent> WeakThis(this);
	FIgiCallbacks Callbacks;
	Callbacks.OnOk = [WeakThis](const igi::MsgValue& Body)
	{
		UIgiNpcDialogueComponent* Self = WeakThis.Get();
		if (Self == nullptr)
		{
			return;
		}
		Self->bOpening = false;
		Self->Session = IgiUnreal::FromUtf8(Body.GetString("session"));
		TArray<TFunction<void()>> Work = MoveTemp(Self->WhenOpen);
		Self->WhenOpen.Empty();
		Self->WhenOpenFails.Empty();
		for (TFunction<void()>& Item : Work)
		{
			Item();
		}
	};
	Callbacks.OnError = [WeakThis](const FIgiError& Error)
	{
		UIgiNpcDialogueComponent* Self = WeakThis.Get();
		if (Self == nullptr)
		{
			return;
		}
		Self->bOpening = false;
		UIgiSdkSubsystem* Subsystem = Self->Sdk();
		if (Error.Code == TEXT("session_exists") && Subsystem != nullptr)
		{
			// left by an earlier run with this owner key: take it over, the conversation goes on
			igi::MsgValue Body = igi::MsgValue::Map();
			Body.Set("session", igi::MsgValue::Str(IgiUnreal::ToUtf8(Self->SessionName)));
			FIgiCallbacks Adopt;
			Adopt.OnOk = [WeakThis](const igi::MsgValue& Answer)
			{
				if (UIgiNpcDialogueComponent* Again = WeakThis.Get())
				{
					Again->Session = IgiUnreal::FromUtf8(Answer.GetString("session"));
					TArray<TFunction<void()>> Work = MoveTemp(Again->WhenOpen);
					Again->WhenOpen.Empty();
					Again->WhenOpenFails.Empty();
					for (TFunction<void()>& Item : Work)
					{
						Item();
					}
				}
			};
			Adopt.OnError = [WeakThis](const FIgiError& AdoptError)
			{
				if (UIgiNpcDialogueComponent* Again = WeakThis.Get())
				{
					Again->FailQueued(AdoptError);
				}
			};
			Subsystem->Send("adopt_session", MoveTemp(Body), MoveTemp(Adopt));
			return;
		}
		Self->FailQueued(Error);
	};
	Subsystem->OpenSession(SystemPrompt, SessionName, Priority, MoveTemp(Callbacks));
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

void UIgiNpcDialogueComponent::RunWhenOpen(TFunction<void()> Work)
{
	if (!Session.IsEmpty())
	{
		Work();
		return;
	}
	WhenOpen.Add(MoveTemp(Work));
	if (Sdk() != nullptr && Sdk()->GetConnectionState() == EIgiConnectionState::Ready)
	{
		OpenSession();
	}
}

void UIgiNpcDialogueComponent::Say(const FString& Line)
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
	Say(Line, MoveTemp(Callbacks));
}

uint64 UIgiNpcDialogueComponent::Say(const FString& Line, FIgiCallbacks Callbacks)
{
	UIgiSdkSubsystem* Subsystem = Sdk();
	if (Subsystem == nullptr)
	{
		if (Callbacks.OnError)
		{
			FIgiError Error;
			Error.Code = TEXT("unavailable");
			Error.Message = TEXT("no igi-sdk subsystem in this world");
			Callbacks.OnError(Error);
		}
		return 0;
	}
	if (Session.IsEmpty())
	{
		// said before the session opened: sent once it is
		TSharedRef<FIgiCallbacks> Shared = MakeShared<FIgiCallbacks>(MoveTemp(Callbacks));
		TWeakObjectPtr<UIgiNpcDialogueComponent> WeakThis(this);
		WhenOpenFails.Add([Shared](const FIgiError& Error)
		{
			if (Shared->OnError)
			{
				Shared->OnError(Error);
			}
		});
		RunWhenOpen([WeakThis, Line, Shared]()
		{
			if (UIgiNpcDialogueComponent* Self = WeakThis.Get())
			{
				Self->Say(Line, MoveTemp(Shared.Get()));
			}
		});
		return 0;
	}
	CurrentChat = Subsystem->Chat(Session, Line, MaxTokens, MoveTemp(Callbacks));
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
		if (!Session.IsEmpty())
		{
			Subsystem->SetPriority(Session, Priority);
		}
	}
}

void UIgiNpcDialogueComponent::SaveToSaveGame(UIgiSaveGame* SaveGame, const FString& SlotName, FIgiCallbacks Callbacks)
{
	UIgiSdkSubsystem* Subsystem = Sdk();
	if (SaveGame == nullptr || Subsystem == nullptr || Session.IsEmpty())
	{
		if (Callbacks.OnError)
		{
			FIgiError Error;
			Error.Code = TEXT("invalid_state");
			Error.Message = TEXT("no save game, or the NPC has no open session");
			Callbacks.OnError(Error);
		}
		return;
	}
	// save names are [A-Za-z0-9_.-]: anything else in the slot name becomes '_'
	FString SaveName = SlotName + TEXT(".") + Session;
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
	const FString Key = Session;
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
			FIgiError Error;
			Error.Code = TEXT("unknown_save");
			Error.Message = TEXT("the save game holds no conversation of this NPC");
			Callbacks.OnError(Error);
		}
		return;
	}
	// the live session goes first: the restored one takes its name
	const FString Name = *SaveName;
	const FString Target = SessionName.IsEmpty() ? Session : SessionName;
	TWeakObjectPtr<UIgiNpcDialogueComponent> WeakThis(this);
	TSharedRef<FIgiCallbacks> Shared = MakeShared<FIgiCallbacks>(MoveTemp(Callbacks));
	FIgiCallbacks Closed;
	auto Restore = [WeakThis, Name, Target, Shared](const igi::MsgValue&)
	{
		UIgiNpcDialogueComponent* Self = WeakThis.Get();
		UIgiSdkSubsystem* Sdk = Self ? Self->Sdk() : nullptr;
		if (Sdk == nullptr)
		{
			return;
		}
		FIgiCallbacks Restored;
		Restored.OnOk = [WeakThis, Shared](const igi::MsgValue& Body)
		{
			if (UIgiNpcDialogueComponent* Again = WeakThis.Get())
			{
				Again->Session = IgiUnreal::FromUtf8(Body.GetString("session"));
			}
			if (Shared->OnOk)
			{
				Shared->OnOk(Body);
			}
		};
		Restored.OnError = Shared->OnError;
		Self->Session.Empty();
		Sdk->RestoreSession(Name, Target, MoveTemp(Restored));
	};
	Closed.OnOk = Restore;
	Closed.OnError = [Restore](const FIgiError&) { Restore(igi::MsgValue::Map()); };  // none was open
	if (Session.IsEmpty())
	{
		Restore(igi::MsgValue::Map());
	}
	else
	{
		CancelReply();
		Subsystem->CloseSession(Session, MoveTemp(Closed));
	}
}
