// IgiClient: the engine-agnostic client of the igi-sdk sidecar (protocol 1.3, works with 1.2, 1.1 and 1.0).
//
// API summary
//   var client = new IgiClient(new IgiClientOptions { Endpoint = "tcp://127.0.0.1:5599",
//       OwnerKey = IgiKeys.New(),            // 1.2: kept while the game wants its NPCs back
//       LaunchToken = tokenGivenToTheSidecar }); // 1.2: this client is the game (IsGame)
//   client.Pump();                         // every frame, on the game thread: delivers results,
//                                          // stream tokens, errors and connection changes there
//   client.State / client.Server / client.ConnectionChanged   (hello is automatic on connect)
//   client.IsGame / client.HelloRefused       (1.2: a wrong launch token is refused `forbidden`)
//   IgiRequest r = client.OpenSession(new SessionOptions { Persona = "Brom", Name = "npc.brom" });
//   r.OnOk(body => ...).OnError(err => ...).OnCompleted(req => ...);  r.Session, r.GetLong(...)
//   IgiStream s = client.Chat(sessionId, "Hello!", new ChatOptions { MaxTokens = 64 })
//       .OnToken(piece => ...).OnDone(stream => ... stream.Text ...).OnError(err => ...);
//   client.Chat(sessionId, "Follow me!", new ChatOptions { Tools = new[] { follow, trade },  // 1.3
//       ToolChoice = ActionChoice.Auto }).OnAction(call => ...)    // NpcActions.cs; AnswerActions(...)
//   client.Chat(sessionId, "What do you see?", new ChatOptions { Images = new[] {
//       IgiImage.FromEncoded(png), IgiImage.FromRgba32(texture.GetRawTextureData(), w, h) } });
//   client.Cancel(s); client.SaveSession(id, "brom"); client.RestoreSession("brom"[, "npc.brom"]);
//   client.CloseSession(id); client.SetPriority(id, 10); client.ListSessions();
//   client.AdoptSession(id); client.Goodbye(keepSessions); client.Frame(frame, dtMs, ...);
//   client.ReserveVram(bytes, frames); client.Stats(); client.LoadModel(path); client.Ping();
//   client.Shutdown(); client.Send(type, body)   // the rest, raw
//   client.Dispose();                      // sends what is queued, goodbye (bounded), I/O thread
//                                          // ends, socket closed
//   Transports: the managed ZMTP 3.1 DEALER (default, tcp://), or
//   options.TransportFactory = () => new ZmqNativeTransport(IgiCurveKeys.FromCertificateFiles(...))
//   for CurveZMQ and ipc:// through the system's libzmq.
//
// Threading: every call returns its handle at once and never blocks; one background thread does
// all the I/O. Callbacks run only inside Pump(), on the thread that calls it (the game's main
// thread). Requests may be made from any thread; Pump and Dispose belong to one.
//
// What the client does by itself: hello on every (re)connection (without owner and token for a
// 1.1 sidecar, a 1.0 hello for a 1.0 sidecar),
// hello and resend on hello_required, a ping every lease_s/3, reconnect with back-off 100 ms to
// 2 s keeping its routing id, resume_stream for open streams after a reconnect (and for gaps in
// token indexes), adopt_session for its sessions after its lease lapsed. Timeouts restart with
// every event of a request; 5 s without any message from the sidecar fails what is pending with
// `unavailable` (retryable).
//
// Errors are IgiError {Code, Message, Retryable}: the sidecar's codes (PROTOCOL.md §6) plus the
// local ones in IgiError (unavailable, timeout, stream_lost, disposed, invalid_body, unsupported).
using System;
using System.Collections.Generic;
using System.Diagnostics;

namespace Igi.Sdk
{
    public sealed class IgiClient : IDisposable
    {
        const int DisposeJoinMs = 1500;

        readonly IgiClientOptions options;
        readonly IgiConnection connection;
        readonly Dictionary<long, IgiRequest> pending = new Dictionary<long, IgiRequest>();
        readonly List<IgiRequest> expired = new List<IgiRequest>();
        readonly Stopwatch clock = Stopwatch.StartNew();
        volatile bool disposed;

