using System;
using System.Collections.Generic;
using UnityEngine;

namespace Igi.Sdk.Unity
{
    /// <summary>One action of an NPC as the Inspector edits it (see <see cref="NpcAction"/>).</summary>
    [Serializable]
    public sealed class NpcActionSetting
    {
        [Tooltip("[A-Za-z0-9_-], 1-64 characters; not auto, none or required.")]
        public string name = "";
        [Tooltip("What the action does, for the model (at most 2000 characters).")]
        [TextArea(1, 6)] public string description = "";
        [Tooltip("JSON Schema of the arguments object, as JSON text. Empty: no arguments.")]
        [TextArea(2, 12)] public string parametersJson = "";

        public NpcAction ToAction()
        {
            return new NpcAction(name, description,
                string.IsNullOrEmpty(parametersJson) ? "{\"type\": \"object\", \"properties\": {}}" : parametersJson);
        }
    }

    // NpcDialogue, continued: actions (protocol 1.3 tools). The NPC's actions go with every line
    // it hears; each call the model makes is raised as OnAction (main thread, in order, before
    // the reply's OnReply); the game does it and answers with AnswerAction, and once every call
    // of the reply is answered the NPC's reply continues from the results (OnToken, OnReply).
    public sealed partial class NpcDialogue
    {
        [Header("Actions (protocol 1.3)")]
        [Tooltip("What the NPC may do besides talking (at most 32), sent with every line.")]
        [SerializeField] NpcActionSetting[] actions = new NpcActionSetting[0];
        [Tooltip("auto: talk or act as it likes; none: only talk; required: act; or an action's name: exactly that action.")]
        [SerializeField] string actionChoice = ActionChoice.Auto;
        [Tooltip("After the game answered its calls: auto lets the NPC act again, none makes it talk (the default, so a required choice cannot loop).")]
        [SerializeField] string actionChoiceAfterResults = ActionChoice.None;
        [Tooltip("Off: at most one action per reply. On: up to 8.")]
        [SerializeField] bool parallelActions = true;
        [Tooltip("Seconds a reply that may act can go without any event: a call streams nothing until it is whole (a slow CPU takes a while).")]
        [Min(1f)] [SerializeField] float actionReplyTimeoutSeconds = 120f;
        [SerializeField] ActionEvent actionCalled = new ActionEvent();

        /// <summary>An action the NPC called (its name, id and arguments; see
        /// <see cref="ActionCall"/>). Answer it with <see cref="AnswerAction"/>.</summary>
        public event Action<ActionCall> OnAction;

        [NonSerialized] List<ActionCall> _unanswered = new List<ActionCall>();
        [NonSerialized] List<ActionResult> _answers = new List<ActionResult>();

        /// <summary>The calls of the last reply that have no answer yet.</summary>
        public IList<ActionCall> UnansweredActions
        {
            get
            {
                var left = new List<ActionCall>();
                foreach (var call in _unanswered) if (!Answered(call.Id)) left.Add(call);
                return left.AsReadOnly();
            }
        }

        /// <summary>The calls the last reply made (empty when it only talked).</summary>
        public IList<ActionCall> LastActionCalls { get; private set; } = new List<ActionCall>().AsReadOnly();

        // ---- settings ---------------------------------------------------------------------------

        /// <summary>auto (default), none, required, or a declared action's name.</summary>
        public string ActionChoiceSetting { get { return actionChoice; } set { actionChoice = string.IsNullOrEmpty(value) ? ActionChoice.Auto : value; } }
        /// <summary>The choice for the reply that continues from the game's results (default none).</summary>
        public string ActionChoiceAfterResults { get { return actionChoiceAfterResults; } set { actionChoiceAfterResults = string.IsNullOrEmpty(value) ? ActionChoice.None : value; } }
        public bool ParallelActions { get { return parallelActions; } set { parallelActions = value; } }
        /// <summary>Seconds without an event before a reply that may act fails with <c>timeout</c>.</summary>
        public float ActionReplyTimeoutSeconds { get { return actionReplyTimeoutSeconds; } set { actionReplyTimeoutSeconds = Math.Max(1f, value); } }
        public ActionEvent ActionCalled { get { return actionCalled; } }

        /// <summary>The declared actions, as sent.</summary>
        public NpcAction[] Actions
        {
            get
            {
                var list = new NpcAction[actions != null ? actions.Length : 0];
                for (int i = 0; i < list.Length; i++) list[i] = actions[i] != null ? actions[i].ToAction() : null;
                return list;
            }
        }

