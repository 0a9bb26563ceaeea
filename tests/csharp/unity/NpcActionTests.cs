// NpcDialogue's actions (protocol 1.3 tools) outside Unity, driven by hand against the sidecar
// its IgiSidecar starts (the default model): an NPC that may follow, trade or attack is asked
// to act, OnAction comes for a declared action with valid arguments, the game answers from
// OnAction itself, and the NPC's reply continues from the result (OnToken, OnReply); a broken
// declaration is an OnError invalid_body, and the NPC talks on afterwards.
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
        string data;

        [SetUp]
        public void Setup()
        {
            if (string.IsNullOrEmpty(Environment.GetEnvironmentVariable("IGI_SDK_EXE"))) Assert.Ignore("IGI_SDK_EXE is not set");
            data = Path.Combine(Path.GetTempPath(), "igi-unity-" + Guid.NewGuid().ToString("N").Substring(0, 8));
            Directory.CreateDirectory(data);
            Environment.SetEnvironmentVariable("IGI_STUB_DATA", data);
            Environment.SetEnvironmentVariable("IGI_STUB_EDITOR", "0");
            Engine.ResetStatics(typeof(IgiSidecar));
            Engine.ResetStatics(typeof(NpcDialogue));
        }

        [TearDown]
        public void TearDown()
        {
            foreach (var c in live) Engine.Call(c, "OnApplicationQuit");
            foreach (var c in live) Engine.Call(c, "OnDisable");
            foreach (var c in live) Engine.Call(c, "OnDestroy");
            live.Clear();
            SidecarKeys.ForgetLaunch(0);
            try { Directory.Delete(data, true); } catch (IOException) { } catch (UnauthorizedAccessException) { }
        }

        [Test]
        [Timeout(900000)]
        public void AnNpcActsTheGameAnswersAndTheNpcRepliesFromTheResult()
        {
            var sidecar = Engine.Add<IgiSidecar>("Igi Sidecar", live);
            sidecar.Port = 0;
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
    }
}
