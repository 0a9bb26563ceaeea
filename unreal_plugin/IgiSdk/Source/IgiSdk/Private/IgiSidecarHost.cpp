#include "IgiSidecarHost.h"

#include "HAL/FileManager.h"
#include "HAL/PlatformMisc.h"
#include "Misc/FileHelper.h"
#include "Misc/Guid.h"
#include "Misc/Paths.h"

DEFINE_LOG_CATEGORY_STATIC(LogIgiSidecar, Log, All);

namespace
{
	constexpr double WatchEverySeconds = 0.05;
	// igi-sdk's exit status for arguments it refuses (no model, a bad instance): starting it
	// again would fail the same way
	constexpr int32 ConfigurationExitCode = 2;

	FString NewSecret()
	{
		// 64 hex digits: a launch token of [A-Za-z0-9]
		return FGuid::NewGuid().ToString(EGuidFormats::Digits) + FGuid::NewGuid().ToString(EGuidFormats::Digits);
	}
}

FIgiSidecarHost& FIgiSidecarHost::Get()
{
	// outlives every game instance: the next PIE session finds the sidecar running
	static FIgiSidecarHost Host;
	return Host;
}

int32 FIgiSidecarHost::AddUser(const FIgiSidecarSettings& InSettings)
{
	int32 Slot = 1;
	while (Users.Contains(Slot))
	{
		++Slot;
	}
	Users.Add(Slot);
	if (State == EIgiSidecarState::Idle || State == EIgiSidecarState::Failed)
	{
		// the first user's settings start it (PIE players share one project's settings); a
		// failed one is tried again when a new game instance asks
		Settings = InSettings;
		Backoff.MinSeconds = FMath::Max(0.0, Settings.RestartMinSeconds);
		Backoff.MaxSeconds = FMath::Max(Backoff.MinSeconds, Settings.RestartMaxSeconds);
		Backoff.Failures = 0;
		CrashesInARow = 0;
		if (Token.IsEmpty())
		{
			Token = NewSecret();
		}
		Launch();
	}
	return Slot;
}

void FIgiSidecarHost::RemoveUser(int32 Slot)
{
	// the sidecar stays up without users: the next PIE session reuses it, and it exits with
	// this process
	Users.Remove(Slot);
}

void FIgiSidecarHost::Shutdown()
{
	if (Handle.IsValid())
	{
		FPlatformProcess::CloseProc(Handle);
	}
	Handle = FProcHandle();
	State = EIgiSidecarState::Idle;
	Users.Empty();
}

bool FIgiSidecarHost::Launch()
{
	const double Now = FPlatformTime::Seconds();
	LaunchedAt = Now;
	Endpoint.Empty();
	FString Path = Settings.Executable;
#if PLATFORM_WINDOWS
	if (!Path.EndsWith(TEXT(".exe")))
	{
		Path += TEXT(".exe");
	}
#endif
	if (!FPaths::FileExists(Path))
	{
		Fail(TEXT("sidecar_missing"), FString::Printf(TEXT("no igi-sdk sidecar at %s (SidecarExecutable)"), *Path));
		return false;
	}
	Instance = FString::Printf(TEXT("ue%u-"), FPlatformProcess::GetCurrentProcessId()) + FGuid::NewGuid().ToString(EGuidFormats::Digits);
	EndpointFile = FPaths::Combine(FPaths::ProjectSavedDir(), TEXT("IgiSdk"), Instance + TEXT(".endpoint"));
	IFileManager::Get().MakeDirectory(*FPaths::GetPath(EndpointFile), true);
	IFileManager::Get().Delete(*EndpointFile);
	// a free port per launch: the sidecar binds port 0 and writes the port it got
	FString Args = FString::Printf(TEXT("serve --game-pid %u --endpoint tcp://127.0.0.1:0 --endpoint-file \"%s\" --instance %s"),
		FPlatformProcess::GetCurrentProcessId(), *EndpointFile, *Instance);
	if (!Settings.Arguments.IsEmpty())
	{
		Args += TEXT(" ");
		Args += Settings.Arguments;
	}
	// the launch token goes by environment only (a command line is readable by other processes)
	FPlatformMisc::SetEnvironmentVar(TEXT("IGI_SDK_TOKEN"), *Token);
	uint32 NewPid = 0;
	Handle = FPlatformProcess::CreateProc(*Path, *Args, false, true, true, &NewPid, 0, nullptr, nullptr);
	FPlatformMisc::SetEnvironmentVar(TEXT("IGI_SDK_TOKEN"), TEXT(""));
	if (!Handle.IsValid())
	{
		Fail(TEXT("sidecar_start_failed"), FString::Printf(TEXT("could not start %s"), *Path));
		return false;
	}
	Pid = NewPid;
	State = EIgiSidecarState::Launching;
	NextWatchAt = Now + WatchEverySeconds;
	UE_LOG(LogIgiSidecar, Log, TEXT("started the igi-sdk sidecar (pid %u, instance %s)"), Pid, *Instance);
	return true;
}

