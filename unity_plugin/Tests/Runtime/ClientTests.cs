// The client against the real sidecar (one shared instance): hello, streaming, cancel, saves,
// priorities, listing, adoption after goodbye, named sessions, JSON-schema strings, limits.
using System;
using System.Collections.Generic;
using System.Linq;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Sidecar")]
    public class ClientTests : ClientFixture
    {
        IgiClient Connect(Action<IgiClientOptions> configure = null)
        {
            return Connect(Sidecar.Shared.Endpoint, configure);
        }

        static string Unique(string prefix) { return prefix + "." + Guid.NewGuid().ToString("N").Substring(0, 8); }

        string Open(IgiClient client, SessionOptions options = null)
        {
            options = options ?? new SessionOptions { Persona = "Brom", Sampling = Pumping.Greedy };
            return Pumping.Ok(client, client.OpenSession(options)).Session;
        }

        [Test]
        [Timeout(30000)]
        public void HelloIsAutomaticAndAdvertisesProtocol13()
        {
            var client = Connect();
            Assert.AreEqual(1, client.Server.Protocol);
            Assert.AreEqual(3, client.Server.Minor);
            Assert.IsTrue(client.IsGame, "a sidecar started without a launch token takes every client as the game");
            Assert.AreEqual("connection", client.Server.OwnerScope, "no owner key given");
            Assert.AreEqual(15.0, client.Server.LeaseSeconds);
            Assert.IsNotNull(client.Server.Model);
            foreach (var feature in new[] { IgiFeatures.Goodbye, IgiFeatures.Leases, IgiFeatures.ListSessions,
                IgiFeatures.AdoptSession, IgiFeatures.SetPriority, IgiFeatures.ResumeStream, IgiFeatures.JsonSchemaString,
                IgiFeatures.Images, IgiFeatures.Owners, IgiFeatures.LaunchToken, IgiFeatures.Tools })
                Assert.IsTrue(client.Server.HasFeature(feature), "feature " + feature);
            Assert.AreEqual(262144, client.Server.MaxTextChars, "hello.limits (1.3; 32 000 before)");
            var ping = Pumping.Ok(client, client.Ping());
            Assert.Greater(ping.GetDouble("t"), 1.0e9);
            Assert.IsTrue(client.RoutingId.StartsWith("igi-", StringComparison.Ordinal));
            Assert.AreEqual(28, client.RoutingId.Length);
        }

        [Test]
        [Timeout(60000)]
        public void ChatStreamsTokensInOrderThenDone()
        {
            var client = Connect();
            string session = Open(client);
            var pieces = new List<string>();
            var stream = client.Chat(session, "Hello! What do you sell?", new ChatOptions { MaxTokens = 24 })
                .OnToken(piece => pieces.Add(piece));
            Pumping.Ok(client, stream, 60);
            Assert.Greater(pieces.Count, 0);
            Assert.AreEqual(string.Concat(pieces.ToArray()), stream.Text, "done text = tokens joined");
            Assert.AreEqual(pieces.Count, stream.LastTokenIndex, "i counts 1, 2, 3, ... with none skipped");
            StringAssert.IsMatch("^(stop|length|stop_string)$", stream.FinishReason);
            var usage = MsgValue.GetMap(stream.Result, "usage");
            // a piece holds one token's text or more (the sidecar sends a frame's text at most
            // once): events are counted by their i, never by completion_tokens
            Assert.LessOrEqual(pieces.Count, MsgValue.GetLong(usage, "completion_tokens"));
        }

        [Test]
        [Timeout(60000)]
        public void CancelEndsTheStreamWithCancelled()
        {
            var client = Connect();
            string session = Open(client);
            IgiRequest cancel = null;
            IgiStream stream = null;
            stream = client.Chat(session, "Tell me a very long story about dragons.", new ChatOptions { MaxTokens = 2000 })
                .OnToken(piece => { if (cancel == null) cancel = client.Cancel(stream); });
            Pumping.Ok(client, stream, 60);
            Assert.AreEqual("cancelled", stream.FinishReason);
            Assert.Less(stream.LastTokenIndex, 2000);
            Pumping.Ok(client, cancel);
            Assert.IsTrue(cancel.GetBool("cancelled"));
        }

        [Test]
        [Timeout(60000)]
        public void SaveThenRestoreContinuesTheConversation()
        {
            var client = Connect();
            string session = Open(client);
            Pumping.Ok(client, client.Chat(session, "My name is Arin.", new ChatOptions { MaxTokens = 8 }), 60);
            string save = Unique("cs-save");
            var saved = Pumping.Ok(client, client.SaveSession(session, save));
            Assert.AreEqual(save, saved.GetString("name"));
            Assert.Greater(saved.GetLong("bytes"), 0);

            string restored = Pumping.Ok(client, client.RestoreSession(save)).Session;
            Assert.AreNotEqual(session, restored);
            var reply = Pumping.Ok(client, client.Chat(restored, "What is my name?", new ChatOptions { MaxTokens = 12 }), 60);
            Assert.IsNotEmpty(reply.Text);
            Pumping.Fails(client, client.RestoreSession(Unique("no-such-save")), "unknown_save");

            string named = Unique("npc.restored");
            Assert.AreEqual(named, Pumping.Ok(client, client.RestoreSession(save, named)).Session);
        }

        [Test]
        [Timeout(60000)]
        public void SetPriorityWorksOnARunningStream()
        {
            var client = Connect();
            string session = Open(client);
            IgiRequest priority = null;
            var stream = client.Chat(session, "Count from one to twenty.", new ChatOptions { MaxTokens = 40 });
            stream.OnToken(piece => { if (priority == null) priority = client.SetPriority(session, 50); });
            Pumping.Ok(client, stream, 60);
            Pumping.Ok(client, priority);
            var listed = Pumping.Ok(client, client.ListSessions());
            var entry = MsgValue.GetList(listed.Result, "sessions").Cast<Dictionary<string, object>>()
                .Single(s => MsgValue.GetString(s, "session") == session);
            Assert.AreEqual(50, MsgValue.GetLong(entry, "priority"));
            Pumping.Fails(client, client.SetPriority(session, 101), "invalid_body");
            Pumping.Fails(client, client.SetPriority("no-such-session", 1), "unknown_session");
        }

        [Test]
        [Timeout(30000)]
        public void ListSessionsShowsOwnSessions()
        {
            var client = Connect();
            string a = Open(client);
            string b = Open(client);
            var listed = Pumping.Ok(client, client.ListSessions());
            var sessions = MsgValue.GetList(listed.Result, "sessions").Cast<Dictionary<string, object>>().ToList();
            CollectionAssert.IsSubsetOf(new[] { a, b }, sessions.Select(s => MsgValue.GetString(s, "session")).ToList());
            foreach (var s in sessions) Assert.AreEqual("you", MsgValue.GetString(s, "owner"));
            Assert.GreaterOrEqual(MsgValue.GetLong(listed.Result, "free_slots", -1), 0);
            Pumping.Ok(client, client.CloseSession(a));
            listed = Pumping.Ok(client, client.ListSessions());
            Assert.IsFalse(MsgValue.GetList(listed.Result, "sessions").Cast<Dictionary<string, object>>()
                .Any(s => MsgValue.GetString(s, "session") == a));
        }

        [Test]
        [Timeout(60000)]
        public void AnotherClientOfTheSameOwnerAdoptsAfterGoodbyeKeepSessions()
        {
            string owner = IgiKeys.New(); // protocol 1.2: only a client with the same key may adopt
            var first = Connect(o => o.OwnerKey = owner);
            string name = Unique("npc.brom");
            string session = Open(first, new SessionOptions { Name = name, Persona = "Brom", Sampling = Pumping.Greedy });
            Assert.AreEqual(name, session, "a named session's id is its name");
            Pumping.Ok(first, first.Chat(session, "Remember the word: anvil.", new ChatOptions { MaxTokens = 8 }), 60);
            var bye = Pumping.Ok(first, first.Goodbye(true));
            Assert.AreEqual(1, bye.GetLong("orphaned"));

            var second = Connect(o => o.OwnerKey = owner);
            Assert.AreEqual("key", second.Server.OwnerScope);
            var listed = Pumping.Ok(second, second.ListSessions());
            var orphan = MsgValue.GetList(listed.Result, "sessions").Cast<Dictionary<string, object>>()
                .SingleOrDefault(s => MsgValue.GetString(s, "session") == name);
            Assert.IsNotNull(orphan, "the orphaned session is listed");
            Assert.AreEqual("orphaned", MsgValue.GetString(orphan, "owner"));
            var opened = Pumping.Fails(second, second.OpenSession(new SessionOptions { Name = name }), "session_exists");
            Assert.IsFalse(opened.Retryable);
            Assert.AreEqual(name, Pumping.Ok(second, second.AdoptSession(name)).Session);
            Pumping.Ok(second, second.Chat(name, "What was the word?", new ChatOptions { MaxTokens = 8 }), 60);

            // the client that said goodbye says hello again by itself on its next request
            Pumping.Ok(first, first.Ping());
            Pumping.Fails(first, first.AdoptSession(name), "session_owned");
            Pumping.Fails(first, first.Chat(name, "Mine?", new ChatOptions { MaxTokens = 4 }), "unknown_session");
        }

        [Test]
        [Timeout(30000)]
        public void NamedSessionCannotBeOpenedTwice()
        {
            var client = Connect();
            string name = Unique("npc.twice");
            Assert.AreEqual(name, Open(client, new SessionOptions { Name = name }));
            var error = Pumping.Fails(client, client.OpenSession(new SessionOptions { Name = name }), "session_exists");
            Assert.IsFalse(error.Retryable);
            Pumping.Fails(client, client.OpenSession(new SessionOptions { Name = "bad name!" }), "invalid_body");
        }

        [Test]
        [Timeout(60000)]
        public void JsonSchemaAsAStringConstrainsTheReply()
        {
            var client = Connect();
            string session = Open(client);
            var stream = Pumping.Ok(client, client.Chat(session, "What is your price for a sword?", new ChatOptions
            {
                MaxTokens = 40,
                JsonSchema = "{\"type\":\"object\",\"properties\":{\"price\":{\"type\":\"integer\"}},\"required\":[\"price\"]}",
            }), 60);
            var reply = TestJson.Parse(stream.Text) as Dictionary<string, object>;
            Assert.IsNotNull(reply, "reply is a JSON object: " + stream.Text);
            Assert.IsInstanceOf<long>(reply["price"], stream.Text);
            Pumping.Fails(client, client.Chat(session, "x", new ChatOptions { JsonSchema = "[1, 2]" }), "invalid_body");
        }

        [Test]
        [Timeout(60000)]
        public void TextLimitCountsCodePoints()
        {
            var client = Connect();
            string session = Open(client);
            string emoji = "\U0001F600";
            int limit = (int)client.Server.MaxTextChars; // hello.limits: 262 144 code points
            string atLimit = string.Concat(Enumerable.Repeat(emoji, limit)); // twice as many UTF-16 units
            var local = client.Chat(session, atLimit + emoji);
            var error = Pumping.Fails(client, local, "invalid_body");
            StringAssert.Contains((limit + 1).ToString(), error.Message, "refused here, counted in code points");
            // at the limit the client sends it, and the sidecar agrees on the count (what it
            // answers is about the context, not the body)
            var sent = client.Chat(session, atLimit, new ChatOptions { MaxTokens = 1 });
            Pumping.Until(client, () => sent.IsDone, 60, "the sidecar's answer");
            if (!sent.Succeeded) Assert.AreNotEqual("invalid_body", sent.Error.Code, sent.Error.ToString());
        }

        [Test]
        [Timeout(30000)]
        public void ServerErrorsAreTyped()
        {
            var client = Connect();
            var error = Pumping.Fails(client, client.Chat("no-such-session", "hi"), "unknown_session");
            Assert.IsFalse(error.Retryable);
            Assert.IsNotEmpty(error.Message);
            Pumping.Fails(client, client.SaveSession("no-such-session", "con"), "invalid_body");
            Pumping.Fails(client, client.Send("no_such_request", null), "unknown_type");
        }

        [Test]
        [Timeout(30000)]
        public void FrameStatsAndReserveVramAnswer()
        {
            var client = Connect();
            Pumping.Ok(client, client.Frame(1, 16.6, 16.6, 1000, 2000));
            var stats = Pumping.Ok(client, client.Stats());
            Assert.IsNotNull(stats.GetString("model"));
            var reserve = client.ReserveVram(0, 1);
            Pumping.Until(client, () => reserve.IsDone, 10, "reserve_vram");
            if (!reserve.Succeeded) StringAssert.IsMatch("^(cannot_free|deadline_missed)$", reserve.Error.Code);
        }

        [Test]
        [Timeout(60000)]
        public void DroppedConnectionResumesTheStream()
        {
            Cuttable cuttable = null;
            var client = Connect(o => o.TransportFactory = () => cuttable = new Cuttable(new ZmtpDealer()));
            string session = Open(client);
            var indexes = new List<long>();
            IgiStream stream = null;
            stream = client.Chat(session, "Tell me about your forge.", new ChatOptions { MaxTokens = 60 })
                .OnToken(piece =>
                {
                    indexes.Add(stream.LastTokenIndex);
                    if (stream.LastTokenIndex == 3) cuttable.Cut(); // the network drops mid-stream
                });
            Pumping.Ok(client, stream, 60);
            Assert.GreaterOrEqual(cuttable.Connects, 2, "the client reconnected");
            CollectionAssert.AreEqual(Enumerable.Range(1, indexes.Count).Select(i => (long)i).ToList(), indexes,
                "every token once, in order, across the drop");
            var usage = MsgValue.GetMap(stream.Result, "usage");
            Assert.LessOrEqual(indexes.Count, MsgValue.GetLong(usage, "completion_tokens"));
            lock (cuttable.SentTypes) CollectionAssert.Contains(cuttable.SentTypes, "resume_stream");
            var listed = MsgValue.GetList(Pumping.Ok(client, client.ListSessions()).Result, "sessions");
            Assert.IsTrue(listed.Cast<Dictionary<string, object>>().Any(s => MsgValue.GetString(s, "session") == session),
                "the session survived the drop (same routing id)");
            Pumping.Ok(client, client.Chat(session, "Thanks.", new ChatOptions { MaxTokens = 4 }), 60);
        }

        [Test]
        [Timeout(60000)]
        public void DisposeSendsWhatWasAskedJustBefore()
        {
            var client = Pumping.Connect(Sidecar.Shared.Endpoint);
            string session = Open(client);
            Pumping.Ok(client, client.Chat(session, "I am the smith's apprentice.", new ChatOptions { MaxTokens = 4 }), 60);
            string save = Unique("cs-dispose");
            client.SaveSession(session, save); // and leave at once, as OnDestroy would
            client.Dispose();

            var next = Connect();
            Pumping.Ok(next, next.RestoreSession(save));
        }

        [Test]
        [Timeout(30000)]
        public void AnIdleClientKeepsItsLeaseWithPings()
        {
            Cuttable cuttable = null;
            string owner = IgiKeys.New(); // the other client below sees this one's sessions
            var client = Connect(o =>
            {
                o.LeaseSeconds = 2;
                o.OwnerKey = owner;
                o.TransportFactory = () => cuttable = new Cuttable(new ZmtpDealer());
            });
            string session = Open(client);
            var clock = System.Diagnostics.Stopwatch.StartNew();
            Pumping.Until(client, () => clock.Elapsed.TotalSeconds > 5, 10, "5 s of idling"); // 2.5 leases
            Assert.AreEqual(IgiConnectionState.Ready, client.State, "heartbeats kept coming");
            var other = Connect(o => o.OwnerKey = owner);
            var listed = Pumping.Ok(other, other.ListSessions());
            // the same key: an orphan would be listed ("orphaned"); one held by a live client is not
            Assert.IsFalse(MsgValue.GetList(listed.Result, "sessions").Cast<Dictionary<string, object>>()
                .Any(s => MsgValue.GetString(s, "session") == session), "not orphaned");
            Assert.GreaterOrEqual(MsgValue.GetLong(listed.Result, "others"), 1, "counted among the others");
            lock (cuttable.SentTypes)
            {
                Assert.AreEqual(1, cuttable.SentTypes.Count(t => t == "hello"), "never forgotten");
                Assert.GreaterOrEqual(cuttable.SentTypes.Count(t => t == "ping"), 6, "a ping every lease_s/3");
            }
        }

        [Test]
        [Timeout(60000)]
        public void AFrozenClientWhoseLeaseLapsedTakesItsSessionBack()
        {
            // the game sat at a breakpoint longer than its lease, with no reply running (one
            // running keeps its lease): the sidecar orphaned its session; on waking the client
            // says hello again and adopts the session
            Cuttable cuttable = null;
            var client = Connect(o =>
            {
                o.LeaseSeconds = 2;
                o.OwnerKey = IgiKeys.New(); // how a game gets its NPCs back (IgiSidecar always sets one)
                o.TransportFactory = () => cuttable = new Cuttable(new ZmtpDealer());
            });
            Assert.AreEqual(2.0, client.Server.LeaseSeconds);
            string session = Open(client);
            Pumping.Ok(client, client.Chat(session, "Hello.", new ChatOptions { MaxTokens = 4 }), 60);
            cuttable.Freeze(3500);
            // its next lease ping is answered hello_required: hello again, then adopt
            Pumping.Until(client, () => { lock (cuttable.SentTypes) return cuttable.SentTypes.Contains("adopt_session"); },
                10, "the session's adoption");
            lock (cuttable.SentTypes) Assert.GreaterOrEqual(cuttable.SentTypes.Count(t => t == "hello"), 2);
            var again = Pumping.Ok(client, client.Chat(session, "Are you still there?", new ChatOptions { MaxTokens = 4 }), 60);
            Assert.IsNotEmpty(again.Text, "the session was adopted back");
        }

        /// <summary>A transport whose connection the test can cut, as a network failure would.</summary>
        sealed class Cuttable : IIgiTransport
        {
            readonly IIgiTransport inner;
            public int Connects;
            public readonly List<string> SentTypes = new List<string>(); // read after the I/O thread is idle
            volatile bool cut;

            public Cuttable(IIgiTransport inner) { this.inner = inner; }
            public void Cut() { cut = true; }
            volatile int freezeMs;
            /// <summary>The I/O thread stops for that long at its next receive (a breakpoint).</summary>
            public void Freeze(int ms) { freezeMs = ms; }
            public void Connect(string endpoint, byte[] routingId, int timeoutMs)
            {
                inner.Connect(endpoint, routingId, timeoutMs);
                Connects++;
            }
            public bool IsConnected { get { return inner.IsConnected; } }
            public void Send(byte[] message)
            {
                long id;
                string type;
                Dictionary<string, object> body;
                if (Protocol.TryDecode(message, out id, out type, out body)) lock (SentTypes) SentTypes.Add(type);
                inner.Send(message);
            }
            public bool Receive(int timeoutMs, List<byte[]> into)
            {
                if (cut) { cut = false; inner.Close(); return false; }
                if (freezeMs > 0) { System.Threading.Thread.Sleep(freezeMs); freezeMs = 0; }
                return inner.Receive(timeoutMs, into);
            }
            public double SecondsSinceTraffic { get { return inner.SecondsSinceTraffic; } }
            public void Close() { inner.Close(); }
            public void Dispose() { inner.Dispose(); }
        }
    }
}
