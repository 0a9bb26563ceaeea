// A ZeroMQ DEALER speaking ZMTP 3.1 (RFC 37) over a plain TCP socket, so the package needs no
// native library: NULL security mechanism, one connection, single-frame messages.
//
// Wire summary (RFC 37): a 64-byte greeting each way (signature FF 00*8 7F, version 3.1,
// mechanism "NULL" padded to 20 bytes, as-server 0, 31 filler bytes), then a READY command with
// the Socket-Type and Identity properties each way, then frames: a flags byte (MORE=1, LONG=2,
// COMMAND=4), a 1-byte or 8-byte big-endian size, the body. A PING command is answered with
// PONG. The sidecar sets no ZMTP heartbeats; this DEALER PINGs it after a second of silence.
using System;
using System.Collections.Generic;
using System.Diagnostics;
using System.IO;
using System.Net;
using System.Net.Sockets;
using System.Text;
using System.Threading;

namespace Igi.Sdk
{
    public sealed class ZmtpDealer : IIgiWakeableTransport
    {
        const byte FlagMore = 1, FlagLong = 2, FlagCommand = 4;
        const int GreetingBytes = 64;
        // the sidecar sends nothing near its own 17 MiB message limit (a saved session, a
        // list: kilobytes); a frame announcing more than twice that means a broken stream
        const long MaxFrameBytes = 2 * Protocol.MaxMessageBytes;

        Socket socket;
        readonly byte[] chunk = new byte[64 * 1024];
        byte[] pending = new byte[64 * 1024]; // bytes received but not yet parsed
        int pendingCount;
        bool droppingMultipart; // inside a multipart message (dropped whole)
        readonly Stopwatch sinceTraffic = new Stopwatch();
        readonly Stopwatch sincePing = new Stopwatch();
        // a PING after this much silence: the sidecar's libzmq answers PONG from its own I/O
        // thread even while the sidecar is busy (loading its model at start), so silence means a
        // dead process, not a busy one. The sidecar itself sends no PINGs (libzmq #4364).
        const double PingAfterSeconds = 1.0;
        // PING command: name length, "PING", TTL 0 (2 bytes), no context
        static readonly byte[] PingCommand = { 4, (byte)'P', (byte)'I', (byte)'N', (byte)'G', 0, 0 };

        // Wake(): one datagram to a loopback UDP socket that Receive waits on beside the TCP
        // socket (Socket.Select), so a request queued by the game ends the I/O thread's sleep
        readonly object wakeLock = new object();
        Socket wakeReceiver, wakeSender;
        int wakePending; // 1 while a wake datagram is on its way (one is enough)
        static readonly byte[] WakeByte = { 1 };
        readonly byte[] wakeDrain = new byte[16];
        readonly List<Socket> selectRead = new List<Socket>(2);

        public bool IsConnected { get { return socket != null; } }

        public void Wake()
        {
            if (Interlocked.Exchange(ref wakePending, 1) == 1) return;
            lock (wakeLock)
            {
                if (wakeSender == null) { wakePending = 0; return; } // not connected: nothing waits on it
                try { wakeSender.Send(WakeByte, 0, 1, SocketFlags.None); }
                catch (SocketException) { wakePending = 0; }
                catch (ObjectDisposedException) { wakePending = 0; }
            }
        }

        void OpenWake()
        {
            lock (wakeLock)
            {
                if (wakeReceiver != null) return;
                try
                {
                    var receiver = new Socket(AddressFamily.InterNetwork, SocketType.Dgram, ProtocolType.Udp);
                    receiver.Bind(new IPEndPoint(IPAddress.Loopback, 0));
                    var sender = new Socket(AddressFamily.InterNetwork, SocketType.Dgram, ProtocolType.Udp);
                    sender.Connect(receiver.LocalEndPoint);
                    wakeReceiver = receiver;
                    wakeSender = sender;
                }
                catch (SocketException)
                {
                    wakeReceiver = wakeSender = null; // no UDP on loopback: Receive waits its whole timeout
                }
                wakePending = 0;
            }
        }

        void CloseWake()
        {
            lock (wakeLock)
            {
                if (wakeReceiver != null) wakeReceiver.Close();
                if (wakeSender != null) wakeSender.Close();
                wakeReceiver = wakeSender = null;
            }
        }

