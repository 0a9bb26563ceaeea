// The golden vectors of bridge/vectors (folder from env IGI_VECTORS_DIR): every message decodes
// to its readable twin, requests re-encode byte for byte (float32 input aside: the client always
// writes float64), the client's own requests equal the vectors, and every invalid_* vector sent
// to the real sidecar gets the error code and id it promises.
using System;
using System.Collections.Generic;
using System.IO;
using System.Linq;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Vectors")]
    public class VectorTests
    {
        sealed class Vector
        {
            public string Name;
            public Dictionary<string, object> Twin;
            public byte[] Bytes;
            public string Direction { get { return MsgValue.GetString(Twin, "direction"); } }
            public Dictionary<string, object> Message { get { return MsgValue.GetMap(Twin, "message"); } }
            public Dictionary<string, object> Expect { get { return MsgValue.GetMap(Twin, "expect"); } }
        }

        static List<Vector> Load()
        {
            string dir = Environment.GetEnvironmentVariable("IGI_VECTORS_DIR");
            if (string.IsNullOrEmpty(dir)) Assert.Ignore("IGI_VECTORS_DIR is not set (bridge/vectors)");
            var vectors = new List<Vector>();
            foreach (string json in Directory.GetFiles(dir, "*.json").OrderBy(p => p, StringComparer.Ordinal))
            {
                vectors.Add(new Vector
                {
                    Name = Path.GetFileNameWithoutExtension(json),
                    Twin = (Dictionary<string, object>)TestJson.Parse(File.ReadAllText(json)),
                    Bytes = File.ReadAllBytes(Path.ChangeExtension(json, ".msgpack")),
                });
            }
            Assert.Greater(vectors.Count, 50, "too few vectors in " + dir);
            return vectors;
        }

        [Test]
        public void EveryVectorDecodesToItsTwin()
        {
            int maps = 0, refused = 0;
            foreach (var v in Load())
            {
                object decoded;
                string error;
                bool ok = MsgPack.TryDecode(v.Bytes, out decoded, out error);
                if (v.Message == null)
                {
                    // not a msgpack map at all: our decoder refuses it or yields a non-map
                    Assert.IsFalse(ok && decoded is Dictionary<string, object>, v.Name + " should not decode to a map");
                    refused++;
                    continue;
                }
                if (!ok && OverLimit(v))
                {
                    // past a protocol limit (the sidecar answers malformed): our decoder refuses it too
                    refused++;
                    continue;
                }
                Assert.IsTrue(ok, v.Name + ": " + error);
                ValueAssert.AreEqual(v.Message, decoded, v.Name);
                maps++;
            }
            Assert.Greater(maps, 50);
            Assert.Greater(refused, 0);
        }

        // a request the sidecar must refuse as malformed for a size limit (an array, a map, a str too long)
        static bool OverLimit(Vector v)
        {
            return v.Name.StartsWith("invalid_", StringComparison.Ordinal) && v.Expect != null
                && MsgValue.GetString(v.Expect, "code") == "malformed";
        }

        [Test]
        public void EveryReplyVectorReadsAsAnEnvelope()
        {
            int n = 0;
            foreach (var v in Load().Where(x => x.Direction == "reply"))
            {
                long id;
                string type;
                Dictionary<string, object> body;
                Assert.IsTrue(Protocol.TryDecode(v.Bytes, out id, out type, out body), v.Name);
                Assert.AreEqual(v.Message["id"], id, v.Name);
                Assert.AreEqual(v.Message["type"], type, v.Name);
                n++;
            }
            Assert.Greater(n, 20);
        }

        [Test]
        public void RequestVectorsReencodeByteForByte()
        {
            var notExact = new List<string>();
            foreach (var v in Load().Where(x => x.Direction == "request" && x.Message != null))
            {
                object decoded;
                string error;
                if (!MsgPack.TryDecode(v.Bytes, out decoded, out error) && OverLimit(v)) continue; // the encoder refuses it too
                decoded = MsgPack.Decode(v.Bytes);
                byte[] again = MsgPack.Encode(decoded);
                ValueAssert.AreEqual(decoded, MsgPack.Decode(again), v.Name + " (re-encoded)");
                if (!again.SequenceEqual(v.Bytes)) notExact.Add(v.Name);
            }
            // The only byte difference allowed: a float32 in the vector is re-encoded as float64.
            foreach (string name in notExact)
                StringAssert.Contains("float32", name, name + " does not re-encode byte for byte");
        }

        // ---- the client's own requests equal the vectors ----------------------------------------

        static Dictionary<string, object> VectorBody(string name)
        {
            var v = Load().Single(x => x.Name == name);
            return MsgValue.GetMap(v.Message, "body");
        }

        static Dictionary<string, object> SentBody(IgiClient client, FakeTransport fake, IgiRequest request)
        {
            Pumping.Until(client, () => fake.Sent.Any(m => (long)m["id"] == request.Id), 5, request.Type + " sent");
            var envelope = fake.Sent.First(m => (long)m["id"] == request.Id);
            Assert.AreEqual(1L, envelope["v"]);
            Assert.AreEqual(4, envelope.Count, "envelope keys");
            return (Dictionary<string, object>)envelope["body"];
        }

        [Test]
        public void ClientRequestsMatchTheVectors()
        {
            var fake = new FakeTransport();
            using (var client = new IgiClient(new IgiClientOptions
            {
                TransportFactory = () => fake, ClientName = "npc-plugin", GamePid = 4242, LeaseSeconds = 15,
            }))
            {
                Pumping.Until(client, () => client.State == IgiConnectionState.Ready, 5, "fake hello");
                ValueAssert.AreEqual(VectorBody("request_hello"), fake.SentOf("hello")[0]["body"], "hello");

                var sampling = new SamplingOptions { MinP = 0.05, RepeatPenalty = 1.1, Seed = 7, Temperature = 0.7, TopK = 40, TopP = 0.95 };
                Check(client, fake, "request_open_session", client.OpenSession(new SessionOptions
                {
                    Persona = "brom", Priority = 1, Sampling = sampling, SystemPrompt = "You are Brom, the blacksmith of Oakvale.",
                }));
                Check(client, fake, "request_open_session_defaults", client.OpenSession());
                Check(client, fake, "request_open_session_named", client.OpenSession(new SessionOptions { Name = "npc.brom", Persona = "brom" }));
                Check(client, fake, "request_chat", client.Chat("3f2a9c0d81be", "Greetings, smith! What can you offer me?",
                    new ChatOptions { MaxTokens = 64, Stop = new[] { "\nPlayer:" } }));
                Check(client, fake, "request_chat_json_schema_string", client.Chat("3f2a9c0d81be", "Your price?", new ChatOptions
                {
                    JsonSchema = "{\"type\":\"object\",\"properties\":{\"price\":{\"type\":\"integer\"}},\"required\":[\"price\"]}",
                }));
                Check(client, fake, "request_chat_images", client.Chat("3f2a9c0d81be", "What do you make of this?", new ChatOptions
                {
                    MaxTokens = 64,
                    Images = new[]
                    {
                        IgiImage.FromEncoded(VectorImage("request_chat_images", 0, "data")),
                        // the same 2x2 picture as Unity holds it: RGBA, the bottom row first
                        IgiImage.FromRgba32(new byte[] { 0, 0, 255, 255, 255, 255, 255, 255, 255, 0, 0, 255, 0, 255, 0, 255 }, 2, 2),
                    },
                }));
                Check(client, fake, "request_cancel", client.Cancel(5));
                Check(client, fake, "request_save_session", client.SaveSession("3f2a9c0d81be", "brom-day1"));
                Check(client, fake, "request_restore_session", client.RestoreSession("brom-day1"));
                Check(client, fake, "request_restore_session_named", client.RestoreSession("brom-day1", "npc.brom"));
                Check(client, fake, "request_close_session", client.CloseSession("3f2a9c0d81be"));
                Check(client, fake, "request_frame", client.Frame(1200, 16.6, 16.6, 5368709120L, 8589934592L));
                Check(client, fake, "request_reserve_vram", client.ReserveVram(1073741824L, 30));
                Check(client, fake, "request_stats", client.Stats());
                Check(client, fake, "request_ping", client.Ping());
                Check(client, fake, "request_shutdown", client.Shutdown());
                Check(client, fake, "request_load_model", client.LoadModel("smol.gguf", 2147483648L, 4096, 8));
                Check(client, fake, "request_set_priority", client.SetPriority("3f2a9c0d81be", 50));
                Check(client, fake, "request_list_sessions", client.ListSessions());
                Check(client, fake, "request_adopt_session", client.AdoptSession("npc.brom"));
                Check(client, fake, "request_goodbye", client.Goodbye(true));
            }
        }

        [Test]
        public void TheOwnersHelloAndTheHelloAnswerMatchTheVectors()
        {
            var vectors = Load();
            var owner = vectors.SingleOrDefault(v => v.Name == "request_hello_owner");
            if (owner == null) Assert.Ignore("no request_hello_owner vector (vectors of a sidecar before protocol 1.2)");
            var sent = MsgValue.GetMap(owner.Message, "body");
            var fake = new FakeTransport();
            using (var client = new IgiClient(new IgiClientOptions
            {
                TransportFactory = () => fake, ClientName = "npc-plugin", GamePid = 4242, LeaseSeconds = 15,
                OwnerKey = MsgValue.GetString(sent, "owner"), LaunchToken = MsgValue.GetString(sent, "token"),
            }))
            {
                Pumping.Until(client, () => client.State == IgiConnectionState.Ready, 5, "fake hello");
                ValueAssert.AreEqual(sent, fake.SentOf("hello")[0]["body"], "hello with owner and token");
            }
            // what the client reads from the hello answer
            var reply = vectors.Single(v => v.Name == "reply_ok_hello");
            long id;
            string type;
            Dictionary<string, object> body;
            Assert.IsTrue(Protocol.TryDecode(reply.Bytes, out id, out type, out body));
            var info = IgiServerInfo.FromHello(body);
            Assert.AreEqual(Protocol.Minor, info.Minor);
            Assert.AreEqual(MsgValue.GetBool(body, "game"), info.IsGame);
            Assert.AreEqual(MsgValue.GetString(body, "owner"), info.OwnerScope);
            Assert.IsTrue(info.HasFeature(IgiFeatures.Owners) && info.HasFeature(IgiFeatures.LaunchToken), "1.2 features");
            var frame = vectors.Single(v => v.Name == "reply_ok_frame");
            Assert.IsTrue(Protocol.TryDecode(frame.Bytes, out id, out type, out body));
            Assert.IsTrue(MsgValue.GetBool(body, "paced"), "frame's ok says it paced");
        }

        /// <summary>The bytes of a bin field of an image in a vector's twin.</summary>
        static byte[] VectorImage(string vector, int index, string field)
        {
            var image = (Dictionary<string, object>)MsgValue.GetList(VectorBody(vector), "images")[index];
            string hex = ValueAssert.BinHex(image[field]);
            Assert.IsNotNull(hex, vector + " images[" + index + "]." + field + " is not a {\"$bin\": hex}");
            var bytes = new byte[hex.Length / 2];
            for (int i = 0; i < bytes.Length; i++) bytes[i] = Convert.ToByte(hex.Substring(2 * i, 2), 16);
            return bytes;
        }

        static void Check(IgiClient client, FakeTransport fake, string vector, IgiRequest request)
        {
            ValueAssert.AreEqual(VectorBody(vector), SentBody(client, fake, request), vector);
        }

        // ---- invalid_* vectors against the real sidecar ---------------------------------------

        [Test]
        [Timeout(60000)]
        public void InvalidVectorsGetTheirPromisedErrors()
        {
            var sidecar = Sidecar.Shared;
            var failures = new List<string>();
            int checkedCount = 0;
            foreach (var v in Load().Where(x => x.Name.StartsWith("invalid_", StringComparison.Ordinal)))
            {
                // a fresh connection per vector: one vector's state cannot leak into the next
                using (var dealer = new ZmtpDealer())
                {
                    dealer.Connect(sidecar.Endpoint, System.Text.Encoding.ASCII.GetBytes("igi-vector" + checkedCount), 5000);
                    if (!v.Name.StartsWith("invalid_hello", StringComparison.Ordinal))
                        SendAndRead(dealer, Protocol.Encode(900000, "hello", new Dictionary<string, object> { { "protocol", 1L }, { "minor", 1L } }), 900000);
                    var answer = SendAndRead(dealer, v.Bytes, -1);
                    long expectedId = MsgValue.GetLong(v.Expect, "id", -1);
                    string expectedCode = MsgValue.GetString(v.Expect, "code");
                    string got = MsgValue.GetString(answer.Item3, "code") + " id " + answer.Item1;
                    if (answer.Item2 != "error" || got != expectedCode + " id " + expectedId)
                        failures.Add(v.Name + ": expected " + expectedCode + " id " + expectedId + ", got " + answer.Item2 + " " + got);
                    checkedCount++;
                }
            }
            Assert.IsEmpty(failures, string.Join("\n", failures.ToArray()));
            Assert.Greater(checkedCount, 20);
        }

        [Test]
        [Timeout(60000)]
        public void RequestVectorsAreAcceptedByTheSidecar()
        {
            // accepted = not refused for its form; what it answers depends on the sidecar's state
            // (the vectors' session ids do not exist here). shutdown would stop the shared sidecar.
            var refusals = new HashSet<string> { "malformed", "invalid_body", "unknown_type", "unsupported_version", "hello_required" };
            var sidecar = Sidecar.Shared;
            var failures = new List<string>();
            int sent = 0;
            foreach (var v in Load().Where(x => x.Name.StartsWith("request_", StringComparison.Ordinal) && x.Name != "request_shutdown"))
            {
                using (var dealer = new ZmtpDealer())
                {
                    dealer.Connect(sidecar.Endpoint, System.Text.Encoding.ASCII.GetBytes("igi-accept" + sent), 5000);
                    string type = MsgValue.GetString(v.Message, "type");
                    if (type != "hello")
                        SendAndRead(dealer, Protocol.Encode(900000, "hello", new Dictionary<string, object> { { "protocol", 1L }, { "minor", 1L } }), 900000);
                    var answer = SendAndRead(dealer, v.Bytes, -1);
                    string code = MsgValue.GetString(answer.Item3, "code");
                    if (answer.Item1 != MsgValue.GetLong(v.Message, "id", -1) || (answer.Item2 == "error" && refusals.Contains(code)))
                        failures.Add(v.Name + ": " + answer.Item2 + " " + code + " id " + answer.Item1 + " " + MsgValue.GetString(answer.Item3, "message"));
                    if (v.Name == "request_unknown_field_ignored")
                        CollectionAssert.AreEqual(new[] { "unknown_field" }, MsgValue.GetStrings(answer.Item3, "ignored"));
                    if (type == "chat" && answer.Item2 != "error")
                        SendAndRead(dealer, Protocol.Encode(900001, "cancel", new Dictionary<string, object> { { "request", v.Message["id"] } }), 900001);
                    sent++;
                }
            }
            Assert.IsEmpty(failures, string.Join("\n", failures.ToArray()));
            Assert.Greater(sent, 20);
        }

        // Sends one message and returns the first answer that is not a heartbeat (with the id
        // wanted, or any id when wantId is -1).
        static Tuple<long, string, Dictionary<string, object>> SendAndRead(ZmtpDealer dealer, byte[] message, long wantId)
        {
            dealer.Send(message);
            var clock = System.Diagnostics.Stopwatch.StartNew();
            var received = new List<byte[]>();
            while (clock.Elapsed.TotalSeconds < 10)
            {
                received.Clear();
                Assert.IsTrue(dealer.Receive(50, received), "the sidecar dropped the connection");
                foreach (var m in received)
                {
                    long id;
                    string type;
                    Dictionary<string, object> body;
                    Assert.IsTrue(Protocol.TryDecode(m, out id, out type, out body), "undecodable answer");
                    if (type == "heartbeat" || (wantId >= 0 && id != wantId)) continue;
                    return Tuple.Create(id, type, body);
                }
            }
            Assert.Fail("no answer within 10 s");
            return null;
        }
    }
}
