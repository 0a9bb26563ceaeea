// The one sidecar of this process. Every game instance (two PIE players, a standalone game) is a
// client of it: it is started once with one launch token, watched, and started again with
// back-off when it exits, so a crash costs the NPCs a few seconds, not the rest of the session.
// The module owns it; game-instance subsystems hold it while they live (AddUser / RemoveUser).
// Game thread only.
#pragma once

#include "CoreMinimal.h"
#include "HAL/PlatformProcess.h"
#include "IgiTypes.h"

// Delays between restarts: doubling from MinSeconds up to MaxSeconds, back to the minimum once a
// start has stayed up for StableSeconds (a sidecar that crashes at start costs one attempt per
// half minute, never a busy loop).
struct FIgiRestartBackoff
{
	double MinSeconds = 1.0;
	double MaxSeconds = 30.0;
	double StableSeconds = 60.0;
	int32 Failures = 0;

	// the wait before the next start, counting this failure
	double NextDelay()
	{
		const double Delay = MinSeconds * static_cast<double>(1u << FMath::Min(Failures, 16));
		++Failures;
		return FMath::Min(Delay, MaxSeconds);
	}

	// a sidecar ended after running UpSeconds
	void Ended(double UpSeconds)
	{
		if (UpSeconds >= StableSeconds)
		{
			Failures = 0;
		}
	}
};

struct FIgiSidecarSettings
{
	FString Executable;      // full path
	FString Arguments;       // --model-dir, --model and the game's own additions
	double RestartMinSeconds = 1.0;
	double RestartMaxSeconds = 30.0;
	int32 MaxRestarts = 5;   // crashes in a row (a run that stays up 60 s resets the count)
	double EndpointWaitSeconds = 120.0;  // the sidecar binds before it loads its model
};

enum class EIgiSidecarState : uint8
{
	Idle,        // nobody asked for it yet
	Launching,   // started, its endpoint not yet reported
	Running,     // endpoint known (Generation counts these)
	Restarting,  // exited; started again at RestartAt
	Failed       // missing, refused its arguments, or crashed MaxRestarts times in a row
};

class FIgiSidecarHost
{
public:
	static FIgiSidecarHost& Get();

	// A game instance begins using the sidecar (the first one starts it with its settings).
	// Returns its slot, 1 for the first live user: PIE's second player gets 2.
	int32 AddUser(const FIgiSidecarSettings& Settings);
	void RemoveUser(int32 Slot);
	int32 NumUsers() const { return Users.Num(); }

	// Watches the process and the endpoint file; starts the sidecar again when it is due. Every
	// user calls it from its tick; the work runs at most every WatchEverySeconds.
	void Tick();

	EIgiSidecarState GetState() const { return State; }
	const FString& GetEndpoint() const { return Endpoint; }
	const FString& GetInstance() const { return Instance; }
	const FString& GetToken() const { return Token; }
	// +1 each time a (new) sidecar reports its endpoint: a user that saw another one reconnects
	uint32 GetGeneration() const { return Generation; }
	// +1 each time the sidecar was found dead: requests in flight there will never be answered
	uint32 GetDeaths() const { return Deaths; }
	int32 GetRestarts() const { return Restarts; }
	uint32 GetPid() const { return Pid; }
	double GetLastLaunchTime() const { return LaunchedAt; }
	double GetLastDeathTime() const { return DiedAt; }
	const FIgiError& GetLastError() const { return LastError; }

	// The module's end (the process's): the handle is closed; the sidecar ends with the game
	// process it watches (--game-pid).
	void Shutdown();

private:
	bool Launch();
	void PollEndpointFile(double Now);
	void OnExited(double Now, int32 ExitCode);
	void Fail(const TCHAR* Code, const FString& Message);

	FIgiSidecarSettings Settings;
	FIgiRestartBackoff Backoff;
	TArray<int32> Users;
	EIgiSidecarState State = EIgiSidecarState::Idle;
	FProcHandle Handle;
	FString Endpoint;
	FString Instance;
	FString Token;  // one per process: every user's client carries it, across restarts
	FString EndpointFile;
	FIgiError LastError;
	uint32 Generation = 0;
	uint32 Deaths = 0;
	uint32 Pid = 0;
	int32 Restarts = 0;
	int32 CrashesInARow = 0;
	double LaunchedAt = 0.0;
	double DiedAt = 0.0;
	double RestartAt = 0.0;
	double NextWatchAt = 0.0;
};
