// The same DEALER through the system's libzmq (P/Invoke), for what the managed ZMTP transport
// does not speak: CurveZMQ (non-loopback sidecars) and ipc:// endpoints. The game ships libzmq
// itself (libzmq.dll / libzmq.so / libzmq.dylib, resolved by the name "libzmq"); this package
// carries no native binary. Receiving waits in zmq_poll on the DEALER and on an inproc PAIR that
// Wake() writes to (so a request queued by the game ends the wait); zmq_pollitem_t's fd is an
// int on POSIX and a SOCKET (pointer-sized) on Windows, so both layouts are declared. libzmq connects, reconnects (100 ms doubling to 2 s) and runs the
// ZMTP heartbeats itself, so a dropped connection is invisible here: the client relies on the
// sidecar's heartbeats and on gaps in token indexes instead.
using System;
using System.Collections.Generic;
using System.IO;
using System.Runtime.InteropServices;
using System.Text;
using System.Threading;

namespace Igi.Sdk
{
    /// <summary>CurveZMQ keys as Z85 text (40 characters each), e.g. from `igi-sdk keys` files.</summary>
    public sealed class IgiCurveKeys
    {
        public string ServerPublicKey;
        public string ClientPublicKey;
        public string ClientSecretKey;

        /// <summary>Reads the client's secret certificate (game.key_secret) and the server's
        /// public certificate (server.key), as `igi-sdk keys` writes them.</summary>
        public static IgiCurveKeys FromCertificateFiles(string clientSecretFile, string serverPublicFile)
        {
            var client = ReadCertificate(clientSecretFile);
            var server = ReadCertificate(serverPublicFile);
            string secret;
            if (!client.TryGetValue("secret-key", out secret))
                throw new InvalidDataException(clientSecretFile + " holds no secret key");
            return new IgiCurveKeys
            {
                ServerPublicKey = server["public-key"],
                ClientPublicKey = client["public-key"],
                ClientSecretKey = secret,
            };
        }

        // ZeroMQ certificate files: `    name = "value"` lines under section headers.
        static Dictionary<string, string> ReadCertificate(string path)
        {
            var values = new Dictionary<string, string>();
            foreach (string raw in File.ReadAllLines(path))
            {
                string line = raw.Trim();
                if (line.StartsWith("#", StringComparison.Ordinal)) continue;
                int eq = line.IndexOf('=');
                if (eq <= 0) continue;
                string value = line.Substring(eq + 1).Trim();
                if (value.Length >= 2 && value[0] == '"' && value[value.Length - 1] == '"')
                    value = value.Substring(1, value.Length - 2);
                values[line.Substring(0, eq).Trim()] = value;
            }
            if (!values.ContainsKey("public-key")) throw new InvalidDataException(path + " holds no public key");
            return values;
        }
    }

    public sealed class ZmqNativeTransport : IIgiWakeableTransport
    {
        const string Lib = "libzmq";
        const int ZMQ_DEALER = 5, ZMQ_PAIR = 0;
        const short ZMQ_POLLIN = 1;
        const int ZMQ_DONTWAIT = 1;
        const int ZMQ_ROUTING_ID = 5, ZMQ_LINGER = 17, ZMQ_RECONNECT_IVL = 18, ZMQ_RECONNECT_IVL_MAX = 21;
        const int ZMQ_IPV6 = 42, ZMQ_CURVE_PUBLICKEY = 48, ZMQ_CURVE_SECRETKEY = 49, ZMQ_CURVE_SERVERKEY = 50;
        const int ZMQ_TCP_KEEPALIVE = 34, ZMQ_TCP_KEEPALIVE_CNT = 35, ZMQ_TCP_KEEPALIVE_IDLE = 36, ZMQ_TCP_KEEPALIVE_INTVL = 37;
        const int EAGAIN_POSIX = 11, EAGAIN_MACOS = 35;
        const int MsgBytes = 64; // sizeof(zmq_msg_t)

