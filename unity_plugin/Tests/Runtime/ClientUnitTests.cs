// The client's own rules, against a scripted transport (no sidecar): unknown reply types and
// fields, silence, timeouts, hello_required, a 1.0 sidecar, local refusals, dispose.
using System;
using System.Collections.Generic;
using System.Linq;
using System.Threading;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Client")]
    public class ClientUnitTests : FakeClientFixture
    {
        [Test]
        [Timeout(10000)]
        public void UnknownReplyTypesAndFieldsAreIgnored()
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello") { fake.Reply(id, "ok", FakeTransport.HelloOk()); return; }
                fake.Reply(id, "progress", Map("pct", 50L));                  // a type from the future
                fake.Reply(0, "heartbeat", Map("t", 1.0));
                fake.Reply(id + 1000, "ok", Map());                           // an id that is not ours
                fake.ReplyRaw(new byte[] { 0xc1, 0x00 });                     // garbage
                fake.Reply(id, "ok", Map("t", 5.0, "new_field", Map("x", 1L), "ignored", new List<object> { "foo" }));
            };
            Start();
            var ping = Pumping.Ok(client, client.Ping(), 5);
            Assert.AreEqual(5.0, ping.GetDouble("t"));
            CollectionAssert.AreEqual(new[] { "foo" }, ping.Ignored);
        }

        [Test]
        [Timeout(10000)]
        public void SilenceMakesPendingRequestsUnavailable()
        {
            fake.OnRequest = (id, type, body) => { if (type == "hello") fake.Reply(id, "ok", FakeTransport.HelloOk()); };
            Start(o => o.SidecarSilenceSeconds = 0.5);
            var states = new List<IgiConnectionState>();
            client.ConnectionChanged += states.Add;
            var stream = client.Chat("s", "hello?");
            var ping = client.Ping();
            var error = Pumping.Fails(client, ping, IgiError.Unavailable, 5);
            Assert.IsTrue(error.Retryable);
            Pumping.Fails(client, stream, IgiError.Unavailable, 5);
            CollectionAssert.Contains(states, IgiConnectionState.Unavailable);
        }

        [Test]
        [Timeout(10000)]
        public void TimeoutRestartsWithEveryEventOfTheRequest()
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello") { fake.Reply(id, "ok", FakeTransport.HelloOk()); return; }
                if (type != "chat") return;
                // tokens every 150 ms for 1.2 s: longer than the timeout, never silent that long
                new Thread(() =>
                {
                    for (int i = 1; i <= 8; i++) { Thread.Sleep(150); fake.Reply(id, "token", Map("text", "x", "i", (long)i)); }
                }) { IsBackground = true }.Start();
            };
            Start();
            var stream = client.Chat("s", "hi");
            stream.TimeoutSeconds = 0.5;
            var error = Pumping.Fails(client, stream, IgiError.Timeout, 5);
            Assert.AreEqual(8, stream.LastTokenIndex, "the 150 ms gaps never tripped the 0.5 s timeout");
            Assert.IsTrue(error.Retryable);
            Pumping.Until(client, () => fake.SentOf("cancel").Count == 1, 2, "a cancel for the timed-out stream");
        }

        [Test]
        [Timeout(10000)]
        public void HelloRequiredSaysHelloResendsAndAdoptsItsSessions()
        {
            bool forgotten = false;
            fake.OnRequest = (id, type, body) =>
            {
                switch (type)
                {
                    case "hello": forgotten = false; fake.Reply(id, "ok", FakeTransport.HelloOk()); break;
                    case "open_session": fake.Reply(id, "ok", Map("session", "npc.a")); break;
                    case "adopt_session": fake.Reply(id, "ok", Map("session", body["session"])); break;
                    case "stats":
                        if (forgotten) fake.Reply(id, "error", Map("code", "hello_required", "message", "lease lapsed", "retryable", true));
                        else fake.Reply(id, "ok", Map("model", "fake.gguf"));
                        break;
                }
            };
            Start();
            Pumping.Ok(client, client.OpenSession(new SessionOptions { Name = "npc.a" }), 5);
            forgotten = true; // the sidecar forgot this client (its lease lapsed while the game hung)
            var stats = Pumping.Ok(client, client.Stats(), 5);
            Assert.AreEqual("fake.gguf", stats.GetString("model"));
            Assert.AreEqual(2, fake.SentOf("hello").Count);
            var adopted = fake.SentOf("adopt_session");
            Assert.AreEqual(1, adopted.Count, "the orphaned session is taken back");
            Assert.AreEqual("npc.a", MsgValue.GetString(MsgValue.GetMap(adopted[0], "body"), "session"));
        }

        [Test]
        [Timeout(10000)]
        public void TalksToA10SidecarWithALegacyHello()
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello")
                {
                    if (body.ContainsKey("minor") || body.ContainsKey("lease_s"))
                        fake.Reply(id, "error", Map("code", "invalid_body", "message", "unknown field minor", "retryable", false));
                    else
                        fake.Reply(id, "ok", Map("protocol", 1L, "model", "old.gguf", "loading", false, "limits", Map("max_text_chars", 100L)));
                    return;
                }
                if (type == "ping") fake.Reply(id, "ok", Map("t", 1.0));
            };
            Start();
            Assert.AreEqual(0, client.Server.Minor);
            Assert.IsFalse(client.Server.HasFeature(IgiFeatures.Goodbye));
            Pumping.Ok(client, client.Ping(), 5);
            // the limits come from hello: 101 characters are refused before sending
            Pumping.Fails(client, client.Chat("s", new string('a', 101)), IgiError.InvalidBody, 5);
        }

        [Test]
        [Timeout(10000)]
        public void DroppedStreamWithoutResumeFeatureEndsAsStreamLost()
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello")
                {
                    var ok = FakeTransport.HelloOk();
                    ok["features"] = new List<object> { "goodbye" }; // no resume_stream
                    fake.Reply(id, "ok", ok);
                }
                if (type == "chat") { fake.Reply(id, "token", Map("text", "a", "i", 1L)); }
            };
            Start();
            var stream = client.Chat("s", "hi");
            Pumping.Until(client, () => stream.LastTokenIndex == 1, 5, "first token");
            fake.Drop();
            var error = Pumping.Fails(client, stream, IgiError.StreamLost, 5);
            Assert.IsTrue(error.Retryable);
            Assert.GreaterOrEqual(fake.Connects, 2);
        }

        [Test]
        [Timeout(10000)]
        public void AGapInTokenIndexesIsFilledByResumeStream()
        {
            // events lost without a visible disconnect (e.g. libzmq reconnecting by itself)
            fake.OnRequest = (id, type, body) =>
            {
                switch (type)
                {
                    case "hello": fake.Reply(id, "ok", FakeTransport.HelloOk()); break;
                    case "chat":
                        fake.Reply(id, "token", Map("text", "a", "i", 1L));
                        fake.Reply(id, "token", Map("text", "b", "i", 2L));
                        fake.Reply(id, "token", Map("text", "e", "i", 5L)); // 3 and 4 were lost
                        fake.Reply(id, "token", Map("text", "f", "i", 6L));
                        break;
                    case "resume_stream":
                        long chat = (long)body["request"];
                        Assert.AreEqual(2L, body["after"]);
                        fake.Reply(id, "ok", Map("running", false, "replayed", 5L));
                        foreach (var t in new[] { "c", "d", "e", "f", "g" })
                            fake.Reply(chat, "token", Map("text", t, "i", (long)(t[0] - 'a' + 1)));
                        fake.Reply(chat, "done", Map("text", "abcdefg", "finish_reason", "stop"));
                        break;
                }
            };
            Start();
            var seen = new List<string>();
            var stream = client.Chat("s", "hi").OnToken(seen.Add);
            Pumping.Ok(client, stream, 5);
            CollectionAssert.AreEqual(new[] { "a", "b", "c", "d", "e", "f", "g" }, seen);
            Assert.AreEqual("abcdefg", stream.Text);
            Assert.AreEqual(1, fake.SentOf("resume_stream").Count);
        }

        [Test]
        [Timeout(10000)]
        public void NothingBlocksWhileNoSidecarListens()
        {
            fake.Refuse = true;
            Start(o => o.SidecarSilenceSeconds = 0.5, waitReady: false);
            var ping = client.Ping();
            var stream = client.Chat("s", "anyone?");
            client.Pump();
            // an order of events, not a figure in ms: a queued request fails 0.5 s after it was
            // queued (the silence above), so a call that waited for the sidecar would have had
            // the ping failed by the time this Pump delivers what happened
            Assert.IsFalse(ping.IsDone, "calls return at once: the ping is still waiting after Chat and Pump");
            Assert.IsFalse(stream.IsDone, "and so is the chat");
            Pumping.Fails(client, ping, IgiError.Unavailable, 5);
            Pumping.Fails(client, stream, IgiError.Unavailable, 5);
            Assert.AreEqual(IgiConnectionState.Connecting, client.State);
            fake.Refuse = false; // the sidecar comes up: the back-off loop finds it
            Pumping.Until(client, () => client.State == IgiConnectionState.Ready, 5, "connect after refusals");
        }

        [Test]
        [Timeout(10000)]
        public void DisposeSaysGoodbyeAndFailsWhatIsPendingQuietly()
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello") fake.Reply(id, "ok", FakeTransport.HelloOk());
                if (type == "goodbye") fake.Reply(id, "ok", Map("closed", 0L, "orphaned", 0L));
            };
            Start(o => o.KeepSessionsOnDispose = true);
            bool called = false;
            var never = client.Stats().OnError(e => called = true);
            client.Dispose();
            Assert.AreEqual(IgiConnectionState.Closed, client.State);
            Assert.IsTrue(never.IsDone);
            Assert.AreEqual(IgiError.Disposed, never.Error.Code);
            Assert.IsFalse(called, "no callbacks from Dispose");
            var bye = fake.SentOf("goodbye");
            Assert.AreEqual(1, bye.Count);
            Assert.AreEqual(true, MsgValue.GetMap(bye[0], "body")["keep_sessions"]);
            Assert.IsFalse(fake.IsConnected, "transport closed");
            var after = client.Ping();
            Assert.AreEqual(IgiError.Disposed, after.Error.Code);
        }

        [Test]
        [Timeout(10000)]
        public void TextThatIsNotUnicodeIsRefusedNotThrown()
        {
            Start();
            var broken = client.Chat("s", "half an emoji: \ud83d");
            var error = Pumping.Fails(client, broken, IgiError.InvalidBody, 5);
            StringAssert.Contains("surrogate", error.Message);
            Assert.AreEqual(0, fake.SentOf("chat").Count);
        }

        [Test]
        [Timeout(10000)]
        public void OversizedMessagesAreRefusedBeforeSending()
        {
            Start();
            // over the protocol's 17 MiB (the limit hello gives)
            var big = client.Send("stats", Map("blob", new byte[(int)Protocol.MaxMessageBytes]));
            Pumping.Fails(client, big, IgiError.InvalidBody, 5);
            Assert.AreEqual(0, fake.SentOf("stats").Count);
        }
    }
}
