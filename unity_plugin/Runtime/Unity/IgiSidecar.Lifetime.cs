using System;
using System.Collections.Generic;
using System.IO;
using System.Threading.Tasks;
using UnityEngine;

namespace Igi.Sdk.Unity
{
    // IgiSidecar, continued: finding or starting the sidecar, and watching it (IgiSidecar.cs has
    // the settings, the lifecycle and the public API).
    public sealed partial class IgiSidecar
    {
        // ---- starting ---------------------------------------------------------------------------

        void Begin()
        {
            LastError = null;
            if (!launch)
            {
                Connect(startTimeoutSeconds); // someone else starts it; wait for it
                return;
            }
            int probePort = port;
            _reprobe = false;
            _probe = Task.Run(() => PortProbe.IsListening(probePort, ProbeTimeoutMs));
            _state = SidecarState.Probing;
        }

        void AfterProbe()
        {
            if (_probe == null || !_probe.IsCompleted) return;
            bool listening = _probe.Status == TaskStatus.RanToCompletion && _probe.Result;
            _probe = null;
            if (listening && _reprobe)
            {
                Fail("not_a_sidecar", "something listens on port " + port + " but does not answer as an igi-sdk sidecar; choose another port");
                return;
            }
            if (listening) Connect(connectTimeoutSeconds); // the Editor's sidecar from the last play mode, or one the player runs
            else BeginLaunch();
        }

        void BeginLaunch()
        {
            // everything Unity is read here, on the main thread; the task only touches files and processes
            string configured = executablePath;
            string streamingAssets = Application.streamingAssetsPath;
            bool windows = Path.DirectorySeparatorChar == '\\';
            var launchInfo = new SidecarLaunch
            {
                Arguments = SidecarArguments.Build(Endpoint, System.Diagnostics.Process.GetCurrentProcess().Id,
                    SaveDirectory, modelDir, model, streamingAssets, extraArguments),
                LogPath = DefaultLogPath(),
                Windows = windows,
            };
            // a new token (and owner key) per sidecar started: through its environment only
            launchInfo.Variables[SidecarKeys.TokenVariable] = SidecarKeys.Renew(port);
            UseKeys(); // the client's next hello (to the new sidecar) carries them
            _launch = Task.Run(() =>
            {
                launchInfo.Executable = SidecarLocator.Find(configured, streamingAssets, windows);
                if (launchInfo.Executable == null)
                    throw new FileNotFoundException("igi-sdk not found; looked at " + LookedAt(configured, streamingAssets, windows));
                return SidecarProcess.Start(launchInfo);
            });
            _state = SidecarState.Launching;
        }

        static string LookedAt(string configured, string streamingAssets, bool windows)
        {
            var where = new List<string>();
            if (!string.IsNullOrEmpty(configured)) where.Add(configured);
            where.Add("$" + SidecarLocator.EnvironmentVariable);
            where.Add(Path.Combine(streamingAssets, SidecarLocator.BundledFolder));
            where.Add("PATH");
            return string.Join(", ", where.ToArray()) + (windows ? " (igi-sdk.exe)" : " (igi-sdk)");
        }

        void AfterLaunch(float now)
        {
            if (_launch == null || !_launch.IsCompleted) return;
            Task<SidecarProcess> done = _launch;
            _launch = null;
            if (done.Status != TaskStatus.RanToCompletion)
            {
                Exception e = done.Exception != null ? done.Exception.GetBaseException() : new OperationCanceledException();
                if (e is FileNotFoundException) Fail("sidecar_not_found", e.Message);
                else ScheduleRestart("the sidecar could not be started: " + e.Message);
                return;
            }
            _process = done.Result;
            _processStartedAt = now;
            Debug.Log("Igi SDK: started the sidecar on " + Endpoint + " (log: " + _process.LogPath + ")");
            Connect(startTimeoutSeconds);
        }

        void Connect(float timeoutSeconds)
        {
            if (_client == null)
            {
                _client = new IgiClient(new IgiClientOptions
                {
                    Endpoint = Endpoint,
                    Engine = "unity",
                    ClientName = Truncate(string.IsNullOrEmpty(clientName) ? Application.productName : clientName, 64),
                    GamePid = System.Diagnostics.Process.GetCurrentProcess().Id,
                    LeaseSeconds = leaseSeconds,
                    // the Editor's sidecar outlives the play mode: leave the sessions for the next one to adopt
                    KeepSessionsOnDispose = Application.isEditor,
                });
                _client.ConnectionChanged += OnConnectionChanged;
                _client.HelloRefused += OnHelloRefused;
            }
            UseKeys();
            _state = _client.State == IgiConnectionState.Ready ? SidecarState.Ready : SidecarState.Connecting;
            _connectDeadline = Time.realtimeSinceStartup + timeoutSeconds;
            _warnedSlowStart = false;
        }

        // The owner key and launch token of the sidecar on the port (SidecarKeys), read by the
        // client at its next hello: NPCs a last play mode left are adopted, and this game is the
        // game (IsGame) of a sidecar it started.
        void UseKeys()
        {
            if (_client == null) return;
            _client.Options.OwnerKey = SidecarKeys.OwnerKey(port);
            _client.Options.LaunchToken = SidecarKeys.LaunchToken(port);
        }

