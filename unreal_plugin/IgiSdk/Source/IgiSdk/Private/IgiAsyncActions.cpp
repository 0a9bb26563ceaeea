#include "IgiAsyncActions.h"

#include "Engine/Engine.h"
#include "Engine/GameInstance.h"
#include "Engine/World.h"
#include "IgiNpcDialogueComponent.h"
#include "IgiSaveGame.h"
#include "IgiSdkSubsystem.h"

namespace
{
	FIgiError MakeError(const TCHAR* Code, const TCHAR* Message)
	{
		FIgiError Error;
		Error.Code = Code;
		Error.Message = Message;
		return Error;
	}

	UIgiSdkSubsystem* SdkOf(UObject* Context)
	{
		UWorld* World = (Context != nullptr && GEngine != nullptr)
			? GEngine->GetWorldFromContextObject(Context, EGetWorldErrorMode::ReturnNull) : nullptr;
		UGameInstance* GameInstance = World ? World->GetGameInstance() : nullptr;
		return GameInstance ? GameInstance->GetSubsystem<UIgiSdkSubsystem>() : nullptr;
	}
}

// ---- NPC Say --------------------------------------------------------------------------------

UIgiSayAsyncAction* UIgiSayAsyncAction::NpcSay(UIgiNpcDialogueComponent* Npc, const FString& Line)
{
	UIgiSayAsyncAction* Action = NewObject<UIgiSayAsyncAction>();
	Action->Npc = Npc;
	Action->Line = Line;
	if (Npc != nullptr)
	{
		// kept alive by the game instance until the reply ends
		Action->RegisterWithGameInstance(Npc);
	}
	return Action;
}

UIgiSayAsyncAction* UIgiSayAsyncAction::NpcSayWithOptions(UIgiNpcDialogueComponent* Npc, const FString& Line, const FIgiChatOptions& Options)
{
	UIgiSayAsyncAction* Action = NpcSay(Npc, Line);
	Action->Options = Options;
	Action->bHasOptions = true;
	return Action;
}

void UIgiSayAsyncAction::Activate()
{
	UIgiNpcDialogueComponent* Target = Npc.Get();
	if (Target == nullptr)
	{
		OnError.Broadcast(MakeError(TEXT("invalid_argument"), TEXT("NPC Say needs an NPC dialogue component")));
		SetReadyToDestroy();
		return;
	}
	TWeakObjectPtr<UIgiSayAsyncAction> WeakThis(this);
	FIgiCallbacks Callbacks;
	// one exec of the On Token pin per token
	Callbacks.OnToken = [WeakThis](const FString& Token)
	{
		if (UIgiSayAsyncAction* Self = WeakThis.Get())
		{
			Self->OnToken.Broadcast(Token);
		}
	};
	Callbacks.OnDone = [WeakThis](const FString& Text, const FString& FinishReason)
	{
		if (UIgiSayAsyncAction* Self = WeakThis.Get())
		{
			Self->OnDone.Broadcast(Text, FinishReason);
			Self->SetReadyToDestroy();
		}
	};
	Callbacks.OnError = [WeakThis](const FIgiError& Error)
	{
		if (UIgiSayAsyncAction* Self = WeakThis.Get())
		{
			Self->OnError.Broadcast(Error);
			Self->SetReadyToDestroy();
		}
	};
	if (bHasOptions)
	{
		Target->Say(Line, Options, MoveTemp(Callbacks));
	}
	else
	{
		Target->Say(Line, MoveTemp(Callbacks));
	}
}

// ---- Begin Level Load -----------------------------------------------------------------------

UIgiBeginLevelLoadAsyncAction* UIgiBeginLevelLoadAsyncAction::BeginLevelLoad(UObject* WorldContextObject, int64 Bytes, int32 DeadlineFrames)
{
	UIgiBeginLevelLoadAsyncAction* Action = NewObject<UIgiBeginLevelLoadAsyncAction>();
	Action->WorldContext = WorldContextObject;
	Action->Bytes = Bytes;
	Action->DeadlineFrames = DeadlineFrames;
	if (WorldContextObject != nullptr)
	{
		Action->RegisterWithGameInstance(WorldContextObject);
	}
	return Action;
}

