using System.Collections.Generic;

namespace Igi.Sdk
{
    /// <summary>The envelope {v, id, type, body} (PROTOCOL.md §2) and text rules.</summary>
    public static class Protocol
    {
        public const int Version = 1;
        public const int Minor = 3;
        public const long MaxId = 9007199254740991L; // 2^53 - 1
        /// <summary>The largest message the sidecar reads (PROTOCOL.md §7: one 16 MiB image and
        /// 1 MiB for the rest of a chat); hello's limits.max_message_bytes says it again.</summary>
        public const long MaxMessageBytes = (16L << 20) + (1L << 20);
        /// <summary>The longest msgpack str (UTF-8 bytes) the sidecar reads; a longer one makes
        /// the whole message unreadable (answered <c>malformed</c>, id 0, never tied to its request).</summary>
        public const int MaxStrBytes = 1 << 20;
        /// <summary>The most CPU threads a <c>frame</c> report may say the game keeps busy.</summary>
        public const int MaxBusyThreads = 4096;

        /// <summary>Why a <c>frame</c> report's CPU figures break the protocol's ranges
        /// (busy_threads 0..4096, cpu_share 0..1); null when they do not. Null
        /// <paramref name="busyThreads"/> or <paramref name="cpuShare"/>: not reported.</summary>
        public static string GameCpuProblem(int? busyThreads, double? cpuShare)
        {
            if (busyThreads.HasValue && (busyThreads.Value < 0 || busyThreads.Value > MaxBusyThreads))
                return "busy_threads " + busyThreads.Value + " is outside 0.." + MaxBusyThreads;
            // NaN fails both comparisons: refused too (the sidecar reads no NaN)
            if (cpuShare.HasValue && !(cpuShare.Value >= 0.0 && cpuShare.Value <= 1.0))
                return "cpu_share " + cpuShare.Value.ToString(System.Globalization.CultureInfo.InvariantCulture) +
                    " is outside 0..1";
            return null;
        }

        public static byte[] Encode(long id, string type, Dictionary<string, object> body)
        {
            var envelope = new Dictionary<string, object>(4);
            envelope["v"] = (long)Version;
            envelope["id"] = id;
            envelope["type"] = type;
            envelope["body"] = body ?? new Dictionary<string, object>();
            return MsgPack.Encode(envelope);
        }

        /// <summary>Reads a reply; false for anything that is not a well-formed envelope
        /// (such a message is dropped: it cannot be tied to a request).</summary>
        public static bool TryDecode(byte[] message, out long id, out string type, out Dictionary<string, object> body)
        {
            id = 0;
            type = null;
            body = null;
            object value;
            string error;
            if (!MsgPack.TryDecode(message, out value, out error)) return false;
            var envelope = value as Dictionary<string, object>;
            if (envelope == null) return false;
            if (MsgValue.GetLong(envelope, "v", -1) != Version) return false;
            object rawId = MsgValue.Get(envelope, "id");
            if (!(rawId is long)) return false;
            id = (long)rawId;
            type = MsgValue.GetString(envelope, "type");
            if (type == null) return false;
            body = MsgValue.GetMap(envelope, "body") ?? new Dictionary<string, object>();
            return true;
        }

        /// <summary>Length in Unicode code points, as the sidecar counts it (a surrogate pair is one).</summary>
        public static int CodePoints(string s)
        {
            if (s == null) return 0;
            int n = s.Length;
            for (int i = 0; i + 1 < s.Length; i++)
            {
                if (char.IsHighSurrogate(s[i]) && char.IsLowSurrogate(s[i + 1]))
                {
                    n--;
                    i++;
                }
            }
            return n;
        }
    }
}
