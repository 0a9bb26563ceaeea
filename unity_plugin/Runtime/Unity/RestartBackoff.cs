using System;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// Delays between sidecar restarts: doubling from <see cref="MinSeconds"/> up to
    /// <see cref="MaxSeconds"/>, back to the minimum once a start has stayed up for
    /// <see cref="StableSeconds"/>. A sidecar that crashes at start (a bad model path) then costs
    /// one attempt per half minute, not a busy loop.
    /// </summary>
    public sealed class RestartBackoff
    {
        public float MinSeconds = 1f;
        public float MaxSeconds = 30f;
        public float StableSeconds = 60f;

        int _failures;

        public int Failures { get { return _failures; } }

        /// <summary>The wait before the next start, counting this failure.</summary>
        public float NextDelay()
        {
            float delay = MinSeconds * (float)Math.Pow(2, Math.Min(_failures, 16));
            _failures++;
            return Math.Min(delay, MaxSeconds);
        }

        /// <summary>Call when a sidecar ended after running <paramref name="upSeconds"/>.</summary>
        public void Ended(float upSeconds)
        {
            if (upSeconds >= StableSeconds) _failures = 0;
        }

        public void Reset() { _failures = 0; }
    }
}
