// Protocol 1.2 in the client, against a scripted transport: hello.owner and hello.token, their
// local checks, what the hello answer says (game, owner), a wrong token, a busy sidecar, older
// sidecars that refuse the new fields, frame's "paced".
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.Linq;
using System.Threading;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Client")]
    public class OwnerUnitTests : FakeClientFixture
    {
        const string Owner = "owner-key_0123456789abcdef";
        const string Token = "launch-token_0123456789ABCDEF";

        static Dictionary<string, object> Hello12(bool game, string owner)
        {
            var ok = FakeTransport.HelloOk();
            ok["minor"] = 2L;
            ok["game"] = game;
            ok["owner"] = owner;
            ((List<object>)ok["features"]).AddRange(new object[] { "owners", "launch_token" });
            return ok;
        }

        static Dictionary<string, object> Refusal(string code, bool retryable)
        {
            return Map("code", code, "message", "refused (fake)", "retryable", retryable);
        }

        Dictionary<string, object> HelloBody(int index)
        {
            return (Dictionary<string, object>)fake.SentOf("hello")[index]["body"];
        }

        [Test]
        [Timeout(10000)]
        public void HelloCarriesTheOwnerKeyAndTheLaunchToken()
        {
            fake.OnRequest = (id, type, body) => { if (type == "hello") fake.Reply(id, "ok", Hello12(true, "key")); };
            Start(o => { o.OwnerKey = Owner; o.LaunchToken = Token; });
            var hello = HelloBody(0);
            Assert.AreEqual(Owner, hello["owner"]);
            Assert.AreEqual(Token, hello["token"]);
            Assert.AreEqual((long)Protocol.Minor, hello["minor"]);
            Assert.IsTrue(client.IsGame);
            Assert.AreEqual("key", client.Server.OwnerScope);
            Assert.IsTrue(client.Server.HasFeature(IgiFeatures.Owners) && client.Server.HasFeature(IgiFeatures.LaunchToken));
        }

        [Test]
        [Timeout(10000)]
        public void WithoutThemHelloHasNeitherField()
        {
            fake.OnRequest = (id, type, body) => { if (type == "hello") fake.Reply(id, "ok", Hello12(false, "connection")); };
            Start(o => { });
            var hello = HelloBody(0);
            Assert.IsFalse(hello.ContainsKey("owner") || hello.ContainsKey("token"), string.Join(",", hello.Keys.ToArray()));
            Assert.IsFalse(client.IsGame, "hello.game false: a guest");
            Assert.AreEqual("connection", client.Server.OwnerScope);
        }

        [Test]
        [Timeout(10000)]
        public void AnOlderSidecarsHelloMakesEveryClientTheGame()
        {
            Start(o => { }); // the fake answers like a 1.1 sidecar: no game, no owner
            Assert.IsTrue(client.IsGame);
            Assert.AreEqual("connection", client.Server.OwnerScope);
        }

        [Test]
        public void MalformedKeysAreRefusedByTheConstructorWithoutEchoingThem()
        {
            var bad = new[]
            {
                "short-key",                       // 9 characters
                new string('k', 129),              // too long
                "has spaces in the owner key!",    // outside [A-Za-z0-9_-]
                "ünïcode-letters-are-not-allowed",
                "",
            };
            foreach (string key in bad)
            {
                var owner = Assert.Throws<ArgumentException>(() => new IgiClient(new IgiClientOptions { TransportFactory = () => fake, OwnerKey = key }));
                StringAssert.Contains("OwnerKey", owner.Message);
                if (key.Length > 0) StringAssert.DoesNotContain(key, owner.Message, "a secret is not repeated in errors");
                var token = Assert.Throws<ArgumentException>(() => new IgiClient(new IgiClientOptions { TransportFactory = () => fake, LaunchToken = key }));
                StringAssert.Contains("LaunchToken", token.Message);
            }
            Assert.AreEqual(0, fake.Connects, "nothing was started");
            // the bounds themselves are fine
            using (new IgiClient(new IgiClientOptions { TransportFactory = () => new FakeTransport(), OwnerKey = new string('a', 16), LaunchToken = new string('Z', 128) })) { }
        }

        [Test]
        public void NewKeysAreValidAndUnlike()
        {
            var keys = Enumerable.Range(0, 200).Select(i => IgiKeys.New()).ToList();
            foreach (string key in keys)
            {
                Assert.IsNull(IgiKeys.Problem(key), key);
                Assert.AreEqual(43, key.Length, "32 random bytes, base64url without padding");
            }
            Assert.AreEqual(keys.Count, keys.Distinct().Count());
            // every one of the 64 characters turns up: the bytes are spread, not e.g. hex
            Assert.AreEqual(64, new HashSet<char>(string.Concat(keys.ToArray())).Count);
        }

        [Test]
        [Timeout(10000)]
        public void AKeyBrokenAfterConstructionIsNeverSent()
        {
            bool dropNext = false;
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello") fake.Reply(id, "ok", Hello12(true, "key"));
                if (type == "ping" && dropNext) { dropNext = false; fake.Drop(); }
                else if (type == "ping") fake.Reply(id, "ok", Map("t", 1.0));
            };
            Start(o => o.OwnerKey = Owner);
            client.Options.OwnerKey = "not a key";
            dropNext = true;
            var ping = client.Ping(); // the connection drops: the reconnect's hello would carry the bad key
            var error = Pumping.Fails(client, client.Stats(), IgiError.InvalidBody, 5);
            StringAssert.Contains("OwnerKey", error.Message);
            Assert.AreEqual(1, fake.SentOf("hello").Count, "no hello with the broken key went out");
            Pumping.Until(client, () => ping.IsDone, 5, "the ping's end");
            Assert.IsNotNull(client.HelloRefusal);
        }

        [Test]
        [Timeout(10000)]
        public void AWrongTokenIsForbiddenAndANewOneIsUsedAtTheNextHello()
        {
            string good = "the-right-token_0123456789";
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello")
                {
                    if (MsgValue.GetString(body, "token") == good) fake.Reply(id, "ok", Hello12(true, "key"));
                    else fake.Reply(id, "error", Refusal(IgiError.Forbidden, false));
                }
                if (type == "ping") fake.Reply(id, "ok", Map("t", 1.0));
            };
            var refusals = new List<IgiError>();
            Start(o => { o.OwnerKey = Owner; o.LaunchToken = Token; }, false);
            client.HelloRefused += refusals.Add;
            var ping = client.Ping();
            var error = Pumping.Fails(client, ping, IgiError.Forbidden, 5);
            Assert.IsFalse(error.Retryable);
            // one per hello refused: the one on connect, and maybe one more the ping asked for
            Assert.That(refusals.Count, Is.InRange(1, 2));
            Assert.IsTrue(refusals.All(r => r.Code == IgiError.Forbidden && !r.Retryable));
            Assert.AreEqual(IgiError.Forbidden, client.HelloRefusal.Code);
            Assert.AreNotEqual(IgiConnectionState.Ready, client.State);

            client.Options.LaunchToken = good; // the launcher knows better now
            Pumping.Ok(client, client.Ping(), 5);
            Assert.IsTrue(client.IsGame);
            Assert.IsNull(client.HelloRefusal, "cleared by the hello that was answered");
            Assert.AreEqual(good, MsgValue.GetString(HelloBody(fake.SentOf("hello").Count - 1), "token"));
        }

        [Test]
        [Timeout(10000)]
        public void TheRefusalIsDeliveredBeforeTheFailuresItCauses()
        {
            long heldHello = 0;
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello" && heldHello == 0) Interlocked.Exchange(ref heldHello, id);
                else if (type == "hello") fake.Reply(id, "error", Refusal(IgiError.Forbidden, false));
            };
            var refusals = new List<IgiError>();
            Start(o => o.LaunchToken = Token, false);
            client.HelloRefused += refusals.Add;
            Pumping.Until(client, () => Interlocked.Read(ref heldHello) != 0, 5, "the first hello");
            var ping = client.Ping();
            Thread.Sleep(100); // the I/O thread (2 ms turns) has taken the ping: it waits on hello
            fake.Reply(heldHello, "error", Refusal(IgiError.Forbidden, false));
            var clock = Stopwatch.StartNew();
            while (!ping.IsDone)
            {
                client.Pump(1); // one event at a time: the order they were queued in
                Assert.Less(clock.Elapsed.TotalSeconds, 5, "the ping never ended");
                Thread.Sleep(1);
            }
            Assert.AreEqual(IgiError.Forbidden, ping.Error.Code);
            Assert.AreEqual(1, refusals.Count, "HelloRefused was raised before the ping it failed");
            Assert.AreEqual(IgiError.Forbidden, client.HelloRefusal.Code);
        }

        [Test]
        [Timeout(10000)]
        public void ABusySidecarIsGreetedAgainAfterAPause()
        {
            int hellos = 0;
            fake.OnRequest = (id, type, body) =>
            {
                if (type != "hello") return;
                if (++hellos < 3) fake.Reply(id, "error", Refusal("busy", true));
                else fake.Reply(id, "ok", Hello12(false, "key"));
            };
            var refusals = new List<IgiError>();
            Start(o => o.OwnerKey = Owner, false);
            client.HelloRefused += refusals.Add;
            Pumping.Until(client, () => client.State == IgiConnectionState.Ready, 8, "hello after two busy refusals");
            Assert.AreEqual(3, hellos);
            Assert.AreEqual(2, refusals.Count);
            Assert.IsTrue(refusals.All(r => r.Code == "busy" && r.Retryable));
        }

        [Test]
        [Timeout(10000)]
        public void A11SidecarThatRefusesOwnerAndTokenGetsA11Hello()
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type != "hello") return;
                if (body.ContainsKey("owner") || body.ContainsKey("token"))
                    fake.Reply(id, "error", Refusal("invalid_body", false));
                else
                    fake.Reply(id, "ok", FakeTransport.HelloOk());
            };
            Start(o => { o.OwnerKey = Owner; o.LaunchToken = Token; });
            var second = HelloBody(1);
            Assert.AreEqual((long)Protocol.Minor, second["minor"], "still a 1.1 hello: minor and lease_s kept");
            Assert.IsTrue(second.ContainsKey("lease_s"));
            Assert.AreEqual(1, client.Server.Minor);
            Assert.IsTrue(client.IsGame);
        }

        [Test]
        [Timeout(10000)]
        public void A10SidecarIsReachedInThreeSteps()
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type != "hello") return;
                if (body.Count > 4) // anything past protocol, engine, client_name, game_pid
                    fake.Reply(id, "error", Refusal("invalid_body", false));
                else
                    fake.Reply(id, "ok", Map("protocol", 1L, "model", "old.gguf", "loading", false));
            };
            Start(o => { o.OwnerKey = Owner; });
            Assert.AreEqual(3, fake.SentOf("hello").Count);
            Assert.IsFalse(HelloBody(2).ContainsKey("minor"));
            Assert.AreEqual(0, client.Server.Minor);
        }

        [Test]
        [Timeout(10000)]
        public void FramesSayWhetherTheyPaced()
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello") fake.Reply(id, "ok", Hello12(false, "key"));
                if (type == "frame") fake.Reply(id, "ok", Map("paced", false));
            };
            Start(o => o.OwnerKey = Owner);
            var frame = Pumping.Ok(client, client.Frame(1, 16.6, 16.6), 5);
            Assert.IsFalse(frame.GetBool("paced", true));
        }
    }
}
