using System;
using System.Collections.Generic;
using System.IO;
using System.Threading.Tasks;
using UnityEngine;

namespace Igi.Sdk.Unity
{
    public enum SidecarState
    {
        /// <summary>Not started yet (Start runs it), or stopped.</summary>
        Stopped,
        /// <summary>Looking whether a sidecar already listens on the port.</summary>
        Probing,
        /// <summary>Finding and starting <c>igi-sdk serve</c> (off the main thread).</summary>
        Launching,
        /// <summary>Waiting for the sidecar to answer hello (a fresh one loads its model first).</summary>
        Connecting,
        /// <summary>hello answered: requests flow.</summary>
        Ready,
        /// <summary>The sidecar ended; the next start waits for the back-off.</summary>
        Restarting,
        /// <summary>Cannot go on without a change (see <see cref="IgiSidecar.LastError"/>); <see cref="IgiSidecar.Restart"/> tries again.</summary>
        Failed,
    }

    /// <summary>
    /// The game's link to the igi-sdk sidecar, one per game (kept across scene loads). Starts
    /// <c>igi-sdk serve</c> tied to this process, or reuses the one already listening on the port
    /// (the Editor's, across play modes); connects the core <see cref="IgiClient"/> and pumps it
    /// every frame, so its callbacks run on the main thread; restarts a crashed sidecar with
    /// back-off; says goodbye when the game quits. Nothing here waits on the main thread.
    /// </summary>
    [DefaultExecutionOrder(-100)] // pump before other scripts' Update: they see this frame's events
    [DisallowMultipleComponent]
    [AddComponentMenu("Igi SDK/Igi Sidecar")]
    public sealed class IgiSidecar : MonoBehaviour
    {
        public const int DefaultPort = 5599;
        public const string DefaultSaveSubfolder = "igi-sdk/sessions";
        const int ProbeTimeoutMs = 300;
        const float PingEverySeconds = 1f;
        const int ConfigurationExitCode = 2;

        [Header("Sidecar process")]
        [Tooltip("Start igi-sdk serve when nothing listens on the port. Off: connect to a sidecar you run yourself.")]
        [SerializeField] bool launch = true;
        [Tooltip("The igi-sdk executable. Empty: IGI_SDK_EXE, then StreamingAssets/igi-sdk/, then PATH.")]
        [SerializeField] string executablePath = "";
        [Tooltip("Loopback TCP port of the sidecar.")]
        [Range(1024, 65535)] [SerializeField] int port = DefaultPort;
        [Tooltip("Folder of GGUF models, absolute or relative to StreamingAssets. Empty: the sidecar's embedded default model.")]
        [SerializeField] string modelDir = "";
        [Tooltip("Model file inside Model Dir, loaded when the sidecar starts.")]
        [SerializeField] string model = "";
        [Tooltip("Saved conversations, under Application.persistentDataPath.")]
        [SerializeField] string saveFolder = DefaultSaveSubfolder;
        [Tooltip("More igi-sdk serve arguments, one per entry (e.g. --max-sessions, 16).")]
        [SerializeField] string[] extraArguments = new string[0];

        [Header("Connection")]
        [Tooltip("Shown in the sidecar's stats and logs.")]
        [SerializeField] string clientName = "";
        [Tooltip("Silent this long (a debugger pause), the sidecar forgets this client and orphans its sessions.")]
        [Range(2f, 3600f)] [SerializeField] float leaseSeconds = 15f;
        [Tooltip("How long a sidecar found on the port may take to answer.")]
        [SerializeField] float connectTimeoutSeconds = 10f;
        [Tooltip("How long a sidecar started here may take to load its model and answer.")]
        [SerializeField] float startTimeoutSeconds = 600f;

        [Header("Restart")]
        [SerializeField] bool restartOnCrash = true;
        [SerializeField] float restartBackoffMinSeconds = 1f;
        [SerializeField] float restartBackoffMaxSeconds = 30f;

        static IgiSidecar _instance;
        static bool _quitting;

        readonly RestartBackoff _backoff = new RestartBackoff();
        readonly List<VramReservation> _reservations = new List<VramReservation>();
        IgiClient _client;
        SidecarProcess _process;
        Task<bool> _probe;
        bool _reprobe;
        Task<SidecarProcess> _launch;
        SidecarState _state = SidecarState.Stopped;
        float _connectDeadline;
        bool _warnedSlowStart;
        float _restartAt;
        float _processStartedAt;
        float _lastAnswerAt = -1f;
        float _nextPingAt;
        bool _pingInFlight;
        int _readyCount;

        /// <summary>The sidecar of this game (null before one is created).</summary>
        public static IgiSidecar Instance { get { return _instance; } }

        /// <summary>True once the game is quitting (components skip their goodbyes: the sidecar's goodbye covers them).</summary>
        public static bool IsQuitting { get { return _quitting; } }

        /// <summary>The scene's sidecar, or a new one with default settings.</summary>
        public static IgiSidecar FindOrCreate()
        {
            if (_instance != null) return _instance;
            var found = FindObjectOfType<IgiSidecar>();
            if (found != null) return found;
            return new GameObject("Igi Sidecar").AddComponent<IgiSidecar>();
        }

