// An NPC that talks: its persona (system prompt) and a stable session name ("npc.brom"); Say()
// streams the reply token by token. The session opens when the sidecar is ready; one left by an
// earlier run of the game (same owner key) is adopted, so the conversation goes on.
#pragma once

#include "Components/ActorComponent.h"
#include "CoreMinimal.h"
#include "IgiTypes.h"
#include "IgiNpcDialogueComponent.generated.h"

class UIgiSaveGame;
class UIgiSdkSubsystem;

UCLASS(ClassGroup = (AI), meta = (BlueprintSpawnableComponent))
class IGISDK_API UIgiNpcDialogueComponent : public UActorComponent
{
	GENERATED_BODY()

public:
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk", meta = (MultiLine = true))
	FString SystemPrompt;

	// the session's name in the sidecar: [A-Za-z0-9_.-], stable across runs ("npc.brom")
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	FString SessionName;

	// higher decodes first (-100..100)
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	int32 Priority = 0;

	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	int32 MaxTokens = 128;

	// every token of the current reply, as it arrives
	UPROPERTY(BlueprintAssignable, Category = "igi-sdk")
	FIgiTokenSignature OnToken;

	UPROPERTY(BlueprintAssignable, Category = "igi-sdk")
	FIgiDoneSignature OnDone;

	UPROPERTY(BlueprintAssignable, Category = "igi-sdk")
	FIgiErrorSignature OnError;

	// The player's line; the reply comes through OnToken, then OnDone or OnError.
	UFUNCTION(BlueprintCallable, Category = "igi-sdk")
	void Say(const FString& Line);

	// the same with callbacks of one's own (the async action uses it); returns the request id
	uint64 Say(const FString& Line, FIgiCallbacks Callbacks);

	// stops the current reply (it still ends with OnDone, finish reason "cancelled")
	UFUNCTION(BlueprintCallable, Category = "igi-sdk")
	void CancelReply();

	UFUNCTION(BlueprintCallable, Category = "igi-sdk")
	void SetPriority(int32 NewPriority);

	UFUNCTION(BlueprintPure, Category = "igi-sdk")
	bool IsSessionOpen() const { return !Session.IsEmpty(); }

	// Writes the conversation as the sidecar save "<SlotName>.<SessionName>" and records it in
	// SaveGame (save the game's slot after OnSaved).
	void SaveToSaveGame(UIgiSaveGame* SaveGame, const FString& SlotName, FIgiCallbacks Callbacks);

	// Replaces the live conversation with the one SaveGame recorded for this NPC.
	void RestoreFromSaveGame(UIgiSaveGame* SaveGame, FIgiCallbacks Callbacks);

protected:
	virtual void BeginPlay() override;
	virtual void EndPlay(const EEndPlayReason::Type Reason) override;

private:
	UFUNCTION()
	void HandleConnectionChanged(EIgiConnectionState State);

	UIgiSdkSubsystem* Sdk() const;
	void OpenSession();
	void RunWhenOpen(TFunction<void()> Work);
	void FailQueued(const FIgiError& Error);

	FString Session;
	bool bOpening = false;
	uint64 CurrentChat = 0;
	TArray<TFunction<void()>> WhenOpen;  // lines said before the session opened
	TArray<TFunction<void(const FIgiError&)>> WhenOpenFails;
};