        // Waits up to timeoutMs until the TCP socket is readable or Wake() was called; true: readable.
        bool WaitReadable(int timeoutMs)
        {
            Socket receiver = wakeReceiver; // only this thread opens and closes it
            if (receiver == null || timeoutMs <= 0) return socket.Poll(Math.Max(0, timeoutMs) * 1000, SelectMode.SelectRead);
            selectRead.Clear();
            selectRead.Add(socket);
            selectRead.Add(receiver);
            Socket.Select(selectRead, null, null, timeoutMs * 1000);
            bool woken = selectRead.Contains(receiver);
            bool readable = selectRead.Contains(socket);
            if (woken)
            {
                Volatile.Write(ref wakePending, 0); // before draining: a later Wake sends again
                while (receiver.Available > 0) receiver.Receive(wakeDrain, 0, wakeDrain.Length, SocketFlags.None);
            }
            return readable;
        }

        public double SecondsSinceTraffic { get { return sinceTraffic.Elapsed.TotalSeconds; } }

        public void Connect(string endpoint, byte[] routingId, int timeoutMs)
        {
            Close();
            var deadline = Stopwatch.StartNew();
            IPEndPoint target = ParseTcpEndpoint(endpoint);
            var s = new Socket(target.AddressFamily, SocketType.Stream, ProtocolType.Tcp);
            try
            {
                s.NoDelay = true;
                IAsyncResult pendingConnect = s.BeginConnect(target, null, null);
                if (!pendingConnect.AsyncWaitHandle.WaitOne(timeoutMs))
                    throw new IgiTransportException("connect to " + endpoint + " timed out");
                s.EndConnect(pendingConnect);
                socket = s;
                OpenWake();
                pendingCount = 0;
                droppingMultipart = false;
                sinceTraffic.Reset();
                sinceTraffic.Start();
                Handshake(routingId, timeoutMs - (int)deadline.ElapsedMilliseconds);
            }
            catch (SocketException e)
            {
                Close();
                s.Close();
                throw new IgiTransportException("cannot connect to " + endpoint + ": " + e.SocketErrorCode, e);
            }
            catch (ObjectDisposedException e)
            {
                Close();
                throw new IgiTransportException("connection to " + endpoint + " closed", e);
            }
            catch (IgiTransportException)
            {
                Close();
                s.Close();
                throw;
            }
        }

        /// <summary>tcp://HOST:PORT with HOST an IPv4 address, [IPv6] or localhost.</summary>
        public static IPEndPoint ParseTcpEndpoint(string endpoint)
        {
            const string scheme = "tcp://";
            if (endpoint == null || !endpoint.StartsWith(scheme, StringComparison.Ordinal))
                throw new IgiTransportException("endpoint must be tcp://HOST:PORT (ipc:// needs the native transport): " + endpoint);
            string rest = endpoint.Substring(scheme.Length);
            int colon = rest.LastIndexOf(':');
            int port;
            if (colon <= 0 || !int.TryParse(rest.Substring(colon + 1), out port) || port <= 0 || port > 65535)
                throw new IgiTransportException("endpoint has no valid port: " + endpoint);
            string host = rest.Substring(0, colon);
            if (host.StartsWith("[", StringComparison.Ordinal) && host.EndsWith("]", StringComparison.Ordinal))
                host = host.Substring(1, host.Length - 2);
            if (host == "localhost") return new IPEndPoint(IPAddress.Loopback, port);
            IPAddress address;
            if (!IPAddress.TryParse(host, out address))
                throw new IgiTransportException("endpoint host must be an IP address or localhost: " + endpoint);
            return new IPEndPoint(address, port);
        }

        void Handshake(byte[] routingId, int timeoutMs)
        {
            var clock = Stopwatch.StartNew();
            SendRaw(Greeting());
            byte[] peer;
            try
            {
                peer = ReadExactly(GreetingBytes, timeoutMs, clock);
            }
            catch (IgiTransportException)
            {
                // libzmq hangs up on a mechanism it does not want, often after sending its own:
                // name it, so the game learns why rather than just "closed"
                if (pendingCount >= 32 && pending[0] == 0xff)
                {
                    string wanted = Encoding.ASCII.GetString(pending, 12, 20).TrimEnd('\0');
                    if (wanted != "NULL") throw new IgiTransportException(MechanismRefusal(wanted));
                }
                throw;
            }
            if (peer[0] != 0xff || peer[9] != 0x7f)
                throw new IgiTransportException("the peer is not a ZeroMQ socket (bad greeting)");
            if (peer[10] < 3)
                throw new IgiTransportException("the peer speaks ZMTP " + peer[10] + ".x; 3.x is needed");
            string mechanism = Encoding.ASCII.GetString(peer, 12, 20).TrimEnd('\0');
            if (mechanism != "NULL") throw new IgiTransportException(MechanismRefusal(mechanism));

            SendFrame(ReadyCommand(routingId), FlagCommand);

            // The peer's READY: the first command frame after the greeting.
            while (true)
            {
                byte[] body;
                byte flags;
                if (TryParseFrame(out flags, out body))
                {
                    if ((flags & FlagCommand) == 0)
                        throw new IgiTransportException("the peer sent data before READY");
                    string name = CommandName(body);
                    if (name == "READY") return;
                    if (name == "ERROR")
                        throw new IgiTransportException("the peer refused the handshake: " + ErrorReason(body));
                    continue; // anything else before READY is not ours to judge
                }
                int left = timeoutMs - (int)clock.ElapsedMilliseconds;
                if (left <= 0) throw new IgiTransportException("handshake timed out");
                if (!Fill(Math.Min(left, 50)))
                    throw new IgiTransportException("the peer closed the connection during the handshake (a sidecar that requires CurveZMQ does so to clients without keys)");
            }
        }

