using UnityEngine;
#if UNITY_EDITOR || DEVELOPMENT_BUILD
using UnityEngine.Profiling;
#endif

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// Tells the sidecar, every N frames, how long frames take and how much graphics memory the
    /// game uses, so its VRAM arbiter moves the model out of the game's way and paces decoding
    /// to the frame-time target. Figures Unity does not know are left out, never guessed.
    ///
    /// The game's VRAM figure is optional: the sidecar's arbiter reads the whole device (NVML or
    /// the driver), the game's use included, so a release player (where Unity tracks no
    /// graphics-driver memory: <c>Profiler.GetAllocatedMemoryForGraphicsDriver</c> works in the
    /// Editor and development builds only) sends none and loses nothing. Reports go through
    /// <see cref="IgiClient.ReportFrame"/>: no garbage per frame.
    ///
    /// The game's CPU use (<see cref="BusyThreads"/>, <see cref="CpuShare"/>) goes with every
    /// report once the game sets it: the model's CPU threads then keep off the cores the game
    /// holds. Only the game knows it: Unity's <c>SystemInfo.processorCount</c> is the machine's
    /// CPUs, not the threads the game keeps busy, so nothing is sent until it is set.
    /// </summary>
    [DisallowMultipleComponent]
    [AddComponentMenu("Igi SDK/VRAM Reporter")]
    public sealed class VramReporter : MonoBehaviour
    {
        const long MiB = 1L << 20;

        [Tooltip("Send one report every this many frames.")]
        [Range(1, 120)] [SerializeField] int everyNFrames = 1;
        [Tooltip("Frame-rate target when Application.targetFrameRate is not set (0: none, the model is not paced).")]
        [Min(0)] [SerializeField] int targetFrameRate;
        [Tooltip("Report graphics memory (Profiler.GetAllocatedMemoryForGraphicsDriver, SystemInfo.graphicsMemorySize).")]
        [SerializeField] bool reportMemory = true;

        [System.NonSerialized] IgiSidecar _sidecar;
        [System.NonSerialized] bool _warnedUnpaced;

        /// <summary>The game's own VRAM use in bytes when it knows better than Unity (e.g. from DXGI); null: Unity's figure.</summary>
        public long? OverrideUsed { get; set; }
        /// <summary>VRAM the game and the model may use together, in bytes; null: <c>SystemInfo.graphicsMemorySize</c>.</summary>
        public long? OverrideBudget { get; set; }
        /// <summary>
        /// The CPU threads the game keeps busy now (0..4096), e.g. its main and render threads
        /// plus the job workers that have work; null (the default): not reported. Sent with every
        /// report until changed; the sidecar keeps the last figure it got, so set 0 rather than
        /// null when the game goes idle. Out of range: <see cref="System.ArgumentOutOfRangeException"/>.
        /// </summary>
        public int? BusyThreads
        {
            get { return _busyThreads; }
            set
            {
                string problem = Protocol.GameCpuProblem(value, null);
                if (problem != null) throw new System.ArgumentOutOfRangeException("value", problem);
                _busyThreads = value;
            }
        }

        /// <summary>
        /// The share of the machine's CPU time the game used over its last frames (0..1, e.g.
        /// from the OS's process times over the cores); null (the default): not reported. Sent
        /// with every report until changed; set 0 rather than null when the game goes idle.
        /// Out of range or NaN: <see cref="System.ArgumentOutOfRangeException"/>.
        /// </summary>
        public double? CpuShare
        {
            get { return _cpuShare; }
            set
            {
                string problem = Protocol.GameCpuProblem(null, value);
                if (problem != null) throw new System.ArgumentOutOfRangeException("value", problem);
                _cpuShare = value;
            }
        }

        [System.NonSerialized] int? _busyThreads;
        [System.NonSerialized] double? _cpuShare;

        public int EveryNFrames { get { return everyNFrames; } set { everyNFrames = value < 1 ? 1 : value; } }

        void OnEnable()
        {
            _sidecar = null; // found again in Update (a script reload leaves it empty)
        }

        void Update()
        {
            if (_sidecar == null) _sidecar = IgiSidecar.FindOrCreate();
            if (!_sidecar.IsReady || Time.frameCount % everyNFrames != 0) return;
            IgiClient client = _sidecar.Client;
            // the latest report replaces one not sent yet: a stalled sidecar piles nothing up
            client.ReportFrame(Time.frameCount, FrameTimeMs(), TargetFrameTimeMs(), Used(), Budget(),
                _busyThreads ?? -1, _cpuShare ?? double.NaN);
            // protocol 1.2: only the game's frames pace the engine (the client holding the launch token)
            if (!_warnedUnpaced && !client.IsGame)
            {
                _warnedUnpaced = true;
                Debug.LogWarning("Igi SDK: the sidecar does not take this game's frames as pacing (hello.game is false: it was started elsewhere with a launch token this game does not hold)");
            }
        }

        static double FrameTimeMs()
        {
            // real time, unaffected by Time.timeScale (a paused game still renders frames); the protocol caps it at 10 s
            double ms = Time.unscaledDeltaTime * 1000.0;
            return ms < 0 ? 0 : (ms > 10000 ? 10000 : ms);
        }

        // NaN, -1: not known (left out of the report)
        double TargetFrameTimeMs()
        {
            int fps = Application.targetFrameRate > 0 ? Application.targetFrameRate : targetFrameRate;
            if (fps <= 0) return double.NaN;
            return 1000.0 / fps; // 1 fps at least: within the protocol's (0, 1000] ms
        }

        long Used()
        {
            if (OverrideUsed.HasValue) return OverrideUsed.Value;
            if (!reportMemory) return -1;
#if UNITY_EDITOR || DEVELOPMENT_BUILD
            long bytes = Profiler.GetAllocatedMemoryForGraphicsDriver(); // 0 where the player does not track it
            return bytes > 0 ? bytes : -1;
#else
            return -1; // a release player: Unity does not track it; the sidecar reads the device itself
#endif
        }

        long Budget()
        {
            if (OverrideBudget.HasValue) return OverrideBudget.Value;
            if (!reportMemory) return -1;
            int mb = SystemInfo.graphicsMemorySize; // the card's total: an upper bound, not a budget
            return mb > 0 ? mb * MiB : -1;
        }
    }
}
