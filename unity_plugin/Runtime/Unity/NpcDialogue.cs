using System;
using System.Collections.Generic;
using System.Threading.Tasks;
using UnityEngine;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// One NPC's conversation with the player. The session has a stable name
    /// (<c>npc.&lt;name&gt;</c>): after a play-mode restart the NPC adopts the session it left
    /// orphaned, so the conversation goes on; otherwise it opens a new one. Every event is raised
    /// on the main thread, from <see cref="IgiSidecar"/>'s Update.
    /// </summary>
    [AddComponentMenu("Igi SDK/NPC Dialogue")]
    public sealed partial class NpcDialogue : MonoBehaviour
    {
        // a restore goes into the other name of the pair, so a failed restore leaves the
        // current conversation untouched; both names are found again after a restart
        const string AlternateSuffix = ".b";
        const int MaxBaseNameLength = 128 - 2;
        const float RetryEverySeconds = 2f;

        [Header("Character")]
        [Tooltip("The NPC's name. With an empty system prompt the sidecar says \"You are <persona>.\"")]
        [SerializeField] string persona = "";
        [Tooltip("Who the NPC is and how it talks. Used when the session is opened (an adopted session keeps its own).")]
        [TextArea(3, 12)] [SerializeField] string systemPrompt = "";
        [Tooltip("Stable session id, kept across play-mode restarts ([A-Za-z0-9_.-]). Empty: npc.<GameObject name>.")]
        [SerializeField] string sessionName = "";
        [SerializeField] NpcSampling sampling = new NpcSampling();

        [Header("Replies")]
        [Range(1, 4096)] [SerializeField] int maxTokens = 256;
        [Tooltip("The reply ends at any of these (at most 8, 1-64 characters each); they are not shown.")]
        [SerializeField] string[] stopStrings = new string[0];
        [Tooltip("Constrains every reply to this GBNF grammar (root rule `root`). Empty: free text.")]
        [TextArea(2, 12)] [SerializeField] string grammar = "";
        [Tooltip("Constrains every reply to JSON matching this JSON Schema (as JSON text; the sidecar converts it). Empty: free text. Wins over Grammar when both are set.")]
        [TextArea(2, 12)] [SerializeField] string jsonSchema = "";

        [Header("Priority")]
        [Tooltip("The player looks at this NPC: its replies are decoded first.")]
        [SerializeField] bool facingPlayer;
        [Range(-100, 100)] [SerializeField] int priority;
        [Range(-100, 100)] [SerializeField] int facingPriority = 50;

        [Header("Lifetime")]
        [Tooltip("On destroy, leave the session open for the next NpcDialogue of the same name (scene reloads, pooled NPCs).")]
        [SerializeField] bool keepSessionOnDestroy;

        [Header("Events")]
        [SerializeField] TextEvent tokenReceived = new TextEvent();
        [SerializeField] TextEvent replyFinished = new TextEvent();
        [SerializeField] ErrorEvent errorRaised = new ErrorEvent();

        /// <summary>Each streamed piece of the reply, in order.</summary>
        public event Action<string> OnToken;
        /// <summary>The whole reply once it ended (also when cancelled: the text said so far).</summary>
        public event Action<string> OnReply;
        /// <summary>A failure: a stable code (the sidecar's, or <c>session_lost</c>, <c>not_ready</c>, ...) and a message for humans.</summary>
        public event Action<string, string> OnError;

        static readonly Dictionary<string, NpcDialogue> Claims = new Dictionary<string, NpcDialogue>();

        // Runtime state: never serialized, so a script reload in play mode leaves a fresh
        // component that claims its name and finds its session again (OnEnable).
        [NonSerialized] IgiSidecar _sidecar;
        [NonSerialized] string _baseName;
        [NonSerialized] bool _claimed;
        [NonSerialized] string _session;
        [NonSerialized] bool _hadSession;
        [NonSerialized] int _acquireGeneration;
        [NonSerialized] bool _acquiring;
        [NonSerialized] int _seenReadyCount;
        [NonSerialized] float _retryAt = -1f;
        [NonSerialized] float _retryUntil = -1f;
        [NonSerialized] IgiStream _stream;
        [NonSerialized] bool _restoring;
        [NonSerialized] IgiRequest _closing; // the session a restore replaced, being closed
        [NonSerialized] string _pendingLine;
        [NonSerialized] IgiImage[] _pendingImages;
        [NonSerialized] int? _priorityOverride;
        [NonSerialized] int _sentPriority = int.MinValue;
        [NonSerialized] bool _destroyed;
        [NonSerialized] bool _claimPending;

        // ---- state ------------------------------------------------------------------------------

        /// <summary>The session's id while there is one (the stable name, or its alternate after a restore).</summary>
        public string SessionId { get { return _session; } }
        /// <summary>The stable session name this NPC uses.</summary>
        public string SessionName { get { return _baseName ?? ResolveName(); } }
        public bool IsReady { get { return _session != null && _sidecar != null && _sidecar.IsReady; } }
        public bool IsReplying { get { return _stream != null && !_stream.IsDone; } }
        /// <summary>The reply so far while streaming; the last reply afterwards.</summary>
        public string CurrentReply { get { return _stream != null ? _stream.Text : LastReply ?? ""; } }
        public string LastReply { get; private set; }
        /// <summary>stop, stop_string, length or cancelled.</summary>
        public string LastFinishReason { get; private set; }

        // ---- settings, for NPCs built from code (before Start) --------------------------------

        public string Persona { get { return persona; } set { persona = value ?? ""; } }
        public string SystemPrompt { get { return systemPrompt; } set { systemPrompt = value ?? ""; } }
        public string SessionNameSetting { get { return sessionName; } set { sessionName = value ?? ""; } }
        public NpcSampling Sampling { get { return sampling; } }
        /// <summary>GBNF grammar for the replies (root rule <c>root</c>); empty: none.</summary>
        public string Grammar { get { return grammar; } set { grammar = value ?? ""; } }
        /// <summary>JSON Schema (JSON text) the replies must match, e.g. for an NPC that answers
        /// {"mood": ..., "line": ...}; empty: none. Needs a sidecar with json_schema_string (1.1).</summary>
        public string JsonSchema { get { return jsonSchema; } set { jsonSchema = value ?? ""; } }
        public int MaxTokens { get { return maxTokens; } set { maxTokens = Math.Max(1, Math.Min(4096, value)); } }
        /// <summary>The reply ends at any of these (at most 8, 1-64 characters each; empty ones
        /// are skipped); they are not shown. A copy: set the whole array.</summary>
        public string[] StopStrings
        {
            get { return stopStrings != null ? (string[])stopStrings.Clone() : new string[0]; }
            set { stopStrings = value != null ? (string[])value.Clone() : new string[0]; }
        }
        public bool KeepSessionOnDestroy { get { return keepSessionOnDestroy; } set { keepSessionOnDestroy = value; } }
        public TextEvent TokenReceived { get { return tokenReceived; } }
        public TextEvent ReplyFinished { get { return replyFinished; } }
        public ErrorEvent ErrorRaised { get { return errorRaised; } }

        /// <summary>The player looks at this NPC: its session gets <c>facingPriority</c>.</summary>
        public bool FacingPlayer { get { return facingPlayer; } set { facingPlayer = value; } }

        int DesiredPriority
        {
            get { return _priorityOverride ?? (facingPlayer ? facingPriority : priority); }
        }

        IgiClient Client { get { return _sidecar != null ? _sidecar.Client : null; } }

        bool SidecarSpeaks11
        {
            get { return Client != null && Client.Server != null && Client.Server.Minor >= 1; }
        }

        [RuntimeInitializeOnLoadMethod(RuntimeInitializeLoadType.SubsystemRegistration)]
        static void ResetStatics() { Claims.Clear(); }

        // ---- lifecycle --------------------------------------------------------------------------

        // Awake is followed by OnEnable, and so is a script reload in play mode (runtime fields
        // empty, the name claims cleared): claim the name in the next Update either way
        void OnEnable()
        {
            if (!_claimed) _claimPending = true;
        }

        void Start()
        {
            if (!_claimed) Claim();
        }

        void Claim()
        {
            _claimPending = false;
            _sidecar = IgiSidecar.FindOrCreate();
            _baseName = ResolveName();
            NpcDialogue holder;
            if (Claims.TryGetValue(_baseName, out holder) && holder != null && holder != this && !holder._destroyed)
            {
                RaiseError("session_exists", "another NpcDialogue ('" + holder.name + "') uses the session name " + _baseName);
                return;
            }
            Claims[_baseName] = this;
            _claimed = true;
        }

        void Update()
        {
            if (_claimPending && !_destroyed) Claim();
            if (!_claimed || _sidecar == null || !_sidecar.IsReady) return;
            if (_sidecar.ReadyCount != _seenReadyCount)
            {
                // a new connection (first start, reconnect, restarted sidecar): find the session again
                _seenReadyCount = _sidecar.ReadyCount;
                Acquire();
            }
            else if (_retryAt >= 0f && Time.realtimeSinceStartup >= _retryAt)
            {
                _retryAt = -1f;
                Acquire();
            }
            ApplyPriority();
        }

        void OnDestroy()
        {
            _destroyed = true;
            _acquireGeneration++; // answers still on their way find nobody
            NpcDialogue holder;
            if (_claimed && Claims.TryGetValue(_baseName, out holder) && holder == this) Claims.Remove(_baseName);
            // quitting: the sidecar's goodbye closes (player) or orphans (Editor) every session at once
            if (IgiSidecar.IsQuitting || Client == null || !_sidecar.IsReady) return;
            if (IsReplying) Client.Cancel(_stream);
            if (!keepSessionOnDestroy && _session != null) Client.CloseSession(_session);
        }

        // ---- the game's calls -------------------------------------------------------------------

        /// <summary>
        /// Sends the player's line; the reply streams through <see cref="OnToken"/> and ends with
        /// <see cref="OnReply"/> or <see cref="OnError"/>. Before the session is ready the line
        /// waits and is sent then. False (and <c>session_busy</c>) while the NPC still replies.
        /// </summary>
        public bool Say(string playerLine)
        {
            return Say(playerLine, null);
        }

        /// <summary>
        /// <see cref="Say(string)"/> with what the NPC sees (up to 4 images; the sidecar's model
        /// needs its vision projector, else <see cref="OnError"/> gets <c>vision_unavailable</c>).
        /// Unity's pixel rows run bottom to top: <c>IgiImage.FromRgba32(texture.GetRawTextureData(),
        /// w, h)</c> flips them; <c>IgiImage.FromEncoded(texture.EncodeToPNG())</c> needs nothing.
        /// </summary>
        public bool Say(string playerLine, params IgiImage[] images)
        {
            if (string.IsNullOrEmpty(playerLine) || _destroyed) return false;
            if (IsReplying || _restoring)
            {
                RaiseError("session_busy", _baseName + " is still replying: Cancel() first, or wait for OnReply");
                return false;
            }
            if (!IsReady)
            {
                _pendingLine = playerLine;
                _pendingImages = images;
                if (_claimed && !_acquiring && _sidecar != null && _sidecar.IsReady) Acquire();
                return true;
            }
            var chat = LineOptions();
            if (images != null && images.Length > 0) chat.Images = images;
            AddActions(chat, actionChoice);
            Follow(Client.Chat(_session, playerLine, chat), chat);
            return true;
        }

        // the options every line is sent with (a follow-up to action results too)
        ChatOptions LineOptions()
        {
            var chat = new ChatOptions { MaxTokens = maxTokens };
            var stops = NonEmpty(stopStrings);
            if (stops.Length > 0) chat.Stop = stops;
            if (!string.IsNullOrEmpty(jsonSchema)) chat.JsonSchema = jsonSchema;
            else if (!string.IsNullOrEmpty(grammar)) chat.Grammar = grammar;
            return chat;
        }

        // the reply's events become the component's (the stream is the NPC's current reply)
        void Follow(IgiStream stream, ChatOptions chat)
        {
            _stream = stream;
            BeginReply(stream, chat);
            stream.OnToken(piece => { if (!_destroyed) RaiseToken(piece); })
                .OnAction(call => { if (!_destroyed) RaiseAction(call); })
                .OnDone(done =>
                {
                    if (_destroyed) return;
                    LastReply = done.Text;
                    LastFinishReason = done.FinishReason;
                    EndReply(done);
                    RaiseReply(done.Text);
                    SendAnswersIfComplete();
                })
                .OnError(error =>
                {
                    if (_destroyed) return;
                    LastReply = stream.Text;
                    LastFinishReason = "error";
                    if (error.Code == "unknown_session") _session = null; // gone (closed by a load_model): open again on the next Say
                    RaiseError(error.Code, error.Message);
                });
        }

        /// <summary>Stops the reply (the player walked away). It still ends with OnReply, holding the text said so far.</summary>
        public void Cancel()
        {
            _pendingLine = null;
            _pendingImages = null;
            if (IsReplying && Client != null) Client.Cancel(_stream);
        }

        /// <summary>Saves the conversation as <paramref name="saveName"/> (letters, digits, <c>._-</c>). Completes on the main thread.</summary>
        public Task<bool> SaveTo(string saveName)
        {
            var result = new TaskCompletionSource<bool>();
            if (!CanChangeSession(result)) return result.Task;
            Client.SaveSession(_session, saveName).OnCompleted(request => Finish(result, request));
            return result.Task;
        }

        /// <summary>
        /// Replaces the conversation with the one saved as <paramref name="saveName"/>. If the
        /// restore fails (no such save, another model) the current conversation stays.
        /// </summary>
        public Task<bool> RestoreFrom(string saveName)
        {
            var result = new TaskCompletionSource<bool>();
            if (!CanChangeSession(result)) return result.Task;
            _restoring = true;
            // the name we restore into may be the one the last restore is still closing
            if (_closing != null && !_closing.IsDone) _closing.OnCompleted(closed => SendRestore(saveName, result));
            else SendRestore(saveName, result);
            return result.Task;
        }

        void SendRestore(string saveName, TaskCompletionSource<bool> result)
        {
            string target = _session == _baseName ? _baseName + AlternateSuffix : _baseName;
            string previous = _session;
            int generation = _acquireGeneration;
            // 1.1: the restored session takes a name of ours (a 1.0 sidecar picks a random id)
            Client.RestoreSession(saveName ?? "", SidecarSpeaks11 ? target : null).OnCompleted(request =>
            {
                _restoring = false;
                if (_destroyed || generation != _acquireGeneration) { result.TrySetResult(false); return; }
                if (!request.Succeeded) { Finish(result, request); return; }
                string restored = request.Session ?? target;
                if (previous != null && previous != restored) _closing = Client.CloseSession(previous);
                _session = restored;
                _sentPriority = int.MinValue; // the save carries its own priority: send ours
                LastReply = null;
                result.TrySetResult(true);
            });
        }

        /// <summary>Sets the session's priority (-100..100) until <see cref="ClearPriority"/>; higher decodes first.</summary>
        public void SetPriority(int value)
        {
            _priorityOverride = Math.Max(-100, Math.Min(100, value));
            ApplyPriority();
        }

        /// <summary>Back to the Inspector's priority (and <see cref="FacingPlayer"/>).</summary>
        public void ClearPriority()
        {
            _priorityOverride = null;
            ApplyPriority();
        }

        bool CanChangeSession(TaskCompletionSource<bool> result)
        {
            string code = null, message = null;
            if (!IsReady) { code = "not_ready"; message = _baseName + " has no session yet (the sidecar is starting, or the session is being opened)"; }
            else if (IsReplying || _restoring) { code = "session_busy"; message = _baseName + " is replying: Cancel() first, or wait for OnReply"; }
            if (code == null) return true;
            RaiseError(code, message);
            result.TrySetResult(false);
            return false;
        }

        void Finish(TaskCompletionSource<bool> result, IgiRequest request)
        {
            if (!request.Succeeded && !_destroyed) RaiseError(request.Error.Code, request.Error.Message);
            result.TrySetResult(request.Succeeded);
        }

        void ApplyPriority()
        {
            int wanted = DesiredPriority;
            if (!IsReady || wanted == _sentPriority) return;
            _sentPriority = wanted;
            // a 1.0 sidecar only takes the priority at open_session
            if (Client.Server != null && Client.Server.HasFeature(IgiFeatures.SetPriority))
                Client.SetPriority(_session, wanted);
        }

        static string[] NonEmpty(string[] values)
        {
            var kept = new List<string>();
            if (values != null)
                foreach (string value in values)
                    if (!string.IsNullOrEmpty(value)) kept.Add(value);
            return kept.ToArray();
        }

        // ---- events (a listener's exception is logged, never breaks the pump) ----------------

        void RaiseToken(string piece)
        {
            try
            {
                var handler = OnToken;
                if (handler != null) handler(piece);
                tokenReceived.Invoke(piece);
            }
            catch (Exception e) { Debug.LogException(e); }
        }

        void RaiseReply(string text)
        {
            try
            {
                var handler = OnReply;
                if (handler != null) handler(text);
                replyFinished.Invoke(text);
            }
            catch (Exception e) { Debug.LogException(e); }
        }

        void RaiseError(string code, string message)
        {
            try
            {
                var handler = OnError;
                if (handler != null) handler(code, message);
                else Debug.LogWarning("Igi SDK: " + name + ": " + code + ": " + message);
                errorRaised.Invoke(code, message);
            }
            catch (Exception e) { Debug.LogException(e); }
        }
    }
}
