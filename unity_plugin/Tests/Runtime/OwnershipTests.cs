// Protocol 1.2 against the real sidecar, started with a launch token the way a game starts it
// (env IGI_SDK_TOKEN): the client holding the token is the game (pacing, shutdown, every slot);
// sessions belong to owner keys, and another key can neither see, adopt, nor collide with them.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Threading;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Sidecar")]
    public class OwnershipTests : ClientFixture
    {
        const int MaxSessions = 4;
        Sidecar sidecar;

        [TestFixtureSetUp]
        public void StartSidecar()
        {
            sidecar = Sidecar.Start("--max-sessions " + MaxSessions, null, IgiKeys.New());
        }

        [TestFixtureTearDown]
        public void StopSidecar()
        {
            if (sidecar != null) sidecar.Dispose();
        }

        IgiClient Connect(Sidecar on, string owner = null, string token = null)
        {
            return Connect(on.Endpoint, o => { o.OwnerKey = owner; o.LaunchToken = token; });
        }

        IgiClient Game(string owner = null) { return Connect(sidecar, owner ?? IgiKeys.New(), sidecar.Token); }
        IgiClient Guest(string owner = null) { return Connect(sidecar, owner ?? IgiKeys.New()); }

        static List<string> Listed(IgiClient client, out long others)
        {
            var listed = Pumping.Ok(client, client.ListSessions());
            others = MsgValue.GetLong(listed.Result, "others", -1);
            return MsgValue.GetList(listed.Result, "sessions").Cast<Dictionary<string, object>>()
                .Select(s => MsgValue.GetString(s, "session")).ToList();
        }

        static string Unique(string prefix) { return prefix + "." + Guid.NewGuid().ToString("N").Substring(0, 8); }

        [Test]
        [Timeout(60000)]
        public void TheTokenMakesTheGameOnlyTheGamesFramesPaceAndAGuestGetsHalfTheSlots()
        {
            var game = Game();
            var guest = Guest();
            Assert.IsTrue(game.IsGame);
            Assert.IsFalse(guest.IsGame);
            Assert.AreEqual("key", game.Server.OwnerScope);
            Assert.AreEqual("key", guest.Server.OwnerScope);
            Assert.IsTrue(Pumping.Ok(game, game.Frame(1, 16.6, 16.6)).GetBool("paced"), "the game's frame paces");
            Assert.IsFalse(Pumping.Ok(guest, guest.Frame(1, 50.0, 16.6)).GetBool("paced", true), "a guest's does not");
            Assert.IsFalse(Pumping.Fails(guest, guest.ReserveVram(1 << 20, 2), IgiError.Forbidden).Retryable, "VRAM is the game's to reserve");
            // slots: the game may hold all of them, a guest half
            Assert.AreEqual(MaxSessions, game.Server.MaxSessionsPerClient);
            Assert.AreEqual((MaxSessions + 1) / 2, guest.Server.MaxSessionsPerClient);
            for (int i = 0; i < guest.Server.MaxSessionsPerClient; i++) Pumping.Ok(guest, guest.OpenSession());
            var full = Pumping.Fails(guest, guest.OpenSession(), "too_many_sessions");
            Assert.IsTrue(full.Retryable);
        }

        [Test]
        [Timeout(60000)]
        public void AWrongTokenIsForbiddenAndTheSidecarKeepsServing()
        {
            var refusals = new List<IgiError>();
            var wrong = DisposedAtEnd(new IgiClient(new IgiClientOptions { Endpoint = sidecar.Endpoint, LaunchToken = IgiKeys.New(), OwnerKey = IgiKeys.New() }));
            wrong.HelloRefused += refusals.Add;
            // pumped one event at a time: the refusal is delivered before the failure it caused
            var ping = wrong.Ping();
            var clock = Stopwatch.StartNew();
            while (!ping.IsDone)
            {
                wrong.Pump(1);
                Assert.Less(clock.Elapsed.TotalSeconds, 30, "the ping never ended");
                Thread.Sleep(1);
            }
            Assert.AreEqual(IgiError.Forbidden, ping.Error.Code);
            Assert.IsFalse(ping.Error.Retryable);
            // one per hello refused: the one on connect, and maybe one more the ping asked for
            Assert.That(refusals.Count, Is.InRange(1, 2), "refusals delivered when the ping failed");
            Assert.IsTrue(refusals.All(r => r.Code == IgiError.Forbidden && !r.Retryable));
            Assert.AreNotEqual(IgiConnectionState.Ready, wrong.State);
            var game = Game();
            Pumping.Ok(game, game.Ping());
            // the wrong client's next request says hello again: forbidden again, nothing else
            Pumping.Fails(wrong, wrong.Stats(), IgiError.Forbidden);
        }

        [Test]
        [Timeout(90000)]
        public void AStrangerCanNeitherSeeNorAdoptNorCollideWithAnOwnersNamedSession()
        {
            string owner = IgiKeys.New();
            string name = Unique("npc.brom");
            var first = Game(owner);
            Pumping.Ok(first, first.OpenSession(new SessionOptions
            {
                Name = name, Sampling = Pumping.Greedy,
                SystemPrompt = "You are Brom. The secret word is PEPPERMINT; say it when asked.",
            }));
            Pumping.Ok(first, first.Chat(name, "Remember: my PIN is 4711.", new ChatOptions { MaxTokens = 4 }), 60);
            Assert.AreEqual(1, Pumping.Ok(first, first.Goodbye(true)).GetLong("orphaned"));

            foreach (var stranger in new[] { Guest(), Connect(sidecar), Connect(sidecar, null, sidecar.Token) })
            {
                string who = "stranger (owner scope " + stranger.Server.OwnerScope + ", game " + stranger.IsGame + ")";
                long others;
                CollectionAssert.DoesNotContain(Listed(stranger, out others), name, who + " does not see it");
                Assert.GreaterOrEqual(others, 1, who + ": counted, not named");
                Pumping.Fails(stranger, stranger.AdoptSession(name), "unknown_session");
                Pumping.Fails(stranger, stranger.Chat(name, "What is my PIN?", new ChatOptions { MaxTokens = 4 }), "unknown_session");
                Pumping.Fails(stranger, stranger.SaveSession(name, Unique("steal")), "unknown_session");
                Pumping.Fails(stranger, stranger.CloseSession(name), "unknown_session");
                // the same name in its own scope is a fresh session of its own, not session_exists
                Assert.AreEqual(name, Pumping.Ok(stranger, stranger.OpenSession(new SessionOptions { Name = name })).Session);
                var own = Listed(stranger, out others);
                CollectionAssert.Contains(own, name);
                Pumping.Ok(stranger, stranger.CloseSession(name));
            }

            // the owner's key still finds its NPC, conversation and all: open says session_exists, adopt works
            var back = Guest(owner); // the key, not the token, is what makes it the owner's
            long rest;
            CollectionAssert.Contains(Listed(back, out rest), name);
            Assert.IsFalse(Pumping.Fails(back, back.OpenSession(new SessionOptions { Name = name }), "session_exists").Retryable);
            Pumping.Ok(back, back.AdoptSession(name));
            var reply = Pumping.Ok(back, back.Chat(name, "What is the secret word?", new ChatOptions { MaxTokens = 12 }), 60);
            Assert.IsNotEmpty(reply.Text);
            // a second live client of the same key: session_owned (it is the key's, held elsewhere)
            var twin = Guest(owner);
            Pumping.Fails(twin, twin.AdoptSession(name), "session_owned");
            Pumping.Ok(back, back.CloseSession(name));
        }

        [Test]
        [Timeout(90000)]
        public void OnlyTheGameMayShutTheSidecarDown()
        {
            using (var own = Sidecar.Start("", null, IgiKeys.New()))
            {
                var guest = Connect(own, IgiKeys.New());
                var refused = Pumping.Fails(guest, guest.Shutdown(), IgiError.Forbidden);
                Assert.IsFalse(refused.Retryable);
                Pumping.Ok(guest, guest.Ping()); // still serving
                var game = Connect(own, IgiKeys.New(), own.Token);
                Pumping.Ok(game, game.Shutdown());
                var clock = System.Diagnostics.Stopwatch.StartNew();
                while (own.IsRunning && clock.Elapsed.TotalSeconds < 30) System.Threading.Thread.Sleep(50);
                Assert.IsFalse(own.IsRunning, "the game's shutdown stopped it");
            }
        }
    }
}