        [DllImport(Lib)] static extern IntPtr zmq_ctx_new();
        [DllImport(Lib)] static extern int zmq_ctx_term(IntPtr context);
        [DllImport(Lib)] static extern IntPtr zmq_socket(IntPtr context, int type);
        [DllImport(Lib)] static extern int zmq_close(IntPtr socket);
        [DllImport(Lib)] static extern int zmq_setsockopt(IntPtr socket, int option, byte[] value, UIntPtr length);
        [DllImport(Lib)] static extern int zmq_connect(IntPtr socket, byte[] endpoint);
        [DllImport(Lib)] static extern int zmq_send(IntPtr socket, byte[] buffer, UIntPtr length, int flags);
        [DllImport(Lib)] static extern int zmq_msg_init(IntPtr message);
        [DllImport(Lib)] static extern int zmq_msg_recv(IntPtr message, IntPtr socket, int flags);
        [DllImport(Lib)] static extern IntPtr zmq_msg_data(IntPtr message);
        [DllImport(Lib)] static extern UIntPtr zmq_msg_size(IntPtr message);
        [DllImport(Lib)] static extern int zmq_msg_more(IntPtr message);
        [DllImport(Lib)] static extern int zmq_msg_close(IntPtr message);
        [DllImport(Lib)] static extern int zmq_errno();
        [DllImport(Lib)] static extern int zmq_bind(IntPtr socket, byte[] endpoint);
        [DllImport(Lib, EntryPoint = "zmq_poll")] static extern int zmq_poll_posix([In, Out] PollItemPosix[] items, int count, long timeoutMs);
        [DllImport(Lib, EntryPoint = "zmq_poll")] static extern int zmq_poll_windows([In, Out] PollItemWindows[] items, int count, long timeoutMs);

        [StructLayout(LayoutKind.Sequential)]
        struct PollItemPosix { public IntPtr Socket; public int Fd; public short Events; public short Revents; }
        [StructLayout(LayoutKind.Sequential)]
        struct PollItemWindows { public IntPtr Socket; public IntPtr Fd; public short Events; public short Revents; }

        static readonly bool Windows = Path.DirectorySeparatorChar == '\\';
        static readonly byte[] Empty = new byte[0];
        static long wakeNames;
        readonly PollItemPosix[] pollPosix = new PollItemPosix[2];
        readonly PollItemWindows[] pollWindows = new PollItemWindows[2];
        readonly object wakeLock = new object();
        IntPtr wakeSender, wakeReceiver; // inproc PAIR: Wake() sends on one, Receive polls the other
        int wakePending;
        [DllImport(Lib)] static extern IntPtr zmq_strerror(int error);

        readonly IgiCurveKeys curve;
        const int EINTR = 4;
        IntPtr context, socket, message;
        bool droppingMultipart;

        public ZmqNativeTransport(IgiCurveKeys curve = null) { this.curve = curve; }

        public bool IsConnected { get { return socket != IntPtr.Zero; } }

        // libzmq watches the connection itself (ZMTP heartbeats) and reconnects on its own
        public double SecondsSinceTraffic { get { return 0; } }