        static string MechanismRefusal(string mechanism)
        {
            return "the sidecar wants the " + mechanism + " security mechanism (CurveZMQ needs ZmqNativeTransport with keys)";
        }

        static byte[] Greeting()
        {
            var g = new byte[GreetingBytes];
            g[0] = 0xff;  // signature: FF, 8 padding bytes, 7F
            g[9] = 0x7f;
            g[10] = 3;    // ZMTP 3.1
            g[11] = 1;
            byte[] mechanism = Encoding.ASCII.GetBytes("NULL");
            Buffer.BlockCopy(mechanism, 0, g, 12, mechanism.Length);
            g[32] = 0;    // as-server: we are the client
            return g;
        }

        static byte[] ReadyCommand(byte[] routingId)
        {
            var body = new MemoryStream();
            WriteShortString(body, "READY");
            WriteProperty(body, "Socket-Type", Encoding.ASCII.GetBytes("DEALER"));
            if (routingId != null && routingId.Length > 0)
                WriteProperty(body, "Identity", routingId);
            return body.ToArray();
        }

        static void WriteShortString(MemoryStream o, string s)
        {
            byte[] b = Encoding.ASCII.GetBytes(s);
            o.WriteByte((byte)b.Length);
            o.Write(b, 0, b.Length);
        }

        static void WriteProperty(MemoryStream o, string name, byte[] value)
        {
            WriteShortString(o, name);
            int n = value.Length;
            o.WriteByte((byte)(n >> 24));
            o.WriteByte((byte)(n >> 16));
            o.WriteByte((byte)(n >> 8));
            o.WriteByte((byte)n);
            o.Write(value, 0, n);
        }

        static string CommandName(byte[] body)
        {
            if (body.Length < 1 || body[0] + 1 > body.Length) return "";
            return Encoding.ASCII.GetString(body, 1, body[0]);
        }

        static string ErrorReason(byte[] body)
        {
            int at = 1 + body[0];
            if (at >= body.Length) return "(no reason)";
            int n = Math.Min(body[at], body.Length - at - 1);
            return Encoding.ASCII.GetString(body, at + 1, n);
        }

        public void Send(byte[] message)
        {
            if (socket == null) throw new IgiTransportException("not connected");
            SendFrame(message, 0);
        }

        public bool Receive(int timeoutMs, List<byte[]> into)
        {
            if (socket == null) return false;
            try
            {
                if (sinceTraffic.Elapsed.TotalSeconds >= PingAfterSeconds
                    && (!sincePing.IsRunning || sincePing.Elapsed.TotalSeconds >= PingAfterSeconds))
                {
                    SendFrame(PingCommand, FlagCommand);
                    sincePing.Reset();
                    sincePing.Start();
                }
                bool first = true;
                while (true)
                {
                    byte flags;
                    byte[] body;
                    while (TryParseFrame(out flags, out body))
                        HandleFrame(flags, body, into);
                    // wait only for the first read; then take whatever else is already here
                    if (!first && socket.Available == 0) return true;
                    if (!Fill(first ? timeoutMs : 0, first)) return false;
                    first = false;
                }
            }
            catch (SocketException) { Close(); return false; }
            catch (ObjectDisposedException) { Close(); return false; }
            catch (IgiTransportException) { Close(); return false; }
        }

        void HandleFrame(byte flags, byte[] body, List<byte[]> into)
        {
            if ((flags & FlagCommand) != 0)
            {
                string name = CommandName(body);
                if (name == "PING")
                {
                    // PING = name, TTL (2 bytes), context (0..16 bytes); PONG echoes the context
                    int contextAt = 1 + body[0] + 2;
                    int contextLength = Math.Max(0, body.Length - contextAt);
                    var pong = new byte[5 + contextLength];
                    pong[0] = 4;
                    Encoding.ASCII.GetBytes("PONG", 0, 4, pong, 1);
                    if (contextLength > 0) Buffer.BlockCopy(body, contextAt, pong, 5, contextLength);
                    SendFrame(pong, FlagCommand);
                }
                else if (name == "ERROR")
                {
                    throw new IgiTransportException("the peer sent ERROR: " + ErrorReason(body));
                }
                return; // PONG and unknown commands need nothing from us
            }
            bool more = (flags & FlagMore) != 0;
            if (more || droppingMultipart)
            {
                // The protocol is one frame per message: multipart messages are dropped whole.
                droppingMultipart = more;
                return;
            }
            into.Add(body);
        }