        public IgiClient(IgiClientOptions options = null)
        {
            this.options = options ?? new IgiClientOptions();
            string problem = IgiKeys.OptionsProblem(this.options.OwnerKey, this.options.LaunchToken);
            if (problem != null) throw new ArgumentException(problem, "options");
            connection = new IgiConnection(this.options);
            State = IgiConnectionState.Connecting;
        }

        public IgiClientOptions Options { get { return options; } }

        /// <summary>The routing id this client's DEALER uses ("igi-" + 24 hex digits by default).</summary>
        public string RoutingId { get { return connection.RoutingId; } }

        /// <summary>As of the last Pump.</summary>
        public IgiConnectionState State { get; private set; }

        /// <summary>The last hello answer (null before the first one), as of the last Pump.</summary>
        public IgiServerInfo Server { get; private set; }

        /// <summary>Raised inside Pump when the connection state changes (or a hello is answered again).</summary>
        public event Action<IgiConnectionState> ConnectionChanged;

        /// <summary>Protocol 1.2: this client holds the sidecar's launch token, or the sidecar has
        /// none (then, as with a 1.1 or 1.0 sidecar, every client is the game). Only the game's
        /// frames pace the engine, only its game_pid is watched, only it may shutdown. As of the
        /// last Pump; false before the first hello.</summary>
        public bool IsGame { get { return Server != null && Server.IsGame; } }

        /// <summary>Raised inside Pump when the sidecar refused hello (e.g. <c>forbidden</c>: a
        /// wrong <see cref="IgiClientOptions.LaunchToken"/>). What was pending failed with the same
        /// error; the next request says hello again (with the options as they are then).</summary>
        public event Action<IgiError> HelloRefused;

        /// <summary>The last refusal of hello (null if none), as of the last Pump; cleared when a
        /// hello is answered ok.</summary>
        public IgiError HelloRefusal { get; private set; }

        /// <summary>Requests still waiting for their outcome.</summary>
        public int PendingCount { get { lock (pending) return pending.Count; } }

        // ---- pumping --------------------------------------------------------------------------

        /// <summary>Delivers what arrived since the last call (at most <paramref name="maxEvents"/>
        /// events) and fails requests whose timeout passed. Never waits. Returns the events
        /// delivered.</summary>
        public int Pump(int maxEvents = int.MaxValue)
        {
            double now = clock.Elapsed.TotalSeconds;
            int delivered = 0;
            IgiConnection.Incoming item;
            while (delivered < maxEvents && connection.Inbox.TryDequeue(out item))
            {
                delivered++;
                if (item.IsConnectionChange) DeliverConnectionChange(item);
                else Deliver(item, now);
            }
            FailExpired(now);
            return delivered;
        }

        void DeliverConnectionChange(IgiConnection.Incoming item)
        {
            if (item.HelloRefusal != null)
            {
                HelloRefusal = item.HelloRefusal;
                var refused = HelloRefused;
                if (refused != null) refused(item.HelloRefusal);
                return;
            }
            if (item.Info != null)
            {
                Server = item.Info;
                HelloRefusal = null;
            }
            if (State == IgiConnectionState.Closed) return;
            State = item.State;
            var handler = ConnectionChanged;
            if (handler != null) handler(item.State);
        }

