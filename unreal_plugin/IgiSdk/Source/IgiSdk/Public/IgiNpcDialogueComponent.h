// An NPC that talks: its persona (system prompt) and a stable session name ("npc.brom"); Say()
// streams the reply token by token. The session opens when the sidecar is ready; one left by an
// earlier run of the game (same owner key) is adopted, so the conversation goes on. The
// component keeps the conversation's recent turns: when the sidecar dies and comes back, the
// NPC is opened again with them (or restored from the save it came from), in a fresh session.
// EndPlay closes the session (bKeepSessionOnEndPlay keeps it, e.g. for level streaming).
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

	// how replies are sampled (temperature, top_p, top_k, min_p, repeat penalty, seed); used when
	// the session opens
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	FIgiSampling Sampling;

	// what Say(Line) sends with every line: stop strings, a grammar or a JSON schema (and
	// MaxTokens when non-zero); SayWithOptions takes its own
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	FIgiChatOptions ChatOptions;

	// false (default): EndPlay closes the session, freeing its slot. true: the session stays
	// open in the sidecar (a level streamed out and back in, a component re-created) and the next
	// component of this SessionName takes it over
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	bool bKeepSessionOnEndPlay = false;

	// protocol 1.3: what the NPC may do besides talking (at most 32), sent with every line whose
	// options declare none of their own. Each call comes through OnAction; answer it with
	// AnswerAction, and once every call of the reply is answered the reply continues from the
	// results (OnToken, then OnDone).
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk|Actions")
	TArray<FIgiAction> Actions;

	// auto (empty: talk or act), none (only talk), required (act), or an action's name
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk|Actions")
	FString ActionChoice;

	// the choice for the reply that continues from the game's results: none (default) makes the
	// NPC talk, so a required choice cannot loop
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk|Actions")
	FString ActionChoiceAfterResults = TEXT("none");

	// false: at most one action per reply
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk|Actions")
	bool bParallelActions = true;

	// an action the NPC called (main thread, in order, before the reply's OnDone)
	UPROPERTY(BlueprintAssignable, Category = "igi-sdk|Actions")
	FIgiActionSignature OnAction;

	// What came of the call CallId ("The player paid 30 gold."); may be called from OnAction
	// itself. False (and OnError unknown_action_call) for a call that is not waiting for an
	// answer.
	UFUNCTION(BlueprintCallable, Category = "igi-sdk|Actions")
	bool AnswerAction(const FString& CallId, const FString& Result);

	// the calls of the last reply that have no answer yet
	UFUNCTION(BlueprintPure, Category = "igi-sdk|Actions")
	TArray<FIgiActionCall> GetUnansweredActions() const;

	// the calls the last reply made (empty when it only talked)
	UFUNCTION(BlueprintPure, Category = "igi-sdk|Actions")
	TArray<FIgiActionCall> GetLastActionCalls() const { return LastCalls; }

	// the turns kept to open the NPC again after a sidecar crash (player lines and replies,
	// at most 256); 0: a crash starts the conversation over
	UPROPERTY(EditAnywhere, BlueprintReadWrite, Category = "igi-sdk")
	int32 RecoveryTurns = 64;

	// every token of the current reply, as it arrives
	UPROPERTY(BlueprintAssignable, Category = "igi-sdk")
	FIgiTokenSignature OnToken;

	UPROPERTY(BlueprintAssignable, Category = "igi-sdk")
	FIgiDoneSignature OnDone;

	UPROPERTY(BlueprintAssignable, Category = "igi-sdk")
	FIgiErrorSignature OnError;

	// the NPC is back after its sidecar was restarted (re-opened with its recent turns, or
	// restored from its save)
	UPROPERTY(BlueprintAssignable, Category = "igi-sdk")
	FIgiSignal OnRecovered;

	// The player's line; the reply comes through OnToken, then OnDone or OnError.
	UFUNCTION(BlueprintCallable, Category = "igi-sdk")
	void Say(const FString& Line);

	// the same with this line's own options (stop strings, grammar, JSON schema, images)
	UFUNCTION(BlueprintCallable, Category = "igi-sdk")
	void SayWithOptions(const FString& Line, const FIgiChatOptions& Options);

	// the same with callbacks of one's own (the async action uses it); returns the request id
	// (0 while the line waits for the session)
	uint64 Say(const FString& Line, FIgiCallbacks Callbacks);
	uint64 Say(const FString& Line, const FIgiChatOptions& Options, FIgiCallbacks Callbacks);

	// stops the current reply (it still ends with OnDone, finish reason "cancelled")
	UFUNCTION(BlueprintCallable, Category = "igi-sdk")
	void CancelReply();

	UFUNCTION(BlueprintCallable, Category = "igi-sdk")
	void SetPriority(int32 NewPriority);

	UFUNCTION(BlueprintPure, Category = "igi-sdk")
	bool IsSessionOpen() const { return !Session.IsEmpty(); }

	// the session's id in the sidecar (SessionName, its restore pair "<SessionName>.b", or the
	// sidecar's own id when SessionName is empty); empty while none is open
	UFUNCTION(BlueprintPure, Category = "igi-sdk")
	FString GetSessionId() const { return Session; }

	// the subsystem's sidecar generation the session lives in (a new one after a restart)
	int32 GetSessionGeneration() const { return SessionGeneration; }
	int32 GetRecoveries() const { return Recoveries; }

	// Writes the conversation as the sidecar save "<SlotName>.<SessionName>" and records it in
	// SaveGame (save the game's slot after OnSaved).
	void SaveToSaveGame(UIgiSaveGame* SaveGame, const FString& SlotName, FIgiCallbacks Callbacks);

	// Replaces the live conversation with the one SaveGame recorded for this NPC. If the restore
	// fails (no such save, another model, a damaged file) the live conversation stays as it was.
	void RestoreFromSaveGame(UIgiSaveGame* SaveGame, FIgiCallbacks Callbacks);

	virtual void BeginPlay() override;
	virtual void EndPlay(const EEndPlayReason::Type Reason) override;

