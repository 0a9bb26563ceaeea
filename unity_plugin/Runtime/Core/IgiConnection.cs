// The client's I/O thread: it owns the transport and every piece of connection state, so none of
// it needs a lock. The caller's thread talks to it through two queues: requests go in through
// the outbox, replies and connection changes come out through the inbox (read by Pump).
//
// What it does on its own: connect (back-off 100 ms doubling to 2 s), say hello on every new
// connection (without the 1.2 fields owner and token if the sidecar refuses them, then as 1.0
// if it refuses the 1.1 fields), answer
// hello_required by saying hello and sending the request again, keep the lease with a ping every
// lease_s/3 counted from the last message the sidecar accepted (one it refused as malformed or
// invalid did not keep the lease), refuse a sidecar of another instance or model (wrong_sidecar,
// never used again), declare the sidecar down after 5 s of silence (pending requests fail with
// `unavailable`), resume open streams after a reconnect, and say goodbye when disposed.
using System;
using System.Collections.Concurrent;
using System.Collections.Generic;
using System.Diagnostics;
using System.Text;
using System.Threading;

namespace Igi.Sdk
{
    internal sealed class IgiConnection
    {
        internal enum OutKind { Send, Forget, Stop }

        internal sealed class Outgoing
        {
            public OutKind Kind;
            public long Id;
            public string Type;
            public byte[] Bytes;
            public bool IsStream;
            public string Session; // the session a close_session names
            public string Feature; // the protocol feature it needs (null: none)
        }

        internal sealed class Incoming
        {
            public long Id;
            public string Type;
            public Dictionary<string, object> Body;
            public bool IsConnectionChange;
            public IgiConnectionState State;
            public IgiServerInfo Info;
            public IgiError HelloRefusal; // a connection change that only says hello was refused
        }

        sealed class InFlight
        {
            public long Id;
            public string Type;
            public byte[] Bytes;
            public bool IsStream;
            public bool Internal;      // sent by this thread; its answer is not forwarded
            public bool Sent;
            public bool NeedsResume;   // a stream whose connection dropped
            public long LastToken;     // the last token forwarded (in order)
            public bool ResumeAsked;   // a resume_stream for it is in flight
            public long ResumeOf;      // a resume_stream: the chat it resumes
            public int HelloLevel;     // a hello's fields: HelloFull, HelloNoKeys, HelloLegacy
            public bool HelloHadKeys;  // it carried owner or token
            public int HelloRetries;
            public string Session;
            public string Feature;
            public double QueuedAt;
            public double SentAt;
        }

        // a transport that cannot be woken (a test's, a game's own) is polled this often; the
        // built-in ones are woken by Enqueue and by traffic, so the thread sleeps IdleWaitMs when
        // nothing happens (its timers: pings every second or more, silence after 5 s)
        const int PollMs = 2;
        const int IdleWaitMs = 200;
        const int ConnectTimeoutMs = 2000;
        const int FirstBackoffMs = 100, MaxBackoffMs = 2000;
        const int GoodbyeWaitMs = 300;
        const int FlushWaitMs = 600;
        // what a hello carries: everything (1.2), no owner/token (a 1.1 sidecar refuses them),
        // or only the 1.0 fields (a 1.0 sidecar refuses minor and lease_s)
        const int HelloFull = 2, HelloNoKeys = 1, HelloLegacy = 0;

        // requests that may simply be sent again when the connection dropped before the answer
        static readonly HashSet<string> Idempotent = new HashSet<string>
        { "ping", "stats", "list_sessions", "frame", "set_priority" };

        readonly IgiClientOptions options;
        readonly IIgiTransport transport;
        readonly IIgiWakeableTransport wakeable; // transport, when it can be woken; else null
        readonly byte[] routingId;
        public readonly ConcurrentQueue<Incoming> Inbox = new ConcurrentQueue<Incoming>();
        readonly ConcurrentQueue<Outgoing> outbox = new ConcurrentQueue<Outgoing>();
        readonly AutoResetEvent wake = new AutoResetEvent(false);
        readonly Thread thread;
        volatile bool stopRequested;
        long lastId;

