// NpcDialogue's actions (protocol 1.3 tools) outside Unity, driven by hand against the sidecar
// its IgiSidecar starts (the default model; one sidecar for the fixture): an NPC that may follow,
// trade or attack is asked to act, OnAction comes for a declared action with valid arguments,
// the game answers from OnAction itself, and the NPC's reply continues from the result (OnToken,
// OnReply); a broken declaration is an OnError invalid_body, and the NPC talks on. Mantella's
// request with its four Advanced Actions (tool_choice auto) over 20 lines, each from an NPC of
// its own seed: every reply is a valid call of a declared action or plain text, and the first
// replies that act are answered with AnswerAction and continue in words.
using System;
using System.Collections.Generic;
using System.IO;
using Igi.Sdk;
using Igi.Sdk.Unity;
using NUnit.Framework;
using UnityEngine;

namespace Igi.Sdk.UnityTests
{
    [TestFixture]
    public class NpcActionTests
    {
        readonly List<MonoBehaviour> live = new List<MonoBehaviour>();
        IgiSidecar sidecar;
        string data;

        // one sidecar for the fixture's tests (its model loads once)
        [TestFixtureSetUp]
        public void StartSidecar()
        {
            if (string.IsNullOrEmpty(Environment.GetEnvironmentVariable("IGI_SDK_EXE"))) Assert.Ignore("IGI_SDK_EXE is not set");
            data = Path.Combine(Path.GetTempPath(), "igi-unity-" + Guid.NewGuid().ToString("N").Substring(0, 8));
            Directory.CreateDirectory(data);
            Environment.SetEnvironmentVariable("IGI_STUB_DATA", data);
            Environment.SetEnvironmentVariable("IGI_STUB_EDITOR", "0");
            Engine.ResetStatics(typeof(IgiSidecar));
            var owner = new List<MonoBehaviour>();
            sidecar = Engine.Add<IgiSidecar>("Igi Sidecar", owner);
            sidecar.Port = 0;
            // the settings the Python and C++ suites start it with (the thread count changes
            // what a seed samples)
            sidecar.ExtraArguments = new[] { "--threads", "2", "--ctx", "2048" };
            Assert.IsTrue(Engine.Frames(owner, () => sidecar.IsReady, 240), "ready: " + sidecar.State + " " + sidecar.LastError);
        }

        [TestFixtureTearDown]
        public void StopSidecar()
        {
            if (sidecar != null)
            {
                Engine.Call(sidecar, "OnApplicationQuit");
                Engine.Call(sidecar, "OnDisable");
                Engine.Call(sidecar, "OnDestroy");
                sidecar = null;
            }
            SidecarKeys.ForgetLaunch(0);
            if (data != null) { try { Directory.Delete(data, true); } catch (IOException) { } catch (UnauthorizedAccessException) { } }
        }

        [SetUp]
        public void Setup()
        {
            Engine.ResetStatics(typeof(NpcDialogue));
            live.Clear();
            live.Add(sidecar); // pumped with the test's NPCs
        }

        [TearDown]
        public void TearDown()
        {
            // the NPCs go (their sessions closed); the sidecar stays for the next test
            foreach (var c in live) if (c != sidecar) End(c);
            live.Clear();
        }

        static void End(MonoBehaviour c)
        {
            Engine.Call(c, "OnDisable");
            Engine.Call(c, "OnDestroy");
        }

