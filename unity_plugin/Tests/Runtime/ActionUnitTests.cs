// NPC actions against a scripted transport (no sidecar): the requests equal the golden vectors,
// tool_call events become ActionCalls in order (a replayed one dropped, one only done lists
// raised at done), a sidecar without "tools" is refused unsent, and the JSON the client reads
// and writes itself (arguments, the schema builder).
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Client")]
    public class ActionUnitTests : FakeClientFixture
    {
        static Dictionary<string, object> HelloWithTools()
        {
            var ok = FakeTransport.HelloOk();
            ok["minor"] = 3L;
            ((List<object>)ok["features"]).Add("tools");
            return ok;
        }

        void Start(Action<long, string, Dictionary<string, object>> onRequest, bool tools = true)
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello") fake.Reply(id, "ok", tools ? HelloWithTools() : FakeTransport.HelloOk());
                else if (onRequest != null) onRequest(id, type, body);
            };
            client = new IgiClient(new IgiClientOptions { TransportFactory = () => fake });
            Pumping.Until(client, () => client.State == IgiConnectionState.Ready, 5, "fake hello");
        }

        static Dictionary<string, object> Vector(string name)
        {
            string dir = Environment.GetEnvironmentVariable("IGI_VECTORS_DIR");
            if (string.IsNullOrEmpty(dir)) Assert.Ignore("IGI_VECTORS_DIR is not set (bridge/vectors)");
            string path = Path.Combine(dir, name + ".json");
            if (!File.Exists(path)) Assert.Ignore("no " + name + " vector (vectors before protocol 1.3)");
            return MsgValue.GetMap((Dictionary<string, object>)TestJson.Parse(File.ReadAllText(path)), "message");
        }

        [Test]
        [Timeout(10000)]
        public void ActionRequestsMatchTheVectors()
        {
            Start(null);
            var tools = MsgValue.GetMap(Vector("request_chat_tools"), "body");
            var declared = MsgValue.GetList(tools, "tools");
            // the vector declares one schema as a map, one as JSON text: both ways of NpcAction
            var follow = (Dictionary<string, object>)declared[0];
            var attack = (Dictionary<string, object>)declared[1];
            var chat = client.Chat("3f2a9c0d81be", "Follow me to the mill.", new ChatOptions
            {
                MaxTokens = 64, ToolChoice = ActionChoice.Auto, ParallelToolCalls = false,
                Tools = new[]
                {
                    new NpcAction("follow", "Follow the player.", MsgValue.GetMap(follow, "parameters")),
                    new NpcAction("attack", "Attack a target.", (string)attack["parameters"]),
                },
            });
            Pumping.Until(client, () => fake.SentOf("chat").Count == 1, 5, "chat sent");
            ValueAssert.AreEqual(tools, fake.SentOf("chat")[0]["body"], "request_chat_tools");

            var results = MsgValue.GetMap(Vector("request_chat_tool_results"), "body");
            var result = (Dictionary<string, object>)MsgValue.GetList(results, "tool_results")[0];
            client.AnswerActions("3f2a9c0d81be", new[] { new ActionResult((string)result["id"], (string)result["content"]) });
            Pumping.Until(client, () => fake.SentOf("chat").Count == 2, 5, "answer sent");
            ValueAssert.AreEqual(results, fake.SentOf("chat")[1]["body"], "request_chat_tool_results");
            Assert.IsFalse(chat.IsDone);
        }

        [Test]
        [Timeout(10000)]
        public void ToolCallEventsBecomeActionCallsInOrderOnce()
        {
            var call = MsgValue.GetMap(Vector("event_tool_call"), "body");
            var done = MsgValue.GetMap(Vector("event_done_tool_calls"), "body");
            Start((id, type, body) =>
            {
                if (type != "chat") return;
                fake.Reply(id, "tool_call", call);
                fake.Reply(id, "tool_call", call);   // a replayed event (same i): dropped
                fake.Reply(id, "done", done);
            });
            var raised = new List<ActionCall>();
            var stream = client.Chat("s", "Follow me.", new ChatOptions { Tools = new[] { ActionTests.Follow } })
                .OnAction(c => raised.Add(c));
            Pumping.Ok(client, stream, 5);
            Assert.AreEqual(1, raised.Count);
            Assert.AreEqual("follow", raised[0].Name);
            Assert.AreEqual(call["id"], raised[0].Id);
            Assert.AreEqual(0, raised[0].Index);
            Assert.AreEqual("{\"distance\": 2}", raised[0].Arguments);
            Assert.AreEqual(2, raised[0].GetLong("distance"));
            Assert.IsTrue(raised[0].Has("distance"));
            Assert.AreEqual("fallback", raised[0].GetString("distance", "fallback"), "a number is not a string");
            Assert.AreEqual("tool_calls", stream.FinishReason);
            Assert.AreEqual(1, stream.ActionCalls.Count);
            Assert.AreSame(raised[0], stream.ActionCalls[0], "done's entry is the call raised");
            Assert.AreEqual(1, stream.LastTokenIndex);
        }

        [Test]
        [Timeout(10000)]
        public void ACallOnlyDoneListsIsRaisedAtDone()
        {
            // (a stream resumed after its events were gone: done still lists every call)
            Start((id, type, body) =>
            {
                if (type != "chat") return;
                fake.Reply(id, "tool_call", Map("i", 1L, "index", 0L, "id", "call_a", "name", "follow", "arguments", "{\"distance\": 3}"));
                fake.Reply(id, "done", Map("text", "", "finish_reason", "tool_calls", "tool_calls", new List<object>
                {
                    Map("id", "call_a", "name", "follow", "arguments", "{\"distance\": 3}"),
                    Map("id", "call_b", "name", "attack", "arguments", "{\"target\": \"wolf\"}"),
                }));
            });
            var order = new List<string>();
            var stream = client.Chat("s", "Help!", new ChatOptions { Tools = new[] { ActionTests.Follow, ActionTests.Attack } })
                .OnAction(c => order.Add("action " + c.Id))
                .OnDone(s => order.Add("done"));
            Pumping.Ok(client, stream, 5);
            CollectionAssert.AreEqual(new[] { "action call_a", "action call_b", "done" }, order);
            Assert.AreEqual("wolf", stream.ActionCalls[1].GetString("target"));
            Assert.AreEqual(1, stream.ActionCalls[1].Index);
        }

        [Test]
        [Timeout(10000)]
        public void TokensAndCallsShareTheEventIndex()
        {
            // text first, then a call: i runs 1, 2, 3 across both kinds; a gap would ask for a resume
            Start((id, type, body) =>
            {
                if (type != "chat") return;
                fake.Reply(id, "token", Map("text", "Sure", "i", 1L));
                fake.Reply(id, "token", Map("text", ".", "i", 2L));
                fake.Reply(id, "tool_call", Map("i", 3L, "index", 0L, "id", "call_c", "name", "follow", "arguments", "{\"distance\": 1}"));
                fake.Reply(id, "done", Map("text", "Sure.", "finish_reason", "tool_calls", "tool_calls", new List<object>
                {
                    Map("id", "call_c", "name", "follow", "arguments", "{\"distance\": 1}"),
                }));
            });
            var stream = client.Chat("s", "Come.", new ChatOptions { Tools = new[] { ActionTests.Follow } });
            Pumping.Ok(client, stream, 5);
            Assert.AreEqual("Sure.", stream.Text);
            Assert.AreEqual(3, stream.LastTokenIndex);
            Assert.AreEqual(1, stream.ActionCalls.Count);
            Assert.AreEqual(0, fake.SentOf("resume_stream").Count, "no gap");
        }

        [Test]
        [Timeout(10000)]
        public void ASidecarWithoutToolsIsRefusedUnsent()
        {
            Start(null, tools: false);
            var error = Pumping.Fails(client, client.Chat("s", "Follow me.", new ChatOptions { Tools = new[] { ActionTests.Follow } }),
                IgiError.Unsupported, 5);
            StringAssert.Contains("'tools'", error.Message);
            Pumping.Fails(client, client.AnswerActions("s", new[] { new ActionResult("call_a", "ok") }), IgiError.Unsupported, 5);
            Assert.AreEqual(0, fake.SentOf("chat").Count);
        }

        // ---- JSON ------------------------------------------------------------------------------

        [Test]
        public void TheSchemaBuilderWritesAnObjectSchema()
        {
            string json = ActionParameters.Object()
                .String("item", "what is \"offered\"")
                .Integer("price", minimum: 1)
                .Number("discount", isRequired: false, maximum: 0.5)
                .Boolean("haggle", isRequired: false)
                .Enum("mood", null, "calm", "angry")
                .ToJson();
            Assert.AreEqual("{\"type\":\"object\",\"properties\":{" +
                "\"item\":{\"type\":\"string\",\"description\":\"what is \\\"offered\\\"\"}," +
                "\"price\":{\"type\":\"integer\",\"minimum\":1}," +
                "\"discount\":{\"type\":\"number\",\"maximum\":0.5}," +
                "\"haggle\":{\"type\":\"boolean\"}," +
                "\"mood\":{\"type\":\"string\",\"enum\":[\"calm\",\"angry\"]}}," +
                "\"required\":[\"item\",\"price\",\"mood\"],\"additionalProperties\":false}", json);
            var parsed = IgiJson.ParseObject(json);
            Assert.IsNotNull(parsed);
            Assert.AreEqual(json, IgiJson.Write(parsed), "written, read and written again: the same text");
            Assert.Throws<ArgumentException>(() => ActionParameters.Object().String("a").Integer("a"));
        }

        [Test]
        public void JsonReadsWhatArgumentsHold()
        {
            object v;
            string error;
            Assert.IsTrue(IgiJson.TryParse(" {\"a\": [1, -2.5, 3e2, true, false, null], \"s\": \"x\\n\\u00e9\\\"\", \"o\": {}} ", out v, out error), error);
            var map = (Dictionary<string, object>)v;
            var list = (List<object>)map["a"];
            Assert.AreEqual(1L, list[0]);
            Assert.AreEqual(-2.5, list[1]);
            Assert.AreEqual(300.0, list[2]);
            Assert.AreEqual(true, list[3]);
            Assert.AreEqual(false, list[4]);
            Assert.IsNull(list[5]);
            Assert.AreEqual("x\n\u00e9\"", map["s"]);
            Assert.AreEqual(0, ((Dictionary<string, object>)map["o"]).Count);
            Assert.AreEqual(9223372036854775807L, ((List<object>)ParseOk("[9223372036854775807]"))[0]);
            Assert.IsInstanceOf<double>(((List<object>)ParseOk("[9223372036854775808]"))[0], "past long: a double");
        }

        static object ParseOk(string text)
        {
            object v;
            string error;
            Assert.IsTrue(IgiJson.TryParse(text, out v, out error), text + ": " + error);
            return v;
        }

        [Test]
        public void JsonRefusesMalformedAndUnboundedInput()
        {
            foreach (string bad in new[] { "", "{", "{\"a\" 1}", "[1,]", "{\"a\":1,}", "01x", "\"open", "tru", "[1] 2",
                "{\"a\":\"\u0001\"}", "\"\\x\"", "\"\\u12\"", "-", "1.", "1e", "{1: 2}", "NaN" })
            {
                object v;
                string error;
                Assert.IsFalse(IgiJson.TryParse(bad, out v, out error), "'" + bad + "' read");
                Assert.IsNotNull(error);
                Assert.IsNull(v);
            }
            string deep = new string('[', IgiJson.MaxDepth + 2) + new string(']', IgiJson.MaxDepth + 2);
            object none;
            string why;
            Assert.IsFalse(IgiJson.TryParse(deep, out none, out why));
            StringAssert.Contains("nested", why);
            Assert.IsTrue(IgiJson.TryParse(new string('[', IgiJson.MaxDepth) + new string(']', IgiJson.MaxDepth), out none, out why), why);
            Assert.IsFalse(IgiJson.TryParse(new string(' ', IgiJson.MaxLength + 1), out none, out why));
            Assert.IsNull(new ActionCall("call_x", "wave", "[1]", 0).Args, "arguments that are not an object");
            Assert.AreEqual(7, new ActionCall("call_x", "wave", "[1]", 0).GetLong("n", 7));
            Assert.IsNull(IgiJson.Write(double.NaN), "no NaN in JSON");
            Assert.AreEqual("\"a\\u0001\\t\"", IgiJson.Quote("a\u0001\t"));
        }

        [Test]
        public void ActionRulesFollowTheProtocol()
        {
            foreach (string name in new[] { "a", "follow", "Trade_2", "x-y", new string('n', 64) })
                Assert.IsTrue(ActionRules.IsValidName(name), name);
            foreach (string name in new[] { null, "", "auto", "none", "required", "open door", "é", new string('n', 65), "a.b" })
                Assert.IsFalse(ActionRules.IsValidName(name), name ?? "null");
            Assert.IsNull(ActionRules.Problem(null, null, null, 100));
            Assert.IsNull(ActionRules.Problem(null, ActionChoice.None, null, 100), "none needs no tools");
            Assert.IsNull(ActionRules.Problem(new[] { ActionTests.Follow }, "follow", new[] { new ActionResult("call_1", "ok") }, 100));
            var many = Enumerable.Range(0, 33).Select(k => new NpcAction("a" + k)).ToArray();
            StringAssert.Contains("limit 32", ActionRules.Problem(many, null, null, 100));
            Assert.IsNull(ActionRules.Problem(many.Take(32).ToArray(), null, null, 100));
            var results = Enumerable.Range(0, 17).Select(k => new ActionResult("c" + k, "")).ToArray();
            StringAssert.Contains("limit 16", ActionRules.Problem(null, null, results, 100));
            StringAssert.Contains("content", ActionRules.Problem(null, null, new[] { new ActionResult("c", new string('x', 101)) }, 100));
            StringAssert.Contains("grammar", ActionRules.Problem(new[] { ActionTests.Follow }, null, null, 100, true));
        }
    }
}
