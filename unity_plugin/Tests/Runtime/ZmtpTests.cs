// The managed ZMTP 3.1 DEALER: against a scripted peer on a local TCP socket (greeting, READY
// properties, PING -> PONG, short and long frames, multipart dropped), and against the real
// sidecar's libzmq (a silent connection stays up without ZMTP heartbeats).
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Net;
using System.Net.Sockets;
using System.Text;
using System.Threading;
using NUnit.Framework;

namespace Igi.Sdk.Tests
{
    [TestFixture]
    [Category("Zmtp")]
    public class ZmtpTests
    {
        static byte[] ReadExactly(NetworkStream s, int n)
        {
            var b = new byte[n];
            int got = 0;
            while (got < n)
            {
                int r = s.Read(b, got, n - got);
                if (r <= 0) throw new EndOfStreamException();
                got += r;
            }
            return b;
        }

        static byte[] Frame(byte flags, byte[] body)
        {
            var o = new MemoryStream();
            if (body.Length > 255)
            {
                o.WriteByte((byte)(flags | 2));
                for (int i = 7; i >= 0; i--) o.WriteByte((byte)((long)body.Length >> (8 * i)));
            }
            else
            {
                o.WriteByte(flags);
                o.WriteByte((byte)body.Length);
            }
            o.Write(body, 0, body.Length);
            return o.ToArray();
        }

        static byte[] Command(string name, byte[] data)
        {
            var o = new MemoryStream();
            o.WriteByte((byte)name.Length);
            var n = Encoding.ASCII.GetBytes(name);
            o.Write(n, 0, n.Length);
            o.Write(data, 0, data.Length);
            return o.ToArray();
        }

        // Reads one frame from the peer's side: (flags, body).
        static Tuple<byte, byte[]> ReadFrame(NetworkStream s)
        {
            byte flags = ReadExactly(s, 1)[0];
            long size;
            if ((flags & 2) != 0)
            {
                size = 0;
                foreach (byte b in ReadExactly(s, 8)) size = (size << 8) | b;
            }
            else size = ReadExactly(s, 1)[0];
            return Tuple.Create(flags, ReadExactly(s, (int)size));
        }

        [Test]
        [Timeout(20000)]
        public void SpeaksZmtp31WithAScriptedPeer()
        {
            var listener = new TcpListener(IPAddress.Loopback, 0);
            listener.Start();
            int port = ((IPEndPoint)listener.LocalEndpoint).Port;
            var peerLog = new List<string>();
            Exception peerError = null;
            var peer = new Thread(() =>
            {
                try
                {
                    using (var tcp = listener.AcceptTcpClient())
                    {
                        var s = tcp.GetStream();
                        byte[] greeting = ReadExactly(s, 64);
                        lock (peerLog) peerLog.Add("greeting " + greeting[0] + " " + greeting[9] + " " + greeting[10] + "." + greeting[11] +
                            " " + Encoding.ASCII.GetString(greeting, 12, 4) + " server=" + greeting[32]);
                        var mine = new byte[64];
                        mine[0] = 0xff; mine[9] = 0x7f; mine[10] = 3; mine[11] = 1;
                        Encoding.ASCII.GetBytes("NULL").CopyTo(mine, 12);
                        mine[32] = 1;
                        s.Write(mine, 0, 64);
                        var ready = ReadFrame(s);
                        lock (peerLog) peerLog.Add("ready flags " + ready.Item1 + " " + Encoding.ASCII.GetString(ready.Item2));
                        var props = new MemoryStream();
                        props.WriteByte(11); props.Write(Encoding.ASCII.GetBytes("Socket-Type"), 0, 11);
                        props.Write(new byte[] { 0, 0, 0, 6 }, 0, 4); props.Write(Encoding.ASCII.GetBytes("ROUTER"), 0, 6);
                        var readyBytes = Frame(4, Command("READY", props.ToArray()));
                        s.Write(readyBytes, 0, readyBytes.Length);
                        // a PING with TTL 0x0032 and context "ctx", a multipart message, a long frame, a short one
                        var ping = Frame(4, Command("PING", new byte[] { 0, 0x32, (byte)'c', (byte)'t', (byte)'x' }));
                        s.Write(ping, 0, ping.Length);
                        var part1 = Frame(1, new byte[] { 1, 2 });
                        var part2 = Frame(0, new byte[] { 3 });
                        s.Write(part1, 0, part1.Length);
                        s.Write(part2, 0, part2.Length);
                        var longFrame = Frame(0, new byte[300]);
                        s.Write(longFrame, 0, longFrame.Length);
                        var shortFrame = Frame(0, new byte[] { 42 });
                        // split in two TCP writes: the reader must reassemble
                        s.Write(shortFrame, 0, 1);
                        s.Flush();
                        Thread.Sleep(30);
                        s.Write(shortFrame, 1, shortFrame.Length - 1);
                        var pong = ReadFrame(s);
                        lock (peerLog) peerLog.Add("pong flags " + pong.Item1 + " " + Encoding.ASCII.GetString(pong.Item2, 1, pong.Item2.Length - 1));
                        var data = ReadFrame(s);
                        lock (peerLog) peerLog.Add("data " + data.Item2.Length + " flags " + data.Item1);
                        var big = ReadFrame(s);
                        lock (peerLog) peerLog.Add("big " + big.Item2.Length + " flags " + big.Item1);
                    }
                }
                catch (Exception e) { peerError = e; }
            }) { IsBackground = true };
            peer.Start();

            using (var dealer = new ZmtpDealer())
            {
                dealer.Connect("tcp://127.0.0.1:" + port, Encoding.ASCII.GetBytes("igi-0123"), 5000);
                var got = new List<byte[]>();
                var clock = Stopwatch.StartNew();
                while (got.Count < 2 && clock.Elapsed.TotalSeconds < 5) dealer.Receive(20, got);
                Assert.AreEqual(2, got.Count, "the multipart message is dropped, the others arrive");
                Assert.AreEqual(300, got[0].Length);
                CollectionAssert.AreEqual(new byte[] { 42 }, got[1]);
                dealer.Send(new byte[] { 7, 7 });
                dealer.Send(new byte[1000]);
                peer.Join(5000);
            }
            listener.Stop();
            Assert.IsNull(peerError, peerError == null ? "" : peerError.ToString());
            CollectionAssert.AreEqual(new[]
            {
                "greeting 255 127 3.1 NULL server=0",
                "ready flags 4 \u0005READY\u000bSocket-Type\0\0\0\u0006DEALER\u0008Identity\0\0\0\u0008igi-0123",
                "pong flags 4 PONGctx",
                "data 2 flags 0",
                "big 1000 flags 2",
            }, peerLog);
        }