        [Test]
        [Timeout(900000)]
        public void AnNpcActsTheGameAnswersAndTheNpcRepliesFromTheResult()
        {
            var npc = Engine.Add<NpcDialogue>("Brom", live);
            npc.SystemPrompt = "You are Brom, a blacksmith in a fantasy game. You can follow the player, trade and attack.";
            npc.Sampling.temperature = 0f;
            npc.MaxTokens = 48;
            npc.ActionReplyTimeoutSeconds = 400;
            npc.DeclareAction(new NpcAction("follow", "Follow the player.",
                ActionParameters.Object().Integer("distance", "metres behind the player", minimum: 1, maximum: 10)));
            npc.DeclareAction(new NpcAction("trade", "Offer the player an item for gold.",
                ActionParameters.Object().String("item").Integer("price", "gold coins", minimum: 1)));
            npc.DeclareAction(new NpcAction("attack", "Attack a target.",
                ActionParameters.Object().Enum("target", null, "player", "wolf", "bandit")));
            npc.ActionChoiceSetting = ActionChoice.Required;
            npc.ParallelActions = false;

            var order = new List<string>();
            var errors = new List<string>();
            var tokens = new List<string>();
            ActionCall seen = null;
            npc.OnAction += call =>
            {
                seen = call;
                order.Add("action " + call.Name);
                // the game does it at once and says what came of it
                Assert.IsTrue(npc.AnswerAction(call.Id, "Done: " + call.Name + " " + call.Arguments));
            };
            npc.OnToken += piece => tokens.Add(piece);
            npc.OnReply += text => order.Add("reply");
            npc.OnError += (code, message) => errors.Add(code + ": " + message);

            Assert.IsTrue(Engine.Frames(live, () => sidecar.IsReady && npc.IsReady, 120), "ready: " + sidecar.State + " " + sidecar.LastError);
            Assert.IsTrue(npc.Say("Follow me to the mill, smith."));
            // the reply that acts, then the one that continues from the result
            Assert.IsTrue(Engine.Frames(live, () => order.Count >= 3 || errors.Count > 0, 800), "order: " + string.Join(", ", order.ToArray()));
            CollectionAssert.IsEmpty(errors);
            Assert.IsNotNull(seen);
            CollectionAssert.Contains(new[] { "follow", "trade", "attack" }, seen.Name);
            Assert.IsNotNull(seen.Args, "arguments are a JSON object");
            CollectionAssert.AreEqual(new[] { "action " + seen.Name, "reply", "reply" }, order);
            Assert.AreEqual(0, npc.LastActionCalls.Count, "the last reply only talked (choice after results: none)");
            Assert.Greater(tokens.Count, 0);
            Assert.AreEqual(string.Concat(tokens.ToArray()), npc.LastReply);
            Assert.AreEqual(0, npc.UnansweredActions.Count);

            // a broken declaration: the line fails typed, before anything is sent
            npc.DeclareAction(new NpcAction("open door"));
            Assert.IsTrue(npc.Say("Open the door."));
            Assert.IsTrue(Engine.Frames(live, () => errors.Count > 0, 30));
            StringAssert.StartsWith(IgiError.InvalidBody + ": tools[3].name", errors[0]);
            Assert.IsFalse(npc.AnswerAction("call_nope", "x"), "no such call");
            StringAssert.StartsWith("unknown_action_call", errors[errors.Count - 1]);

            // without the broken action and free to talk, the NPC talks on
            npc.ClearActions();
            int replies = order.Count;
            Assert.IsTrue(npc.Say("Thank you."));
            Assert.IsTrue(Engine.Frames(live, () => order.Count > replies, 300));
            Console.WriteLine("measured: the NPC called " + seen + ", then said: " + npc.LastReply);
        }

        // ---- Mantella's request: its Advanced Actions, tool_choice auto, 20 lines ------------------

        const string Lydia = "You are Lydia, a Nord housecarl in Whiterun. You are talking with the Dragonborn. "
            + "Speak briefly, in character.";
        static readonly string[] Lines = { "Follow me, Lydia.", "Attack that bandit!", "Let's trade.", "Wait here for me.", "How are you today?" };

        // the actions as Mantella's function manager declares them (its own "scope" keys in the
        // properties; Inventory takes no parameters)
        static NpcAction[] MantellaActions()
        {
            return new[]
            {
                new NpcAction("Follow", "Start following the player.",
                    "{\"type\": \"object\", \"properties\": {\"source\": {\"type\": \"string\", \"description\": \"Who follows: one of Lydia\", "
                    + "\"scope\": \"conversation\"}}, \"required\": [\"source\"]}"),
                new NpcAction("Attack", "Attack someone nearby.",
                    "{\"type\": \"object\", \"properties\": {\"source\": {\"type\": \"string\", \"scope\": \"conversation\"}, "
                    + "\"target\": {\"type\": \"string\", \"description\": \"Who is attacked: a nearby NPC\", \"scope\": \"nearby_w_player\"}}, "
                    + "\"required\": [\"source\", \"target\"]}"),
                new NpcAction("Inventory", "Open your inventory to trade with the player."),
                new NpcAction("Wait", "Wait here.",
                    "{\"type\": \"object\", \"properties\": {\"minutes\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 120}}, "
                    + "\"required\": [\"minutes\"]}"),
            };
        }

