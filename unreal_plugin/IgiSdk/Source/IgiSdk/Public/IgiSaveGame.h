// The NPC conversations of a save game: the sidecar keeps each conversation (text and KV cache)
// as a named save in its save folder; the game's save holds the names. Derive the game's own
// USaveGame from this class, or keep one of these next to it in the same slot.
#pragma once

#include "CoreMinimal.h"
#include "GameFramework/SaveGame.h"
#include "IgiSaveGame.generated.h"

UCLASS(BlueprintType)
class IGISDK_API UIgiSaveGame : public USaveGame
{
	GENERATED_BODY()

public:
	// NPC session name ("npc.brom") -> the sidecar's save name for it in this slot
	UPROPERTY(BlueprintReadOnly, SaveGame, Category = "igi-sdk")
	TMap<FString, FString> NpcSaves;
};
