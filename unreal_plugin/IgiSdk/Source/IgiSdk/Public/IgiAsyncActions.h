// Blueprint async nodes. "NPC Say" fires its On Token pin once per token as the reply streams,
// then On Done or On Error exactly once; "NPC Say With Options" takes the line's stop strings,
// grammar or JSON schema, images and token limit. "Begin Level Load" is the call before loading
// a level: its Ready pin fires once, when the sidecar has made room or when the frame deadline
// has passed (the result says which). "Reserve VRAM" is the bare request. "Save NPC" /
// "Restore NPC" keep conversations with a save game.
#pragma once

#include "CoreMinimal.h"
#include "IgiTypes.h"
#include "Kismet/BlueprintAsyncActionBase.h"
#include "IgiAsyncActions.generated.h"

class UIgiNpcDialogueComponent;
class UIgiSaveGame;

UCLASS()
class IGISDK_API UIgiSayAsyncAction : public UBlueprintAsyncActionBase
{
	GENERATED_BODY()

public:
	UPROPERTY(BlueprintAssignable)
	FIgiTokenSignature OnToken;

	UPROPERTY(BlueprintAssignable)
	FIgiDoneSignature OnDone;

	UPROPERTY(BlueprintAssignable)
	FIgiErrorSignature OnError;

	UFUNCTION(BlueprintCallable, Category = "igi-sdk", meta = (BlueprintInternalUseOnly = "true", DisplayName = "NPC Say"))
	static UIgiSayAsyncAction* NpcSay(UIgiNpcDialogueComponent* Npc, const FString& Line);

	UFUNCTION(BlueprintCallable, Category = "igi-sdk", meta = (BlueprintInternalUseOnly = "true", DisplayName = "NPC Say With Options"))
	static UIgiSayAsyncAction* NpcSayWithOptions(UIgiNpcDialogueComponent* Npc, const FString& Line, const FIgiChatOptions& Options);

	virtual void Activate() override;

private:
	TWeakObjectPtr<UIgiNpcDialogueComponent> Npc;
	FString Line;
	FIgiChatOptions Options;
	bool bHasOptions = false;
};

UCLASS()
class IGISDK_API UIgiBeginLevelLoadAsyncAction : public UBlueprintAsyncActionBase
{
	GENERATED_BODY()

public:
	// load the level now: granted, deadline passed, refused or no sidecar (Result.Outcome)
	UPROPERTY(BlueprintAssignable)
	FIgiLevelLoadSignature OnReady;

	// Bytes: the VRAM the level will allocate; DeadlineFrames: the most game frames to wait
	UFUNCTION(BlueprintCallable, Category = "igi-sdk", meta = (BlueprintInternalUseOnly = "true", WorldContext = "WorldContextObject", DisplayName = "Begin Level Load"))
	static UIgiBeginLevelLoadAsyncAction* BeginLevelLoad(UObject* WorldContextObject, int64 Bytes, int32 DeadlineFrames = 30);

	virtual void Activate() override;

private:
	TWeakObjectPtr<UObject> WorldContext;
	int64 Bytes = 0;
	int32 DeadlineFrames = 0;
};

UCLASS()
class IGISDK_API UIgiReserveVramAsyncAction : public UBlueprintAsyncActionBase
{
	GENERATED_BODY()

public:
	// the VRAM is free: allocate now
	UPROPERTY(BlueprintAssignable)
	FIgiSignal OnGranted;

	// cannot_free, deadline_missed (retryable), forbidden, unavailable ...
	UPROPERTY(BlueprintAssignable)
	FIgiErrorSignature OnError;

	UFUNCTION(BlueprintCallable, Category = "igi-sdk", meta = (BlueprintInternalUseOnly = "true", WorldContext = "WorldContextObject", DisplayName = "Reserve VRAM"))
	static UIgiReserveVramAsyncAction* ReserveVram(UObject* WorldContextObject, int64 Bytes, int32 DeadlineFrames = 120);

	virtual void Activate() override;

private:
	TWeakObjectPtr<UObject> WorldContext;
	int64 Bytes = 0;
	int32 DeadlineFrames = 0;
};

UCLASS()
class IGISDK_API UIgiSaveNpcAsyncAction : public UBlueprintAsyncActionBase
{
	GENERATED_BODY()

public:
	UPROPERTY(BlueprintAssignable)
	FIgiSignal OnDone;

	UPROPERTY(BlueprintAssignable)
	FIgiErrorSignature OnError;

	// writes the NPC's conversation and records it in SaveGame (then save the slot as usual)
	UFUNCTION(BlueprintCallable, Category = "igi-sdk", meta = (BlueprintInternalUseOnly = "true", DisplayName = "Save NPC"))
	static UIgiSaveNpcAsyncAction* SaveNpc(UIgiNpcDialogueComponent* Npc, UIgiSaveGame* SaveGame, const FString& SlotName);

	// replaces the NPC's conversation with the one SaveGame recorded
	UFUNCTION(BlueprintCallable, Category = "igi-sdk", meta = (BlueprintInternalUseOnly = "true", DisplayName = "Restore NPC"))
	static UIgiSaveNpcAsyncAction* RestoreNpc(UIgiNpcDialogueComponent* Npc, UIgiSaveGame* SaveGame);

	virtual void Activate() override;

private:
	TWeakObjectPtr<UIgiNpcDialogueComponent> Npc;
	TWeakObjectPtr<UIgiSaveGame> SaveGame;
	FString SlotName;
	bool bRestore = false;
};
