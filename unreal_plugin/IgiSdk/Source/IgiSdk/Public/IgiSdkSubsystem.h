// One sidecar connection per game instance, one sidecar per process. The subsystem uses the
// process's sidecar (FIgiSidecarHost: started with the first game instance, shared by PIE's
// players, kept for the next PIE session), connects its own client (its own sessions), drains
// its events on the game thread every tick, reports frames to the VRAM arbiter, and says goodbye
// when the game instance ends (PIE exit included). When the sidecar dies, the requests in flight
// end at once with a typed error, the sidecar is started again with back-off, the client
// reconnects there, and OnConnectionChanged(Ready) with a new GetSidecarGeneration() tells the
// NPC components to open their conversations again.
#pragma once

#include <memory>
#include <vector>

#include "CoreMinimal.h"
#include "Containers/Ticker.h"
#include "IgiClient.h"
#include "IgiTypes.h"
#include "Subsystems/GameInstanceSubsystem.h"
#include "IgiSdkSubsystem.generated.h"

UCLASS(Config = Game)
class IGISDK_API UIgiSdkSubsystem : public UGameInstanceSubsystem
{
	GENERATED_BODY()

public:
	virtual void Initialize(FSubsystemCollectionBase& Collection) override;
	virtual void Deinitialize() override;

	// ---- settings ([/Script/IgiSdk.IgiSdkSubsystem] in DefaultGame.ini) ----------------------

	// the sidecar executable, relative to the project directory (packaged: next to the game)
	UPROPERTY(Config)
	FString SidecarExecutable = TEXT("Binaries/ThirdParty/IgiSdk/igi-sdk");

	// optional: --model-dir and --model for the sidecar (default: its embedded model)
	UPROPERTY(Config)
	FString ModelDir;

	UPROPERTY(Config)
	FString Model;

	// non-empty: connect to this sidecar instead of starting one (a developer's own)
	UPROPERTY(Config)
	FString Endpoint;

	// frame reports pace inference against this frame time (0: never slow the model)
	UPROPERTY(Config)
	float TargetFrameTimeMs = 0.f;

	UPROPERTY(Config)
	bool bReportFrames = true;

	UPROPERTY(Config)
	float LeaseSeconds = 15.f;

	// more arguments for `igi-sdk serve` (e.g. --ctx 4096 --max-sessions 12)
	UPROPERTY(Config)
	FString ExtraArguments;

	// a dedicated server starts no sidecar (and connects to none) unless this is set
	UPROPERTY(Config)
	bool bStartOnDedicatedServer = false;

	// a sidecar that exits is started again after RestartMinSeconds, doubling up to
	// RestartMaxSeconds, at most MaxRestarts crashes in a row (a run of 60 s resets the count)
	UPROPERTY(Config)
	bool bRestartOnCrash = true;

	UPROPERTY(Config)
	float RestartMinSeconds = 1.f;

	UPROPERTY(Config)
	float RestartMaxSeconds = 30.f;

	UPROPERTY(Config)
	int32 MaxRestarts = 5;

	// ---- Blueprint API ------------------------------------------------------------------------

	UFUNCTION(BlueprintPure, Category = "igi-sdk")
	EIgiConnectionState GetConnectionState() const;

	UFUNCTION(BlueprintPure, Category = "igi-sdk")
	FString GetModelName() const;

	// which sidecar the client talks to: +1 each time it reaches a new one (a restart after a
	// crash); sessions opened under an earlier generation are gone
	UFUNCTION(BlueprintPure, Category = "igi-sdk")
	int32 GetSidecarGeneration() const { return static_cast<int32>(ConnectedGeneration); }

	// the process's sidecar died and is being started again: lines wait for it
	bool IsSidecarRestarting() const { return bSidecarDown; }

	// how many times this process's sidecar was started again after it exited
	UFUNCTION(BlueprintPure, Category = "igi-sdk")
	int32 GetSidecarRestarts() const;

	// the NPC the player faces decodes first (-100..100), a running reply included
	UFUNCTION(BlueprintCallable, Category = "igi-sdk")
	void SetPriority(const FString& Session, int32 Priority);

	// The game's CPU use, sent with every frame report from now on: BusyThreads, the CPU threads
	// the game keeps busy now (its game, render and worker threads that have work; not the
	// machine's core count, which says nothing of the game), and CpuShare, the share of the
	// machine's CPU time it used over its last frames (0..1). Either -1: not reported. The
	// model's CPU threads keep off the cores they add up to. Beyond the protocol's ranges
	// (BusyThreads 0..4096, CpuShare 0..1) they are clamped. The sidecar keeps the last figures it
	// got: report 0 when the game goes idle, not -1.
	UFUNCTION(BlueprintCallable, Category = "igi-sdk")
	void SetGameCpuUse(int32 BusyThreads, float CpuShare = -1.f);

