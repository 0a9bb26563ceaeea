using System;
using System.Collections.Generic;
using System.Text;

namespace Igi.Sdk
{
    public enum IgiRequestState { Pending, Succeeded, Failed }

    /// <summary>
    /// The handle of one request. It is returned at once; its outcome arrives through
    /// <see cref="IgiClient.Pump"/> on the thread that pumps, where the callbacks run.
    /// A callback added after the outcome runs at once.
    /// </summary>
    public class IgiRequest
    {
        public readonly long Id;
        public readonly string Type;
        public IgiRequestState State { get; private set; }
        public bool IsDone { get { return State != IgiRequestState.Pending; } }
        public bool Succeeded { get { return State == IgiRequestState.Succeeded; } }
        /// <summary>The ok body (for a chat: the done body); null until it succeeded.</summary>
        public Dictionary<string, object> Result { get; private set; }
        /// <summary>Set when it failed.</summary>
        public IgiError Error { get; private set; }
        /// <summary>Seconds without any event of this request before it fails with
        /// <c>timeout</c>; the clock restarts with every event. May be changed while pending
        /// (on the thread that pumps): the wait under way is lengthened or shortened too.</summary>
        public double TimeoutSeconds
        {
            get { return timeoutSeconds; }
            set
            {
                DeadlineAt += value - timeoutSeconds;
                timeoutSeconds = value;
            }
        }

        double timeoutSeconds;

        internal double DeadlineAt; // client clock seconds, set by the client

        Action<Dictionary<string, object>> okCallbacks;
        Action<IgiError> errorCallbacks;
        Action<IgiRequest> completedCallbacks;

        internal IgiRequest(long id, string type, double timeoutSeconds)
        {
            Id = id;
            Type = type;
            this.timeoutSeconds = timeoutSeconds;
        }

        /// <summary>Runs once with the ok body.</summary>
        public IgiRequest OnOk(Action<Dictionary<string, object>> callback)
        {
            if (State == IgiRequestState.Succeeded) callback(Result);
            else if (State == IgiRequestState.Pending) okCallbacks += callback;
            return this;
        }

        /// <summary>Runs once with the error.</summary>
        public IgiRequest OnError(Action<IgiError> callback)
        {
            if (State == IgiRequestState.Failed) callback(Error);
            else if (State == IgiRequestState.Pending) errorCallbacks += callback;
            return this;
        }

        /// <summary>Runs once, whichever way it ends.</summary>
        public IgiRequest OnCompleted(Action<IgiRequest> callback)
        {
            if (IsDone) callback(this);
            else completedCallbacks += callback;
            return this;
        }

        // ---- reads of the result (fallbacks when absent) ----------------------------------

        public string GetString(string key, string fallback = null) { return MsgValue.GetString(Result, key, fallback); }
        public long GetLong(string key, long fallback = 0) { return MsgValue.GetLong(Result, key, fallback); }
        public double GetDouble(string key, double fallback = 0) { return MsgValue.GetDouble(Result, key, fallback); }
        public bool GetBool(string key, bool fallback = false) { return MsgValue.GetBool(Result, key, fallback); }
        /// <summary>The session id of an open_session/restore_session/adopt_session answer.</summary>
        public string Session { get { return GetString("session"); } }
        /// <summary>Fields the 1.1 sidecar ignored (unknown to it), e.g. "sampling.x".</summary>
        public List<string> Ignored { get { return MsgValue.GetStrings(Result, "ignored"); } }

        // ---- completion (client side) -------------------------------------------------------

        internal virtual void Succeed(Dictionary<string, object> body)
        {
            if (IsDone) return;
            Result = body ?? new Dictionary<string, object>();
            State = IgiRequestState.Succeeded;
            var ok = okCallbacks;
            var completed = completedCallbacks;
            ClearCallbacks();
            if (ok != null) ok(Result);
            if (completed != null) completed(this);
        }

        internal virtual void Fail(IgiError error)
        {
            if (IsDone) return;
            Error = error;
            State = IgiRequestState.Failed;
            var failed = errorCallbacks;
            var completed = completedCallbacks;
            ClearCallbacks();
            if (failed != null) failed(error);
            if (completed != null) completed(this);
        }

        /// <summary>Ends it without running callbacks (the client is going away).</summary>
        internal void FailQuietly(IgiError error)
        {
            if (IsDone) return;
            ClearCallbacks();
            Error = error;
            State = IgiRequestState.Failed;
        }

        protected virtual void ClearCallbacks()
        {
            okCallbacks = null;
            errorCallbacks = null;
            completedCallbacks = null;
        }