        // ---- state owned by the I/O thread --------------------------------------------------
        readonly Stopwatch clock = Stopwatch.StartNew();
        readonly Dictionary<long, InFlight> inflight = new Dictionary<long, InFlight>();
        readonly List<InFlight> waiting = new List<InFlight>();
        readonly List<byte[]> received = new List<byte[]>();
        readonly HashSet<string> ownedSessions = new HashSet<string>();
        IgiServerInfo info;
        bool greeted;           // hello answered on this connection
        long helloId;           // the automatic hello in flight, 0 if none
        int helloLevel = HelloFull; // lowered when the sidecar refuses newer hello fields
        double helloAgainAt;    // > 0: hello was refused retryable (busy); greet again then
        int helloBackoffMs = FirstBackoffMs * 5;
        bool farewell;          // goodbye answered: stay quiet until the game asks for something
        bool readoptAfterHello; // forgotten (hello_required): take the orphaned sessions back
        bool down;              // silent for SidecarSilenceSeconds
        double heardAt;         // last message from the sidecar
        double greetedAt;
        double acceptedAt;      // when the last message the sidecar accepted was sent (its lease)
        double keepaliveAt;     // when the last keepalive ping was sent
        IgiError identityRefusal; // the sidecar is not the one expected: nothing more goes to it
        double nextConnectAt;
        int backoffMs = FirstBackoffMs;
        string lastTransportError; // why the last connect failed, for the unavailable message
        IgiConnectionState postedState = IgiConnectionState.Connecting;

        public IgiConnection(IgiClientOptions options)
        {
            this.options = options;
            transport = options.TransportFactory != null ? options.TransportFactory() : new ZmtpDealer();
            wakeable = transport as IIgiWakeableTransport;
            string id = options.RoutingId;
            if (string.IsNullOrEmpty(id)) id = "igi-" + Guid.NewGuid().ToString("N").Substring(0, 24);
            routingId = Encoding.ASCII.GetBytes(id);
            thread = new Thread(Run);
            thread.IsBackground = true; // never keeps a game (or the editor) from exiting
            thread.Name = "igi-sdk I/O";
            thread.Start();
        }

        public string RoutingId { get { return Encoding.ASCII.GetString(routingId); } }

        public long NextId() { return Interlocked.Increment(ref lastId); }

        public void Enqueue(Outgoing message)
        {
            outbox.Enqueue(message);
            wake.Set();
            if (wakeable != null) wakeable.Wake(); // cuts the I/O thread's wait on the socket short
        }

        // ---- frame reports: the game's thread writes the latest here, the I/O thread sends it.
        // Nothing is allocated on the game's thread (no request object, no encoding, no answer
        // delivered back): a frame report every frame would otherwise be garbage every frame.
        readonly object frameLock = new object();
        bool framePending;
        long frameNumber;
        double frameTimeMs, frameTarget;
        long frameVramUsed, frameVramBudget;
        int frameBusyThreads;
        double frameCpuShare;
        volatile string frameError;

        /// <summary>The code and message of the last frame report the sidecar refused; null if none was.</summary>
        public string FrameError { get { return frameError; } }

        /// <summary>A frame report refused before sending (its arguments break the protocol's
        /// rules): kept where the sidecar's refusals are.</summary>
        public void RefuseFrame(string code, string message) { frameError = code + ": " + message; }

        /// <summary>Negative <paramref name="busyThreads"/> and NaN <paramref name="cpuShare"/>: not
        /// reported (left out); the caller has checked the rest against the protocol's ranges.</summary>
        public void PostFrame(long frame, double timeMs, double targetMs, long vramUsed, long vramBudget,
            int busyThreads, double cpuShare)
        {
            lock (frameLock)
            {
                // the sidecar paces by the latest frame: one not yet sent is replaced, not queued
                framePending = true;
                frameNumber = frame;
                frameTimeMs = timeMs;
                frameTarget = targetMs;
                frameVramUsed = vramUsed;
                frameVramBudget = vramBudget;
                frameBusyThreads = busyThreads;
                frameCpuShare = cpuShare;
            }
            wake.Set();
            if (wakeable != null) wakeable.Wake();
        }