        void OnHelloRefused(IgiError error)
        {
            if (error.Retryable)
            {
                LastError = error.Code + ": " + error.Message; // busy: the core greets again after a pause
                return;
            }
            if (error.Code == IgiError.Forbidden && _client.Options.LaunchToken != null)
            {
                // the sidecar on the port was not started by this process (ours ended and another
                // took the port): not ours to command, so talk to it as a guest
                Debug.LogWarning("Igi SDK: the sidecar on " + Endpoint + " refused this game's launch token (it was started elsewhere); connecting without it (its pacing and shutdown are not this game's)");
                SidecarKeys.ForgetLaunchToken(port);
                _client.Options.LaunchToken = null;
                _client.Ping(); // says hello again
                return;
            }
            Fail("hello_refused", error.Code + ": " + error.Message);
        }

        static string Truncate(string text, int length)
        {
            text = text ?? "";
            return text.Length <= length ? text : text.Substring(0, length);
        }

        // ---- health -----------------------------------------------------------------------------

        void OnConnectionChanged(IgiConnectionState state)
        {
            float now = Time.realtimeSinceStartup;
            if (state == IgiConnectionState.Ready)
            {
                _lastAnswerAt = now;
                if (_state == SidecarState.Ready) return; // a hello answered again (the core re-adopted its sessions)
                _state = SidecarState.Ready;
                _readyCount++;
                LastError = null;
                var ready = Ready;
                if (ready != null) ready();
                return;
            }
            if (_state != SidecarState.Ready) return;
            // the core keeps reconnecting; this only decides how long to wait before calling it stuck
            Connect(_process != null ? startTimeoutSeconds : connectTimeoutSeconds);
            RaiseLost(state == IgiConnectionState.Unavailable ? "the sidecar has been silent for 5 s" : "the connection to the sidecar dropped");
        }

        void WatchProcess(float now)
        {
            if (_process == null || !_process.HasExited) return;
            int exitCode = _process.ExitCode;
            string reason = "the sidecar exited (code " + exitCode + "; log: " + _process.LogPath + ")";
            _backoff.Ended(now - _processStartedAt);
            _process = null;
            if (_state == SidecarState.Ready) _state = SidecarState.Connecting;
            RaiseLost(reason);
            if (_quitting) return;
            // exit status 2: igi-sdk refused its arguments (model_not_found, game_not_running, a
            // busy port): starting it again would fail the same way
            if (exitCode == ConfigurationExitCode) Fail("sidecar_refused", reason);
            else if (restartOnCrash) ScheduleRestart(reason);
            else Fail("sidecar_exited", reason);
        }

        void WatchConnecting(float now)
        {
            if (_state != SidecarState.Connecting || now < _connectDeadline || !launch) return;
            if (_process == null)
            {
                // the sidecar found on the port is gone or is not one: look again, start one if nobody is there
                int probePort = port;
                _reprobe = true;
                _probe = Task.Run(() => PortProbe.IsListening(probePort, ProbeTimeoutMs));
                _state = SidecarState.Probing;
                return;
            }
            if (!_warnedSlowStart)
            {
                _warnedSlowStart = true;
                LastError = "slow_start: the sidecar has not answered for " + startTimeoutSeconds + " s (see " + _process.LogPath + ")";
                Debug.LogWarning("Igi SDK: " + LastError);
            }
        }

        void PingWhileReady(float now)
        {
            // the core keeps the lease by itself; this ping measures liveness for SecondsSinceLastAnswer
            if (_state != SidecarState.Ready || _pingInFlight || now < _nextPingAt) return;
            _pingInFlight = true;
            _nextPingAt = now + PingEverySeconds;
            _client.Ping().OnCompleted(request =>
            {
                _pingInFlight = false;
                if (request.Succeeded) _lastAnswerAt = Time.realtimeSinceStartup;
            });
        }

        void ScheduleRestart(string reason)
        {
            _backoff.MinSeconds = restartBackoffMinSeconds;
            _backoff.MaxSeconds = restartBackoffMaxSeconds;
            float delay = _backoff.NextDelay();
            LastError = "sidecar_exited: " + reason;
            Debug.LogWarning("Igi SDK: " + reason + "; starting it again in " + delay.ToString("0.#") + " s");
            _restartAt = Time.realtimeSinceStartup + delay;
            _state = SidecarState.Restarting;
        }

        void Fail(string code, string message)
        {
            LastError = code + ": " + message;
            Debug.LogError("Igi SDK: " + LastError);
            _state = SidecarState.Failed;
        }

        void RaiseLost(string reason)
        {
            var lost = Lost;
            if (lost != null) lost(reason);
        }

        void CloseClient()
        {
            foreach (var reservation in _reservations) reservation.Refuse(IgiError.Disposed, "the sidecar connection was closed");
            _reservations.Clear();
            _pingInFlight = false; // a disposed client runs no more callbacks
            if (_client == null) return;
            // goodbye, bounded (about a second, at quit only): in a player the sidecar then exits
            // with the game; in the Editor it stays, and the sessions wait to be adopted
            _client.ConnectionChanged -= OnConnectionChanged;
            _client.HelloRefused -= OnHelloRefused;
            _client.Dispose();
            _client = null;
            _state = SidecarState.Stopped;
        }
    }
}