        public override string ToString()
        {
            return Type + "#" + Id + " " + State + (Error != null ? " " + Error : "");
        }
    }

    /// <summary>A chat: token events, then exactly one done (success) or error.</summary>
    public sealed class IgiStream : IgiRequest
    {
        /// <summary>The session this chat speaks in (<see cref="IgiRequest.Session"/> reads
        /// the answer's "session" field, which a chat's done does not have).</summary>
        public readonly string SessionId;
        readonly StringBuilder text = new StringBuilder();
        readonly List<ActionCall> calls = new List<ActionCall>();
        Action<string> tokenCallbacks;
        Action<ActionCall> actionCallbacks;

        /// <summary>The reply so far (the tokens joined; after done, done's text).</summary>
        public string Text { get { return text.ToString(); } }
        /// <summary>The i of the last token (or, protocol 1.3, action call) delivered: the
        /// events of a reply count 1, 2, 3, ...</summary>
        public long LastTokenIndex { get; private set; }
        /// <summary>Protocol 1.3: the actions the NPC called in this reply, in order (as their
        /// events came; after done, done's tool_calls).</summary>
        public IList<ActionCall> ActionCalls { get { return calls.AsReadOnly(); } }
        /// <summary>done's finish_reason: stop, stop_string, length, cancelled, or (1.3)
        /// tool_calls when the reply ended in action calls.</summary>
        public string FinishReason { get { return GetString("finish_reason"); } }
        /// <summary>cancel was asked for this stream.</summary>
        public bool CancelRequested { get; internal set; }

        internal IgiStream(long id, string session, double timeoutSeconds)
            : base(id, "chat", timeoutSeconds)
        {
            SessionId = session;
        }

        /// <summary>Runs for every token (its text), in order.</summary>
        public IgiStream OnToken(Action<string> callback)
        {
            if (!IsDone) tokenCallbacks += callback;
            return this;
        }

        /// <summary>Protocol 1.3: runs for every action the NPC calls, in order, as soon as the
        /// call is complete (before done). A call done lists that came without its event (a
        /// resumed stream) runs just before done.</summary>
        public IgiStream OnAction(Action<ActionCall> callback)
        {
            if (!IsDone) actionCallbacks += callback;
            return this;
        }

        /// <summary>Runs once with the finished stream (done event).</summary>
        public IgiStream OnDone(Action<IgiStream> callback)
        {
            OnOk(delegate { callback(this); });
            return this;
        }

        public new IgiStream OnError(Action<IgiError> callback)
        {
            base.OnError(callback);
            return this;
        }

        /// <summary>False for a repeated token (a resumed stream replays from the last one seen).</summary>
        internal bool AddToken(long index, string piece)
        {
            if (IsDone || index <= LastTokenIndex) return false;
            LastTokenIndex = index;
            text.Append(piece);
            var callbacks = tokenCallbacks;
            if (callbacks != null) callbacks(piece);
            return true;
        }

        /// <summary>False for a repeated event (see <see cref="AddToken"/>).</summary>
        internal bool AddActionCall(long index, Dictionary<string, object> body)
        {
            if (IsDone || index <= LastTokenIndex) return false;
            LastTokenIndex = index;
            var call = ActionCall.FromWire(body, calls.Count);
            calls.Add(call);
            RaiseAction(call);
            return true;
        }

        void RaiseAction(ActionCall call)
        {
            var callbacks = actionCallbacks;
            if (callbacks != null) callbacks(call);
        }

        internal override void Succeed(Dictionary<string, object> body)
        {
            string full = MsgValue.GetString(body, "text");
            if (full != null)
            {
                text.Length = 0;
                text.Append(full);
            }
            // done's tool_calls are the reply's calls: one whose event was not seen is raised now
            var listed = MsgValue.GetList(body, "tool_calls");
            if (listed != null && !IsDone)
            {
                var seen = new Dictionary<string, ActionCall>();
                foreach (var call in calls) seen[call.Id] = call;
                var ordered = new List<ActionCall>(listed.Count);
                foreach (object item in listed)
                {
                    var map = item as Dictionary<string, object>;
                    if (map == null) continue;
                    ActionCall known;
                    string id = MsgValue.GetString(map, "id", "");
                    if (seen.TryGetValue(id, out known)) { ordered.Add(known); continue; }
                    var call = ActionCall.FromWire(map, ordered.Count);
                    ordered.Add(call);
                    RaiseAction(call);
                }
                calls.Clear();
                calls.AddRange(ordered);
            }
            base.Succeed(body);
        }

        protected override void ClearCallbacks()
        {
            base.ClearCallbacks();
            tokenCallbacks = null;
            actionCallbacks = null;
        }
    }
}