void UIgiBeginLevelLoadAsyncAction::Activate()
{
	UIgiSdkSubsystem* Sdk = SdkOf(WorldContext.Get());
	if (Sdk == nullptr)
	{
		// no sidecar to ask: the level loads now
		FIgiLevelLoadResult Result;
		Result.Outcome = EIgiLevelLoadOutcome::NoSidecar;
		Result.Error = MakeError(TEXT("unavailable"), TEXT("no igi-sdk subsystem in this world"));
		OnReady.Broadcast(Result);
		SetReadyToDestroy();
		return;
	}
	TWeakObjectPtr<UIgiBeginLevelLoadAsyncAction> WeakThis(this);
	Sdk->BeginLevelLoad(Bytes, DeadlineFrames, [WeakThis](const FIgiLevelLoadResult& Result)
	{
		if (UIgiBeginLevelLoadAsyncAction* Self = WeakThis.Get())
		{
			Self->OnReady.Broadcast(Result);
			Self->SetReadyToDestroy();
		}
	});
}

// ---- Reserve VRAM ---------------------------------------------------------------------------

UIgiReserveVramAsyncAction* UIgiReserveVramAsyncAction::ReserveVram(UObject* WorldContextObject, int64 Bytes, int32 DeadlineFrames)
{
	UIgiReserveVramAsyncAction* Action = NewObject<UIgiReserveVramAsyncAction>();
	Action->WorldContext = WorldContextObject;
	Action->Bytes = Bytes;
	Action->DeadlineFrames = DeadlineFrames;
	if (WorldContextObject != nullptr)
	{
		Action->RegisterWithGameInstance(WorldContextObject);
	}
	return Action;
}

void UIgiReserveVramAsyncAction::Activate()
{
	UIgiSdkSubsystem* Sdk = SdkOf(WorldContext.Get());
	if (Sdk == nullptr)
	{
		OnError.Broadcast(MakeError(TEXT("unavailable"), TEXT("no igi-sdk subsystem in this world")));
		SetReadyToDestroy();
		return;
	}
	TWeakObjectPtr<UIgiReserveVramAsyncAction> WeakThis(this);
	FIgiCallbacks Callbacks;
	Callbacks.OnOk = [WeakThis](const igi::MsgValue&)
	{
		if (UIgiReserveVramAsyncAction* Self = WeakThis.Get())
		{
			Self->OnGranted.Broadcast();
			Self->SetReadyToDestroy();
		}
	};
	Callbacks.OnError = [WeakThis](const FIgiError& Error)
	{
		if (UIgiReserveVramAsyncAction* Self = WeakThis.Get())
		{
			Self->OnError.Broadcast(Error);
			Self->SetReadyToDestroy();
		}
	};
	Sdk->ReserveVram(Bytes, DeadlineFrames, MoveTemp(Callbacks));
}

// ---- Save / Restore NPC ---------------------------------------------------------------------

UIgiSaveNpcAsyncAction* UIgiSaveNpcAsyncAction::SaveNpc(UIgiNpcDialogueComponent* Npc, UIgiSaveGame* SaveGame, const FString& SlotName)
{
	UIgiSaveNpcAsyncAction* Action = NewObject<UIgiSaveNpcAsyncAction>();
	Action->Npc = Npc;
	Action->SaveGame = SaveGame;
	Action->SlotName = SlotName;
	if (Npc != nullptr)
	{
		Action->RegisterWithGameInstance(Npc);
	}
	return Action;
}

UIgiSaveNpcAsyncAction* UIgiSaveNpcAsyncAction::RestoreNpc(UIgiNpcDialogueComponent* Npc, UIgiSaveGame* SaveGame)
{
	UIgiSaveNpcAsyncAction* Action = SaveNpc(Npc, SaveGame, FString());
	Action->bRestore = true;
	return Action;
}

void UIgiSaveNpcAsyncAction::Activate()
{
	UIgiNpcDialogueComponent* Target = Npc.Get();
	if (Target == nullptr)
	{
		OnError.Broadcast(MakeError(TEXT("invalid_argument"), TEXT("needs an NPC dialogue component")));
		SetReadyToDestroy();
		return;
	}
	TWeakObjectPtr<UIgiSaveNpcAsyncAction> WeakThis(this);
	FIgiCallbacks Callbacks;
	Callbacks.OnOk = [WeakThis](const igi::MsgValue&)
	{
		if (UIgiSaveNpcAsyncAction* Self = WeakThis.Get())
		{
			Self->OnDone.Broadcast();
			Self->SetReadyToDestroy();
		}
	};
	Callbacks.OnError = [WeakThis](const FIgiError& Error)
	{
		if (UIgiSaveNpcAsyncAction* Self = WeakThis.Get())
		{
			Self->OnError.Broadcast(Error);
			Self->SetReadyToDestroy();
		}
	};
	if (bRestore)
	{
		Target->RestoreFromSaveGame(SaveGame.Get(), MoveTemp(Callbacks));
	}
	else
	{
		Target->SaveToSaveGame(SaveGame.Get(), SlotName, MoveTemp(Callbacks));
	}
}