private:
	struct FTurn
	{
		bool bPlayer = false;
		FString Text;
	};

	UFUNCTION()
	void HandleConnectionChanged(EIgiConnectionState State);

	UIgiSdkSubsystem* Sdk() const;
	bool IsStale() const;
	void OpenSession();
	void Adopt();
	void RestoreForRecovery();
	void UseSession(const FString& Id, bool bRecovered);
	void RunWhenOpen(TFunction<void()> Work, TFunction<void(const FIgiError&)> Fail);
	void FailQueued(const FIgiError& Error);
	void Remember(const FString& Line, const FString& Reply);
	void Restore(const FString& Name, const FString& Target, TSharedRef<FIgiCallbacks> Callbacks, bool bRetried);
	uint64 SendLine(const FString& Line, const FIgiChatOptions& Options, TSharedRef<FIgiCallbacks> Callbacks, bool bRetried);
	FIgiChatOptions WithActions(const FIgiChatOptions& Options, const FString& Choice) const;
	void BeginReply();
	void EndReply(const TArray<FIgiActionCall>& Calls);
	void SendAnswersIfComplete();
	bool IsAnswered(const FString& CallId) const;

	FString Session;
	int32 SessionGeneration = 0;
	bool bOpening = false;
	bool bRecovering = false;   // the session died with its sidecar: the next open brings it back
	bool bEndedPlay = false;
	bool bTranscriptComplete = true;  // false once a save replaced the conversation
	FString RecoverySave;       // the save the conversation was last restored from
	int32 Recoveries = 0;
	uint64 CurrentChat = 0;
	TArray<FTurn> Transcript;
	TArray<TFunction<void()>> WhenOpen;  // lines said before the session opened
	TArray<TFunction<void(const FIgiError&)>> WhenOpenFails;
	// actions: the calls of the reply under way, those of the last reply, the answers so far
	TArray<FIgiActionCall> CurrentCalls;
	TArray<FIgiActionCall> LastCalls;
	TArray<FIgiActionCall> Unanswered;
	TArray<FIgiActionResult> Answers;
	FIgiChatOptions LastLineOptions;  // the options of the line the calls answer (without actions)
};