void FIgiSidecarHost::Fail(const TCHAR* Code, const FString& Message)
{
	State = EIgiSidecarState::Failed;
	LastError.Code = Code;
	LastError.Message = Message;
	LastError.bRetryable = false;
	UE_LOG(LogIgiSidecar, Error, TEXT("%s"), *Message);
}

void FIgiSidecarHost::Tick()
{
	const double Now = FPlatformTime::Seconds();
	if (Now < NextWatchAt)
	{
		return;
	}
	NextWatchAt = Now + WatchEverySeconds;
	switch (State)
	{
	case EIgiSidecarState::Launching:
	case EIgiSidecarState::Running:
		if (!FPlatformProcess::IsProcRunning(Handle))
		{
			int32 ExitCode = -1;
			FPlatformProcess::GetProcReturnCode(Handle, &ExitCode);
			OnExited(Now, ExitCode);
			return;
		}
		if (State == EIgiSidecarState::Launching)
		{
			PollEndpointFile(Now);
		}
		else if (CrashesInARow > 0 && Now - LaunchedAt >= Backoff.StableSeconds)
		{
			CrashesInARow = 0;  // it stayed up: the next crash starts the count again
		}
		return;
	case EIgiSidecarState::Restarting:
		if (Now >= RestartAt && Users.Num() > 0)
		{
			++Restarts;
			Launch();
		}
		return;
	default:
		return;
	}
}

void FIgiSidecarHost::PollEndpointFile(double Now)
{
	FString Text;
	// one short line: a longer file is not the sidecar's, and is not read
	const int64 Size = IFileManager::Get().FileSize(*EndpointFile);
	if (Size > 0 && Size <= 256 && FFileHelper::LoadFileToString(Text, *EndpointFile))
	{
		Text.TrimStartAndEndInline();
		// written atomically by the sidecar: a whole endpoint or nothing
		if (Text.StartsWith(TEXT("tcp://")))
		{
			Endpoint = Text;
			State = EIgiSidecarState::Running;
			++Generation;
			UE_LOG(LogIgiSidecar, Log, TEXT("the igi-sdk sidecar listens on %s"), *Endpoint);
			return;
		}
	}
	if (Now - LaunchedAt > Settings.EndpointWaitSeconds)
	{
		// hung before binding: end it, and let the exit path decide about a restart
		FPlatformProcess::TerminateProc(Handle, true);
		UE_LOG(LogIgiSidecar, Warning, TEXT("the igi-sdk sidecar reported no endpoint in %.0f s; stopped it"), Settings.EndpointWaitSeconds);
	}
}

void FIgiSidecarHost::OnExited(double Now, int32 ExitCode)
{
	FPlatformProcess::CloseProc(Handle);
	Handle = FProcHandle();
	++Deaths;
	DiedAt = Now;
	Endpoint.Empty();
	const double Up = Now - LaunchedAt;
	Backoff.Ended(Up);
	if (Up >= Backoff.StableSeconds)
	{
		CrashesInARow = 0;
	}
	++CrashesInARow;
	if (ExitCode == ConfigurationExitCode)
	{
		Fail(TEXT("sidecar_refused"), FString::Printf(TEXT("the igi-sdk sidecar refused its arguments (exit status %d)"), ExitCode));
		return;
	}
	if (CrashesInARow > Settings.MaxRestarts)
	{
		Fail(TEXT("sidecar_exited"), FString::Printf(TEXT("the igi-sdk sidecar exited %d times in a row (last status %d); not started again"), CrashesInARow, ExitCode));
		return;
	}
	const double Delay = Backoff.NextDelay();
	RestartAt = Now + Delay;
	State = EIgiSidecarState::Restarting;
	LastError.Code = TEXT("sidecar_exited");
	LastError.Message = FString::Printf(TEXT("the igi-sdk sidecar exited (status %d); starting it again in %.1f s"), ExitCode, Delay);
	LastError.bRetryable = true;
	UE_LOG(LogIgiSidecar, Warning, TEXT("%s"), *LastError.Message);
}