        public void Connect(string endpoint, byte[] routingId, int timeoutMs)
        {
            Close();
            try
            {
                context = zmq_ctx_new();
                if (context == IntPtr.Zero) throw Failure("zmq_ctx_new");
                socket = zmq_socket(context, ZMQ_DEALER);
                if (socket == IntPtr.Zero) throw Failure("zmq_socket");
                if (routingId != null && routingId.Length > 0) Set(ZMQ_ROUTING_ID, routingId);
                SetInt(ZMQ_LINGER, 0);
                SetInt(ZMQ_RECONNECT_IVL, 100);
                SetInt(ZMQ_RECONNECT_IVL_MAX, 2000);
                // no ZMTP heartbeats: libzmq 4.3 can abort a process that writes one to a
                // connection that broke while its input was stopped (libzmq #4364). The sidecar's
                // heartbeat messages tell whether it lives; TCP keepalive ends a connection to a
                // host that vanished
                SetInt(ZMQ_TCP_KEEPALIVE, 1);
                SetInt(ZMQ_TCP_KEEPALIVE_IDLE, 30);
                SetInt(ZMQ_TCP_KEEPALIVE_INTVL, 5);
                SetInt(ZMQ_TCP_KEEPALIVE_CNT, 3);
                if (endpoint != null && endpoint.Contains("[")) SetInt(ZMQ_IPV6, 1);
                if (curve != null)
                {
                    Set(ZMQ_CURVE_SERVERKEY, Z85(curve.ServerPublicKey));
                    Set(ZMQ_CURVE_PUBLICKEY, Z85(curve.ClientPublicKey));
                    Set(ZMQ_CURVE_SECRETKEY, Z85(curve.ClientSecretKey));
                }
                if (zmq_connect(socket, CString(endpoint ?? "")) != 0) throw Failure("connect to " + endpoint);
                message = Marshal.AllocHGlobal(MsgBytes);
                OpenWake();
            }
            catch (DllNotFoundException e)
            {
                Close();
                throw new IgiTransportException("libzmq is not installed (the native transport needs it)", e);
            }
            catch (EntryPointNotFoundException e)
            {
                Close();
                throw new IgiTransportException("libzmq is too old (4.2 or newer is needed)", e);
            }
            catch (IgiTransportException)
            {
                Close();
                throw;
            }
        }

        public void Send(byte[] data)
        {
            if (socket == IntPtr.Zero) throw new IgiTransportException("not connected");
            if (zmq_send(socket, data, (UIntPtr)(uint)data.Length, ZMQ_DONTWAIT) < 0)
                throw Failure("send"); // EAGAIN: libzmq's queue is full
        }

        public bool Receive(int timeoutMs, List<byte[]> into)
        {
            if (socket == IntPtr.Zero) return false;
            bool got = false;
            while (ReceiveOne(into)) got = true;
            if (got || timeoutMs <= 0) return true;
            if (Poll(timeoutMs)) while (ReceiveOne(into)) { }
            return true;
        }

        public void Wake()
        {
            if (Interlocked.Exchange(ref wakePending, 1) == 1) return;
            lock (wakeLock)
            {
                // one empty message; a full queue means a wake is already waiting
                if (wakeSender == IntPtr.Zero || zmq_send(wakeSender, Empty, UIntPtr.Zero, ZMQ_DONTWAIT) < 0) wakePending = 0;
            }
        }

        void OpenWake()
        {
            string name = "inproc://igi-wake-" + Interlocked.Increment(ref wakeNames);
            lock (wakeLock)
            {
                // kept in the fields at once: Close closes them (zmq_ctx_term waits for every socket)
                wakeReceiver = zmq_socket(context, ZMQ_PAIR);
                wakeSender = zmq_socket(context, ZMQ_PAIR);
                wakePending = 0;
                if (wakeReceiver == IntPtr.Zero || wakeSender == IntPtr.Zero || zmq_bind(wakeReceiver, CString(name)) != 0
                    || zmq_connect(wakeSender, CString(name)) != 0)
                    throw Failure("wake pair");
            }
        }

