using System;

namespace Igi.Sdk
{
    /// <summary>How the client connects and how long it waits. Read once by the constructor.</summary>
    public sealed class IgiClientOptions
    {
        public string Endpoint = "tcp://127.0.0.1:5599";
        /// <summary>hello.engine (≤ 64 characters).</summary>
        public string Engine = "unity";
        /// <summary>hello.client_name (≤ 64 characters), for the sidecar's logs and stats.</summary>
        public string ClientName = "";
        /// <summary>hello.game_pid: the sidecar exits when this process dies (if it launched it;
        /// protocol 1.2: honoured only from the game, see <see cref="LaunchToken"/>).</summary>
        public int? GamePid;
        /// <summary>hello.owner (protocol 1.2): the owner key, a secret of 16..128 characters of
        /// [A-Za-z0-9_-] (<see cref="IgiKeys.New"/> makes one). The sessions this client opens,
        /// restores or adopts belong to it: only a client with the same key sees, lists, opens
        /// over (session_exists) or adopts them, so "open by name; on session_exists, adopt" finds
        /// only the game's own NPC. Keep one for as long as the game wants its NPCs back (a
        /// play-mode restart, a reconnect after a lease lapsed). Null: the sessions belong to this
        /// connection alone. Read at every hello; the constructor refuses a malformed one.</summary>
        public string OwnerKey;
        /// <summary>hello.token (protocol 1.2): the launch token the sidecar was started with
        /// (env var IGI_SDK_TOKEN of its process). The client that holds it is the game: only its
        /// frames pace the engine, only its game_pid is watched, only it may shutdown, and only it
        /// may hold every session slot. A wrong one: hello is refused <c>forbidden</c>. Null: not
        /// the game, unless the sidecar was started without a token (then every client is). Read
        /// at every hello (a launcher that starts a new sidecar sets the new token here before the
        /// client reconnects); the constructor refuses a malformed one.</summary>
        public string LaunchToken;
        /// <summary>The <c>--instance</c> id the expected sidecar was started with: a sidecar whose
        /// hello answers another one (or none) is refused with <see cref="IgiError.WrongSidecar"/>
        /// and never used. Null: any. Read at every hello.</summary>
        public string ExpectedInstance;
        /// <summary>The model file name the sidecar must have loaded (hello's <c>model</c>;
        /// compared by file name). Null: any. A sidecar still loading (model null, loading true)
        /// passes.</summary>
        public string ExpectedModel;
        /// <summary>hello.lease_s (protocol 1.1, 2..3600; a 1.2 sidecar grants at most 300, see
        /// <see cref="IgiServerInfo.LeaseSeconds"/>): silent longer than this, the sidecar forgets
        /// the client and orphans its sessions. The client pings every third of the lease granted.</summary>
        public double LeaseSeconds = 15;
        /// <summary>A request fails with <c>timeout</c> when none of its events came for this long.</summary>
        public double RequestTimeoutSeconds = 15;
        /// <summary>Same for streams (time between two events of one chat; reading a long
        /// prompt on the CPU can take a while before the first token).</summary>
        public double StreamTimeoutSeconds = 60;
        /// <summary>load_model answers when the load ends.</summary>
        public double LoadModelTimeoutSeconds = 600;
        /// <summary>No message at all from the sidecar for this long: it is down
        /// (pending requests fail with <c>unavailable</c>; reconnecting goes on).</summary>
        public double SidecarSilenceSeconds = 5;
        /// <summary>Dispose says goodbye with keep_sessions = this (true: the sessions become
        /// orphaned and a later client with the same <see cref="OwnerKey"/> can adopt them, e.g.
        /// across a play-mode restart).</summary>
        public bool KeepSessionsOnDispose;
        /// <summary>The DEALER's routing id; null: "igi-" + 24 random hex digits per client.
        /// Reconnects keep it, so the sidecar (ROUTER_HANDOVER) keeps this client's sessions.</summary>
        public string RoutingId;
        /// <summary>Makes the transport; default: the managed ZMTP DEALER (<see cref="ZmtpDealer"/>).</summary>
        public Func<IIgiTransport> TransportFactory;
    }

    /// <summary>open_session.sampling; null fields are left to the sidecar's defaults.</summary>
    public sealed class SamplingOptions
    {
        public double? Temperature;   // 0..5 (0.7; 0 = greedy)
        public double? TopP;          // (0, 1] (0.95)
        public int? TopK;             // 0..100000 (40; 0 = off)
        public double? MinP;          // 0..1 (0.05)
        public double? RepeatPenalty; // 0.5..3 (1.1)
        public long? Seed;            // 0..2^32-1 (0)
    }

    /// <summary>open_session fields; null fields are left out.</summary>
    public sealed class SessionOptions
    {
        public string SystemPrompt;
        public string Persona;
        public SamplingOptions Sampling;
        public int? Priority;  // -100..100, higher decodes first
        /// <summary>Protocol 1.1: a stable session id such as "npc.brom" ([A-Za-z0-9_.-], 1-128).</summary>
        public string Name;
    }

    /// <summary>chat fields besides session and text; null fields are left out.</summary>
    public sealed class ChatOptions
    {
        public int? MaxTokens;     // 1..4096 (256)
        public string[] Stop;      // ≤ 8 strings of 1-64 characters
        public string Grammar;     // GBNF, root rule `root`
        /// <summary>A JSON Schema as JSON text (protocol 1.1 json_schema_string): the sidecar
        /// parses it, so the engine needs no JSON tree.</summary>
        public string JsonSchema;
        /// <summary>Protocol 1.1 feature images: up to 4 images the NPC sees with this line
        /// (the model needs its vision projector). A <c>&lt;__media__&gt;</c> in the text places
        /// each, in order; without markers they go before the text.</summary>
        public IgiImage[] Images;
        /// <summary>Protocol 1.3 feature tools: the actions the NPC may take with this reply
        /// (at most 32; see <see cref="NpcAction"/>). Each call comes as an
        /// <see cref="ActionCall"/> (<see cref="IgiStream.OnAction"/>) and in done's tool_calls.</summary>
        public NpcAction[] Tools;
        /// <summary>tool_choice: <see cref="ActionChoice.Auto"/> (null), <see cref="ActionChoice.None"/>,
        /// <see cref="ActionChoice.Required"/>, or a declared action's name (exactly that one).</summary>
        public string ToolChoice;
        /// <summary>parallel_tool_calls: false, at most one call per reply; true (null), up to 8.</summary>
        public bool? ParallelToolCalls;
        /// <summary>tool_results: what came of the previous reply's calls (at most 16); the
        /// reply continues from them (the line's text may then be "").</summary>
        public ActionResult[] ToolResults;
    }
}