        void SendFrame()
        {
            var body = new Dictionary<string, object>();
            lock (frameLock)
            {
                if (!framePending) return;
                framePending = false;
                body["frame"] = frameNumber;
                body["frame_time_ms"] = frameTimeMs;
                if (!double.IsNaN(frameTarget)) body["target_frame_time_ms"] = frameTarget;
                if (frameVramUsed >= 0) body["vram_used"] = frameVramUsed;
                if (frameVramBudget >= 0) body["vram_budget"] = frameVramBudget;
                if (frameBusyThreads >= 0) body["busy_threads"] = (long)frameBusyThreads;
                if (!double.IsNaN(frameCpuShare)) body["cpu_share"] = frameCpuShare;
            }
            SendInternal("frame", body, 0);
        }

        /// <summary>Loop turns of the I/O thread so far (each wait on the socket or the queue is one).</summary>
        public long Turns { get { return Interlocked.Read(ref turns); } }
        long turns;

        /// <summary>Stops the thread (after a goodbye, bounded) and waits for it, bounded.</summary>
        public void Stop(int joinTimeoutMs)
        {
            Enqueue(new Outgoing { Kind = OutKind.Stop });
            if (Thread.CurrentThread != thread) thread.Join(joinTimeoutMs);
        }

        double Now { get { return clock.Elapsed.TotalSeconds; } }

        void Run()
        {
            try
            {
                while (!stopRequested)
                {
                    DrainOutbox();
                    if (stopRequested) break;
                    Interlocked.Increment(ref turns);
                    if (!transport.IsConnected)
                    {
                        if (identityRefusal != null)
                        {
                            wake.WaitOne(IdleWaitMs); // refused: no reconnecting, only failing what comes
                            continue;
                        }
                        if (Now >= nextConnectAt) TryConnect();
                        if (!transport.IsConnected)
                        {
                            CheckSilence();
                            int waitMs = (int)Math.Ceiling((nextConnectAt - Now) * 1000);
                            wake.WaitOne(Math.Max(1, Math.Min(IdleWaitMs, waitMs)));
                            continue;
                        }
                    }
                    SendWhatIsReady();
                    if (!transport.IsConnected) { OnDropped(); continue; }
                    received.Clear();
                    bool alive = transport.Receive(wakeable != null ? IdleWaitMs : PollMs, received);
                    foreach (var message in received) HandleSafely(message);
                    if (!alive || transport.SecondsSinceTraffic > options.SidecarSilenceSeconds) OnDropped();
                    CheckSilence();
                }
                SayGoodbye();
            }
            catch (Exception e)
            {
                // A bug in this thread must not vanish silently: fail what is pending with it.
                FailEverything(new IgiError("internal", "igi-sdk I/O thread: " + e, false));
            }
            finally
            {
                transport.Close();
                PostState(IgiConnectionState.Closed, null);
            }
        }

        // ---- caller -> I/O thread -----------------------------------------------------------

        void DrainOutbox()
        {
            Outgoing o;
            while (outbox.TryDequeue(out o))
            {
                switch (o.Kind)
                {
                    case OutKind.Stop:
                        stopRequested = true;
                        break;
                    case OutKind.Forget:
                        inflight.Remove(o.Id);
                        waiting.RemoveAll(f => f.Id == o.Id);
                        break;
                    case OutKind.Send:
                        if (identityRefusal != null)
                        {
                            Forward(o.Id, "error", ErrorBody(identityRefusal.Code, identityRefusal.Message, false));
                            break;
                        }
                        waiting.Add(new InFlight
                        {
                            Id = o.Id, Type = o.Type, Bytes = o.Bytes, IsStream = o.IsStream,
                            Session = o.Session, Feature = o.Feature, QueuedAt = Now,
                        });
                        if (o.Type != "goodbye") farewell = false;
                        break;
                }
            }
        }

        // ---- connection ---------------------------------------------------------------------