        /// <summary>Adds an action (kept as a serialized setting: it survives a script reload).
        /// The protocol's rules are checked when a line is sent (a broken declaration fails that
        /// line with <c>invalid_body</c> through OnError).</summary>
        public void DeclareAction(NpcAction action)
        {
            if (action == null) throw new ArgumentNullException("action");
            var list = new List<NpcActionSetting>(actions ?? new NpcActionSetting[0]);
            list.Add(new NpcActionSetting { name = action.Name ?? "", description = action.Description, parametersJson = action.ParametersJson ?? "" });
            actions = list.ToArray();
        }

        public void ClearActions() { actions = new NpcActionSetting[0]; }

        // ---- answering --------------------------------------------------------------------------

        /// <summary>What came of the call <paramref name="callId"/> ("The player paid 30
        /// gold."); may be called from <see cref="OnAction"/> itself. Once the reply ended and
        /// every call of it is answered, the reply continues from the results (OnToken, then
        /// OnReply). False (and OnError <c>unknown_action_call</c>) for a call that is not
        /// waiting for an answer.</summary>
        public bool AnswerAction(string callId, string result)
        {
            if (_destroyed) return false;
            // during the reply its calls so far; afterwards the calls it ended with
            IList<ActionCall> calls = IsReplying ? _stream.ActionCalls : (IList<ActionCall>)_unanswered;
            bool waiting = false;
            foreach (var c in calls) if (c.Id == callId) waiting = true;
            if (!waiting || Answered(callId))
            {
                RaiseError("unknown_action_call", "no call " + callId + " of " + _baseName + " is waiting for an answer");
                return false;
            }
            _answers.Add(new ActionResult(callId, result));
            if (!IsReplying) SendAnswersIfComplete();
            return true;
        }

        /// <summary>Answers several calls at once (see <see cref="AnswerAction"/>).</summary>
        public bool AnswerActions(params ActionResult[] results)
        {
            bool all = true;
            foreach (var r in results ?? new ActionResult[0]) all &= r != null && AnswerAction(r.Id, r.Content);
            return all;
        }

        void SendAnswersIfComplete()
        {
            if (_unanswered.Count == 0 || _answers.Count < _unanswered.Count || IsReplying || _destroyed) return;
            if (!IsReady)
            {
                RaiseError("not_ready", _baseName + " has no session (the sidecar restarted): its action calls are lost");
                ForgetCalls();
                return;
            }
            var chat = LineOptions();
            AddActions(chat, actionChoiceAfterResults);
            // in the order of the calls
            var results = new List<ActionResult>(_unanswered.Count);
            foreach (var call in _unanswered)
                foreach (var a in _answers)
                    if (a.Id == call.Id) results.Add(a);
            Follow(Client.AnswerActions(_session, results.ToArray(), chat), chat);
        }

        bool Answered(string callId)
        {
            foreach (var a in _answers) if (a.Id == callId) return true;
            return false;
        }

        void ForgetCalls()
        {
            _unanswered.Clear();
            _answers.Clear();
        }

        // ---- with the reply ---------------------------------------------------------------------

        void AddActions(ChatOptions chat, string choice)
        {
            if (actions == null || actions.Length == 0) return;
            chat.Tools = Actions;
            if (choice != ActionChoice.Auto) chat.ToolChoice = choice;
            if (!parallelActions) chat.ParallelToolCalls = false;
        }

        // a new reply: calls left unanswered belong to the last one and are dropped
        void BeginReply(IgiStream stream, ChatOptions chat)
        {
            ForgetCalls();
            bool mayAct = chat.Tools != null && chat.Tools.Length > 0 && chat.ToolChoice != ActionChoice.None;
            if (mayAct) stream.TimeoutSeconds = Math.Max(stream.TimeoutSeconds, actionReplyTimeoutSeconds);
        }

        void EndReply(IgiStream done)
        {
            LastActionCalls = done.ActionCalls;
            _unanswered.AddRange(done.ActionCalls);
            // answers given during the reply to calls it did not end with are dropped
            _answers.RemoveAll(a => !_unanswered.Exists(c => c.Id == a.Id));
        }

        void RaiseAction(ActionCall call)
        {
            try
            {
                var handler = OnAction;
                if (handler != null) handler(call);
                actionCalled.Invoke(call.Name, call.Arguments, call.Id);
            }
            catch (Exception e) { Debug.LogException(e); }
        }
    }
}