        void Deliver(IgiConnection.Incoming item, double now)
        {
            IgiRequest request;
            bool isStream;
            bool ends;
            lock (pending)
            {
                if (!pending.TryGetValue(item.Id, out request)) return; // finished, timed out, or not ours
                isStream = request is IgiStream;
                // a chat ends with done or error (never ok); anything else with ok or error
                ends = item.Type == "error" || item.Type == (isStream ? "done" : "ok");
                if (ends) pending.Remove(item.Id);
                else request.DeadlineAt = now + request.TimeoutSeconds;
            }
            // callbacks run outside the lock: they may call the client
            if (item.Type == "token" && isStream)
                ((IgiStream)request).AddToken(MsgValue.GetLong(item.Body, "i"), MsgValue.GetString(item.Body, "text", ""));
            else if (item.Type == "tool_call" && isStream)
                ((IgiStream)request).AddActionCall(MsgValue.GetLong(item.Body, "i"), item.Body);
            else if (ends && item.Type == "error")
                request.Fail(new IgiError(MsgValue.GetString(item.Body, "code", "error"),
                    MsgValue.GetString(item.Body, "message", ""), MsgValue.GetBool(item.Body, "retryable")));
            else if (ends)
                request.Succeed(item.Body);
        }

        void FailExpired(double now)
        {
            lock (pending)
            {
                foreach (var request in pending.Values)
                    if (now > request.DeadlineAt) expired.Add(request);
                foreach (var request in expired) pending.Remove(request.Id);
            }
            if (expired.Count == 0) return;
            foreach (var request in expired)
            {
                connection.Enqueue(new IgiConnection.Outgoing { Kind = IgiConnection.OutKind.Forget, Id = request.Id });
                var stream = request as IgiStream;
                if (stream != null && !stream.CancelRequested) SendCancel(stream.Id); // stop it there too
                request.Fail(new IgiError(IgiError.Timeout, request.Type + " got no event for " +
                    request.TimeoutSeconds + " s (the sidecar is alive)", true));
            }
            expired.Clear();
        }

        // ---- requests -------------------------------------------------------------------------

        public IgiRequest Hello()
        {
            var body = new Dictionary<string, object>();
            body["protocol"] = (long)Protocol.Version;
            body["minor"] = (long)Protocol.Minor;
            body["lease_s"] = options.LeaseSeconds;
            body["engine"] = options.Engine ?? "unity";
            body["client_name"] = options.ClientName ?? "";
            if (options.GamePid.HasValue) body["game_pid"] = (long)options.GamePid.Value;
            if (options.OwnerKey != null) body["owner"] = options.OwnerKey;
            if (options.LaunchToken != null) body["token"] = options.LaunchToken;
            return Submit("hello", body, IgiKeys.OptionsProblem(options.OwnerKey, options.LaunchToken));
        }

        public IgiRequest Ping() { return Submit("ping", null); }

        public IgiRequest OpenSession(SessionOptions session = null)
        {
            session = session ?? new SessionOptions();
            var body = new Dictionary<string, object>();
            if (session.SystemPrompt != null) body["system_prompt"] = session.SystemPrompt;
            if (session.Persona != null) body["persona"] = session.Persona;
            if (session.Priority.HasValue) body["priority"] = (long)session.Priority.Value;
            if (session.Name != null) body["name"] = session.Name;
            if (session.Sampling != null) body["sampling"] = SamplingBody(session.Sampling);
            string tooLong = TooLong("system_prompt", session.SystemPrompt, TextLimit) ?? TooLong("persona", session.Persona, 128);
            return Submit("open_session", body, tooLong);
        }

        static Dictionary<string, object> SamplingBody(SamplingOptions s)
        {
            var body = new Dictionary<string, object>();
            if (s.Temperature.HasValue) body["temperature"] = s.Temperature.Value;
            if (s.TopP.HasValue) body["top_p"] = s.TopP.Value;
            if (s.TopK.HasValue) body["top_k"] = (long)s.TopK.Value;
            if (s.MinP.HasValue) body["min_p"] = s.MinP.Value;
            if (s.RepeatPenalty.HasValue) body["repeat_penalty"] = s.RepeatPenalty.Value;
            if (s.Seed.HasValue) body["seed"] = s.Seed.Value;
            return body;
        }