        void TryConnect()
        {
            try
            {
                transport.Connect(options.Endpoint, routingId, ConnectTimeoutMs);
            }
            catch (IgiTransportException e)
            {
                lastTransportError = e.Message;
                nextConnectAt = Now + backoffMs / 1000.0;
                backoffMs = Math.Min(backoffMs * 2, MaxBackoffMs);
                return;
            }
            backoffMs = FirstBackoffMs;
            lastTransportError = null;
            greeted = false;
            helloId = 0;
            // a fresh connection says hello at once, unless the game said goodbye and has
            // nothing to send
            if (!farewell || waiting.Count > 0 || inflight.Count > 0) SendHello();
        }

        void OnDropped()
        {
            transport.Close();
            greeted = false;
            helloId = 0;
            nextConnectAt = Now + FirstBackoffMs / 1000.0;
            var requeue = new List<InFlight>();
            foreach (var f in new List<InFlight>(inflight.Values))
            {
                if (f.IsStream) { f.NeedsResume = true; continue; }
                inflight.Remove(f.Id);
                if (f.Internal) continue;
                if (!f.Sent || Idempotent.Contains(f.Type))
                {
                    f.Sent = false;
                    f.QueuedAt = Now; // its wait for a connection starts again
                    requeue.Add(f);
                    continue;
                }
                Forward(f.Id, "error", ErrorBody(IgiError.Unavailable,
                    "the connection to the sidecar dropped before " + f.Type + " was answered", true));
            }
            waiting.InsertRange(0, requeue);
            if (postedState == IgiConnectionState.Ready) PostState(IgiConnectionState.Connecting, null);
        }

        void CheckSilence()
        {
            double now = Now;
            double limit = options.SidecarSilenceSeconds;
            if (!greeted)
            {
                // requests that could not even be sent for that long: the sidecar is not there
                for (int i = waiting.Count - 1; i >= 0; i--)
                {
                    if (now - waiting[i].QueuedAt <= limit) continue;
                    var f = waiting[i];
                    waiting.RemoveAt(i);
                    if (!f.Internal)
                        Forward(f.Id, "error", ErrorBody(IgiError.Unavailable, "no sidecar answered at " + options.Endpoint +
                            (lastTransportError != null ? " (" + lastTransportError + ")" : ""), true));
                }
            }
            // a request fails once the sidecar has said nothing at all for `limit` since it went
            List<InFlight> expired = null;
            foreach (var f in inflight.Values)
            {
                if ((f.Sent || f.NeedsResume) && now - Math.Max(f.SentAt, heardAt) > limit)
                {
                    if (expired == null) expired = new List<InFlight>();
                    expired.Add(f);
                }
            }
            bool silentWhileGreeted = greeted && now - Math.Max(heardAt, greetedAt) > limit;
            if (expired == null && !silentWhileGreeted) return;
            if (expired != null)
            {
                var error = ErrorBody(IgiError.Unavailable, "no message from the sidecar at " + options.Endpoint + " for " + limit + " s", true);
                foreach (var f in expired)
                {
                    inflight.Remove(f.Id);
                    if (f.Id == helloId) helloId = 0;
                    if (!f.Internal) Forward(f.Id, "error", error);
                }
            }
            if (!down)
            {
                down = true;
                greeted = false; // whatever answers next will be greeted again first
                PostState(IgiConnectionState.Unavailable, null);
            }
        }

        void FailEverything(IgiError error)
        {
            var body = ErrorBody(error.Code, error.Message, error.Retryable);
            foreach (var f in inflight.Values) if (!f.Internal) Forward(f.Id, "error", body);
            foreach (var f in waiting) if (!f.Internal) Forward(f.Id, "error", body);
            inflight.Clear();
            waiting.Clear();
        }

        // ---- sending ------------------------------------------------------------------------

