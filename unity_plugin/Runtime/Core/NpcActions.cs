// NPC actions (protocol 1.3 feature "tools"): what an NPC may do besides talking, declared with
// each line it hears (ChatOptions.Tools), called by the model as typed calls (ActionCall, one
// `tool_call` event each), answered by the game with results (ChatOptions.ToolResults).
//
//   var trade = new NpcAction("trade", "Offer the player an item for gold.",
//       ActionParameters.Object().String("item", "what is offered").Integer("price", "gold", minimum: 1));
//   client.Chat(session, "What have you got?", new ChatOptions { Tools = new[] { follow, trade, attack },
//       ToolChoice = ActionChoice.Required })
//       .OnAction(call => { if (call.Name == "trade") Offer(call.GetString("item"), call.GetLong("price")); })
//       .OnDone(s => ...);                                     // s.ActionCalls, s.FinishReason "tool_calls"
//   client.AnswerActions(session, new[] { new ActionResult(call.Id, "The player paid.") }, options);
//
// Declarations are checked here before anything is sent (ActionRules.Problem: the protocol's
// rules); a broken one fails the chat at once with invalid_body, as the sidecar would.
using System;
using System.Collections.Generic;

namespace Igi.Sdk
{
    /// <summary>One action an NPC may take (a tool on the wire): its name, what it does (the model
    /// reads this), and a JSON Schema of its arguments object.</summary>
    public sealed class NpcAction
    {
        /// <summary>[A-Za-z0-9_-], 1..64 characters; not auto, none or required.</summary>
        public readonly string Name;
        /// <summary>At most 2000 characters; may be empty.</summary>
        public readonly string Description;
        /// <summary>The arguments' JSON Schema as JSON text (an object schema); null: any object
        /// (or <see cref="Parameters"/>).</summary>
        public readonly string ParametersJson;
        /// <summary>The same schema as a map (msgpack on the wire), when declared that way.</summary>
        public readonly Dictionary<string, object> Parameters;

        public NpcAction(string name, string description = "", string parametersJson = null)
        {
            Name = name;
            Description = description ?? "";
            ParametersJson = parametersJson;
        }

        /// <summary>With the schema as a map of the shapes MsgPack encodes (Dictionary, List,
        /// string, long, double, bool).</summary>
        public NpcAction(string name, string description, Dictionary<string, object> parameters)
        {
            Name = name;
            Description = description ?? "";
            Parameters = parameters;
            ParametersJson = parameters != null ? IgiJson.Write(parameters) : null;
        }

        public NpcAction(string name, string description, ActionParameters parameters)
            : this(name, description, parameters != null ? parameters.ToJson() : null)
        {
        }

        internal Dictionary<string, object> ToWire()
        {
            var tool = new Dictionary<string, object>(3);
            tool["name"] = Name ?? "";
            tool["description"] = Description;
            // JSON text as given (the sidecar reads it: the client needs no schema tree), a map as given
            if (Parameters != null) tool["parameters"] = Parameters;
            else if (ParametersJson != null) tool["parameters"] = ParametersJson;
            return tool;
        }

        public override string ToString() { return "action " + Name; }
    }

    /// <summary>tool_choice values besides a declared action's name.</summary>
    public static class ActionChoice
    {
        /// <summary>The NPC talks or acts, as it likes (the default).</summary>
        public const string Auto = "auto";
        /// <summary>The NPC only talks.</summary>
        public const string None = "none";
        /// <summary>The NPC acts: at least one call.</summary>
        public const string Required = "required";
    }

    /// <summary>A small builder of the arguments' JSON Schema: an object whose properties are
    /// added in order, each required unless said otherwise, and no others allowed.</summary>
    public sealed class ActionParameters
    {
        readonly Dictionary<string, object> properties = new Dictionary<string, object>();
        readonly List<object> required = new List<object>();

        public static ActionParameters Object() { return new ActionParameters(); }

        public ActionParameters String(string name, string description = null, bool isRequired = true)
        {
            return Add(name, Property("string", description), isRequired);
        }

        /// <summary>A string that is one of <paramref name="values"/>.</summary>
        public ActionParameters Enum(string name, string description, params string[] values)
        {
            var p = Property("string", description);
            p["enum"] = new List<object>(values ?? new string[0]);
            return Add(name, p, true);
        }

