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
            _endpointFileInUse = null;
            if (!launch)
            {
                // the game's launcher started the sidecar (serve --endpoint-file F --instance ID)
                string file = !string.IsNullOrEmpty(endpointFile) ? endpointFile : Environment.GetEnvironmentVariable(SidecarIdentity.EndpointFileVariable);
                string id = !string.IsNullOrEmpty(instanceId) ? instanceId : Environment.GetEnvironmentVariable(SidecarIdentity.InstanceVariable);
                _expectedInstance = string.IsNullOrEmpty(id) ? null : id;
                _keyPort = port;
                if (!string.IsNullOrEmpty(file))
                {
                    _endpointFileInUse = file;
                    _endpointDeadline = Time.realtimeSinceStartup + startTimeoutSeconds;
                    _endpoint = null;
                    _state = SidecarState.Launching; // waits for the file (AfterLaunch)
                    return;
                }
                if (port == 0) { Fail("no_endpoint", "Launch is off: set Endpoint File (or IGI_SDK_ENDPOINT_FILE) or a Port"); return; }
                UsePort(port);
                Connect(startTimeoutSeconds); // someone else starts it; wait for it
                return;
            }
            if (port == 0 && !Application.isEditor)
            {
                // a player: the sidecar this process started before (a re-enabled component), else a new one on a free port
                _keyPort = 0;
                if (ReattachKept()) return;
                BeginLaunch();
                return;
            }
            if (port == 0)
            {
                string project = Path.GetDirectoryName(Application.dataPath);
                _keyPort = SidecarIdentity.EditorPort(project);
                _expectedInstance = SidecarIdentity.EditorInstance(project);
            }
            else
            {
                _keyPort = port;
                int pid;
                string kept, endpoint, log;
                // the instance this process started on the port; none: whatever listens there is not ours
                _expectedInstance = SidecarKeys.KeptLaunch(port, out pid, out kept, out endpoint, out log) ? kept : SidecarIdentity.NewInstance();
            }
            UsePort(_keyPort);
            _reprobe = false;
            StartProbe(_keyPort, 0);
        }

        // A probe, or another after one that found no answer (each waits twice as long)
        void StartProbe(int probePort, int tries)
        {
            _probeTries = tries;
            int timeout = ProbeTimeoutMs << Math.Min(tries, MaxProbeTries);
            _probe = Task.Run(() => PortProbe.Check(probePort, timeout));
            _state = SidecarState.Probing;
        }

        void UsePort(int p)
        {
            _activePort = p;
            _endpoint = SidecarArguments.Endpoint(p);
        }

        // After a script reload or a re-enable: the sidecar this process started, if it still runs.
        bool ReattachKept()
        {
            int pid;
            string kept, endpoint, log;
            if (!SidecarKeys.KeptLaunch(_keyPort, out pid, out kept, out endpoint, out log)) return false;
            var process = SidecarProcess.Attach(pid, log);
            if (process.HasExited || endpoint == null || !endpoint.StartsWith("tcp://", StringComparison.Ordinal))
            {
                process.Dispose();
                SidecarKeys.ForgetLaunch(_keyPort);
                return false;
            }
            _process = process;
            _processStartedAt = Time.realtimeSinceStartup;
            _expectedInstance = kept;
            _endpoint = endpoint;
            Connect(connectTimeoutSeconds);
            return true;
        }

        void AfterProbe()
        {
            if (_probe == null || !_probe.IsCompleted) return;
            PortState found = _probe.Status == TaskStatus.RanToCompletion ? _probe.Result : PortState.Unknown;
            _probe = null;
            if (found == PortState.Unknown && _probeTries + 1 < MaxProbeTries)
            {
                StartProbe(_activePort, _probeTries + 1);
                return;
            }
            // only a refusal says nobody is there: a port that never answered is left to the
            // connection (which fails as not_a_sidecar), never given a second sidecar
            bool listening = found != PortState.Free;
            if (listening && _reprobe)
            {
                Fail("not_a_sidecar", "something listens on port " + _activePort + " but does not answer as an igi-sdk sidecar; choose another port");
                return;
            }
            if (listening)
            {
                // ours from before (the Editor's last play mode, a script reload): the instance check decides
                int pid;
                string kept, endpoint, log;
                if (_process == null && SidecarKeys.KeptLaunch(_keyPort, out pid, out kept, out endpoint, out log) && kept == _expectedInstance)
                {
                    var process = SidecarProcess.Attach(pid, log);
                    if (!process.HasExited) { _process = process; _processStartedAt = Time.realtimeSinceStartup; }
                    else process.Dispose();
                }
                Connect(connectTimeoutSeconds);
            }
            else BeginLaunch();
        }

        void BeginLaunch()
        {
            // everything Unity is read here, on the main thread; the task only touches files and processes
            string configured = executablePath;
            string streamingAssets = Application.streamingAssetsPath;
            bool windows = Path.DirectorySeparatorChar == '\\';
            bool freePort = _keyPort == 0;
            if (freePort) _expectedInstance = SidecarIdentity.NewInstance(); // a fresh one per launch
            string file = SidecarIdentity.EndpointFilePath(_expectedInstance);
            string endpoint = freePort ? SidecarArguments.Endpoint(0) : _endpoint;
            var launchInfo = new SidecarLaunch
            {
                Arguments = SidecarArguments.Build(endpoint, System.Diagnostics.Process.GetCurrentProcess().Id,
                    SaveDirectory, modelDir, model, streamingAssets, extraArguments, _expectedInstance, file),
                LogPath = DefaultLogPath(),
                Windows = windows,
            };
            // a new token (and owner key) per sidecar started: through its environment only
            launchInfo.Variables[SidecarKeys.TokenVariable] = SidecarKeys.Renew(_keyPort);
            UseKeys(); // the client's next hello (to the new sidecar) carries them
            if (freePort)
            {
                _endpoint = null; // known once the sidecar wrote it
                _endpointFileInUse = file;
                _endpointDeadline = Time.realtimeSinceStartup + connectTimeoutSeconds + 20f;
            }
            _launch = Task.Run(() =>
            {
                launchInfo.Executable = SidecarLocator.Find(configured, streamingAssets, windows);
                if (launchInfo.Executable == null)
                    throw new FileNotFoundException("igi-sdk not found; looked at " + LookedAt(configured, streamingAssets, windows));
                Directory.CreateDirectory(Path.GetDirectoryName(file));
                try { File.Delete(file); } catch (IOException) { } // a stale one from a crashed run
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
            if (_launch != null)
            {
                if (!_launch.IsCompleted) return;
                Task<SidecarProcess> done = _launch;
                _launch = null;
                if (done.Status != TaskStatus.RanToCompletion)
                {
                    Exception e = done.Exception != null ? done.Exception.GetBaseException() : new OperationCanceledException();
                    if (e is FileNotFoundException) Fail("sidecar_not_found", e.Message);
                    else if (e is LaunchUnsupportedException)
                        Fail("launch_unsupported", e.Message + ". Start the sidecar from the game's launcher (igi-sdk serve --endpoint tcp://127.0.0.1:0 --endpoint-file F --instance ID) and turn Launch off with Endpoint File F and Instance ID (docs/unity.md)");
                    else ScheduleRestart("the sidecar could not be started: " + e.Message);
                    return;
                }
                _process = done.Result;
                _processStartedAt = now;
                _startedHere = true;
            }
            if (_endpointFileInUse != null && _endpoint == null)
            {
                // a free port: the sidecar writes it once bound (before its model loads)
                if (now < _nextFileCheckAt) return;
                _nextFileCheckAt = now + 0.1f;
                string found = SidecarIdentity.ReadEndpointFile(_endpointFileInUse);
                if (found == null)
                {
                    if (now > _endpointDeadline)
                        Fail("no_endpoint", "no endpoint in " + _endpointFileInUse + " after " + (_endpointDeadline - _processStartedAt).ToString("0") + " s" + (_process != null ? " (log: " + _process.LogPath + ")" : ""));
                    return; // Update's WatchProcess notices a sidecar that exits meanwhile
                }
                _endpoint = found;
                _activePort = int.Parse(found.Substring(found.LastIndexOf(':') + 1));
            }
            if (_process != null)
            {
                SidecarKeys.KeepLaunch(_keyPort, _process.Pid, _expectedInstance, _endpoint, _process.LogPath);
                Debug.Log("Igi SDK: started the sidecar " + _expectedInstance + " on " + _endpoint + " (pid " + _process.Pid + ", log: " + _process.LogPath + ")");
            }
            Connect(startTimeoutSeconds);
        }

        void Connect(float timeoutSeconds)
        {
            if (_client != null && (_client.Options.Endpoint != _endpoint || _client.Options.ExpectedInstance != _expectedInstance))
                DisposeClient(); // another sidecar (a new free port, another instance): a new client
            if (_client == null)
            {
                _client = new IgiClient(new IgiClientOptions
                {
                    Endpoint = _endpoint,
                    Engine = "unity",
                    ClientName = Truncate(string.IsNullOrEmpty(clientName) ? Application.productName : clientName, 64),
                    GamePid = System.Diagnostics.Process.GetCurrentProcess().Id,
                    LeaseSeconds = leaseSeconds,
                    // the Editor's sidecar outlives the play mode: leave the sessions for the next one to adopt
                    KeepSessionsOnDispose = Application.isEditor,
                    ExpectedInstance = _expectedInstance,
                    ExpectedModel = string.IsNullOrEmpty(model) ? null : model,
                    // in the options it is made with: its I/O thread may say hello before the
                    // UseKeys below, and a hello without the token is a guest's (IsGame false)
                    OwnerKey = SidecarKeys.OwnerKey(_keyPort),
                    LaunchToken = SidecarKeys.LaunchToken(_keyPort),
                });
                _client.ConnectionChanged += OnConnectionChanged;
                _client.HelloRefused += OnHelloRefused;
            }
            UseKeys();
            _state = _client.State == IgiConnectionState.Ready ? SidecarState.Ready : SidecarState.Connecting;
            _connectDeadline = Time.realtimeSinceStartup + timeoutSeconds;
            _warnedSlowStart = false;
        }

        // The owner key and launch token of the sidecar (SidecarKeys), read by the client at its
        // next hello: NPCs a last play mode left are adopted, and this game is the game (IsGame)
        // of a sidecar it started.
        void UseKeys()
        {
            if (_client == null) return;
            _client.Options.OwnerKey = SidecarKeys.OwnerKey(_keyPort);
            _client.Options.LaunchToken = SidecarKeys.LaunchToken(_keyPort);
        }

        void OnHelloRefused(IgiError error)
        {
            if (error.Code == IgiError.WrongSidecar)
            {
                // never reused: another Editor's or game's sidecar, or a developer's own
                Fail(IgiError.WrongSidecar, error.Message + (port != 0 || Application.isEditor
                    ? "; port " + _activePort + " is taken by it: stop it or set another Port" : ""));
                return;
            }
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
                SidecarKeys.ForgetLaunchToken(_keyPort);
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
            if (_process == null || now < _nextWatchAt) return;
            _nextWatchAt = now + WatchEverySeconds;
            if (!_process.HasExited) return;
            int exitCode = _process.ExitCode;
            string reason = "the sidecar exited (code " + exitCode + "; log: " + _process.LogPath + ")";
            _backoff.Ended(now - _processStartedAt);
            _process.Dispose();
            _process = null;
            SidecarKeys.ForgetLaunch(_keyPort);
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
                if (_keyPort == 0) { BeginLaunch(); return; }
                _reprobe = true;
                StartProbe(_activePort, 0);
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

        void DisposeClient()
        {
            if (_client == null) return;
            _client.ConnectionChanged -= OnConnectionChanged;
            _client.HelloRefused -= OnHelloRefused;
            _client.Dispose();
            _client = null;
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