        void SendWhatIsReady()
        {
            if (!greeted)
            {
                bool due = helloAgainAt > 0 ? Now >= helloAgainAt : waiting.Count > 0 || inflight.Count > 0;
                if (helloId == 0 && due) SendHello();
                return;
            }
            while (waiting.Count > 0 && transport.IsConnected)
            {
                var f = waiting[0];
                waiting.RemoveAt(0);
                string missing = f.Feature != null ? info.MissingFeature(f.Feature) : null;
                if (missing != null)
                {
                    // this sidecar would ignore what the request is for: refuse it unsent
                    Forward(f.Id, "error", ErrorBody(IgiError.Unsupported, f.Type + " needs the protocol feature '" +
                        missing + "', which the sidecar at " + options.Endpoint + " does not offer", false));
                    continue;
                }
                inflight[f.Id] = f;
                Transmit(f);
            }
            double leaseS = info != null && info.LeaseSeconds > 0 ? info.LeaseSeconds : options.LeaseSeconds;
            if (framePending && transport.IsConnected) SendFrame();
            // the lease runs from the last message the sidecar accepted, not the last one sent
            if (!farewell && Now - Math.Max(acceptedAt, keepaliveAt) > leaseS / 3)
            {
                keepaliveAt = Now;
                SendInternal("ping", new Dictionary<string, object>(), 0);
            }
        }

        void SendHello()
        {
            // read at every hello: a launcher that started a new sidecar may have set a new token
            string owner = Volatile.Read(ref options.OwnerKey);
            string token = Volatile.Read(ref options.LaunchToken);
            string problem = IgiKeys.OptionsProblem(owner, token);
            if (problem != null)
            {
                // set after the constructor checked them: refused here, never sent
                RefuseHello(IgiError.InvalidBody, "hello not sent: " + problem);
                return;
            }
            var body = new Dictionary<string, object>();
            body["protocol"] = (long)Protocol.Version;
            if (helloLevel > HelloLegacy)
            {
                body["minor"] = (long)Protocol.Minor;
                body["lease_s"] = options.LeaseSeconds;
            }
            body["engine"] = options.Engine ?? "unity";
            body["client_name"] = options.ClientName ?? "";
            if (options.GamePid.HasValue) body["game_pid"] = (long)options.GamePid.Value;
            bool keys = helloLevel == HelloFull && (owner != null || token != null);
            if (keys && owner != null) body["owner"] = owner;
            if (keys && token != null) body["token"] = token;
            helloAgainAt = 0;
            var hello = SendInternal("hello", body, 0);
            hello.HelloLevel = helloLevel;
            hello.HelloHadKeys = keys;
            helloId = hello.Id;
        }

        InFlight SendInternal(string type, Dictionary<string, object> body, long resumeOf)
        {
            long id = NextId();
            var f = new InFlight
            {
                Id = id, Type = type, Bytes = Protocol.Encode(id, type, body), Internal = true,
                ResumeOf = resumeOf, QueuedAt = Now,
            };
            inflight[id] = f;
            Transmit(f);
            return f;
        }

        void Transmit(InFlight f)
        {
            if (!transport.IsConnected) return;
            try
            {
                transport.Send(f.Bytes);
                f.Sent = true;
                f.SentAt = Now;
            }
            catch (IgiTransportException)
            {
                // the loop notices the closed transport and handles the drop
            }
        }

        // ---- receiving ----------------------------------------------------------------------

        // One odd message must not end the I/O thread: it is dropped and the loop goes on.
        void HandleSafely(byte[] message)
        {
            try
            {
                Handle(message);
            }
            catch (Exception e) when (!(e is ThreadAbortException))
            {
                DroppedMessages++;
            }
        }

        /// <summary>Messages dropped because handling them failed (a client bug if ever non-zero).</summary>
        public int DroppedMessages;

