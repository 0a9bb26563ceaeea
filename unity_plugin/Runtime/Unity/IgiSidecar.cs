using System;
using System.Collections.Generic;
using System.IO;
using System.Threading.Tasks;
using UnityEngine;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// The game's link to the igi-sdk sidecar, one per game (kept across scene loads). Starts
    /// <c>igi-sdk serve</c> tied to this process (a player: on a free port, with a fresh instance
    /// id; the Editor: on the project's own port, see <see cref="SidecarIdentity"/>), or reuses the
    /// one this process started before (the Editor's, across play modes and script reloads) and
    /// refuses any other; connects the core <see cref="IgiClient"/> with the
    /// game's owner key and the launch token of the sidecar it started (<see cref="SidecarKeys"/>),
    /// and pumps it
    /// every frame, so its callbacks run on the main thread; restarts a crashed sidecar with
    /// back-off; says goodbye when the game quits. Nothing here waits on the main thread.
    /// </summary>
    [DefaultExecutionOrder(-100)] // pump before other scripts' Update: they see this frame's events
    [DisallowMultipleComponent]
    [AddComponentMenu("Igi SDK/Igi Sidecar")]
    public sealed partial class IgiSidecar : MonoBehaviour
    {
        /// <summary>0: automatic (a player: a free port per launch; the Editor: the project's port).</summary>
        public const int DefaultPort = 0;
        const float WatchEverySeconds = 0.25f; // the PID check: one system call, no allocation
        public const string DefaultSaveSubfolder = "igi-sdk/sessions";
        const int ProbeTimeoutMs = 300;
        const int MaxProbeTries = 5; // 300 ms, then 0.6, 1.2, 2.4, 4.8 s
        const float PingEverySeconds = 1f;
        const int ConfigurationExitCode = 2;

        [Header("Sidecar process")]
        [Tooltip("Start igi-sdk serve when nothing listens on the port. Off: connect to a sidecar you run yourself.")]
        [SerializeField] bool launch = true;
        [Tooltip("The igi-sdk executable. Empty: IGI_SDK_EXE, then StreamingAssets/igi-sdk/, then PATH.")]
        [SerializeField] string executablePath = "";
        [Tooltip("Loopback TCP port of the sidecar. 0: automatic (a player: a free port per launch; the Editor: one derived from the project's path).")]
        [Range(0, 65535)] [SerializeField] int port = DefaultPort;
        [Tooltip("Launch off: the file the game's launcher had the sidecar write its endpoint to (serve --endpoint-file). Empty: IGI_SDK_ENDPOINT_FILE, else the port.")]
        [SerializeField] string endpointFile = "";
        [Tooltip("Launch off: the sidecar's --instance id; another sidecar is refused. Empty: IGI_SDK_INSTANCE, else any.")]
        [SerializeField] string instanceId = "";
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
        [Tooltip("Silent this long (a debugger pause), the sidecar forgets this client and orphans its sessions (a 1.2 sidecar grants at most 300 s).")]
        [Range(2f, 300f)] [SerializeField] float leaseSeconds = 15f;
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

        // Runtime state: never serialized. A script reload in play mode serializes every other
        // field of the component and restores it into a fresh one, which then gets OnEnable (no
        // Awake, no Start): restored state without its client is what must not happen.
        [NonSerialized] readonly RestartBackoff _backoff = new RestartBackoff();
        [NonSerialized] readonly List<VramReservation> _reservations = new List<VramReservation>();
        [NonSerialized] IgiClient _client;
        [NonSerialized] SidecarProcess _process;
        [NonSerialized] Task<PortState> _probe;
        [NonSerialized] int _probeTries; // probes of the port so far that found no answer
        [NonSerialized] bool _reprobe;
        [NonSerialized] Task<SidecarProcess> _launch;
        [NonSerialized] SidecarState _state = SidecarState.Stopped;
        [NonSerialized] bool _enabled;
        [NonSerialized] float _connectDeadline;
        [NonSerialized] bool _warnedSlowStart;
        [NonSerialized] float _restartAt;
        [NonSerialized] float _processStartedAt;
        [NonSerialized] float _lastAnswerAt = -1f;
        [NonSerialized] float _nextPingAt;
        [NonSerialized] bool _pingInFlight;
        [NonSerialized] int _readyCount;
        [NonSerialized] float _nextWatchAt;
        [NonSerialized] int _keyPort;          // what SidecarKeys keeps this sidecar's keys under (0: a player's free port)
        [NonSerialized] int _activePort;       // the port in use; 0 until a player's sidecar reported its own
        [NonSerialized] string _endpoint;      // null until known
        [NonSerialized] string _expectedInstance;
        [NonSerialized] string _endpointFileInUse; // a started sidecar's endpoint file, awaited
        [NonSerialized] float _endpointDeadline;
        [NonSerialized] float _nextFileCheckAt;
        [NonSerialized] bool _startedHere;
        [NonSerialized] int _updates;          // this component's Update calls: BeginLevelLoad's frame clock

        /// <summary>The sidecar of this game (null before one is created).</summary>
        public static IgiSidecar Instance { get { return _instance; } }

        /// <summary>True once the game is quitting (components skip their goodbyes: the sidecar's goodbye covers them).</summary>
        public static bool IsQuitting { get { return _quitting; } }

        /// <summary>The scene's sidecar, or a new one with default settings.</summary>
        public static IgiSidecar FindOrCreate()
        {
            if (_instance != null) return _instance;
#if UNITY_2023_1_OR_NEWER
            var found = FindAnyObjectByType<IgiSidecar>();
#else
            var found = FindObjectOfType<IgiSidecar>();
#endif
            if (found != null) return found;
            return new GameObject("Igi Sidecar").AddComponent<IgiSidecar>();
        }

        /// <summary>The core client (null until the sidecar is located). Its callbacks run in this component's Update.</summary>
        public IgiClient Client { get { return _client; } }
        public SidecarState State { get { return _state; } }
        public bool IsReady { get { return _state == SidecarState.Ready; } }
        /// <summary>Counts the connections that became ready: when it changes, sessions may have to be found again.</summary>
        public int ReadyCount { get { return _readyCount; } }
        /// <summary>This game is the sidecar's game (protocol 1.2: it holds the launch token the
        /// sidecar was started with, or the sidecar has none): its frames pace the engine, its
        /// process is watched, it may shut the sidecar down, it may hold every session slot.</summary>
        public bool IsGame { get { return _client != null && _client.IsGame; } }
        /// <summary>This component started the sidecar (rather than finding one on the port).</summary>
        public bool StartedHere { get { return _startedHere; } }
        /// <summary>What went wrong last, "code: message"; null if nothing did.</summary>
        public string LastError { get; private set; }
        /// <summary>Seconds since the sidecar last answered (it is pinged every second); infinity before it ever did.</summary>
        public float SecondsSinceLastAnswer { get { return _lastAnswerAt < 0 ? float.PositiveInfinity : Time.realtimeSinceStartup - _lastAnswerAt; } }
        /// <summary>The sidecar's endpoint; null while a player's sidecar has not reported its port yet.</summary>
        public string Endpoint { get { return _endpoint; } }
        /// <summary>The instance id the sidecar must answer hello with (null: any).</summary>
        public string ExpectedInstance { get { return _expectedInstance; } }
        /// <summary>The PID of the sidecar this process started (0: none, or found elsewhere).</summary>
        public int SidecarPid { get { return _process != null ? _process.Pid : 0; } }
        public string LogPath { get { return DefaultLogPath(); } }
        public string SaveDirectory { get { return Path.GetFullPath(Path.Combine(Application.persistentDataPath, saveFolder)); } }

        // settings, for scenes built from code: read when the sidecar starts (Start)
        public int Port { get { return port; } set { port = value; } }
        public bool Launch { get { return launch; } set { launch = value; } }
        public string ExecutablePath { get { return executablePath; } set { executablePath = value ?? ""; } }
        public string ModelDir { get { return modelDir; } set { modelDir = value ?? ""; } }
        public string Model { get { return model; } set { model = value ?? ""; } }
        public string EndpointFile { get { return endpointFile; } set { endpointFile = value ?? ""; } }
        public string InstanceId { get { return instanceId; } set { instanceId = value ?? ""; } }
        /// <summary>More <c>igi-sdk serve</c> arguments, one per entry (e.g. <c>--threads</c>,
        /// <c>2</c>). A copy: set the whole array.</summary>
        public string[] ExtraArguments
        {
            get { return extraArguments != null ? (string[])extraArguments.Clone() : new string[0]; }
            set { extraArguments = value != null ? (string[])value.Clone() : new string[0]; }
        }

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

        // OnEnable follows Awake, and also a script reload in play mode (a fresh component, its
        // runtime fields empty, statics cleared): take the game's place back and begin again;
        // the sidecar this process started is found through what SidecarKeys kept
        void OnEnable()
        {
            if (_instance == null) _instance = this;
            _enabled = true;
        }

        void Start()
        {
            _enabled = true; // OnEnable did it; harmless twice
        }

        // OnDisable comes before a script reload (and a Destroy): goodbye with the sessions kept,
        // so the component that comes back adopts its NPCs
        void OnDisable()
        {
            _enabled = false;
            if (_instance != this) return;
            if (_client != null && !_quitting) _client.Options.KeepSessionsOnDispose = true;
            CloseClient();
            _probe = null;
            _launch = null;
            if (_process != null) { _process.Dispose(); _process = null; }
        }

        void Update()
        {
            float now = Time.realtimeSinceStartup;
            if (_instance != this) return;
            switch (_state)
            {
                case SidecarState.Stopped: if (_enabled && !_quitting) Begin(); break;
                case SidecarState.Probing: AfterProbe(); break;
                case SidecarState.Launching: AfterLaunch(now); break;
                case SidecarState.Restarting: if (now >= _restartAt) Begin(); break;
            }
            _updates++;
            if (_client != null) _client.Pump(); // callbacks (and ConnectionChanged) run here
            if (_reservations.Count > 0) EndLateReservations();
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
            if (_process != null) { _process.Dispose(); _process = null; }
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

        // ---- VRAM -------------------------------------------------------------------------------

        /// <summary>How many of the game's frames <see cref="BeginLevelLoad"/> waits by default
        /// (half a second at 60 fps; a GPU sidecar grants in one or two).</summary>
        public const int DefaultLevelLoadFrames = 30;
        const int MaxDeadlineFrames = 100000; // reserve_vram's deadline_frames (PROTOCOL.md)

        /// <summary>
        /// The call to make before a level (or any large set of assets) loads: asks the sidecar
        /// to free <paramref name="bytes"/> of VRAM (<c>reserve_vram</c>; the model moves to a
        /// smaller placement or the CPU) and waits at most <paramref name="deadlineFrames"/> of
        /// the game's frames for the answer. <c>yield return</c> it in a coroutine or
        /// <c>await</c> it, then load: it always ends, on the main thread, with
        /// <see cref="VramReservation.Granted"/> (the memory is free now), or with
        /// <see cref="VramReservation.ErrorCode"/> <c>cannot_free</c>, <c>deadline_missed</c>
        /// (the frames ran out first: load anyway, the sidecar goes on freeing), <c>forbidden</c>
        /// (this game is a guest of the sidecar) or <c>unavailable</c> (no sidecar connected).
        /// A sidecar without a GPU holds no VRAM and grants at once.
        /// </summary>
        public VramReservation BeginLevelLoad(long bytes, int deadlineFrames = DefaultLevelLoadFrames)
        {
            if (bytes < 0) throw new ArgumentOutOfRangeException("bytes", "a reservation is 0 bytes or more");
            if (deadlineFrames < 0 || deadlineFrames > MaxDeadlineFrames)
                throw new ArgumentOutOfRangeException("deadlineFrames", "0.." + MaxDeadlineFrames + " frames");
            var reservation = ReserveVramCoroutine(bytes, deadlineFrames);
            // counted in this component's Update (not Time.frameCount): it is what pumps the
            // answers, so a deadline of N frames gives the answer N chances to arrive
            if (!reservation.IsDone) reservation.EndsAtUpdate = _updates + deadlineFrames;
            return reservation;
        }

        /// <summary>
        /// Asks the sidecar to free <paramref name="bytes"/> of VRAM before a level load (protocol
        /// 1.2: only the game may, see <see cref="IsGame"/>; others are refused <c>forbidden</c>). The task
        /// completes on the main thread within about 5 s: true once that much is free.
        /// <see cref="BeginLevelLoad"/> is the same with a bound in frames.
        /// </summary>
        public Task<bool> ReserveVram(long bytes, int deadlineFrames = 2)
        {
            return ReserveVramCoroutine(bytes, deadlineFrames).Task;
        }

        /// <summary>The same for coroutines: <c>yield return</c> it, then read <see cref="VramReservation.Granted"/>.</summary>
        public VramReservation ReserveVramCoroutine(long bytes, int deadlineFrames = 2)
        {
            var reservation = new VramReservation(bytes, deadlineFrames);
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
                else if (request.Succeeded) reservation.Refuse(VramReservation.NotGranted, "the sidecar did not grant the reservation");
                else reservation.Refuse(request.Error.Code, request.Error.Message);
            });
            return reservation;
        }

        // after this frame's Pump: level loads whose frames ran out stop waiting (no allocation)
        void EndLateReservations()
        {
            for (int i = _reservations.Count - 1; i >= 0; i--)
            {
                var reservation = _reservations[i];
                if (reservation.EndsAtUpdate < 0 || _updates < reservation.EndsAtUpdate) continue;
                _reservations.RemoveAt(i);
                reservation.Refuse(VramReservation.DeadlineMissed, "not granted within " + reservation.DeadlineFrames +
                    " frames; the sidecar goes on freeing it (ask again, or load now)");
            }
        }
    }
}