        /// <summary>Streams the reply to <paramref name="text"/> in <paramref name="session"/>.</summary>
        public IgiStream Chat(string session, string text, ChatOptions chat = null)
        {
            chat = chat ?? new ChatOptions();
            var body = new Dictionary<string, object>();
            body["session"] = session ?? "";
            body["text"] = text ?? "";
            if (chat.MaxTokens.HasValue) body["max_tokens"] = (long)chat.MaxTokens.Value;
            if (chat.Stop != null) body["stop"] = new List<object>(chat.Stop);
            if (chat.Grammar != null) body["grammar"] = chat.Grammar;
            if (chat.JsonSchema != null) body["json_schema"] = chat.JsonSchema;
            string refusal = text == null ? "text is required" : TooLong("text", text, TextLimit)
                ?? TooLong("grammar", chat.Grammar, TextLimit) ?? ImagesProblem(chat.Images)
                ?? ActionRules.Problem(chat.Tools, chat.ToolChoice, chat.ToolResults, TextLimit,
                    chat.Grammar != null || chat.JsonSchema != null);
            bool images = chat.Images != null && chat.Images.Length > 0;
            if (images && refusal == null) body["images"] = ImagesBody(chat.Images);
            bool tools = refusal == null && AddActions(body, chat);
            string feature = images && tools ? IgiFeatures.Images + " " + IgiFeatures.Tools
                : images ? IgiFeatures.Images : tools ? IgiFeatures.Tools : null;
            return (IgiStream)Submit("chat", body, refusal, session, feature);
        }

        /// <summary>Protocol 1.3: sends what came of the NPC's action calls; the reply continues
        /// from them (a stream like <see cref="Chat"/>'s). <paramref name="chat"/>: the line's
        /// options (declare the actions again to let the NPC act once more; its ToolResults are
        /// replaced by <paramref name="results"/>).</summary>
        public IgiStream AnswerActions(string session, ActionResult[] results, ChatOptions chat = null)
        {
            var answer = new ChatOptions();
            if (chat != null)
            {
                answer.MaxTokens = chat.MaxTokens;
                answer.Stop = chat.Stop;
                answer.Grammar = chat.Grammar;
                answer.JsonSchema = chat.JsonSchema;
                answer.Images = chat.Images;
                answer.Tools = chat.Tools;
                answer.ToolChoice = chat.ToolChoice;
                answer.ParallelToolCalls = chat.ParallelToolCalls;
            }
            answer.ToolResults = results ?? new ActionResult[0];
            if (answer.ToolResults.Length == 0)
            {
                // refused here: a reply continues from results, so there must be some
                return (IgiStream)Submit("chat", null, "tool_results is empty: nothing to answer", session);
            }
            return Chat(session, "", answer);
        }

        // tools, tool_choice, parallel_tool_calls, tool_results (only those given); true when any was
        static bool AddActions(Dictionary<string, object> body, ChatOptions chat)
        {
            bool any = false;
            if (chat.Tools != null && chat.Tools.Length > 0)
            {
                var list = new List<object>(chat.Tools.Length);
                foreach (var action in chat.Tools) list.Add(action.ToWire());
                body["tools"] = list;
                any = true;
            }
            if (chat.ToolChoice != null) { body["tool_choice"] = chat.ToolChoice; any = true; }
            if (chat.ParallelToolCalls.HasValue) { body["parallel_tool_calls"] = chat.ParallelToolCalls.Value; any = true; }
            if (chat.ToolResults != null && chat.ToolResults.Length > 0)
            {
                var list = new List<object>(chat.ToolResults.Length);
                foreach (var result in chat.ToolResults) list.Add(result.ToWire());
                body["tool_results"] = list;
                any = true;
            }
            return any;
        }

        static string ImagesProblem(IgiImage[] images)
        {
            if (images == null) return null;
            if (images.Length > IgiImage.MaxImages)
                return "images has " + images.Length + " images (limit " + IgiImage.MaxImages + ")";
            for (int i = 0; i < images.Length; i++)
            {
                string problem = images[i] == null ? "is null" : images[i].Problem();
                if (problem != null) return "images[" + i + "] " + problem;
            }
            return null;
        }

        static List<object> ImagesBody(IgiImage[] images)
        {
            var list = new List<object>(images.Length);
            foreach (var image in images) list.Add(image.ToWire());
            return list;
        }