        void Handle(byte[] message)
        {
            long id;
            string type;
            Dictionary<string, object> body;
            if (!Protocol.TryDecode(message, out id, out type, out body)) return;
            heardAt = Now;
            if (down)
            {
                down = false;
                // the sidecar is back (or was only stalled): greet it again to learn which
                if (!greeted && helloId == 0) SendHello();
            }
            if (type != "ok" && type != "error" && type != "token" && type != "tool_call" && type != "done") return; // heartbeat, or newer
            InFlight f;
            if (!inflight.TryGetValue(id, out f)) return;
            // any answer but a refusal to read it means the sidecar took the message: its lease
            // was renewed when the message arrived
            if (type != "error" || !NotRead(MsgValue.GetString(body, "code"))) acceptedAt = Math.Max(acceptedAt, f.SentAt);

            if (type == "error" && MsgValue.GetString(body, "code") == "hello_required" && f.Type != "hello")
            {
                HelloAgainThenResend(f);
                return;
            }
            if (f.Type == "hello") { OnHelloAnswer(f, type, body); return; }
            if (f.ResumeOf != 0) { OnResumeAnswer(f, type, body); return; }
            if (f.IsStream)
            {
                // a tool_call event counts in the same `i` sequence as tokens (protocol 1.3)
                if (type == "token" || type == "tool_call") OnToken(f, type, body);
                else if (type == "done" || type == "error")
                {
                    inflight.Remove(id);
                    Forward(id, type, body);
                }
                return;
            }
            if (type != "ok" && type != "error") return;
            inflight.Remove(id);
            if (type == "ok") TrackSessions(f, body);
            else if (f.Internal && f.Type == "adopt_session") ownedSessions.Remove(f.Session); // gone
            if (!f.Internal) Forward(id, type, body);
            else if (f.Type == "frame" && type == "error")
                frameError = MsgValue.GetString(body, "code") + ": " + MsgValue.GetString(body, "message");
        }

        // Tokens go to the game in order, each once. A gap in `i` means events were lost (a
        // reconnect the transport hid, e.g. libzmq's own): ask the sidecar to replay from the
        // last one delivered, and drop what comes out of order meanwhile.
        void OnToken(InFlight f, string type, Dictionary<string, object> body)
        {
            long i = MsgValue.GetLong(body, "i");
            bool canResume = info != null && info.HasFeature(IgiFeatures.ResumeStream);
            if (i == f.LastToken + 1 || !canResume)
            {
                f.LastToken = Math.Max(f.LastToken, i);
                Forward(f.Id, type, body);
                return;
            }
            if (i <= f.LastToken || f.ResumeAsked) return;
            f.ResumeAsked = true;
            SendResume(f);
        }

        void SendResume(InFlight f)
        {
            var body = new Dictionary<string, object>();
            body["request"] = f.Id;
            body["after"] = f.LastToken;
            SendInternal("resume_stream", body, f.Id);
        }

        // what the sidecar answers to a message it did not read as a request (PROTOCOL.md §6)
        static bool NotRead(string code)
        {
            return code == "malformed" || code == "unknown_type" || code == "invalid_body" || code == "unsupported_version";
        }

        void HelloAgainThenResend(InFlight f)
        {
            inflight.Remove(f.Id);
            greeted = false;
            if (!farewell && ownedSessions.Count > 0) readoptAfterHello = true;
            // forgotten (its lease lapsed, e.g. the game sat at a breakpoint) or a new sidecar:
            // open streams were cancelled there; the hello is followed by a resume for each,
            // which replays their end or says they are gone
            foreach (var open in inflight.Values) if (open.IsStream) open.NeedsResume = true;
            if (f.HelloRetries++ < 2)
            {
                f.Sent = false;
                if (!f.Internal || f.Type != "ping") waiting.Insert(0, f);
            }
            else if (!f.Internal)
            {
                Forward(f.Id, "error", ErrorBody("hello_required", "the sidecar keeps asking for hello", true));
            }
            if (helloId == 0) SendHello();
        }

