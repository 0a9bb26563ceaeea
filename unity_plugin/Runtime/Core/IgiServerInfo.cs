using System.Collections.Generic;

namespace Igi.Sdk
{
    /// <summary>What the sidecar said in its answer to hello.</summary>
    public sealed class IgiServerInfo
    {
        public int Protocol;
        /// <summary>0 for a 1.0 sidecar.</summary>
        public int Minor;
        public string Model;
        public bool Loading;
        /// <summary>The lease in force (0 for a 1.0 sidecar, which has none).</summary>
        public double LeaseSeconds;
        public readonly List<string> Features = new List<string>();
        public long MaxMessageBytes = Igi.Sdk.Protocol.MaxMessageBytes;
        public long MaxTextChars = 32000;
        public long MaxTokens = 4096;
        /// <summary>This client's cap (protocol 1.2: a client that is not the game gets half the slots).</summary>
        public long MaxSessionsPerClient = 8;
        /// <summary>Protocol 1.2 hello.game: this client holds the launch token, or the sidecar has
        /// none. True for an older sidecar, where every client may pace, shutdown and so on.</summary>
        public bool IsGame = true;
        /// <summary>Protocol 1.2 hello.owner: "key" (sessions belong to the owner key) or
        /// "connection" (to this connection alone: no key was given, or the sidecar is older).</summary>
        public string OwnerScope = "connection";
        public long MaxStreamsPerClient = 4;
        /// <summary>The whole ok body, for fields this version does not know.</summary>
        public Dictionary<string, object> Raw;
        /// <summary>hello.instance: the instance id the sidecar was started with
        /// (<c>--instance</c>); null when none (or an older sidecar).</summary>
        public string Instance;

        public bool HasFeature(string feature) { return Features.Contains(feature); }

        /// <summary>The first of <paramref name="features"/> (names separated by spaces) this
        /// sidecar does not offer; null when it offers them all.</summary>
        public string MissingFeature(string features)
        {
            foreach (string feature in features.Split(' '))
                if (feature.Length > 0 && !Features.Contains(feature)) return feature;
            return null;
        }

        public static IgiServerInfo FromHello(Dictionary<string, object> body)
        {
            var info = new IgiServerInfo();
            info.Raw = body;
            info.Protocol = (int)MsgValue.GetLong(body, "protocol", 1);
            info.Minor = (int)MsgValue.GetLong(body, "minor", 0);
            info.Model = MsgValue.GetString(body, "model");
            info.Instance = MsgValue.GetString(body, "instance");
            info.Loading = MsgValue.GetBool(body, "loading");
            info.LeaseSeconds = MsgValue.GetDouble(body, "lease_s", 0);
            info.IsGame = MsgValue.GetBool(body, "game", true);
            info.OwnerScope = MsgValue.GetString(body, "owner") ?? "connection";
            info.Features.AddRange(MsgValue.GetStrings(body, "features"));
            var limits = MsgValue.GetMap(body, "limits");
            info.MaxMessageBytes = MsgValue.GetLong(limits, "max_message_bytes", info.MaxMessageBytes);
            info.MaxTextChars = MsgValue.GetLong(limits, "max_text_chars", info.MaxTextChars);
            info.MaxTokens = MsgValue.GetLong(limits, "max_tokens", info.MaxTokens);
            info.MaxSessionsPerClient = MsgValue.GetLong(limits, "max_sessions_per_client", info.MaxSessionsPerClient);
            info.MaxStreamsPerClient = MsgValue.GetLong(limits, "max_streams_per_client", info.MaxStreamsPerClient);
            return info;
        }
    }

    /// <summary>Feature names a 1.1 sidecar lists in hello's ok.</summary>
    public static class IgiFeatures
    {
        public const string Goodbye = "goodbye";
        public const string Leases = "leases";
        public const string ListSessions = "list_sessions";
        public const string AdoptSession = "adopt_session";
        public const string SetPriority = "set_priority";
        public const string ResumeStream = "resume_stream";
        public const string JsonSchemaString = "json_schema_string";
        public const string SessionNames = "session_names";
        /// <summary>chat.images (<see cref="ChatOptions.Images"/>) and load_model.mmproj.</summary>
        public const string Images = "images";
        /// <summary>Protocol 1.2: hello.owner, sessions scoped to owner keys.</summary>
        public const string Owners = "owners";
        /// <summary>Protocol 1.2: hello.token, the launch token that makes a client the game.</summary>
        public const string LaunchToken = "launch_token";
        /// <summary>Protocol 1.3: chat.tools, tool_choice, parallel_tool_calls, tool_results,
        /// <c>tool_call</c> events (NPC actions: <see cref="NpcAction"/>).</summary>
        public const string Tools = "tools";
    }

    public enum IgiConnectionState
    {
        /// <summary>Connecting, or connected and waiting for hello's answer.</summary>
        Connecting,
        /// <summary>hello answered: requests flow.</summary>
        Ready,
        /// <summary>The sidecar has been silent for 5 s; reconnecting goes on.</summary>
        Unavailable,
        /// <summary>Disposed.</summary>
        Closed,
    }
}