        /// <summary>Asks the stream to stop; it still ends with done (finish_reason "cancelled").</summary>
        public IgiRequest Cancel(IgiStream stream)
        {
            if (stream != null) stream.CancelRequested = true;
            return Cancel(stream != null ? stream.Id : 0);
        }

        public IgiRequest Cancel(long chatRequestId)
        {
            IgiRequest request;
            IgiStream stream;
            lock (pending) stream = pending.TryGetValue(chatRequestId, out request) ? request as IgiStream : null;
            if (stream != null) stream.CancelRequested = true;
            return SendCancel(chatRequestId);
        }

        IgiRequest SendCancel(long chatRequestId)
        {
            var body = new Dictionary<string, object>();
            body["request"] = chatRequestId;
            return Submit("cancel", body);
        }

        public IgiRequest SaveSession(string session, string name)
        {
            return Submit("save_session", Body("session", session, "name", name));
        }

        public IgiRequest RestoreSession(string name) { return Submit("restore_session", Body("name", name)); }

        /// <summary>Protocol 1.1: restores into a session with a stable name (the session id is
        /// <paramref name="session"/>).</summary>
        public IgiRequest RestoreSession(string name, string session)
        {
            var body = Body("name", name);
            if (session != null) body["session"] = session;
            return Submit("restore_session", body);
        }

        public IgiRequest CloseSession(string session)
        {
            return Submit("close_session", Body("session", session), null, session);
        }

        /// <summary>Protocol 1.1: -100..100, takes effect at the next decode step.</summary>
        public IgiRequest SetPriority(string session, int priority)
        {
            var body = Body("session", session);
            body["priority"] = (long)priority;
            return Submit("set_priority", body);
        }

        /// <summary>Protocol 1.1: ok {"sessions": [...], "free_slots", "others"}. Protocol 1.2:
        /// only this owner's sessions (owner "you" or "orphaned"); "others" counts the rest.</summary>
        public IgiRequest ListSessions() { return Submit("list_sessions", null); }

        /// <summary>Protocol 1.1: takes over an orphaned session (its conversation goes on).
        /// Protocol 1.2: only a session of this client's owner key (another's is
        /// <c>unknown_session</c>; one held by another live client of the same key, <c>session_owned</c>).</summary>
        public IgiRequest AdoptSession(string session) { return Submit("adopt_session", Body("session", session)); }

        /// <summary>Protocol 1.1: leave; keepSessions: the sessions become orphaned (adoptable)
        /// instead of closed. The next request says hello again by itself.</summary>
        public IgiRequest Goodbye(bool keepSessions = false)
        {
            var body = new Dictionary<string, object>();
            body["keep_sessions"] = keepSessions;
            return Submit("goodbye", body);
        }

        /// <summary>One rendered frame's report (VRAM arbiter and pacing inputs). Protocol 1.2: the
        /// ok's "paced" (GetBool("paced")) says whether it paced the engine: only the game's do
        /// (<see cref="IsGame"/>).
        /// <para>The game's CPU use, both optional (null: left out of the message): <paramref name="busyThreads"/>,
        /// the CPU threads the game keeps busy now (0..4096: its own worker threads that have work,
        /// not the machine's processor count), and <paramref name="cpuShare"/>, the share of the
        /// machine's CPU time the game used over its last frames (0..1). The model's CPU threads
        /// keep off the cores they add up to; the sidecar keeps the last report until a new one
        /// comes (<c>stats</c>: engine.threads.game_cores). A figure outside its range is refused
        /// here, unsent, as <c>invalid_body</c>.</para></summary>
        public IgiRequest Frame(long frame, double frameTimeMs, double? targetFrameTimeMs = null,
            long? vramUsed = null, long? vramBudget = null, int? busyThreads = null, double? cpuShare = null)
        {
            var body = new Dictionary<string, object>();
            body["frame"] = frame;
            body["frame_time_ms"] = frameTimeMs;
            if (targetFrameTimeMs.HasValue) body["target_frame_time_ms"] = targetFrameTimeMs.Value;
            if (vramUsed.HasValue) body["vram_used"] = vramUsed.Value;
            if (vramBudget.HasValue) body["vram_budget"] = vramBudget.Value;
            if (busyThreads.HasValue) body["busy_threads"] = (long)busyThreads.Value;
            if (cpuShare.HasValue) body["cpu_share"] = cpuShare.Value;
            return Submit("frame", body, Protocol.GameCpuProblem(busyThreads, cpuShare));
        }