        void OnHelloAnswer(InFlight f, string type, Dictionary<string, object> body)
        {
            inflight.Remove(f.Id);
            if (f.Id == helloId) helloId = 0;
            if (type == "ok")
            {
                var served = IgiServerInfo.FromHello(body);
                string wrong = IdentityProblem(served);
                if (wrong != null)
                {
                    // another game's, another Editor's or a developer's sidecar: never used
                    identityRefusal = new IgiError(IgiError.WrongSidecar, wrong, false);
                    if (!f.Internal) Forward(f.Id, "error", ErrorBody(IgiError.WrongSidecar, wrong, false));
                    RefuseHello(IgiError.WrongSidecar, wrong);
                    transport.Close();
                    return;
                }
                greeted = true;
                greetedAt = Now;
                helloBackoffMs = FirstBackoffMs * 5;
                down = false;
                info = served;
                PostState(IgiConnectionState.Ready, info);
                if (!f.Internal) Forward(f.Id, type, body);
                ResumeStreams();
                if (readoptAfterHello) ReadoptSessions();
                return;
            }
            if (!f.Internal) { Forward(f.Id, type, body); return; }
            string code = MsgValue.GetString(body, "code");
            if (code == "invalid_body" && f.HelloLevel > HelloLegacy)
            {
                // a 1.1 sidecar refuses owner and token (it has neither: its sessions belong to
                // connections and every client is the game), a 1.0 sidecar minor and lease_s
                helloLevel = f.HelloHadKeys ? HelloNoKeys : HelloLegacy;
                SendHello();
                return;
            }
            string message = "hello refused: " + MsgValue.GetString(body, "message", "");
            if (MsgValue.GetBool(body, "retryable"))
            {
                // busy (the sidecar has as many clients as it takes): greet again after a pause,
                // growing; what waits meanwhile fails as unavailable after SidecarSilenceSeconds
                helloAgainAt = Now + helloBackoffMs / 1000.0;
                helloBackoffMs = Math.Min(helloBackoffMs * 2, MaxBackoffMs * 2);
                Inbox.Enqueue(new Incoming { IsConnectionChange = true, State = postedState, HelloRefusal = new IgiError(code ?? "error", message, true) });
                return;
            }
            // the sidecar will not talk to us (unsupported_version, forbidden: a wrong launch
            // token, ...): what waits cannot go
            RefuseHello(code ?? "error", message);
        }

        string IdentityProblem(IgiServerInfo served)
        {
            string instance = Volatile.Read(ref options.ExpectedInstance);
            if (instance != null && served.Instance != instance)
                return "the sidecar at " + options.Endpoint + " is " + (served.Instance == null ? "not a named instance" :
                    "instance '" + served.Instance + "'") + ", not '" + instance + "' (another program's sidecar): not used";
            string model = Volatile.Read(ref options.ExpectedModel);
            if (model == null || (served.Model == null && served.Loading)) return null;
            if (FileName(served.Model) == FileName(model)) return null;
            return "the sidecar at " + options.Endpoint + " serves " + (served.Model ?? "no model") + ", not " + model + ": not used";
        }

        static string FileName(string path)
        {
            if (path == null) return null;
            int slash = Math.Max(path.LastIndexOf('/'), path.LastIndexOf('\\'));
            return path.Substring(slash + 1);
        }

        void RefuseHello(string code, string message)
        {
            // the refusal goes into the inbox before the failures it causes: a Pump that delivers
            // a request's failure has already raised HelloRefused, so a handler sees why
            Inbox.Enqueue(new Incoming { IsConnectionChange = true, State = postedState, HelloRefusal = new IgiError(code, message, false) });
            FailEverything(new IgiError(code, message, false)); // nothing can go on this connection
            farewell = true;
        }

        void ResumeStreams()
        {
            foreach (var f in new List<InFlight>(inflight.Values))
            {
                if (!f.IsStream || !f.NeedsResume) continue;
                f.NeedsResume = false;
                if (info.HasFeature(IgiFeatures.ResumeStream))
                {
                    f.ResumeAsked = true;
                    SendResume(f);
                }
                else
                {
                    inflight.Remove(f.Id);
                    Forward(f.Id, "error", ErrorBody(IgiError.StreamLost,
                        "the connection dropped mid-stream and this sidecar cannot resume streams", true));
                }
            }
        }