        // What is wrong with a call against the four schemas (null: nothing). Each object is
        // closed (no keys besides its properties) and every property is required: Follow a
        // string source, Attack string source and target, Inventory nothing, Wait an integer
        // 1..120 (5.0 is an integer to JSON Schema).
        static string CallProblem(ActionCall call)
        {
            string[] strings;
            switch (call.Name)
            {
                case "Follow": strings = new[] { "source" }; break;
                case "Attack": strings = new[] { "source", "target" }; break;
                case "Inventory": strings = new string[0]; break;
                case "Wait": strings = null; break;
                default: return "undeclared action " + call.Name;
            }
            var args = call.Args;
            if (args == null) return "arguments are not a JSON object: " + call.Arguments;
            int expected = strings != null ? strings.Length : 1;
            if (args.Count != expected) return call.Name + " takes " + expected + " arguments: " + call.Arguments;
            if (strings == null)
            {
                object minutes;
                if (!args.TryGetValue("minutes", out minutes)) return "Wait without minutes: " + call.Arguments;
                double value;
                if (minutes is long) value = (long)minutes;
                else if (minutes is double && Math.Floor((double)minutes) == (double)minutes) value = (double)minutes;
                else return "Wait's minutes is not an integer: " + call.Arguments;
                return value >= 1 && value <= 120 ? null : "Wait's minutes outside 1..120: " + call.Arguments;
            }
            foreach (string key in strings)
            {
                object v;
                if (!args.TryGetValue(key, out v)) return call.Name + " without " + key + ": " + call.Arguments;
                if (!(v is string)) return call.Name + "'s " + key + " is not a string: " + call.Arguments;
            }
            return null;
        }

        [Test]
        [Timeout(1100000)]
        public void MantellasActionsOver20LinesAreValidCallsOrTextAndTheResultIsAnswered()
        {
            int calls = 0, text = 0, invalid = 0, followed = 0;
            var problems = new List<string>();
            for (int k = 0; k < 20; k++)
            {
                // an NPC per line: the seed goes with the session (open_session's sampling)
                var npc = Engine.Add<NpcDialogue>("Lydia" + k, live);
                npc.SystemPrompt = Lydia;
                npc.Sampling.temperature = 0.9f;
                npc.Sampling.seed = 100 + k;
                npc.MaxTokens = 64;
                npc.StopStrings = new[] { "\n" }; // a spoken line ends at its newline; a call is never cut by it
                npc.ActionReplyTimeoutSeconds = 400;
                foreach (var action in MantellaActions()) npc.DeclareAction(action);
                var replies = new List<string>();
                var errors = new List<string>();
                var acted = new List<ActionCall>();
                IList<ActionCall> ended = null;
                npc.OnAction += call => acted.Add(call);
                npc.OnReply += said =>
                {
                    if (replies.Count == 0) ended = npc.LastActionCalls;
                    replies.Add(said);
                };
                npc.OnError += (code, message) => errors.Add(code + ": " + message);
                string line = Lines[k % Lines.Length];
                Assert.IsTrue(npc.Say(line)); // sent once its session is open
                Assert.IsTrue(Engine.Frames(live, () => replies.Count > 0 || errors.Count > 0, 420), "line " + k + ": no reply");

                string problem = null;
                if (errors.Count > 0) problem = errors[0];
                else if (ended.Count > 0)
                {
                    if (replies[0].Length > 0) problem = "text with calls: " + replies[0];
                    foreach (var call in ended) problem = problem ?? CallProblem(call);
                    // OnAction raised each call once, in order, before OnReply
                    var raised = new List<string>();
                    foreach (var call in acted) raised.Add(call.Id);
                    var listed = new List<string>();
                    foreach (var call in ended) listed.Add(call.Id);
                    CollectionAssert.AreEqual(listed, raised, "line " + k);
                }
                else if (replies[0].Trim().Length == 0 || replies[0].Contains("<tool_call>")) problem = "neither text nor a call: '" + replies[0] + "'";
                if (problem != null)
                {
                    invalid++;
                    problems.Add("line " + k + " (" + line + "): " + problem);
                }
                else if (ended.Count > 0) calls++;
                else text++;

                // the game does the first replies' actions and says what came of them, as
                // Mantella sends tool messages: the NPC goes on in words
                if (problem == null && ended.Count > 0 && followed < 2)
                {
                    followed++;
                    foreach (var call in ended) Assert.IsTrue(npc.AnswerAction(call.Id, "done"), "line " + k + ": " + call);
                    Assert.IsTrue(Engine.Frames(live, () => replies.Count > 1 || errors.Count > 0, 420), "line " + k + ": no reply after the results");
                    CollectionAssert.IsEmpty(errors, "line " + k);
                    Assert.IsNotEmpty(replies[1].Trim(), "line " + k + ": the reply after the results (" + npc.LastFinishReason + ")");
                    Assert.AreEqual(0, npc.LastActionCalls.Count, "line " + k + ": choice after results none");
                    Console.WriteLine("measured: Unity NPC line " + k + " called " + ended[0] + "; after the result it said: " + replies[1]);
                }
                live.Remove(npc);
                End(npc); // its session closed: the next NPC opens its own
            }
            Console.WriteLine("measured: Unity NpcDialogue, Mantella's 4 actions over 20 lines: " + calls + " call, " + text
                + " text, " + invalid + " invalid; " + followed + " answered with AnswerAction and continued in words");
            Assert.AreEqual(0, invalid, string.Join("\n", problems.ToArray()));
            Assert.AreEqual(20, calls + text);
        }
    }
}