	UPROPERTY(BlueprintAssignable, Category = "igi-sdk")
	FIgiConnectionSignature OnConnectionChanged;

	// the last reason the sidecar could not be used (wrong instance, no executable, ...)
	UPROPERTY(BlueprintReadOnly, Category = "igi-sdk")
	FIgiError LastError;

	// ---- C++ API: every call returns the request's id ------------------------------------------

	uint64 Send(const char* Type, igi::MsgValue Body, FIgiCallbacks Callbacks);
	uint64 OpenSession(const FString& SystemPrompt, const FString& Name, int32 Priority, FIgiCallbacks Callbacks);
	uint64 Chat(const FString& Session, const FString& Text, int32 MaxTokens, FIgiCallbacks Callbacks);
	// the same with a line's options (stop strings, grammar or JSON schema, images; MaxTokens 0:
	// DefaultMaxTokens)
	uint64 Chat(const FString& Session, const FString& Text, const FIgiChatOptions& Options, int32 DefaultMaxTokens, FIgiCallbacks Callbacks);
	void Cancel(uint64 ChatId);
	uint64 SaveSession(const FString& Session, const FString& SaveName, FIgiCallbacks Callbacks);
	uint64 RestoreSession(const FString& SaveName, const FString& Session, FIgiCallbacks Callbacks);
	uint64 CloseSession(const FString& Session, FIgiCallbacks Callbacks);
	// before a large allocation (a level load): answered once that much VRAM is free
	uint64 ReserveVram(int64 Bytes, int32 DeadlineFrames, FIgiCallbacks Callbacks);
	// The call to make before loading a level: asks the sidecar for Bytes of VRAM and answers
	// Then exactly once, on the game thread: when the VRAM is free (Granted), or when
	// DeadlineFrames game frames have passed (DeadlinePassed), or at once when there is no
	// sidecar to ask. Load the level in Then, whatever the outcome.
	void BeginLevelLoad(int64 Bytes, int32 DeadlineFrames, TFunction<void(const FIgiLevelLoadResult&)> Then);
	// Forgets the callbacks of a request (their owner is gone); its answer is dropped.
	void Forget(uint64 Id);

	// The game's own VRAM use in bytes for frame reports, or -1 (not sent: the arbiter already
	// reads the whole device through the driver). Override where the engine knows it.
	virtual int64 QueryVramUsedBytes() const { return -1; }

	igi::Client* GetClient() const { return Client.get(); }

	// the open_session / chat body fields of the plugin's structs (empty fields left out)
	static igi::MsgValue SamplingBody(const FIgiSampling& Sampling);
	static igi::MsgValue ChatExtra(const FIgiChatOptions& Options);
	// a line with actions (protocol 1.3) as the core client takes it
	static igi::ChatOptions ToolOptions(const FIgiChatOptions& Options, int32 MaxTokens);

private:
	struct FLevelLoad
	{
		uint64 Id = 0;
		int32 FramesLeft = 0;
		int32 FramesWaited = 0;
		TSharedPtr<TFunction<void(const FIgiLevelLoadResult&)>> Then;
	};

	bool Tick(float DeltaSeconds);
	void Dispatch(igi::Event& Event);
	void FollowHost();
	void FailPending(const FIgiError& Error);
	void TickLevelLoads();
	void FinishLevelLoad(uint64 Id, EIgiLevelLoadOutcome Outcome, const FIgiError& Error);
	void BroadcastState(EIgiConnectionState State);
	FString LoadOrCreateOwnerKey() const;

	std::unique_ptr<igi::Client> Client;
	// shared: a callback may send requests (Pending grows) while it runs
	TMap<uint64, TSharedPtr<FIgiCallbacks>> Pending;
	TArray<FLevelLoad> LevelLoads;
	std::vector<igi::Event> Events;  // reused every tick
	FTSTicker::FDelegateHandle TickHandle;
	bool bStarted = false;
	int32 HostSlot = 0;          // 0: not a user of the process's sidecar (Endpoint, or none)
	uint32 SeenGeneration = 0;   // the host's generation the client was pointed at
	uint32 SeenDeaths = 0;
	uint32 ConnectedGeneration = 0;  // the generation of the last Ready
	std::string ConnectedInstance;   // Endpoint: the instance of the last Ready
	bool bSidecarDown = false;   // died, not yet back: the state reads Unavailable
	bool bReportedFailure = false;
	EIgiConnectionState LastBroadcast = EIgiConnectionState::Connecting;
	// the client's state as its events were dispatched: what the game thread has been told, so a
	// Ready read here always comes with GetSidecarGeneration() of that sidecar
	EIgiConnectionState ClientState = EIgiConnectionState::Connecting;
	int64 FrameNumber = 0;
	int32 GameBusyThreads = -1;  // SetGameCpuUse's; -1: not reported
	float GameCpuShare = -1.f;
};