        /// <summary>The core client (null until the sidecar is located). Its callbacks run in this component's Update.</summary>
        public IgiClient Client { get { return _client; } }
        public SidecarState State { get { return _state; } }
        public bool IsReady { get { return _state == SidecarState.Ready; } }
        /// <summary>Counts the connections that became ready: when it changes, sessions may have to be found again.</summary>
        public int ReadyCount { get { return _readyCount; } }
        /// <summary>This component started the sidecar (rather than finding one on the port).</summary>
        public bool StartedHere { get { return _process != null; } }
        /// <summary>What went wrong last, "code: message"; null if nothing did.</summary>
        public string LastError { get; private set; }
        /// <summary>Seconds since the sidecar last answered (it is pinged every second); infinity before it ever did.</summary>
        public float SecondsSinceLastAnswer { get { return _lastAnswerAt < 0 ? float.PositiveInfinity : Time.realtimeSinceStartup - _lastAnswerAt; } }
        public string Endpoint { get { return SidecarArguments.Endpoint(port); } }
        public string LogPath { get { return DefaultLogPath(); } }
        public string SaveDirectory { get { return Path.GetFullPath(Path.Combine(Application.persistentDataPath, saveFolder)); } }

        // settings, for scenes built from code: read when the sidecar starts (Start)
        public int Port { get { return port; } set { port = value; } }
        public bool Launch { get { return launch; } set { launch = value; } }
        public string ExecutablePath { get { return executablePath; } set { executablePath = value ?? ""; } }
        public string ModelDir { get { return modelDir; } set { modelDir = value ?? ""; } }
        public string Model { get { return model; } set { model = value ?? ""; } }

        /// <summary>Raised (on the main thread) each time a connection becomes ready.</summary>
        public event Action Ready;
        /// <summary>Raised when the sidecar stops answering or its process ends, with the reason.</summary>
        public event Action<string> Lost;

        public static string DefaultLogPath()
        {
            return Path.Combine(Path.Combine(Application.persistentDataPath, "igi-sdk"), "sidecar.log");
        }

        public static string DefaultSaveFolder()
        {
            return Path.GetFullPath(Path.Combine(Application.persistentDataPath, DefaultSaveSubfolder));
        }

        [RuntimeInitializeOnLoadMethod(RuntimeInitializeLoadType.SubsystemRegistration)]
        static void ResetStatics()
        {
            // with domain reload off (Enter Play Mode Options), statics survive play modes
            _instance = null;
            _quitting = false;
        }

        // ---- lifecycle --------------------------------------------------------------------------

        void Awake()
        {
            if (_instance != null && _instance != this)
            {
                Debug.LogWarning("Igi SDK: a second IgiSidecar on '" + name + "' is removed; one per game is enough");
                Destroy(this);
                return;
            }
            _instance = this;
            _quitting = false;
            DontDestroyOnLoad(gameObject);
        }

        void Start()
        {
            if (_instance == this) Begin();
        }

        void Update()
        {
            float now = Time.realtimeSinceStartup;
            switch (_state)
            {
                case SidecarState.Probing: AfterProbe(); break;
                case SidecarState.Launching: AfterLaunch(now); break;
                case SidecarState.Restarting: if (now >= _restartAt) Begin(); break;
            }
            if (_client != null) _client.Pump(); // callbacks (and ConnectionChanged) run here
            WatchProcess(now);
            WatchConnecting(now);
            PingWhileReady(now);
        }

        void OnApplicationQuit()
        {
            _quitting = true;
            CloseClient();
        }

        void OnDestroy()
        {
            if (_instance != this) return;
            CloseClient();
            _instance = null;
        }

        /// <summary>Starts over after <see cref="SidecarState.Failed"/> (settings changed, sidecar installed).</summary>
        public void Restart()
        {
            if (_state == SidecarState.Failed || _state == SidecarState.Stopped || _state == SidecarState.Restarting)
            {
                _backoff.Reset();
                Begin();
            }
        }

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
            }
            _state = _client.State == IgiConnectionState.Ready ? SidecarState.Ready : SidecarState.Connecting;
            _connectDeadline = Time.realtimeSinceStartup + timeoutSeconds;
            _warnedSlowStart = false;
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
            _client.Dispose();
            _client = null;
            _state = SidecarState.Stopped;
        }

        // ---- VRAM -------------------------------------------------------------------------------

        /// <summary>
        /// Asks the sidecar to free <paramref name="bytes"/> of VRAM before a level load. The task
        /// completes on the main thread within about 5 s: true once that much is free.
        /// </summary>
        public Task<bool> ReserveVram(long bytes, int deadlineFrames = 2)
        {
            return ReserveVramCoroutine(bytes, deadlineFrames).Task;
        }

        /// <summary>The same for coroutines: <c>yield return</c> it, then read <see cref="VramReservation.Granted"/>.</summary>
        public VramReservation ReserveVramCoroutine(long bytes, int deadlineFrames = 2)
        {
            var reservation = new VramReservation(bytes);
            if (!IsReady)
            {
                reservation.Refuse(IgiError.Unavailable, "no sidecar is connected (" + _state + ")");
                return reservation;
            }
            _reservations.Add(reservation);
            _client.ReserveVram(bytes, deadlineFrames).OnCompleted(request =>
            {
                _reservations.Remove(reservation);
                if (request.Succeeded && request.GetBool("granted", true)) reservation.Grant();
                else if (request.Succeeded) reservation.Refuse("not_granted", "the sidecar did not grant the reservation");
                else reservation.Refuse(request.Error.Code, request.Error.Message);
            });
            return reservation;
        }
    }
}