        // Parses one frame from the pending bytes, if a whole one is there.
        bool TryParseFrame(out byte flags, out byte[] body)
        {
            flags = 0;
            body = null;
            if (pendingCount < 2) return false;
            flags = pending[0];
            long size;
            int header;
            if ((flags & FlagLong) != 0)
            {
                if (pendingCount < 9) return false;
                size = 0;
                for (int i = 1; i <= 8; i++) size = (size << 8) | pending[i];
                header = 9;
                if (size < 0 || size > MaxFrameBytes)
                    throw new IgiTransportException("frame of " + size + " bytes is too large");
            }
            else
            {
                size = pending[1];
                header = 2;
            }
            if (pendingCount < header + size) return false;
            body = new byte[size];
            Buffer.BlockCopy(pending, header, body, 0, (int)size);
            int consumed = header + (int)size;
            Buffer.BlockCopy(pending, consumed, pending, 0, pendingCount - consumed);
            pendingCount -= consumed;
            return true;
        }

        // Waits up to timeoutMs for bytes and appends them to the pending buffer. False: closed.
        // wakeable: Wake() may end the wait early (the I/O loop's wait; not the handshake's)
        bool Fill(int timeoutMs, bool wakeable = false)
        {
            if (socket == null) return false;
            bool readable = wakeable ? WaitReadable(timeoutMs) : socket.Poll(Math.Max(0, timeoutMs) * 1000, SelectMode.SelectRead);
            if (!readable) return true;
            int n = socket.Receive(chunk, 0, chunk.Length, SocketFlags.None);
            if (n <= 0) { Close(); return false; } // readable with no bytes: the peer closed
            if (pendingCount + n > pending.Length)
            {
                var bigger = new byte[Math.Max(pending.Length * 2, pendingCount + n)];
                Buffer.BlockCopy(pending, 0, bigger, 0, pendingCount);
                pending = bigger;
            }
            Buffer.BlockCopy(chunk, 0, pending, pendingCount, n);
            pendingCount += n;
            sinceTraffic.Reset();
            sinceTraffic.Start();
            return true;
        }

        byte[] ReadExactly(int count, int timeoutMs, Stopwatch clock)
        {
            while (pendingCount < count)
            {
                int left = timeoutMs - (int)clock.ElapsedMilliseconds;
                if (left <= 0) throw new IgiTransportException("handshake timed out");
                if (!Fill(Math.Min(left, 50)))
                    throw new IgiTransportException("the peer closed the connection during the handshake (a sidecar that requires CurveZMQ does so to clients without keys)");
            }
            var result = new byte[count];
            Buffer.BlockCopy(pending, 0, result, 0, count);
            Buffer.BlockCopy(pending, count, pending, 0, pendingCount - count);
            pendingCount -= count;
            return result;
        }

        void SendFrame(byte[] body, byte flags)
        {
            long n = body.Length;
            byte[] frame;
            int header;
            if (n <= 255)
            {
                header = 2;
                frame = new byte[header + n];
                frame[0] = flags;
                frame[1] = (byte)n;
            }
            else
            {
                header = 9;
                frame = new byte[header + n];
                frame[0] = (byte)(flags | FlagLong);
                for (int i = 0; i < 8; i++) frame[1 + i] = (byte)(n >> (56 - 8 * i));
            }
            Buffer.BlockCopy(body, 0, frame, header, (int)n);
            SendRaw(frame);
        }

        void SendRaw(byte[] bytes)
        {
            Socket s = socket;
            if (s == null) throw new IgiTransportException("not connected");
            try
            {
                int sent = 0;
                while (sent < bytes.Length)
                    sent += s.Send(bytes, sent, bytes.Length - sent, SocketFlags.None);
            }
            catch (SocketException e)
            {
                Close();
                throw new IgiTransportException("send failed: " + e.SocketErrorCode, e);
            }
            catch (ObjectDisposedException e)
            {
                Close();
                throw new IgiTransportException("send on a closed connection", e);
            }
        }

        public void Close()
        {
            CloseWake();
            Socket s = socket;
            socket = null;
            if (s == null) return;
            try { s.Shutdown(SocketShutdown.Both); } catch (SocketException) { } catch (ObjectDisposedException) { }
            s.Close();
        }

        public void Dispose() { Close(); }
    }
}