        // zmq_poll on the DEALER and the wake PAIR; true: the DEALER has input
        bool Poll(int timeoutMs)
        {
            short dealer, woken;
            int r;
            if (Windows)
            {
                pollWindows[0] = new PollItemWindows { Socket = socket, Events = ZMQ_POLLIN };
                pollWindows[1] = new PollItemWindows { Socket = wakeReceiver, Events = ZMQ_POLLIN };
                r = zmq_poll_windows(pollWindows, wakeReceiver != IntPtr.Zero ? 2 : 1, timeoutMs);
                dealer = pollWindows[0].Revents;
                woken = pollWindows[1].Revents;
            }
            else
            {
                pollPosix[0] = new PollItemPosix { Socket = socket, Events = ZMQ_POLLIN };
                pollPosix[1] = new PollItemPosix { Socket = wakeReceiver, Events = ZMQ_POLLIN };
                r = zmq_poll_posix(pollPosix, wakeReceiver != IntPtr.Zero ? 2 : 1, timeoutMs);
                dealer = pollPosix[0].Revents;
                woken = pollPosix[1].Revents;
            }
            if (r < 0)
            {
                if (zmq_errno() == EINTR) return false;
                throw Failure("poll");
            }
            if ((woken & ZMQ_POLLIN) != 0)
            {
                Volatile.Write(ref wakePending, 0); // before draining: a later Wake sends again
                while (zmq_msg_init(message) == 0)
                {
                    int n = zmq_msg_recv(message, wakeReceiver, ZMQ_DONTWAIT);
                    zmq_msg_close(message);
                    if (n < 0) break;
                }
            }
            return (dealer & ZMQ_POLLIN) != 0;
        }

        bool ReceiveOne(List<byte[]> into)
        {
            if (zmq_msg_init(message) != 0) return false;
            try
            {
                int size = zmq_msg_recv(message, socket, ZMQ_DONTWAIT);
                if (size < 0)
                {
                    int error = zmq_errno();
                    if (error == EAGAIN_POSIX || error == EAGAIN_MACOS) return false;
                    throw Failure("receive");
                }
                bool more = zmq_msg_more(message) != 0;
                if (more || droppingMultipart)
                {
                    droppingMultipart = more; // one frame per message: multipart is dropped whole
                    return true;
                }
                var data = new byte[(int)(uint)zmq_msg_size(message)];
                if (data.Length > 0) Marshal.Copy(zmq_msg_data(message), data, 0, data.Length);
                into.Add(data);
                return true;
            }
            finally
            {
                zmq_msg_close(message);
            }
        }

        void Set(int option, byte[] value)
        {
            if (zmq_setsockopt(socket, option, value, (UIntPtr)(uint)value.Length) != 0)
                throw Failure("setsockopt " + option);
        }

        void SetInt(int option, int value)
        {
            Set(option, BitConverter.GetBytes(value)); // native byte order, as libzmq reads an int
        }

        static byte[] Z85(string key)
        {
            if (key == null || key.Length != 40) throw new IgiTransportException("a CurveZMQ key must be 40 Z85 characters");
            return CString(key); // 41 bytes: libzmq reads Z85 text with its terminating zero
        }

        static byte[] CString(string s)
        {
            byte[] text = Encoding.UTF8.GetBytes(s);
            var z = new byte[text.Length + 1];
            Buffer.BlockCopy(text, 0, z, 0, text.Length);
            return z;
        }

        static IgiTransportException Failure(string what)
        {
            int error = zmq_errno();
            string reason = Marshal.PtrToStringAnsi(zmq_strerror(error));
            return new IgiTransportException("libzmq " + what + " failed: " + reason + " (" + error + ")");
        }

        public void Close()
        {
            lock (wakeLock)
            {
                if (wakeSender != IntPtr.Zero) { zmq_close(wakeSender); wakeSender = IntPtr.Zero; }
                if (wakeReceiver != IntPtr.Zero) { zmq_close(wakeReceiver); wakeReceiver = IntPtr.Zero; }
            }
            if (socket != IntPtr.Zero) { zmq_close(socket); socket = IntPtr.Zero; }
            if (context != IntPtr.Zero) { zmq_ctx_term(context); context = IntPtr.Zero; }
            if (message != IntPtr.Zero) { Marshal.FreeHGlobal(message); message = IntPtr.Zero; }
            droppingMultipart = false;
        }

        public void Dispose() { Close(); }
    }
}