        /// <summary>
        /// The frame report for every frame: the same message as <see cref="Frame"/>, without a
        /// request handle and without garbage on the calling thread (the I/O thread encodes and
        /// sends the latest one; one not sent yet is replaced). Pass NaN for no target, -1
        /// for no VRAM figure, -1 for no <paramref name="busyThreads"/> and NaN for no
        /// <paramref name="cpuShare"/> (the game's CPU use: see <see cref="Frame"/>). The sidecar's
        /// refusals (e.g. <c>forbidden</c> for a client that is not the game) are in
        /// <see cref="FrameError"/>. False once disposed, and false for a report refused here
        /// unsent (busyThreads above 4096, cpuShare outside 0..1: <c>invalid_body</c> in
        /// <see cref="FrameError"/>).
        /// </summary>
        public bool ReportFrame(long frame, double frameTimeMs, double targetFrameTimeMs = double.NaN,
            long vramUsed = -1, long vramBudget = -1, int busyThreads = -1, double cpuShare = double.NaN)
        {
            if (disposed) return false;
            // checked without allocating: a report within range leaves no garbage
            if (busyThreads > Protocol.MaxBusyThreads || !(double.IsNaN(cpuShare) || (cpuShare >= 0.0 && cpuShare <= 1.0)))
            {
                connection.RefuseFrame(IgiError.InvalidBody, Protocol.GameCpuProblem(
                    busyThreads < 0 ? (int?)null : busyThreads, double.IsNaN(cpuShare) ? (double?)null : cpuShare));
                return false;
            }
            connection.PostFrame(frame, frameTimeMs, targetFrameTimeMs, vramUsed, vramBudget, busyThreads, cpuShare);
            return true;
        }

        /// <summary>"code: message" of the last <see cref="ReportFrame"/> the sidecar refused; null if none.</summary>
        public string FrameError { get { return connection.FrameError; } }

        /// <summary>Turns of the I/O thread's loop so far: each is one wait on the socket (or the
        /// queue) that ended. Idle, it waits about 200 ms a turn.</summary>
        public long IoTurns { get { return connection.Turns; } }

        /// <summary>Answered (within 5 s) once that much VRAM is free; allocate after its ok.
        /// Protocol 1.2: only the game may (<see cref="IsGame"/>); others get <c>forbidden</c>.</summary>
        public IgiRequest ReserveVram(long bytes, int deadlineFrames)
        {
            var body = new Dictionary<string, object>();
            body["bytes"] = bytes;
            body["deadline_frames"] = (long)deadlineFrames;
            return Submit("reserve_vram", body);
        }

        public IgiRequest Stats() { return Submit("stats", null); }

        /// <summary>Answered when the load ends (its timeout is LoadModelTimeoutSeconds).
        /// <paramref name="mmproj"/>: the model's vision projector (protocol 1.1 feature images),
        /// a path like <paramref name="path"/>; null: text only.</summary>
        public IgiRequest LoadModel(string path, long? vramBudget = null, int? nCtx = null, int? maxSessions = null,
            string mmproj = null)
        {
            var body = Body("path", path);
            if (vramBudget.HasValue) body["vram_budget"] = vramBudget.Value;
            if (nCtx.HasValue) body["n_ctx"] = (long)nCtx.Value;
            if (maxSessions.HasValue) body["max_sessions"] = (long)maxSessions.Value;
            if (mmproj != null) body["mmproj"] = mmproj;
            return Submit("load_model", body, null, null, mmproj != null ? IgiFeatures.Images : null);
        }