        public ActionParameters Integer(string name, string description = null, bool isRequired = true,
            long? minimum = null, long? maximum = null)
        {
            var p = Property("integer", description);
            if (minimum.HasValue) p["minimum"] = minimum.Value;
            if (maximum.HasValue) p["maximum"] = maximum.Value;
            return Add(name, p, isRequired);
        }

        public ActionParameters Number(string name, string description = null, bool isRequired = true,
            double? minimum = null, double? maximum = null)
        {
            var p = Property("number", description);
            if (minimum.HasValue) p["minimum"] = minimum.Value;
            if (maximum.HasValue) p["maximum"] = maximum.Value;
            return Add(name, p, isRequired);
        }

        public ActionParameters Boolean(string name, string description = null, bool isRequired = true)
        {
            return Add(name, Property("boolean", description), isRequired);
        }

        static Dictionary<string, object> Property(string type, string description)
        {
            var p = new Dictionary<string, object>();
            p["type"] = type;
            if (!string.IsNullOrEmpty(description)) p["description"] = description;
            return p;
        }

        ActionParameters Add(string name, Dictionary<string, object> property, bool isRequired)
        {
            if (string.IsNullOrEmpty(name)) throw new ArgumentException("a parameter needs a name", "name");
            if (properties.ContainsKey(name)) throw new ArgumentException("parameter " + name + " is declared twice", "name");
            properties[name] = property;
            if (isRequired) required.Add(name);
            return this;
        }

        /// <summary>The schema as JSON text.</summary>
        public string ToJson()
        {
            var schema = new Dictionary<string, object>();
            schema["type"] = "object";
            schema["properties"] = properties;
            if (required.Count > 0) schema["required"] = required;
            schema["additionalProperties"] = false;
            return IgiJson.Write(schema);
        }

        public override string ToString() { return ToJson(); }
    }

    /// <summary>One call of an action the model made: a <c>tool_call</c> event (or an entry of
    /// done's tool_calls). Its arguments are JSON text valid against the action's schema (the
    /// sidecar constrains decoding to it); the Get* accessors read its top-level fields.</summary>
    public sealed class ActionCall
    {
        /// <summary>The call's id ("call_..."): what its <see cref="ActionResult"/> answers.</summary>
        public readonly string Id;
        /// <summary>The declared action's name.</summary>
        public readonly string Name;
        /// <summary>The arguments object as JSON text.</summary>
        public readonly string Arguments;
        /// <summary>Which call of the reply this is (0, 1, ...).</summary>
        public readonly int Index;

        Dictionary<string, object> args;
        bool parsed;

        public ActionCall(string id, string name, string arguments, int index)
        {
            Id = id ?? "";
            Name = name ?? "";
            Arguments = arguments ?? "{}";
            Index = index;
        }

        /// <summary>The arguments parsed (null if they are not a JSON object, which the sidecar
        /// never sends).</summary>
        public Dictionary<string, object> Args
        {
            get
            {
                if (!parsed)
                {
                    args = IgiJson.ParseObject(Arguments);
                    parsed = true;
                }
                return args;
            }
        }

        public bool Has(string key) { return Args != null && Args.ContainsKey(key); }
        public string GetString(string key, string fallback = null) { return MsgValue.GetString(Args, key, fallback); }
        public long GetLong(string key, long fallback = 0) { return MsgValue.GetLong(Args, key, fallback); }
        public double GetDouble(string key, double fallback = 0) { return MsgValue.GetDouble(Args, key, fallback); }
        public bool GetBool(string key, bool fallback = false) { return MsgValue.GetBool(Args, key, fallback); }

        internal static ActionCall FromWire(Dictionary<string, object> body, int fallbackIndex)
        {
            return new ActionCall(MsgValue.GetString(body, "id"), MsgValue.GetString(body, "name"),
                MsgValue.GetString(body, "arguments", "{}"), (int)MsgValue.GetLong(body, "index", fallbackIndex));
        }

        public override string ToString() { return Name + Arguments + " (" + Id + ")"; }
    }

    /// <summary>What came of one call: sent in the next line's <c>tool_results</c>; the NPC's
    /// reply continues from it.</summary>
    public sealed class ActionResult
    {
        /// <summary>The <see cref="ActionCall.Id"/> it answers (1..64 characters).</summary>
        public readonly string Id;
        /// <summary>What happened, for the model to read ("The player paid 30 gold.").</summary>
        public readonly string Content;

