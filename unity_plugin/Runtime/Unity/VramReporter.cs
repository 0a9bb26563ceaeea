using UnityEngine;
using UnityEngine.Profiling;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// Tells the sidecar, every N frames, how long frames take and how much graphics memory the
    /// game uses, so its VRAM arbiter moves the model out of the game's way and paces decoding
    /// to the frame-time target. Figures Unity does not know are left out, never guessed.
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

        IgiSidecar _sidecar;
        bool _inFlight;
        bool _warnedUnpaced;

        /// <summary>The game's own VRAM use in bytes when it knows better than Unity (e.g. from DXGI); null: Unity's figure.</summary>
        public long? OverrideUsed { get; set; }
        /// <summary>VRAM the game and the model may use together, in bytes; null: <c>SystemInfo.graphicsMemorySize</c>.</summary>
        public long? OverrideBudget { get; set; }
        public int EveryNFrames { get { return everyNFrames; } set { everyNFrames = value < 1 ? 1 : value; } }

        void Start()
        {
            _sidecar = IgiSidecar.FindOrCreate();
        }

        void Update()
        {
            if (_sidecar == null || !_sidecar.IsReady || Time.frameCount % everyNFrames != 0) return;
            // one report at a time: a stalled sidecar must not pile up frames in the queue
            if (_inFlight) return;
            _inFlight = true;
            _sidecar.Client.Frame(Time.frameCount, FrameTimeMs(), TargetFrameTimeMs(), Used(), Budget())
                .OnCompleted(request =>
                {
                    _inFlight = false;
                    // protocol 1.2: only the game's frames pace the engine (the client holding the launch token)
                    if (request.Succeeded && !request.GetBool("paced", true) && !_warnedUnpaced)
                    {
                        _warnedUnpaced = true;
                        Debug.LogWarning("Igi SDK: the sidecar does not take this game's frames as pacing (hello.game is false: it was started elsewhere with a launch token this game does not hold)");
                    }
                });
        }

        static double FrameTimeMs()
        {
            // real time, unaffected by Time.timeScale (a paused game still renders frames); the protocol caps it at 10 s
            double ms = Time.unscaledDeltaTime * 1000.0;
            return ms < 0 ? 0 : (ms > 10000 ? 10000 : ms);
        }

        double? TargetFrameTimeMs()
        {
            int fps = Application.targetFrameRate > 0 ? Application.targetFrameRate : targetFrameRate;
            if (fps <= 0) return null;
            return 1000.0 / fps; // 1 fps at least: within the protocol's (0, 1000] ms
        }

        long? Used()
        {
            if (OverrideUsed.HasValue) return OverrideUsed;
            if (!reportMemory) return null;
            long bytes = Profiler.GetAllocatedMemoryForGraphicsDriver(); // 0 where the player does not track it
            return bytes > 0 ? bytes : (long?)null;
        }

        long? Budget()
        {
            if (OverrideBudget.HasValue) return OverrideBudget;
            if (!reportMemory) return null;
            int mb = SystemInfo.graphicsMemorySize;
            return mb > 0 ? mb * MiB : (long?)null;
        }
    }
}