        /// <summary>Stops the sidecar. Protocol 1.2: only the game may (<see cref="IsGame"/>);
        /// others get <c>forbidden</c>.</summary>
        public IgiRequest Shutdown() { return Submit("shutdown", null); }

        /// <summary>Any request, raw: body values as MsgPack accepts them. Type "chat" gives an IgiStream.</summary>
        public IgiRequest Send(string type, Dictionary<string, object> body)
        {
            return Submit(type, body);
        }

        // ---- plumbing -------------------------------------------------------------------------

        long TextLimit { get { return Server != null ? Server.MaxTextChars : 32000; } }

        static string TooLong(string field, string value, long limit)
        {
            if (value == null) return null;
            int n = Protocol.CodePoints(value);
            return n > limit ? field + " has " + n + " characters (limit " + limit + ")" : null;
        }

        static Dictionary<string, object> Body(string key, string value)
        {
            var body = new Dictionary<string, object>();
            body[key] = value ?? "";
            return body;
        }

        static Dictionary<string, object> Body(string key1, string value1, string key2, string value2)
        {
            var body = Body(key1, value1);
            body[key2] = value2 ?? "";
            return body;
        }

        double TimeoutFor(string type)
        {
            if (type == "chat") return options.StreamTimeoutSeconds;
            if (type == "load_model") return options.LoadModelTimeoutSeconds;
            return options.RequestTimeoutSeconds;
        }

        /// <summary><paramref name="feature"/>: the protocol feature the request needs; checked
        /// against the hello of the connection it goes out on (<c>unsupported</c> if absent).</summary>
        IgiRequest Submit(string type, Dictionary<string, object> body, string refusal = null, string session = null,
            string feature = null)
        {
            long id = connection.NextId();
            IgiRequest request = type == "chat"
                ? new IgiStream(id, session, TimeoutFor(type))
                : new IgiRequest(id, type, TimeoutFor(type));
            if (disposed)
            {
                request.Fail(new IgiError(IgiError.Disposed, "the client is disposed", false));
                return request;
            }
            byte[] bytes = null;
            if (refusal == null)
            {
                try { bytes = Protocol.Encode(id, type, body); }
                catch (MsgPackException e) { refusal = e.Message; }
            }
            long maxBytes = Server != null ? Server.MaxMessageBytes : Protocol.MaxMessageBytes;
            if (refusal == null && bytes.Length > maxBytes)
                refusal = "the message has " + bytes.Length + " bytes (limit " + maxBytes + ")";
            request.DeadlineAt = clock.Elapsed.TotalSeconds + request.TimeoutSeconds;
            lock (pending) pending[id] = request;
            if (refusal != null)
            {
                // refused here, delivered like any answer (in the next Pump)
                connection.Inbox.Enqueue(new IgiConnection.Incoming
                {
                    Id = id, Type = "error", Body = IgiConnection.ErrorBody(IgiError.InvalidBody, refusal, false),
                });
                return request;
            }
            connection.Enqueue(new IgiConnection.Outgoing
            {
                Kind = IgiConnection.OutKind.Send, Id = id, Type = type, Bytes = bytes,
                IsStream = type == "chat", Session = session, Feature = feature,
            });
            return request;
        }

        /// <summary>Says goodbye (keep_sessions = Options.KeepSessionsOnDispose; on a 1.0
        /// sidecar closes the sessions instead), ends the I/O thread and closes the socket.
        /// Waits at most about a second and a half (requests made just before
        /// it are sent and their answers awaited first, bounded). Pending requests end as failed (disposed) without
        /// their callbacks.</summary>
        public void Dispose()
        {
            if (disposed) return;
            disposed = true;
            connection.Stop(DisposeJoinMs);
            List<IgiRequest> left;
            lock (pending)
            {
                left = new List<IgiRequest>(pending.Values);
                pending.Clear();
            }
            foreach (var request in left)
                request.FailQuietly(new IgiError(IgiError.Disposed, "the client was disposed", false));
            State = IgiConnectionState.Closed;
        }
    }
}