        public ActionResult(string callId, string content)
        {
            Id = callId;
            Content = content ?? "";
        }

        internal Dictionary<string, object> ToWire()
        {
            var r = new Dictionary<string, object>(2);
            r["id"] = Id ?? "";
            r["content"] = Content;
            return r;
        }
    }

    /// <summary>The protocol's rules for actions (PROTOCOL.md, chat.tools), checked before
    /// sending.</summary>
    public static class ActionRules
    {
        public const int MaxActions = 32;
        public const int MaxNameLength = 64;
        public const int MaxDescription = 2000;
        public const int MaxResults = 16;
        public const int MaxResultIdLength = 64;
        /// <summary>Calls in one reply with parallel_tool_calls true (false: one).</summary>
        public const int MaxParallelCalls = 8;

        /// <summary>A name the wire accepts: [A-Za-z0-9_-], 1..64, not a tool_choice keyword.</summary>
        public static bool IsValidName(string name)
        {
            if (string.IsNullOrEmpty(name) || name.Length > MaxNameLength) return false;
            if (name == ActionChoice.Auto || name == ActionChoice.None || name == ActionChoice.Required) return false;
            foreach (char c in name)
            {
                bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
                if (!ok) return false;
            }
            return true;
        }

        /// <summary>Why these actions, choice and results break the protocol's rules; null when
        /// they do not. <paramref name="textLimit"/>: the longest result content.</summary>
        public static string Problem(NpcAction[] actions, string choice, ActionResult[] results, long textLimit)
        {
            return Problem(actions, choice, results, textLimit, false);
        }

        /// <summary>As above; <paramref name="constrained"/>: the line also has a grammar or a
        /// JSON schema (actions constrain the reply themselves: the two do not go together).</summary>
        public static string Problem(NpcAction[] actions, string choice, ActionResult[] results, long textLimit, bool constrained)
        {
            int count = actions != null ? actions.Length : 0;
            if (count > MaxActions) return "tools has " + count + " actions (limit " + MaxActions + ")";
            if (count > 0 && constrained) return "tools constrain the reply themselves: give no grammar or json_schema with them";
            var names = new HashSet<string>();
            for (int i = 0; i < count; i++)
            {
                NpcAction a = actions[i];
                if (a == null) return "tools[" + i + "] is null";
                if (!IsValidName(a.Name))
                    return "tools[" + i + "].name '" + a.Name + "' is not 1-64 of [A-Za-z0-9_-] (nor auto, none, required)";
                if (!names.Add(a.Name)) return "tools[" + i + "].name '" + a.Name + "' is declared twice";
                int described = Protocol.CodePoints(a.Description);
                if (described > MaxDescription)
                    return "tools[" + i + "].description has " + described + " characters (limit " + MaxDescription + ")";
                if (a.ParametersJson != null)
                {
                    object schema;
                    string error;
                    if (!IgiJson.TryParse(a.ParametersJson, out schema, out error))
                        return "tools[" + i + "].parameters is not JSON: " + error;
                    var map = schema as Dictionary<string, object>;
                    if (map == null) return "tools[" + i + "].parameters is not a JSON object (a JSON Schema)";
                    object type;
                    if (map.TryGetValue("type", out type) && !"object".Equals(type))
                        return "tools[" + i + "].parameters must describe an object (type: object)";
                }
            }
            if (choice != null && choice != ActionChoice.Auto && choice != ActionChoice.None)
            {
                if (count == 0) return "tool_choice '" + choice + "' with no tools declared";
                if (choice != ActionChoice.Required && !names.Contains(choice))
                    return "tool_choice '" + choice + "' is not auto, none, required or a declared action";
            }
            int answered = results != null ? results.Length : 0;
            if (answered > MaxResults) return "tool_results has " + answered + " results (limit " + MaxResults + ")";
            for (int i = 0; i < answered; i++)
            {
                ActionResult r = results[i];
                if (r == null) return "tool_results[" + i + "] is null";
                if (string.IsNullOrEmpty(r.Id) || r.Id.Length > MaxResultIdLength)
                    return "tool_results[" + i + "].id must be 1-" + MaxResultIdLength + " characters";
                int n = Protocol.CodePoints(r.Content);
                if (n > textLimit) return "tool_results[" + i + "].content has " + n + " characters (limit " + textLimit + ")";
            }
            return null;
        }
    }
}
