// NPC actions (protocol 1.3 tools) against the real sidecar (one shared instance, the default
// model): an NPC that may follow, trade or attack. A required choice gives a valid call of a
// declared action, a named choice calls exactly that action, a result gets an answer, and
// broken declarations are refused typed (here before sending, and by the sidecar).
using System;
using System.Collections.Generic;
using System.Linq;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Sidecar")]
    public class ActionTests : ClientFixture
    {
        // a call is one reply generated without any event until its closing tag: on a loaded
        // 2-core machine that may take longer than the default 60 s between events
        const double CallSeconds = 300;

        public static readonly NpcAction Follow = new NpcAction("follow", "Follow the player at a distance in metres.",
            ActionParameters.Object().Integer("distance", "metres behind the player", minimum: 1, maximum: 10));
        public static readonly NpcAction Trade = new NpcAction("trade", "Offer the player an item for gold.",
            ActionParameters.Object().String("item", "what is offered").Integer("price", "gold coins", minimum: 1));
        public static readonly NpcAction Attack = new NpcAction("attack", "Attack a target.",
            ActionParameters.Object().Enum("target", "whom to attack", "player", "wolf", "bandit"));
        static readonly NpcAction[] All = { Follow, Trade, Attack };

        IgiClient Connect()
        {
            return Connect(Sidecar.Shared.Endpoint, o => o.StreamTimeoutSeconds = CallSeconds);
        }

        static string Open(IgiClient client)
        {
            return Pumping.Ok(client, client.OpenSession(new SessionOptions
            {
                SystemPrompt = "You are Brom, a blacksmith in a fantasy game. You can follow the player, trade and attack.",
                Sampling = Pumping.Greedy,
            })).Session;
        }

        // the arguments are an object valid against the action's schema (as ActionParameters declared it)
        static void AssertValid(ActionCall call)
        {
            Assert.IsNotNull(call.Args, call + ": arguments are a JSON object");
            StringAssert.StartsWith("call_", call.Id);
            switch (call.Name)
            {
                case "follow":
                    Assert.IsTrue(call.Args["distance"] is long, call.ToString());
                    Assert.That(call.GetLong("distance"), Is.InRange(1, 10), call.ToString());
                    Assert.AreEqual(1, call.Args.Count, call.ToString());
                    break;
                case "trade":
                    Assert.IsTrue(call.Args["item"] is string, call.ToString());
                    Assert.IsTrue(call.Args["price"] is long, call.ToString());
                    Assert.GreaterOrEqual(call.GetLong("price"), 1, call.ToString());
                    Assert.AreEqual(2, call.Args.Count, call.ToString());
                    break;
                case "attack":
                    CollectionAssert.Contains(new[] { "player", "wolf", "bandit" }, call.GetString("target"), call.ToString());
                    Assert.AreEqual(1, call.Args.Count, call.ToString());
                    break;
                default:
                    Assert.Fail("a call of an undeclared action: " + call);
                    break;
            }
        }

        // every call raised once, in order, as done lists it
        static void AssertCallsRaisedOnce(IgiStream stream, List<ActionCall> raised)
        {
            Assert.AreEqual(stream.ActionCalls.Count, raised.Count, "one OnAction per call");
            for (int k = 0; k < raised.Count; k++)
            {
                Assert.AreSame(stream.ActionCalls[k], raised[k], "call " + k);
                Assert.AreEqual(k, raised[k].Index);
            }
            var listed = MsgValue.GetList(stream.Result, "tool_calls");
            Assert.AreEqual(raised.Count, listed.Count, "done.tool_calls");
            for (int k = 0; k < raised.Count; k++)
            {
                var entry = (Dictionary<string, object>)listed[k];
                Assert.AreEqual(raised[k].Id, entry["id"]);
                Assert.AreEqual(raised[k].Name, entry["name"]);
                Assert.AreEqual(raised[k].Arguments, entry["arguments"]);
            }
            Assert.AreEqual(raised.Count, raised.Select(c => c.Id).Distinct().Count(), "ids are unique");
        }

        [Test]
        [Timeout(400000)]
        public void RequiredChoiceGivesAValidCallOfADeclaredAction()
        {
            var client = Connect();
            string session = Open(client);
            var raised = new List<ActionCall>();
            var tokens = new List<string>();
            var stream = client.Chat(session, "Follow me to the mill, then we talk about swords.", new ChatOptions
            {
                // one call: the suite's time on a loaded machine (the named test below checks parallel off too)
                MaxTokens = 96, Tools = All, ToolChoice = ActionChoice.Required, ParallelToolCalls = false,
            }).OnAction(call => raised.Add(call)).OnToken(piece => tokens.Add(piece));
            Pumping.Ok(client, stream, CallSeconds);
            Assert.AreEqual("tool_calls", stream.FinishReason);
            Assert.AreEqual(1, raised.Count, "parallel_tool_calls false: one call");
            foreach (var call in raised) AssertValid(call);
            AssertCallsRaisedOnce(stream, raised);
            Assert.AreEqual(0, tokens.Count, "a reply that is calls streams no text");
            Assert.AreEqual("", stream.Text);
            Assert.AreEqual(raised.Count, stream.LastTokenIndex, "tool_call events count in i: 1, 2, ...");
            Console.WriteLine("measured: required choice: " + string.Join(", ", raised.Select(c => c.ToString()).ToArray()));
        }

        [Test]
        [Timeout(400000)]
        public void NamedChoiceCallsThatActionAndAResultGetsAnAnswer()
        {
            var client = Connect();
            string session = Open(client);
            var raised = new List<ActionCall>();
            var options = new ChatOptions { MaxTokens = 96, Tools = All, ToolChoice = "trade", ParallelToolCalls = false };
            var stream = client.Chat(session, "What would you sell me?", options).OnAction(call => raised.Add(call));
            Pumping.Ok(client, stream, CallSeconds);
            Assert.AreEqual("tool_calls", stream.FinishReason);
            Assert.AreEqual(1, raised.Count, "parallel_tool_calls false: one call");
            Assert.AreEqual("trade", raised[0].Name);
            AssertValid(raised[0]);
            AssertCallsRaisedOnce(stream, raised);

            // the game does it and says what came of it; the NPC answers (only text: choice none)
            var answerOptions = new ChatOptions { MaxTokens = 24, Tools = All, ToolChoice = ActionChoice.None };
            var tokens = new List<string>();
            var answer = client.AnswerActions(session, new[] { new ActionResult(raised[0].Id,
                "The player bought the " + raised[0].GetString("item") + " for " + raised[0].GetLong("price") + " gold.") }, answerOptions)
                .OnAction(call => Assert.Fail("choice none: no call, got " + call))
                .OnToken(piece => tokens.Add(piece));
            Pumping.Ok(client, answer, CallSeconds);
            Assert.Greater(tokens.Count, 0, "the reply after the result streams text");
            Assert.AreEqual(string.Concat(tokens.ToArray()), answer.Text);
            StringAssert.IsMatch("^(stop|length|stop_string)$", answer.FinishReason);
            Assert.AreEqual(0, answer.ActionCalls.Count);
            Assert.AreEqual(0, MsgValue.GetList(answer.Result, "tool_calls").Count, "done.tool_calls is empty");
            Console.WriteLine("measured: trade call " + raised[0] + "; answer: " + answer.Text);
        }

        [Test]
        [Timeout(120000)]
        public void InvalidDeclarationsAreRefusedTypedBeforeSending()
        {
            var client = Connect();
            string session = Open(client);
            var cases = new Dictionary<string, ChatOptions>
            {
                { "name", new ChatOptions { Tools = new[] { new NpcAction("open door", "spaces are not allowed") } } },
                { "keyword", new ChatOptions { Tools = new[] { new NpcAction("required") } } },
                { "twice", new ChatOptions { Tools = new[] { Follow, new NpcAction("follow") } } },
                { "choice", new ChatOptions { Tools = All, ToolChoice = "flee" } },
                { "no tools", new ChatOptions { ToolChoice = ActionChoice.Required } },
                { "schema", new ChatOptions { Tools = new[] { new NpcAction("wave", "", "{\"type\": \"object\"") } } },
                { "not an object", new ChatOptions { Tools = new[] { new NpcAction("wave", "", "{\"type\": \"string\"}") } } },
                { "description", new ChatOptions { Tools = new[] { new NpcAction("wave", new string('x', 2001)) } } },
                { "grammar too", new ChatOptions { Tools = All, JsonSchema = "{\"type\": \"object\"}" } },
                { "result id", new ChatOptions { ToolResults = new[] { new ActionResult(new string('c', 65), "x") } } },
            };
            foreach (var c in cases)
            {
                var stream = client.Chat(session, "Hello.", c.Value);
                var error = Pumping.Fails(client, stream, IgiError.InvalidBody);
                Assert.IsFalse(error.Retryable, c.Key);
                StringAssert.Contains("tool", error.Message, c.Key + ": " + error.Message);
            }
            Assert.AreEqual(IgiError.InvalidBody, Pumping.Fails(client, client.AnswerActions(session, new ActionResult[0]), IgiError.InvalidBody).Code);
            // nothing reached the sidecar: the session answers as before
            Pumping.Ok(client, client.Chat(session, "Hello.", new ChatOptions { MaxTokens = 4 }), CallSeconds);
        }

        [Test]
        [Timeout(120000)]
        public void InvalidDeclarationsSentRawAreRefusedTypedByTheSidecar()
        {
            var client = Connect();
            string session = Open(client);
            Func<string, Dictionary<string, object>> tool = name => new Dictionary<string, object>
            {
                { "name", name }, { "description", "" }, { "parameters", "{\"type\": \"object\"}" },
            };
            var bodies = new List<KeyValuePair<string, Dictionary<string, object>>>
            {
                Raw("name", session, new List<object> { tool("open door") }, null),
                Raw("keyword", session, new List<object> { tool("auto") }, null),
                Raw("twice", session, new List<object> { tool("follow"), tool("follow") }, null),
                Raw("choice", session, new List<object> { tool("follow") }, "flee"),
                Raw("too many", session, Enumerable.Range(0, 33).Select(k => (object)tool("a" + k)).ToList(), null),
            };
            foreach (var c in bodies)
            {
                var error = Pumping.Fails(client, client.Send("chat", c.Value), IgiError.InvalidBody);
                Assert.IsFalse(error.Retryable, c.Key);
            }
            Pumping.Ok(client, client.Chat(session, "Hello.", new ChatOptions { MaxTokens = 4 }), CallSeconds);
        }

        static KeyValuePair<string, Dictionary<string, object>> Raw(string what, string session, List<object> tools, string choice)
        {
            var body = new Dictionary<string, object> { { "session", session }, { "text", "Hello." }, { "tools", tools } };
            if (choice != null) body["tool_choice"] = choice;
            return new KeyValuePair<string, Dictionary<string, object>>(what, body);
        }
    }
}