        void OnResumeAnswer(InFlight f, string type, Dictionary<string, object> body)
        {
            inflight.Remove(f.Id);
            InFlight stream;
            // the replay follows this ok: a later gap may ask again
            if (inflight.TryGetValue(f.ResumeOf, out stream)) stream.ResumeAsked = false;
            if (type != "error" || !inflight.ContainsKey(f.ResumeOf)) return; // ok: the events follow
            inflight.Remove(f.ResumeOf);
            Forward(f.ResumeOf, "error", ErrorBody(IgiError.StreamLost,
                "the stream could not be resumed after a reconnect (" + MsgValue.GetString(body, "code") +
                ": " + MsgValue.GetString(body, "message") + ")", true));
        }

        void ReadoptSessions()
        {
            readoptAfterHello = false;
            if (!info.HasFeature(IgiFeatures.AdoptSession)) return;
            foreach (var session in ownedSessions)
            {
                var body = new Dictionary<string, object>();
                body["session"] = session;
                SendInternal("adopt_session", body, 0).Session = session;
            }
        }

        void TrackSessions(InFlight f, Dictionary<string, object> body)
        {
            switch (f.Type)
            {
                case "open_session":
                case "restore_session":
                case "adopt_session":
                    string session = MsgValue.GetString(body, "session");
                    if (session != null) ownedSessions.Add(session);
                    break;
                case "close_session":
                    if (f.Session != null) ownedSessions.Remove(f.Session);
                    break;
                case "goodbye":
                    ownedSessions.Clear();
                    greeted = false;
                    farewell = true;
                    break;
                case "load_model":
                    ownedSessions.Clear(); // a load closes every session
                    break;
            }
        }

        // ---- leaving ------------------------------------------------------------------------

        void SayGoodbye()
        {
            DrainOutbox(); // what the game asked for before Dispose still goes out
            if (!transport.IsConnected || !greeted) return;
            var asked = new List<long>();
            while (waiting.Count > 0)
            {
                var f = waiting[0];
                waiting.RemoveAt(0);
                Transmit(f);
                if (!f.IsStream) asked.Add(f.Id);
            }
            AwaitAnswers(asked, FlushWaitMs); // e.g. a save_session must land before goodbye closes it
            if (info != null && info.HasFeature(IgiFeatures.Goodbye))
            {
                var body = new Dictionary<string, object>();
                body["keep_sessions"] = options.KeepSessionsOnDispose;
                asked.Add(SendInternal("goodbye", body, 0).Id);
            }
            else if (!options.KeepSessionsOnDispose)
            {
                // a 1.0 sidecar keeps a silent client's sessions forever: close them
                foreach (var session in ownedSessions)
                {
                    var body = new Dictionary<string, object>();
                    body["session"] = session;
                    asked.Add(SendInternal("close_session", body, 0).Id);
                }
            }
            AwaitAnswers(asked, GoodbyeWaitMs);
        }

        // Reads until every id in `asked` is answered or `limitMs` passed (answers are dropped:
        // the game is gone).
        void AwaitAnswers(List<long> asked, int limitMs)
        {
            var clock = Stopwatch.StartNew();
            while (asked.Count > 0 && clock.ElapsedMilliseconds < limitMs && transport.IsConnected)
            {
                received.Clear();
                transport.Receive(10, received);
                foreach (var message in received)
                {
                    long id;
                    string type;
                    Dictionary<string, object> ignored;
                    if (Protocol.TryDecode(message, out id, out type, out ignored) && (type == "ok" || type == "error"))
                        asked.Remove(id);
                }
            }
        }

        // ---- I/O thread -> caller -----------------------------------------------------------

        void Forward(long id, string type, Dictionary<string, object> body)
        {
            Inbox.Enqueue(new Incoming { Id = id, Type = type, Body = body });
        }

        void PostState(IgiConnectionState state, IgiServerInfo serverInfo)
        {
            if (state == postedState && serverInfo == null) return;
            postedState = state;
            Inbox.Enqueue(new Incoming { IsConnectionChange = true, State = state, Info = serverInfo });
        }

        internal static Dictionary<string, object> ErrorBody(string code, string message, bool retryable)
        {
            var body = new Dictionary<string, object>();
            body["code"] = code;
            body["message"] = message;
            body["retryable"] = retryable;
            return body;
        }
    }
}
