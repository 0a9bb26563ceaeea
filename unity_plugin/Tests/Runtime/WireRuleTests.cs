// The client's rules on the wire, against a scripted transport (no sidecar): what the sidecar
// could not read is refused before sending, the pre-hello size limit is the protocol's, the
// keepalive counts from messages the sidecar accepted, and a sidecar of another instance or
// model is refused and never used.
using System;
using System.Collections.Generic;
using System.Linq;
using System.Text;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Client")]
    public class WireRuleTests : FakeClientFixture
    {
        static Dictionary<string, object> HelloOk(string instance, string model, bool loading = false, double lease = 15)
        {
            var body = FakeTransport.HelloOk();
            body["minor"] = 2L;
            body["instance"] = instance;
            body["model"] = model;
            body["loading"] = loading;
            body["lease_s"] = lease;
            return body;
        }

        [Test]
        [Timeout(10000)]
        public void WhatTheSidecarCannotReadIsRefusedBeforeSending()
        {
            Start();
            int sentBefore = fake.Sent.Count;
            var longString = new Dictionary<string, object> { { "session", "s" }, { "text", new string('x', Protocol.MaxStrBytes + 1) } };
            var bigMap = new Dictionary<string, object>();
            for (int i = 0; i < MsgPack.MaxMapEntries + 1; i++) bigMap["k" + i] = 1L;
            var longArray = new Dictionary<string, object> { { "stop", Enumerable.Repeat((object)"x", MsgPack.MaxArrayItems + 1).ToList() } };
            var deep = new Dictionary<string, object>();
            var inner = deep;
            for (int i = 0; i < MsgPack.MaxDepth + 2; i++) { var next = new Dictionary<string, object>(); inner["d"] = next; inner = next; }
            foreach (var body in new[] { longString, bigMap, longArray, deep })
            {
                var request = client.Send("chat", body);
                // refused at once: delivered by the very next Pump, not after a timeout
                client.Pump();
                Assert.IsTrue(request.IsDone, "refused in the next Pump");
                Assert.AreEqual(IgiError.InvalidBody, request.Error.Code, request.Error.ToString());
                Assert.IsFalse(request.Error.Retryable);
            }
            // a string of exactly the limit is the sidecar's to judge (the message limit is 17 MiB)
            var atLimit = client.Send("stats", new Dictionary<string, object> { { "x", new string('x', Protocol.MaxStrBytes) } });
            client.Pump();
            Assert.IsFalse(atLimit.IsDone && atLimit.Error != null && atLimit.Error.Code == IgiError.InvalidBody, "1 MiB exactly is allowed");
            Pumping.Until(client, () => fake.Sent.Count > sentBefore, 5, "the message at the limit sent");
            Assert.AreEqual(sentBefore + 1, fake.Sent.Count, "only the message at the limit left the client");
        }

        [Test]
        [Timeout(10000)]
        public void BeforeHelloTheMessageLimitIsTheProtocols()
        {
            fake.OnRequest = (id, type, body) => { }; // hello never answered
            Start(null, waitReady: false);
            Assert.AreEqual(17L << 20, Protocol.MaxMessageBytes);
            // 2 MiB of image: over the old 1 MiB default, under the protocol's 17 MiB
            var image = IgiImage.FromEncoded(Pngish(2 << 20));
            var stream = client.Chat("s", "look", new ChatOptions { Images = new[] { image } });
            client.Pump();
            Assert.IsFalse(stream.IsDone, "not refused locally before hello: " + stream.Error);
            Assert.AreEqual(Protocol.MaxMessageBytes, new IgiServerInfo().MaxMessageBytes);
        }

        static byte[] Pngish(int size)
        {
            var bytes = new byte[size];
            byte[] signature = { 0x89, 0x50, 0x4E, 0x47, 0x0D, 0x0A, 0x1A, 0x0A };
            Buffer.BlockCopy(signature, 0, bytes, 0, signature.Length);
            return bytes;
        }

        [Test]
        [Timeout(15000)]
        public void KeepaliveCountsFromMessagesTheSidecarAccepted()
        {
            // lease 2 s: a ping is due 0.67 s after the last accepted message. The game keeps
            // sending requests the sidecar refuses as invalid_body (they do not keep the lease).
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello") fake.Reply(id, "ok", HelloOk(null, "fake.gguf", lease: 2.0));
                else if (type == "stats") fake.Reply(id, "error", new Dictionary<string, object> { { "code", "invalid_body" }, { "message", "x" }, { "retryable", false } });
                else fake.Reply(id, "ok", new Dictionary<string, object>());
            };
            Start();
            var clock = System.Diagnostics.Stopwatch.StartNew();
            while (clock.Elapsed.TotalSeconds < 1.6 && fake.SentOf("ping").Count == 0)
            {
                client.Send("stats", new Dictionary<string, object> { { "bogus", 1L } });
                client.Pump();
                System.Threading.Thread.Sleep(50);
            }
            Assert.Greater(fake.SentOf("ping").Count, 0, "a keepalive ping despite a steady stream of refused messages");
            Console.WriteLine("measured: first keepalive ping after " + clock.Elapsed.TotalSeconds.ToString("0.00") + " s of refused messages (lease 2 s)");
        }

        [Test]
        [Timeout(10000)]
        public void ASidecarOfAnotherInstanceIsRefusedAndNeverUsed()
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello") fake.Reply(id, "ok", HelloOk("someone-else", "fake.gguf"));
                else fake.Reply(id, "ok", new Dictionary<string, object>());
            };
            IgiError refused = null;
            Start(o => o.ExpectedInstance = "mine-1", waitReady: false);
            client.HelloRefused += e => refused = e;
            Pumping.Until(client, () => refused != null, 5, "the refusal");
            Assert.AreEqual(IgiError.WrongSidecar, refused.Code);
            Assert.IsFalse(refused.Retryable);
            StringAssert.Contains("someone-else", refused.Message);
            Assert.AreNotEqual(IgiConnectionState.Ready, client.State);
            var after = client.Ping();
            Pumping.Until(client, () => after.IsDone, 5, "the ping after the refusal");
            Assert.AreEqual(IgiError.WrongSidecar, after.Error.Code, "nothing more goes to it");
            System.Threading.Thread.Sleep(300);
            Assert.AreEqual(1, fake.Sent.Count, "only the hello was sent: " + string.Join(",", fake.Sent.Select(m => (string)m["type"])));
            Assert.AreEqual(1, fake.Connects, "no reconnect to a refused sidecar");
        }

        [Test]
        [Timeout(10000)]
        public void ASidecarWithoutAnInstanceIsRefusedWhenOneIsExpected()
        {
            fake.OnRequest = (id, type, body) => { if (type == "hello") fake.Reply(id, "ok", HelloOk(null, "fake.gguf")); };
            IgiError refused = null;
            Start(o => o.ExpectedInstance = "mine-1", waitReady: false);
            client.HelloRefused += e => refused = e;
            Pumping.Until(client, () => refused != null, 5, "the refusal");
            Assert.AreEqual(IgiError.WrongSidecar, refused.Code);
        }

        [Test]
        [Timeout(10000)]
        public void AnotherModelIsRefusedALoadingOneIsNot()
        {
            fake.OnRequest = (id, type, body) => { if (type == "hello") fake.Reply(id, "ok", HelloOk("mine-1", "other.gguf")); };
            IgiError refused = null;
            Start(o => { o.ExpectedInstance = "mine-1"; o.ExpectedModel = "/models/npc.gguf"; }, waitReady: false);
            client.HelloRefused += e => refused = e;
            Pumping.Until(client, () => refused != null, 5, "the refusal");
            Assert.AreEqual(IgiError.WrongSidecar, refused.Code);
            StringAssert.Contains("other.gguf", refused.Message);
            client.Dispose();

            fake = new FakeTransport();
            fake.OnRequest = (id, type, body) => { if (type == "hello") fake.Reply(id, "ok", HelloOk("mine-1", null, loading: true)); };
            Start(o => { o.ExpectedInstance = "mine-1"; o.ExpectedModel = "npc.gguf"; });
            Assert.AreEqual("mine-1", client.Server.Instance);
            client.Dispose();

            fake = new FakeTransport();
            fake.OnRequest = (id, type, body) => { if (type == "hello") fake.Reply(id, "ok", HelloOk("mine-1", "npc.gguf")); };
            Start(o => { o.ExpectedInstance = "mine-1"; o.ExpectedModel = @"C:\models\npc.gguf"; });
            Assert.IsTrue(client.State == IgiConnectionState.Ready, "the same file name in another folder is the same model");
        }

        [Test]
        [Timeout(10000)]
        public void FrameReportsAreCoalescedAndRefusalsKept()
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello") fake.Reply(id, "ok", HelloOk(null, "fake.gguf"));
                else if (type == "frame") fake.Reply(id, "error", new Dictionary<string, object> { { "code", "forbidden" }, { "message", "not the game" }, { "retryable", false } });
            };
            Start();
            Assert.IsTrue(client.ReportFrame(1, 16.6, 16.6, 1L << 30, -1));
            Pumping.Until(client, () => client.FrameError != null, 5, "the frame refusal");
            StringAssert.StartsWith("forbidden", client.FrameError);
            var frame = fake.SentOf("frame")[0];
            var sent = (Dictionary<string, object>)frame["body"];
            Assert.AreEqual(1L, sent["frame"]);
            Assert.AreEqual(16.6, sent["frame_time_ms"]);
            Assert.AreEqual(1L << 30, sent["vram_used"]);
            Assert.IsFalse(sent.ContainsKey("vram_budget"), "-1: left out");
            client.Dispose();
            Assert.IsFalse(client.ReportFrame(2, 16.6), "false once disposed");
        }

        static Dictionary<string, object> BodyOf(Dictionary<string, object> message)
        {
            return (Dictionary<string, object>)message["body"];
        }

        [Test]
        [Timeout(10000)]
        public void TheGamesCpuUseIsSentOnlyWhenGivenAndWithinRange()
        {
            fake.OnRequest = (id, type, body) =>
            {
                if (type == "hello") fake.Reply(id, "ok", HelloOk(null, "fake.gguf"));
                else fake.Reply(id, "ok", new Dictionary<string, object> { { "paced", true } });
            };
            Start();
            // not given: not in the message (old call sites send what they sent before)
            Pumping.Ok(client, client.Frame(1, 16.6, 16.6));
            Assert.IsTrue(client.ReportFrame(2, 16.6));
            Pumping.Until(client, () => fake.SentOf("frame").Count == 2, 5, "the frame report");
            foreach (var frame in fake.SentOf("frame"))
            {
                Assert.IsFalse(BodyOf(frame).ContainsKey("busy_threads"), "no busy_threads when not given");
                Assert.IsFalse(BodyOf(frame).ContainsKey("cpu_share"), "no cpu_share when not given");
            }
            // given, at the ends of their ranges: sent as given
            Pumping.Ok(client, client.Frame(3, 16.6, busyThreads: 4096, cpuShare: 0.0));
            Assert.IsTrue(client.ReportFrame(4, 16.6, busyThreads: 0, cpuShare: 1.0));
            Pumping.Until(client, () => fake.SentOf("frame").Count == 4, 5, "the frame report");
            var sent = fake.SentOf("frame");
            Assert.AreEqual(4096L, BodyOf(sent[2])["busy_threads"]);
            Assert.AreEqual(0.0, BodyOf(sent[2])["cpu_share"]);
            Assert.AreEqual(0L, BodyOf(sent[3])["busy_threads"]);
            Assert.AreEqual(1.0, BodyOf(sent[3])["cpu_share"]);
            // one without the other
            Assert.IsTrue(client.ReportFrame(5, 16.6, busyThreads: 3));
            Pumping.Until(client, () => fake.SentOf("frame").Count == 5, 5, "the frame report");
            Assert.AreEqual(3L, BodyOf(fake.SentOf("frame")[4])["busy_threads"]);
            Assert.IsFalse(BodyOf(fake.SentOf("frame")[4]).ContainsKey("cpu_share"));
            Assert.IsNull(client.FrameError);

            // outside the protocol's ranges: refused here, unsent, as invalid_body
            var badRequests = new[]
            {
                client.Frame(6, 16.6, busyThreads: 4097), client.Frame(7, 16.6, busyThreads: -1),
                client.Frame(8, 16.6, cpuShare: 1.5), client.Frame(9, 16.6, cpuShare: -0.1),
                client.Frame(10, 16.6, cpuShare: double.NaN), client.Frame(11, 16.6, cpuShare: double.PositiveInfinity),
            };
            client.Pump();
            foreach (var request in badRequests)
            {
                Assert.IsTrue(request.IsDone, "refused in the next Pump");
                Assert.AreEqual(IgiError.InvalidBody, request.Error.Code, request.Error.ToString());
                Assert.IsFalse(request.Error.Retryable);
            }
            StringAssert.Contains("busy_threads", badRequests[0].Error.Message);
            StringAssert.Contains("cpu_share", badRequests[2].Error.Message);
            foreach (var share in new[] { 1.5, -0.1, double.PositiveInfinity })
            {
                Assert.IsFalse(client.ReportFrame(12, 16.6, cpuShare: share), "refused: cpu_share " + share);
                StringAssert.StartsWith("invalid_body: cpu_share", client.FrameError);
            }
            Assert.IsFalse(client.ReportFrame(13, 16.6, busyThreads: 4097), "refused: busy_threads 4097");
            StringAssert.StartsWith("invalid_body: busy_threads", client.FrameError);
            Assert.IsTrue(client.ReportFrame(14, 16.6, busyThreads: -1, cpuShare: double.NaN), "-1 and NaN: not reported");
            Pumping.Until(client, () => fake.SentOf("frame").Count == 6, 5, "the last frame report");
            System.Threading.Thread.Sleep(100);
            client.Pump();
            var all = fake.SentOf("frame");
            Assert.AreEqual(6, all.Count, "none of the refused frames left the client");
            Assert.AreEqual(14L, BodyOf(all[5])["frame"]);
            Assert.IsFalse(BodyOf(all[5]).ContainsKey("busy_threads"));
            Assert.IsFalse(BodyOf(all[5]).ContainsKey("cpu_share"));
        }
    }
}
