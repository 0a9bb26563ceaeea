// One sidecar connection per game instance. The subsystem starts the sidecar bundled with the
// game (or finds the one it started earlier in this process, e.g. an earlier PIE session),
// connects the client, drains its events on the game thread every tick, reports frames to the
// VRAM arbiter, and says goodbye when the game instance ends (PIE exit included).
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

	// ---- Blueprint API ------------------------------------------------------------------------

	UFUNCTION(BlueprintPure, Category = "igi-sdk")
	EIgiConnectionState GetConnectionState() const;

	UFUNCTION(BlueprintPure, Category = "igi-sdk")
	FString GetModelName() const;

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
	void Cancel(uint64 ChatId);
	uint64 SaveSession(const FString& Session, const FString& SaveName, FIgiCallbacks Callbacks);
	uint64 RestoreSession(const FString& SaveName, const FString& Session, FIgiCallbacks Callbacks);
	uint64 CloseSession(const FString& Session, FIgiCallbacks Callbacks);
	// before a large allocation (a level load): answered once that much VRAM is free
	uint64 ReserveVram(int64 Bytes, int32 DeadlineFrames, FIgiCallbacks Callbacks);
	// Forgets the callbacks of a request (their owner is gone); its answer is dropped.
	void Forget(uint64 Id);

	// The game's own VRAM use in bytes for frame reports, or -1 (not sent: the arbiter already
	// reads the whole device through the driver). Override where the engine knows it.
	virtual int64 QueryVramUsedBytes() const { return -1; }

	igi::Client* GetClient() const { return Client.get(); }

private:
	bool Tick(float DeltaSeconds);
	void Dispatch(igi::Event& Event);
	bool LaunchSidecar();
	void PollEndpointFile();
	FString LoadOrCreateOwnerKey() const;

	std::unique_ptr<igi::Client> Client;
	// shared: a callback may send requests (Pending grows) while it runs
	TMap<uint64, TSharedPtr<FIgiCallbacks>> Pending;
	std::vector<igi::Event> Events;  // reused every tick
	FTSTicker::FDelegateHandle TickHandle;
	bool bStarted = false;
	bool bWaitingForEndpoint = false;
	double WaitingSince = 0.0;
	int64 FrameNumber = 0;
	int32 GameBusyThreads = -1;  // SetGameCpuUse's; -1: not reported
	float GameCpuShare = -1.f;
};