        [Test]
        [Timeout(30000)]
        public void StaysConnectedThroughSilenceWithoutZmtpHeartbeats()
        {
            // The sidecar sets no ZMTP heartbeats (libzmq 4.3 can abort the process writing one
            // to a broken connection, libzmq #4364): liveness is its heartbeat messages and the
            // client's lease. A connection silent for 7 s, before any hello, is still served, and
            // the dealer's own PINGs (after a second of silence) are answered.
            var sidecar = Sidecar.Shared;
            using (var dealer = new ZmtpDealer())
            {
                dealer.Connect(sidecar.Endpoint, Encoding.ASCII.GetBytes("igi-pingpong"), 5000);
                var got = new List<byte[]>();
                var clock = Stopwatch.StartNew();
                while (clock.Elapsed.TotalSeconds < 7)
                    Assert.IsTrue(dealer.Receive(50, got), "dropped after " + clock.Elapsed.TotalSeconds + " s");
                Assert.AreEqual(0, got.Count, "nothing is sent to a client that has not said hello");
                Assert.Less(dealer.SecondsSinceTraffic, 2, "the PONGs to the dealer's PINGs keep coming");
                dealer.Send(Protocol.Encode(1, "ping", null));
                while (got.Count == 0 && clock.Elapsed.TotalSeconds < 12) Assert.IsTrue(dealer.Receive(50, got));
                long id;
                string type;
                Dictionary<string, object> body;
                Assert.IsTrue(Protocol.TryDecode(got[0], out id, out type, out body));
                Assert.AreEqual("error", type);
                Assert.AreEqual("hello_required", MsgValue.GetString(body, "code"));
            }
        }

        [Test]
        public void ParsesEndpoints()
        {
            Assert.AreEqual(new IPEndPoint(IPAddress.Loopback, 5599), ZmtpDealer.ParseTcpEndpoint("tcp://127.0.0.1:5599"));
            Assert.AreEqual(new IPEndPoint(IPAddress.Loopback, 1), ZmtpDealer.ParseTcpEndpoint("tcp://localhost:1"));
            Assert.AreEqual(new IPEndPoint(IPAddress.IPv6Loopback, 80), ZmtpDealer.ParseTcpEndpoint("tcp://[::1]:80"));
            Assert.Throws<IgiTransportException>(() => ZmtpDealer.ParseTcpEndpoint("ipc:///tmp/x"));
            Assert.Throws<IgiTransportException>(() => ZmtpDealer.ParseTcpEndpoint("tcp://127.0.0.1"));
            Assert.Throws<IgiTransportException>(() => ZmtpDealer.ParseTcpEndpoint("tcp://example.com:80"));
        }
    }
}
