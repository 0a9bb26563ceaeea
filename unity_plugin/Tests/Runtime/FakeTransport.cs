// A scripted transport for tests that need no sidecar: it records what the client sends and
// answers through a handler the test supplies (hello is answered like a 1.1 sidecar by default).
using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Threading;

namespace Igi.Sdk.Tests
{
    public sealed class FakeTransport : IIgiTransport
    {
        public readonly ConcurrentQueue<Dictionary<string, object>> Sent = new ConcurrentQueue<Dictionary<string, object>>();
        readonly ConcurrentQueue<byte[]> toClient = new ConcurrentQueue<byte[]>();
        readonly Stopwatch sinceTraffic = Stopwatch.StartNew();
        /// <summary>(id, type, body) of each request the client sends; reply with Reply().</summary>
        public Action<long, string, Dictionary<string, object>> OnRequest;
        public volatile bool Refuse;   // connect attempts fail
        volatile bool connected;
        public int Connects;

        public bool IsConnected { get { return connected; } }
        public double SecondsSinceTraffic { get { return 0; } } // the fake never drops by itself

        public void Connect(string endpoint, byte[] routingId, int timeoutMs)
        {
            if (Refuse) throw new IgiTransportException("refused (fake)");
            Interlocked.Increment(ref Connects);
            connected = true;
        }

        public void Send(byte[] message)
        {
            if (!connected) throw new IgiTransportException("not connected (fake)");
            var envelope = (Dictionary<string, object>)MsgPack.Decode(message);
            Sent.Enqueue(envelope);
            long id = (long)envelope["id"];
            string type = (string)envelope["type"];
            var body = (Dictionary<string, object>)envelope["body"];
            if (OnRequest != null) OnRequest(id, type, body);
            else if (type == "hello") Reply(id, "ok", HelloOk());
        }

        public static Dictionary<string, object> HelloOk()
        {
            return new Dictionary<string, object>
            {
                { "protocol", 1L }, { "minor", 1L }, { "model", "fake.gguf" }, { "loading", false }, { "lease_s", 15.0 },
                { "limits", new Dictionary<string, object> { { "max_text_chars", 32000L }, { "max_message_bytes", Protocol.MaxMessageBytes } } },
                { "features", new List<object> { "goodbye", "leases", "list_sessions", "adopt_session", "set_priority", "resume_stream", "json_schema_string", "session_names", "draft_model", "images" } },
            };
        }

        public void Reply(long id, string type, Dictionary<string, object> body)
        {
            toClient.Enqueue(Protocol.Encode(id, type, body));
        }

        public void ReplyRaw(byte[] message) { toClient.Enqueue(message); }

        public bool Receive(int timeoutMs, List<byte[]> into)
        {
            if (!connected) return false;
            byte[] m;
            if (toClient.IsEmpty) Thread.Sleep(Math.Max(0, timeoutMs));
            while (toClient.TryDequeue(out m)) into.Add(m);
            sinceTraffic.Reset();
            sinceTraffic.Start();
            return connected;
        }

        /// <summary>Drops the connection as a network failure would.</summary>
        public void Drop() { connected = false; }

        public void Close() { connected = false; }
        public void Dispose() { Close(); }

        /// <summary>The bodies sent with this type so far.</summary>
        public List<Dictionary<string, object>> SentOf(string type)
        {
            var result = new List<Dictionary<string, object>>();
            foreach (var m in Sent.ToArray())
                if ((string)m["type"] == type) result.Add(m);
            return result;
        }
    }
}
