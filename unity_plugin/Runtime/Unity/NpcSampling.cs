using System;
using UnityEngine;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// Sampling of an NPC's replies, edited in the Inspector. Ranges are the protocol's
    /// (PROTOCOL.md, open_session); the defaults are the sidecar's.
    /// </summary>
    [Serializable]
    public sealed class NpcSampling
    {
        [Tooltip("0 = always the most likely token (greedy); higher = more varied replies")]
        [Range(0f, 5f)] public float temperature = 0.7f;

        [Tooltip("Keep the smallest set of tokens whose probabilities add up to this")]
        [Range(0.01f, 1f)] public float topP = 0.95f;

        [Tooltip("Keep the K most likely tokens (0 = off)")]
        [Range(0, 1000)] public int topK = 40;

        [Tooltip("Drop tokens less likely than this fraction of the most likely one")]
        [Range(0f, 1f)] public float minP = 0.05f;

        [Tooltip("Above 1 discourages repeating recent tokens")]
        [Range(0.5f, 3f)] public float repeatPenalty = 1.1f;

        [Tooltip("Random seed (same seed, same line, same reply on the same machine)")]
        [Min(0)] public int seed;

        /// <summary>The core client's sampling options (sent as open_session.sampling).</summary>
        public SamplingOptions ToOptions()
        {
            return new SamplingOptions
            {
                Temperature = Round(temperature),
                TopP = Round(Math.Max(topP, 0.01f)),
                TopK = Math.Max(topK, 0),
                MinP = Round(minP),
                RepeatPenalty = Round(repeatPenalty),
                Seed = Math.Max(seed, 0),
            };
        }

        // 0.7f as a double is 0.699999988...: send the decimal the Inspector shows
        static double Round(float value)
        {
            return Math.Round((double)value, 4);
        }
    }
}
