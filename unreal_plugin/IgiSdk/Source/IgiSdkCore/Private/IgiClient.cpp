#include "IgiClient.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "IgiJson.h"
#include "IgiZmtp.h"

namespace igi {

const char* ToString(ConnectionState s) {
    switch (s) {
    case ConnectionState::Connecting: return "connecting";
    case ConnectionState::Ready: return "ready";
    case ConnectionState::Unavailable: return "unavailable";
    case ConnectionState::Refused: return "refused";
    case ConnectionState::Closed: return "closed";
    }
    return "?";
}

bool ServerInfo::Has(const char* feature) const {
    for (const auto& f : features) if (f == feature) return true;
    return false;
}

bool ToolCall::Arguments(MsgValue& out) const {
    return ParseJson(arguments, out) && out.IsMap();
}

bool IsValidToolName(const std::string& name) {
    if (name.empty() || name.size() > 64) return false;
    if (name == "auto" || name == "none" || name == "required") return false;
    for (char c : name) {
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

namespace {

// characters as the sidecar counts them: code points (UTF-8 continuation bytes not counted)
int64_t CodePoints(const std::string& s) {
    int64_t n = 0;
    for (char c : s) if ((static_cast<unsigned char>(c) & 0xc0) != 0x80) ++n;
    return n;
}

}  // namespace

std::string ToolsProblem(const ChatOptions& o, int64_t max_text_chars) {
    const size_t count = o.tools.size();
    if (count > static_cast<size_t>(kMaxTools))
        return "tools has " + std::to_string(count) + " tools (limit " + std::to_string(kMaxTools) + ")";
    if (count > 0 && (o.extra.Find("grammar") || o.extra.Find("json_schema")))
        return "tools constrain the reply themselves: give no grammar or json_schema with them";
    std::set<std::string> names;
    for (size_t i = 0; i < count; ++i) {
        const ToolSpec& t = o.tools[i];
        const std::string at = "tools[" + std::to_string(i) + "]";
        if (!IsValidToolName(t.name))
            return at + ".name '" + t.name.substr(0, 80) + "' is not 1-64 of [A-Za-z0-9_-] (nor auto, none, required)";
        if (!names.insert(t.name).second) return at + ".name '" + t.name + "' is declared twice";
        if (CodePoints(t.description) > 2000) return at + ".description is longer than 2000 characters";
        if (!t.parameters_json.empty()) {
            MsgValue schema;
            std::string why;
            if (!ParseJson(t.parameters_json, schema, &why)) return at + ".parameters is not JSON: " + why;
            if (!schema.IsMap()) return at + ".parameters is not a JSON object (a JSON Schema)";
            const MsgValue* type = schema.Find("type");
            if (type && !(type->IsStr() && type->AsString() == "object"))
                return at + ".parameters must describe an object (type: object)";
        }
    }
    const std::string& choice = o.tool_choice;
    if (!choice.empty() && choice != "auto" && choice != "none") {
        if (count == 0) return "tool_choice '" + choice.substr(0, 64) + "' with no tools declared";
        if (choice != "required" && names.count(choice) == 0)
            return "tool_choice '" + choice.substr(0, 64) + "' is not auto, none, required or a declared tool";
    }
    if (o.tool_results.size() > static_cast<size_t>(kMaxToolResults))
        return "tool_results has " + std::to_string(o.tool_results.size()) + " results (limit " +
               std::to_string(kMaxToolResults) + ")";
    for (size_t i = 0; i < o.tool_results.size(); ++i) {
        const ToolResult& r = o.tool_results[i];
        const std::string at = "tool_results[" + std::to_string(i) + "]";
        if (r.id.empty() || r.id.size() > 64) return at + ".id must be 1-64 characters";
        if (CodePoints(r.content) > max_text_chars)
            return at + ".content is longer than " + std::to_string(max_text_chars) + " characters";
    }
    return std::string();
}

// an envelope up to its body's value: shared by EncodeEnvelope and the frame path, which writes
// the body in place
static void WriteEnvelopeHead(MsgWriter& w, uint64_t id, const char* type) {
    w.MapHeader(4);
    w.Str("v", 1);
    w.Int(kProtocolVersion);
    w.Str("id", 2);
    w.UInt(id);
    w.Str("type", 4);
    w.Str(type, std::char_traits<char>::length(type));
    w.Str("body", 4);
}

std::string EncodeEnvelope(uint64_t id, const char* type, const MsgValue& body) {
    std::string out;
    MsgWriter w(out);
    WriteEnvelopeHead(w, id, type);
    if (body.IsMap()) w.Value(body); else w.MapHeader(0);
    return out;
}

bool DecodeEnvelope(const std::string& frame, uint64_t& id, std::string& type, MsgValue& body) {
    MsgValue msg;
    if (!MsgDecode(reinterpret_cast<const uint8_t*>(frame.data()), frame.size(), msg)) return false;
    if (!msg.IsMap()) return false;
    const MsgValue* v = msg.Find("v");
    const MsgValue* i = msg.Find("id");
    const MsgValue* t = msg.Find("type");
    int64_t version = 0, raw_id = 0;
    if (!v || !v->GetInt(version) || version != kProtocolVersion) return false;
    if (!i || !i->GetInt(raw_id) || raw_id < 0) return false;
    if (!t || !t->IsStr()) return false;
    id = static_cast<uint64_t>(raw_id);
    type = t->AsString();
    const MsgValue* b = msg.Find("body");
    if (b && b->IsMap()) body = *b;
    else if (!b || b->IsNil()) body = MsgValue::Map();
    else return false;
    return true;
}

namespace {

using Clock = std::chrono::steady_clock;

const int kConnectTimeoutMs = 2000;
const int kFirstBackoffMs = 100, kMaxBackoffMs = 2000;
const int kGoodbyeWaitMs = 300, kFlushWaitMs = 600;
// what a hello carries: everything (1.2), no owner/token (a 1.1 sidecar refuses them), or only
// the 1.0 fields (a 1.0 sidecar refuses minor and lease_s)
const int kHelloFull = 2, kHelloNoKeys = 1, kHelloLegacy = 0;

bool IsIdempotent(const std::string& type) {
    return type == "ping" || type == "stats" || type == "list_sessions" || type == "set_priority";
}

MsgValue ErrorBody(const char* code, const std::string& message, bool retryable) {
    MsgValue b = MsgValue::Map();
    b.Set("code", MsgValue::Str(code));
    b.Set("message", MsgValue::Str(message));
    b.Set("retryable", MsgValue::Bool(retryable));
    return b;
}

std::string RandomHex(size_t digits) {
    std::random_device rd;
    std::mt19937_64 rng((static_cast<uint64_t>(rd()) << 32) ^ rd() ^
                        static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
    static const char hex[] = "0123456789abcdef";
    std::string s;
    for (size_t i = 0; i < digits; ++i) s.push_back(hex[rng() & 15]);
    return s;
}

bool ValidKey(const std::string& s) {
    if (s.size() < 16 || s.size() > 128) return false;
    for (char c : s) {
        bool ok = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-';
        if (!ok) return false;
    }
    return true;
}

}  // namespace

struct Client::Impl {
    enum class OutKind { Send, Stop, Drop, Endpoint };
    struct Outgoing {
        OutKind kind = OutKind::Send;
        uint64_t id = 0;
        std::string type;
        std::string bytes;
        bool stream = false;
        std::string session;
        std::string feature;
        std::string endpoint, instance;
    };
    struct InFlight {
        uint64_t id = 0;
        std::string type;
        std::string bytes;
        bool stream = false;
        bool internal = false;  // sent by the I/O thread; its answer is not forwarded
        bool sent = false;
        bool needs_resume = false;
        bool resume_asked = false;
        int64_t last_token = 0;
        uint64_t resume_of = 0;
        int hello_level = kHelloFull;
        bool hello_had_keys = false;
        int hello_retries = 0;
        std::string session;
        std::string feature;
        Clock::time_point queued_at, sent_at;
    };

    explicit Impl(ClientOptions o) : options(std::move(o)) {
        for (auto& b : frame_ring) b.reserve(kFrameEnvelopeBytes);
        for (auto& b : frame_batch) b.reserve(kFrameEnvelopeBytes);
    }

    ClientOptions options;
    std::string routing_id;
    std::atomic<uint64_t> last_id{0};
    std::atomic<int> state{static_cast<int>(ConnectionState::Connecting)};
    std::atomic<bool> running{false};

    // caller <-> I/O thread
    mutable std::mutex out_mutex;
    std::deque<Outgoing> outbox;
    std::mutex in_mutex;
    std::vector<Event> inbox;
    mutable std::mutex info_mutex;
    ServerInfo shared_info;
    ClientCounters shared_counters;
    std::atomic<int64_t> max_message_bytes{kMaxMessageBytes};
    std::thread thread;
    std::condition_variable out_cv;  // wakes the thread while it has no connection

    // Frame reports: the game thread encodes each into a ring of buffers that keep their
    // capacity (no allocation per frame) and does not wake the I/O thread for it; the thread
    // sends what is there whenever it wakes (traffic, a request, its io_wait_ms timeout), and a
    // report still waiting after kFrameFlushMs wakes it. A full ring drops its oldest report.
    static const size_t kFrameSlots = 16;
    static const size_t kFrameEnvelopeBytes = 256;  // the largest frame envelope is about 200
    std::mutex frame_mutex;
    std::string frame_ring[kFrameSlots];
    uint64_t frame_ring_ids[kFrameSlots] = {};
    size_t frame_head = 0, frame_count = 0;
    Clock::time_point frame_oldest_at{};
    bool frame_wake_asked = false;
    std::string frame_batch[kFrameSlots];  // the I/O thread's side of the swap
    uint64_t frame_batch_ids[kFrameSlots] = {};

    // ---- state owned by the I/O thread --------------------------------------------------
    std::unique_ptr<ZmtpDealer> dealer;
    std::map<uint64_t, InFlight> inflight;
    std::deque<InFlight> waiting;
    std::set<std::string> owned_sessions;
    std::vector<std::string> received;
    ServerInfo info;
    ClientCounters counters;
    bool stop_requested = false;
    bool greeted = false;
    uint64_t hello_id = 0;
    int hello_level = kHelloFull;
    Clock::time_point hello_again_at{};
    bool hello_again = false;
    int hello_backoff_ms = kFirstBackoffMs * 5;
    bool farewell = false;   // goodbye answered: quiet until the game asks for something
    bool refused = false;    // the sidecar is not ours, or refused us: no reconnect until told
    std::string refusal_code;  // why (the code the requests in flight ended with)
    bool readopt_after_hello = false;
    bool down = false;
    bool ever_connected = false;
    Clock::time_point heard_at = Clock::now();
    Clock::time_point greeted_at = Clock::now();
    Clock::time_point accepted_at = Clock::now();  // an answer that kept the lease
    Clock::time_point pinged_at = Clock::now();
    Clock::time_point next_connect_at = Clock::now();
    int backoff_ms = kFirstBackoffMs;
    std::string last_transport_error;
    ConnectionState posted = ConnectionState::Connecting;

    static double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

    // ---- caller side --------------------------------------------------------------------

    void Enqueue(Outgoing o) {
        {
            std::lock_guard<std::mutex> lock(out_mutex);
            outbox.push_back(std::move(o));
        }
        out_cv.notify_one();
        std::lock_guard<std::mutex> lock(out_mutex);
        if (dealer) dealer->Wake();
    }

    void Post(Event e) {
        std::lock_guard<std::mutex> lock(in_mutex);
        inbox.push_back(std::move(e));
    }

    // a request refused here, unsent: its Error event comes with the next Poll
    uint64_t RefuseUnsent(const char* code, const std::string& message) {
        uint64_t id = ++last_id;
        Event e;
        e.kind = EventKind::Error;
        e.id = id;
        e.error = Error{code, message, false};
        Post(std::move(e));
        return id;
    }

    uint64_t Submit(const char* type, const MsgValue& body, bool stream, const char* feature, const std::string& session) {
        uint64_t id = ++last_id;
        Outgoing o;
        o.kind = OutKind::Send;
        o.id = id;
        o.type = type;
        o.bytes = EncodeEnvelope(id, type, body);
        o.stream = stream;
        o.session = session;
        if (feature) o.feature = feature;
        if (static_cast<int64_t>(o.bytes.size()) > max_message_bytes.load()) {
            // the sidecar would drop the connection without an answer: fail it here, at once
            Event e;
            e.kind = EventKind::Error;
            e.id = id;
            e.error = Error{errc::kMessageTooLarge,
                            std::string(type) + " is " + std::to_string(o.bytes.size()) +
                                " bytes; the protocol's limit is " + std::to_string(max_message_bytes.load()),
                            false};
            Post(std::move(e));
            return id;
        }
        Enqueue(std::move(o));
        return id;
    }

    // ---- the I/O thread -------------------------------------------------------------------

    void Run() {
        while (!stop_requested) {
            DrainOutbox();
            if (stop_requested) break;
            SendFrames();
            if (!dealer->IsConnected()) {
                if (!refused && Clock::now() >= next_connect_at) TryConnect();
                if (!dealer->IsConnected()) {
                    CheckSilence();
                    std::unique_lock<std::mutex> lock(out_mutex);
                    if (outbox.empty()) out_cv.wait_for(lock, std::chrono::milliseconds(20));
                    continue;
                }
            }
            SendWhatIsReady();
            if (!dealer->IsConnected()) { OnDropped(); continue; }
            received.clear();
            bool alive = dealer->Receive(options.io_wait_ms, received);
            for (const auto& m : received) Handle(m);
            if (!alive || dealer->SecondsSinceTraffic() > options.silence_s) OnDropped();
            CheckSilence();
            PublishCounters();
        }
        SayGoodbye();
        FailEverything(Error{errc::kStopped, "the client stopped", false});
        dealer->Close();
        PostState(ConnectionState::Closed, nullptr);
    }

    void DrainOutbox() {
        std::deque<Outgoing> batch;
        {
            std::lock_guard<std::mutex> lock(out_mutex);
            batch.swap(outbox);
        }
        for (auto& o : batch) {
            switch (o.kind) {
            case OutKind::Stop: stop_requested = true; break;
            case OutKind::Drop:
                if (dealer->IsConnected()) { dealer->Close(); OnDropped(); }
                break;
            case OutKind::Endpoint:
                options.endpoint = o.endpoint;
                options.expected_instance = o.instance;
                refused = false;
                if (posted == ConnectionState::Refused) PostState(ConnectionState::Connecting, nullptr);
                if (dealer->IsConnected()) { dealer->Close(); OnDropped(); }
                next_connect_at = Clock::now();
                break;
            case OutKind::Send: {
                InFlight f;
                f.id = o.id;
                f.type = std::move(o.type);
                f.bytes = std::move(o.bytes);
                f.stream = o.stream;
                f.session = std::move(o.session);
                f.feature = std::move(o.feature);
                f.queued_at = Clock::now();
                if (f.type != "goodbye") farewell = false;
                if (refused) {
                    // the refusal's own code (wrong_sidecar, forbidden, ...): a request queued
                    // while hello was being refused ends as the ones in flight did
                    const std::string code = refusal_code.empty() ? std::string(errc::kUnavailable) : refusal_code;
                    Forward(f.id, "error", ErrorBody(code.c_str(), "the sidecar was refused: " + last_transport_error, false));
                    break;
                }
                waiting.push_back(std::move(f));
                break;
            }
            }
        }
    }

    void TryConnect() {
        std::string error;
        if (!dealer->Connect(options.endpoint, routing_id, kConnectTimeoutMs, error)) {
            last_transport_error = error;
            next_connect_at = Clock::now() + std::chrono::milliseconds(backoff_ms);
            backoff_ms = std::min(backoff_ms * 2, kMaxBackoffMs);
            return;
        }
        if (ever_connected) ++counters.reconnects;
        ever_connected = true;
        backoff_ms = kFirstBackoffMs;
        last_transport_error.clear();
        greeted = false;
        hello_id = 0;
        heard_at = Clock::now();
        if (!farewell || !waiting.empty() || !inflight.empty()) SendHello();
    }

    void OnDropped() {
        dealer->Close();
        greeted = false;
        hello_id = 0;
        next_connect_at = Clock::now() + std::chrono::milliseconds(kFirstBackoffMs);
        std::vector<InFlight> requeue;
        for (auto it = inflight.begin(); it != inflight.end();) {
            InFlight& f = it->second;
            if (f.stream) { f.needs_resume = true; f.resume_asked = false; ++it; continue; }
            InFlight moved = std::move(f);
            it = inflight.erase(it);
            if (moved.internal) continue;
            if (!moved.sent || IsIdempotent(moved.type)) {
                moved.sent = false;
                moved.queued_at = Clock::now();
                requeue.push_back(std::move(moved));
                continue;
            }
            Forward(moved.id, "error", ErrorBody(errc::kUnavailable,
                "the connection to the sidecar dropped before " + moved.type + " was answered", true));
        }
        for (auto r = requeue.rbegin(); r != requeue.rend(); ++r) waiting.push_front(std::move(*r));
        if (posted == ConnectionState::Ready) PostState(ConnectionState::Connecting, nullptr);
    }

    void CheckSilence() {
        double limit = options.silence_s;
        if (!greeted) {
            for (auto it = waiting.begin(); it != waiting.end();) {
                if (Since(it->queued_at) <= limit) { ++it; continue; }
                if (!it->internal)
                    Forward(it->id, "error", ErrorBody(errc::kUnavailable, "no sidecar answered at " + options.endpoint +
                        (last_transport_error.empty() ? "" : " (" + last_transport_error + ")"), true));
                it = waiting.erase(it);
            }
        }
        Clock::time_point last = heard_at;
        bool any = false;
        for (auto it = inflight.begin(); it != inflight.end();) {
            InFlight& f = it->second;
            Clock::time_point since = std::max(f.sent_at, heard_at);
            if ((f.sent || f.needs_resume) && Since(since) > limit) {
                if (f.id == hello_id) hello_id = 0;
                if (!f.internal)
                    Forward(f.id, "error", ErrorBody(errc::kUnavailable, "no message from the sidecar at " + options.endpoint +
                        " for " + std::to_string(static_cast<int>(limit)) + " s", true));
                it = inflight.erase(it);
                any = true;
                continue;
            }
            ++it;
        }
        bool silent = greeted && Since(std::max(last, greeted_at)) > limit;
        if ((any || silent) && !down) {
            down = true;
            greeted = false;  // whatever answers next is greeted again first
            PostState(ConnectionState::Unavailable, nullptr);
        }
    }

    void FailEverything(const Error& e) {
        MsgValue body = ErrorBody(e.code.c_str(), e.message, e.retryable);
        for (auto& kv : inflight) if (!kv.second.internal) Forward(kv.first, "error", body);
        for (auto& f : waiting) if (!f.internal) Forward(f.id, "error", body);
        inflight.clear();
        waiting.clear();
    }

    // ---- sending ---------------------------------------------------------------------------

    // The frame reports queued since the last wake, oldest first. Only to a greeted sidecar: a
    // stale frame tells the arbiter nothing, so without one they are dropped.
    void SendFrames() {
        size_t n = 0;
        {
            std::lock_guard<std::mutex> lock(frame_mutex);
            n = frame_count;
            for (size_t i = 0; i < n; ++i) {
                size_t slot = (frame_head + i) % kFrameSlots;
                frame_batch[i].swap(frame_ring[slot]);  // both keep their capacity
                frame_batch_ids[i] = frame_ring_ids[slot];
            }
            frame_head = (frame_head + n) % kFrameSlots;
            frame_count = 0;
            frame_wake_asked = false;
        }
        if (!greeted || !dealer->IsConnected()) return;
        // the answer is dropped; tracked like any request so the lease and silence see it
        for (size_t i = 0; i < n && dealer->IsConnected(); ++i)
            SendInternal("frame", frame_batch[i], 0, frame_batch_ids[i]);
    }

    void SendWhatIsReady() {
        if (!greeted) {
            bool due = hello_again ? Clock::now() >= hello_again_at : (!waiting.empty() || !inflight.empty());
            if (hello_id == 0 && due) SendHello();
            return;
        }
        while (!waiting.empty() && dealer->IsConnected()) {
            InFlight f = std::move(waiting.front());
            waiting.pop_front();
            if (!f.feature.empty() && !info.Has(f.feature.c_str())) {
                Forward(f.id, "error", ErrorBody(errc::kUnsupported, f.type + " needs the protocol feature '" + f.feature +
                    "', which the sidecar at " + options.endpoint + " does not offer", false));
                continue;
            }
            uint64_t id = f.id;
            inflight[id] = std::move(f);
            Transmit(inflight[id]);
        }
        // the lease is kept by accepted requests; with nothing else said, a ping every lease/3
        double lease = info.lease_s > 0 ? info.lease_s : options.lease_s;
        if (!farewell && Since(std::max(accepted_at, pinged_at)) > lease / 3) {
            pinged_at = Clock::now();
            uint64_t id = ++last_id;
            SendInternal("ping", EncodeEnvelope(id, "ping", MsgValue::Map()), 0, id);
        }
    }

    void SendHello() {
        std::string owner = options.owner_key, token = options.launch_token;
        MsgValue body = MsgValue::Map();
        body.Set("protocol", MsgValue::Int(kProtocolVersion));
        if (hello_level > kHelloLegacy) {
            body.Set("minor", MsgValue::Int(kProtocolMinor));
            body.Set("lease_s", MsgValue::Float(options.lease_s));
        }
        body.Set("engine", MsgValue::Str(options.engine));
        body.Set("client_name", MsgValue::Str(options.client_name));
        if (options.game_pid > 0) body.Set("game_pid", MsgValue::Int(options.game_pid));
        bool keys = hello_level == kHelloFull && (!owner.empty() || !token.empty());
        if (keys && !owner.empty()) body.Set("owner", MsgValue::Str(owner));
        if (keys && !token.empty()) body.Set("token", MsgValue::Str(token));
        hello_again = false;
        uint64_t id = ++last_id;
        InFlight& f = SendInternal("hello", EncodeEnvelope(id, "hello", body), 0, id);
        f.hello_level = hello_level;
        f.hello_had_keys = keys;
        hello_id = id;
    }

    // `bytes` is the envelope already encoded with `id`
    InFlight& SendInternal(const char* type, std::string bytes, uint64_t resume_of, uint64_t id) {
        InFlight& f = inflight[id];
        f.id = id;
        f.type = type;
        f.bytes = std::move(bytes);
        f.internal = true;
        f.resume_of = resume_of;
        f.queued_at = Clock::now();
        Transmit(f);
        return f;
    }

    void Transmit(InFlight& f) {
        if (!dealer->IsConnected()) return;
        if (dealer->Send(f.bytes)) {
            f.sent = true;
            f.sent_at = Clock::now();
        }
        // a failed send closed the dealer: the loop handles the drop
    }

    // ---- receiving -------------------------------------------------------------------------

    void Handle(const std::string& frame) {
        uint64_t id;
        std::string type;
        MsgValue body;
        if (!DecodeEnvelope(frame, id, type, body)) { ++counters.dropped_messages; return; }
        heard_at = Clock::now();
        if (down) {
            down = false;
            if (!greeted && hello_id == 0) SendHello();  // back, or only stalled: greet to learn which
        }
        if (type != "ok" && type != "error" && type != "token" && type != "tool_call" && type != "done") return;  // heartbeat, newer types
        auto it = inflight.find(id);
        if (it == inflight.end()) return;
        InFlight& f = it->second;
        if (type != "error") accepted_at = Clock::now();
        if (type == "error" && body.GetString("code") == "hello_required" && f.type != "hello") {
            HelloAgainThenResend(id);
            return;
        }
        if (f.type == "hello") { OnHelloAnswer(id, type, body); return; }
        if (f.resume_of != 0) { OnResumeAnswer(id, type, body); return; }
        if (f.stream) {
            // a tool_call event counts in the same `i` sequence as tokens (protocol 1.3)
            if (type == "token" || type == "tool_call") OnToken(f, type == "tool_call", body);
            else if (type == "done" || type == "error") {
                inflight.erase(it);
                Forward(id, type.c_str(), std::move(body));
            }
            return;
        }
        if (type != "ok" && type != "error") return;
        InFlight done = std::move(f);
        inflight.erase(it);
        if (type == "ok") TrackSessions(done, body);
        else if (done.internal && done.type == "adopt_session") owned_sessions.erase(done.session);
        if (!done.internal) Forward(id, type.c_str(), std::move(body));
    }

    // Tokens reach the game in order, each once. A gap in `i` means events were lost: ask for a
    // replay from the last one delivered; replayed duplicates are dropped.
    void OnToken(InFlight& f, bool call, const MsgValue& body) {
        int64_t i = body.GetInt("i", 0);
        if (i == f.last_token + 1 || !info.Has("resume_stream")) {
            f.last_token = std::max(f.last_token, i);
            Event e;
            e.kind = call ? EventKind::ToolCall : EventKind::Token;
            e.id = f.id;
            e.index = i;
            if (call) e.call = ReadCall(body, 0);
            else e.text = body.GetString("text");
            Post(std::move(e));
            return;
        }
        if (i <= f.last_token) { ++counters.duplicate_tokens; return; }
        if (f.resume_asked) return;  // a replay is on its way
        f.resume_asked = true;
        SendResume(f);
    }

    void SendResume(InFlight& f) {
        MsgValue body = MsgValue::Map();
        body.Set("request", MsgValue::UInt(f.id));
        body.Set("after", MsgValue::Int(f.last_token));
        uint64_t id = ++last_id;
        uint64_t of = f.id;
        ++counters.resumes;
        SendInternal("resume_stream", EncodeEnvelope(id, "resume_stream", body), of, id);
    }

    void HelloAgainThenResend(uint64_t id) {
        InFlight f = std::move(inflight[id]);
        inflight.erase(id);
        greeted = false;
        if (!farewell && !owned_sessions.empty()) readopt_after_hello = true;
        // forgotten (its lease lapsed) or a new sidecar: streams were cancelled there; the hello
        // is followed by a resume for each, which replays their end or says they are gone
        for (auto& kv : inflight) if (kv.second.stream) { kv.second.needs_resume = true; kv.second.resume_asked = false; }
        if (f.hello_retries++ < 2) {
            f.sent = false;
            if (!(f.internal && f.type == "ping")) waiting.push_front(std::move(f));
        } else if (!f.internal) {
            Forward(f.id, "error", ErrorBody("hello_required", "the sidecar keeps asking for hello", true));
        }
        if (hello_id == 0) SendHello();
    }

    void OnHelloAnswer(uint64_t id, const std::string& type, const MsgValue& body) {
        InFlight f = std::move(inflight[id]);
        inflight.erase(id);
        if (id == hello_id) hello_id = 0;
        if (type == "ok") {
            ServerInfo next;
            next.minor = static_cast<int>(body.GetInt("minor", 0));
            next.lease_s = body.GetDouble("lease_s", 0);
            next.game = body.GetBool("game", false);
            next.model = body.GetString("model");
            next.instance = body.GetString("instance");
            next.owner = body.GetString("owner");
            if (const MsgValue* feats = body.Find("features"))
                for (const auto& v : feats->Items()) if (v.IsStr()) next.features.push_back(v.AsString());
            if (const MsgValue* limits = body.Find("limits")) {
                next.max_message_bytes = limits->GetInt("max_message_bytes", kMaxMessageBytes);
                next.max_text_chars = limits->GetInt("max_text_chars", 32000);
            }
            if (!options.expected_instance.empty() && next.instance != options.expected_instance) {
                // another game's sidecar, a developer's own, or a stale one on a reused port
                std::string why = next.instance.empty()
                    ? "the sidecar at " + options.endpoint + " did not report an instance (expected " + options.expected_instance + ")"
                    : "the sidecar at " + options.endpoint + " is instance " + next.instance + ", not " + options.expected_instance;
                Refuse(errc::kWrongSidecar, why);
                return;
            }
            info = next;
            max_message_bytes.store(info.max_message_bytes > 0 ? info.max_message_bytes : kMaxMessageBytes);
            {
                std::lock_guard<std::mutex> lock(info_mutex);
                shared_info = info;
            }
            greeted = true;
            down = false;
            greeted_at = accepted_at = Clock::now();
            hello_backoff_ms = kFirstBackoffMs * 5;
            PostState(ConnectionState::Ready, &body);
            ResumeStreams();
            if (readopt_after_hello) Readopt();
            return;
        }
        std::string code = body.GetString("code", "error");
        if (code == "invalid_body" && f.hello_level > kHelloLegacy) {
            hello_level = f.hello_had_keys ? kHelloNoKeys : kHelloLegacy;
            SendHello();
            return;
        }
        std::string message = "hello refused: " + body.GetString("message");
        if (body.GetBool("retryable")) {
            hello_again = true;
            hello_again_at = Clock::now() + std::chrono::milliseconds(hello_backoff_ms);
            hello_backoff_ms = std::min(hello_backoff_ms * 2, kMaxBackoffMs * 2);
            return;
        }
        Refuse(code.c_str(), message);
    }

    void Refuse(const char* code, const std::string& message) {
        refused = true;
        refusal_code = code;
        last_transport_error = message;
        // the state change is posted before the failures it causes: whoever sees a request
        // fail with the refusal's code already reads State() == Refused
        Event e;
        e.kind = EventKind::State;
        e.state = ConnectionState::Refused;
        e.error = Error{code, message, false};
        posted = ConnectionState::Refused;
        state.store(static_cast<int>(posted));
        Post(std::move(e));
        FailEverything(Error{code, message, false});
        dealer->Close();
        greeted = false;
    }

    void ResumeStreams() {
        for (auto it = inflight.begin(); it != inflight.end();) {
            InFlight& f = it->second;
            if (!f.stream || !f.needs_resume) { ++it; continue; }
            f.needs_resume = false;
            if (info.Has("resume_stream")) {
                f.resume_asked = true;
                SendResume(f);
                // SendResume inserted into the map; iterators of std::map stay valid
                ++it;
            } else {
                uint64_t id = f.id;
                it = inflight.erase(it);
                Forward(id, "error", ErrorBody(errc::kStreamLost, "the connection dropped mid-stream and this sidecar cannot resume streams", true));
            }
        }
    }

    void OnResumeAnswer(uint64_t id, const std::string& type, const MsgValue& body) {
        uint64_t of = inflight[id].resume_of;
        inflight.erase(id);
        auto stream = inflight.find(of);
        if (stream == inflight.end()) return;
        stream->second.resume_asked = false;  // the replay follows this ok; a later gap may ask again
        if (type != "error") return;
        inflight.erase(stream);
        Forward(of, "error", ErrorBody(errc::kStreamLost, "the stream could not be resumed after a reconnect (" +
            body.GetString("code") + ": " + body.GetString("message") + ")", true));
    }

    void Readopt() {
        readopt_after_hello = false;
        if (!info.Has("adopt_session")) return;
        for (const auto& s : owned_sessions) {
            MsgValue body = MsgValue::Map();
            body.Set("session", MsgValue::Str(s));
            uint64_t id = ++last_id;
            SendInternal("adopt_session", EncodeEnvelope(id, "adopt_session", body), 0, id).session = s;
        }
    }

    void TrackSessions(const InFlight& f, const MsgValue& body) {
        if (f.type == "open_session" || f.type == "restore_session" || f.type == "adopt_session") {
            std::string s = body.GetString("session");
            if (!s.empty()) owned_sessions.insert(s);
        } else if (f.type == "close_session") {
            owned_sessions.erase(f.session);
        } else if (f.type == "goodbye") {
            owned_sessions.clear();
            greeted = false;
            farewell = true;
        } else if (f.type == "load_model") {
            owned_sessions.clear();
        }
    }

    // ---- leaving ---------------------------------------------------------------------------

    void SayGoodbye() {
        if (!dealer->IsConnected() || !greeted) return;
        std::vector<uint64_t> asked;
        while (!waiting.empty()) {
            InFlight f = std::move(waiting.front());
            waiting.pop_front();
            uint64_t id = f.id;
            bool stream = f.stream;
            inflight[id] = std::move(f);
            Transmit(inflight[id]);
            if (!stream) asked.push_back(id);
        }
        AwaitAnswers(asked, kFlushWaitMs);  // a save_session must land before goodbye closes it
        if (info.Has("goodbye")) {
            MsgValue body = MsgValue::Map();
            body.Set("keep_sessions", MsgValue::Bool(options.keep_sessions_on_stop));
            uint64_t id = ++last_id;
            SendInternal("goodbye", EncodeEnvelope(id, "goodbye", body), 0, id);
            asked.push_back(id);
        }
        AwaitAnswers(asked, kGoodbyeWaitMs);
    }

    void AwaitAnswers(std::vector<uint64_t>& asked, int limit_ms) {
        auto start = Clock::now();
        while (!asked.empty() && dealer->IsConnected() && Since(start) * 1000 < limit_ms) {
            received.clear();
            dealer->Receive(10, received);
            for (const auto& m : received) {
                uint64_t id;
                std::string type;
                MsgValue body;
                if (!DecodeEnvelope(m, id, type, body)) continue;
                auto it = inflight.find(id);
                if (it != inflight.end() && (type == "ok" || type == "error")) {
                    if (!it->second.internal) Forward(id, type.c_str(), std::move(body));
                    inflight.erase(it);
                }
                if (type == "ok" || type == "error") asked.erase(std::remove(asked.begin(), asked.end(), id), asked.end());
            }
        }
    }

    // ---- I/O thread -> caller -----------------------------------------------------------------

    void Forward(uint64_t id, const char* type, MsgValue body) {
        Event e;
        e.id = id;
        std::string t(type);
        if (t == "ok") {
            e.kind = EventKind::Ok;
            e.body = std::move(body);
        } else if (t == "done") {
            e.kind = EventKind::Done;
            e.text = body.GetString("text");
            e.finish_reason = body.GetString("finish_reason");
            if (const MsgValue* calls = body.Find("tool_calls")) {
                for (size_t k = 0; k < calls->Size(); ++k)
                    if (calls->At(k).IsMap()) e.tool_calls.push_back(ReadCall(calls->At(k), static_cast<int>(k)));
            }
            e.body = std::move(body);
        } else {
            e.kind = EventKind::Error;
            e.error = Error{body.GetString("code", "error"), body.GetString("message"), body.GetBool("retryable")};
        }
        Post(std::move(e));
    }

    static ToolCall ReadCall(const MsgValue& body, int fallback_index) {
        ToolCall c;
        c.index = static_cast<int>(body.GetInt("index", fallback_index));
        c.id = body.GetString("id");
        c.name = body.GetString("name");
        c.arguments = body.GetString("arguments", "{}");
        return c;
    }

    void PostState(ConnectionState s, const MsgValue* hello) {
        if (s == posted && hello == nullptr) return;
        posted = s;
        state.store(static_cast<int>(s));
        Event e;
        e.kind = EventKind::State;
        e.state = s;
        if (hello) e.body = *hello;
        Post(std::move(e));
    }

    void PublishCounters() {
        std::lock_guard<std::mutex> lock(info_mutex);
        shared_counters = counters;
    }
};

Client::Client(ClientOptions options) : impl_(new Impl(std::move(options))) {
    impl_->routing_id = impl_->options.routing_id.empty() ? "igi-" + RandomHex(24) : impl_->options.routing_id;
}

Client::~Client() { Stop(); }

bool Client::Start(std::string* error) {
    Impl& d = *impl_;
    if (d.running.load()) return true;
    std::string host;
    uint16_t port;
    auto fail = [&](const std::string& why) { if (error) *error = why; return false; };
    if (!ParseTcpEndpoint(d.options.endpoint, host, port)) return fail("endpoint must be tcp://HOST:PORT: " + d.options.endpoint);
    if (d.options.launch_token.empty()) {
        const char* env = std::getenv("IGI_SDK_TOKEN");
        if (env) d.options.launch_token = env;
    }
    if (!d.options.owner_key.empty() && !ValidKey(d.options.owner_key))
        return fail("owner key must be 16-128 characters of [A-Za-z0-9_-]");
    if (d.options.launch_token.size() > 128) return fail("launch token longer than 128 characters");
    if (d.options.lease_s < 2 || d.options.lease_s > 3600) return fail("lease_s must be 2..3600");
    if (d.routing_id.empty() || d.routing_id.size() > 255 || d.routing_id[0] == '\0')
        return fail("routing id must be 1-255 bytes not starting with a zero byte");
#ifdef IGI_SDK_NO_BSD_SOCKETS
    if (!d.options.socket_factory) return fail("no socket factory");
    std::unique_ptr<ISocket> socket = d.options.socket_factory();
#else
    std::unique_ptr<ISocket> socket = d.options.socket_factory ? d.options.socket_factory() : MakeBsdSocket();
#endif
    if (!socket) return fail("the socket factory made no socket");
    {
        std::lock_guard<std::mutex> lock(d.out_mutex);
        d.dealer.reset(new ZmtpDealer(std::move(socket)));
    }
    d.stop_requested = false;
    d.running.store(true);
    d.thread = std::thread([&d]() { d.Run(); });
    return true;
}

void Client::Stop() {
    Impl& d = *impl_;
    if (!d.running.exchange(false)) return;
    Impl::Outgoing o;
    o.kind = Impl::OutKind::Stop;
    d.Enqueue(std::move(o));
    if (d.thread.joinable()) d.thread.join();
}

void Client::SetEndpoint(const std::string& endpoint, const std::string& expected_instance) {
    Impl::Outgoing o;
    o.kind = Impl::OutKind::Endpoint;
    o.endpoint = endpoint;
    o.instance = expected_instance;
    impl_->Enqueue(std::move(o));
}

void Client::DropConnection() {
    Impl::Outgoing o;
    o.kind = Impl::OutKind::Drop;
    impl_->Enqueue(std::move(o));
}

uint64_t Client::Request(const char* type, MsgValue body, const char* feature) {
    std::string session = body.GetString("session");
    return impl_->Submit(type, body.IsMap() ? body : MsgValue::Map(), false, feature, session);
}

uint64_t Client::OpenSession(const std::string& system_prompt, const std::string& name, int priority, const std::string& persona) {
    MsgValue b = MsgValue::Map();
    b.Set("system_prompt", MsgValue::Str(system_prompt));
    if (!persona.empty()) b.Set("persona", MsgValue::Str(persona));
    if (!name.empty()) b.Set("name", MsgValue::Str(name));
    if (priority != 0) b.Set("priority", MsgValue::Int(priority));
    return Request("open_session", std::move(b));
}

uint64_t Client::Chat(const std::string& session, const std::string& text, int max_tokens, MsgValue extra) {
    MsgValue b = extra.IsMap() ? std::move(extra) : MsgValue::Map();
    b.Set("session", MsgValue::Str(session));
    b.Set("text", MsgValue::Str(text));
    b.Set("max_tokens", MsgValue::Int(max_tokens));
    return impl_->Submit("chat", b, true, nullptr, session);
}

uint64_t Client::Chat(const std::string& session, const std::string& text, const ChatOptions& options) {
    MsgValue b = options.extra.IsMap() ? options.extra : MsgValue::Map();
    b.Set("session", MsgValue::Str(session));
    b.Set("text", MsgValue::Str(text));
    b.Set("max_tokens", MsgValue::Int(options.max_tokens));
    bool tools = false;
    if (!options.tools.empty()) {
        MsgValue list = MsgValue::Array();
        for (const ToolSpec& t : options.tools) {
            MsgValue tool = MsgValue::Map();
            tool.Set("name", MsgValue::Str(t.name));
            tool.Set("description", MsgValue::Str(t.description));
            // JSON text: the sidecar reads the schema (the client needs no tree of it)
            if (!t.parameters_json.empty()) tool.Set("parameters", MsgValue::Str(t.parameters_json));
            list.Push(std::move(tool));
        }
        b.Set("tools", std::move(list));
        tools = true;
    }
    if (!options.tool_choice.empty()) { b.Set("tool_choice", MsgValue::Str(options.tool_choice)); tools = true; }
    if (options.parallel_tool_calls >= 0) {
        b.Set("parallel_tool_calls", MsgValue::Bool(options.parallel_tool_calls != 0));
        tools = true;
    }
    if (!options.tool_results.empty()) {
        MsgValue list = MsgValue::Array();
        for (const ToolResult& r : options.tool_results) {
            MsgValue result = MsgValue::Map();
            result.Set("id", MsgValue::Str(r.id));
            result.Set("content", MsgValue::Str(r.content));
            list.Push(std::move(result));
        }
        b.Set("tool_results", std::move(list));
        tools = true;
    }
    std::string problem = ToolsProblem(options, Info().max_text_chars);
    if (!problem.empty()) return impl_->RefuseUnsent(errc::kInvalidBody, problem);
    return impl_->Submit("chat", b, true, tools ? "tools" : nullptr, session);
}

uint64_t Client::AnswerToolCalls(const std::string& session, std::vector<ToolResult> results, ChatOptions options) {
    if (results.empty()) return impl_->RefuseUnsent(errc::kInvalidBody, "tool_results is empty: nothing to answer");
    options.tool_results = std::move(results);
    return Chat(session, std::string(), options);
}

uint64_t Client::Cancel(uint64_t chat_id) {
    MsgValue b = MsgValue::Map();
    b.Set("request", MsgValue::UInt(chat_id));
    return Request("cancel", std::move(b));
}

uint64_t Client::SetPriority(const std::string& session, int priority) {
    MsgValue b = MsgValue::Map();
    b.Set("session", MsgValue::Str(session));
    b.Set("priority", MsgValue::Int(priority));
    return Request("set_priority", std::move(b), "set_priority");
}

uint64_t Client::ListSessions() { return Request("list_sessions", MsgValue::Map(), "list_sessions"); }

uint64_t Client::SaveSession(const std::string& session, const std::string& name) {
    MsgValue b = MsgValue::Map();
    b.Set("session", MsgValue::Str(session));
    b.Set("name", MsgValue::Str(name));
    return Request("save_session", std::move(b));
}

uint64_t Client::RestoreSession(const std::string& name, const std::string& session) {
    MsgValue b = MsgValue::Map();
    b.Set("name", MsgValue::Str(name));
    if (!session.empty()) b.Set("session", MsgValue::Str(session));
    return Request("restore_session", std::move(b));
}

uint64_t Client::CloseSession(const std::string& session) {
    MsgValue b = MsgValue::Map();
    b.Set("session", MsgValue::Str(session));
    return Request("close_session", std::move(b));
}

uint64_t Client::AdoptSession(const std::string& session) {
    MsgValue b = MsgValue::Map();
    b.Set("session", MsgValue::Str(session));
    return Request("adopt_session", std::move(b), "adopt_session");
}

uint64_t Client::ReserveVram(int64_t bytes, int deadline_frames) {
    MsgValue b = MsgValue::Map();
    b.Set("bytes", MsgValue::Int(bytes));
    b.Set("deadline_frames", MsgValue::Int(deadline_frames));
    return Request("reserve_vram", std::move(b));
}

uint64_t Client::Stats() { return Request("stats", MsgValue::Map()); }
uint64_t Client::Ping() { return Request("ping", MsgValue::Map()); }

uint64_t Client::Goodbye(bool keep_sessions) {
    MsgValue b = MsgValue::Map();
    b.Set("keep_sessions", MsgValue::Bool(keep_sessions));
    return Request("goodbye", std::move(b), "goodbye");
}

namespace {

// A frame report's figures clamped into the protocol's ranges (see FrameBody in the header).
struct FrameFields {
    int64_t frame = 0;
    double frame_time_ms = 0;
    bool has_target = false;
    double target_frame_time_ms = 0;
    int64_t vram_used = -1, vram_budget = -1;
    int busy_threads = -1;
    bool has_cpu_share = false;
    double cpu_share = 0;
    uint32_t Count() const {
        return 2u + has_target + (vram_used >= 0) + (vram_budget >= 0) + (busy_threads >= 0) + has_cpu_share;
    }
};

FrameFields ClampFrame(int64_t frame, double frame_time_ms, double target_frame_time_ms, int64_t vram_used,
                       int64_t vram_budget, int busy_threads, double cpu_share) {
    FrameFields f;
    f.frame = frame < 0 ? 0 : frame;
    // NaN reads as 0 (the sidecar would refuse the whole report, unanswered here)
    f.frame_time_ms = !(frame_time_ms >= 0) ? 0 : frame_time_ms > 10000 ? 10000 : frame_time_ms;
    f.has_target = target_frame_time_ms > 0;
    if (f.has_target) f.target_frame_time_ms = std::min(target_frame_time_ms, 1000.0);
    f.vram_used = vram_used >= 0 ? vram_used : -1;
    f.vram_budget = vram_budget >= 0 ? vram_budget : -1;
    f.busy_threads = busy_threads >= 0 ? std::min(busy_threads, kMaxBusyThreads) : -1;
    f.has_cpu_share = std::isfinite(cpu_share) && cpu_share >= 0;
    if (f.has_cpu_share) f.cpu_share = std::min(cpu_share, 1.0);
    return f;
}

}  // namespace

MsgValue FrameBody(int64_t frame, double frame_time_ms, double target_frame_time_ms, int64_t vram_used,
                   int64_t vram_budget, int busy_threads, double cpu_share) {
    FrameFields f = ClampFrame(frame, frame_time_ms, target_frame_time_ms, vram_used, vram_budget, busy_threads, cpu_share);
    MsgValue b = MsgValue::Map();
    b.Set("frame", MsgValue::Int(f.frame));
    b.Set("frame_time_ms", MsgValue::Float(f.frame_time_ms));
    if (f.has_target) b.Set("target_frame_time_ms", MsgValue::Float(f.target_frame_time_ms));
    if (f.vram_used >= 0) b.Set("vram_used", MsgValue::Int(f.vram_used));
    if (f.vram_budget >= 0) b.Set("vram_budget", MsgValue::Int(f.vram_budget));
    if (f.busy_threads >= 0) b.Set("busy_threads", MsgValue::Int(f.busy_threads));
    if (f.has_cpu_share) b.Set("cpu_share", MsgValue::Float(f.cpu_share));
    return b;
}

void AppendFrameEnvelope(std::string& out, uint64_t id, int64_t frame, double frame_time_ms,
                         double target_frame_time_ms, int64_t vram_used, int64_t vram_budget, int busy_threads,
                         double cpu_share) {
    FrameFields f = ClampFrame(frame, frame_time_ms, target_frame_time_ms, vram_used, vram_budget, busy_threads, cpu_share);
    // the bytes EncodeEnvelope(id, "frame", FrameBody(...)) writes, key for key
    MsgWriter w(out);
    WriteEnvelopeHead(w, id, "frame");
    w.MapHeader(f.Count());
    w.Str("frame", 5);
    w.Int(f.frame);
    w.Str("frame_time_ms", 13);
    w.Double(f.frame_time_ms);
    if (f.has_target) { w.Str("target_frame_time_ms", 20); w.Double(f.target_frame_time_ms); }
    if (f.vram_used >= 0) { w.Str("vram_used", 9); w.Int(f.vram_used); }
    if (f.vram_budget >= 0) { w.Str("vram_budget", 11); w.Int(f.vram_budget); }
    if (f.busy_threads >= 0) { w.Str("busy_threads", 12); w.Int(f.busy_threads); }
    if (f.has_cpu_share) { w.Str("cpu_share", 9); w.Double(f.cpu_share); }
}

void Client::ReportFrame(int64_t frame, double frame_time_ms, double target_frame_time_ms, int64_t vram_used,
                         int64_t vram_budget, int busy_threads, double cpu_share) {
    Impl& d = *impl_;
    if (d.state.load() != static_cast<int>(ConnectionState::Ready)) return;
    const uint64_t id = ++d.last_id;
    const Clock::time_point now = Clock::now();
    bool wake = false;
    {
        std::lock_guard<std::mutex> lock(d.frame_mutex);
        if (d.frame_count == Impl::kFrameSlots) {  // the I/O thread is held up: the oldest is stale
            d.frame_head = (d.frame_head + 1) % Impl::kFrameSlots;
            --d.frame_count;
        }
        if (d.frame_count == 0) d.frame_oldest_at = now;
        const size_t slot = (d.frame_head + d.frame_count) % Impl::kFrameSlots;
        d.frame_ring[slot].clear();  // keeps its capacity
        AppendFrameEnvelope(d.frame_ring[slot], id, frame, frame_time_ms, target_frame_time_ms, vram_used,
                            vram_budget, busy_threads, cpu_share);
        d.frame_ring_ids[slot] = id;
        ++d.frame_count;
        if (!d.frame_wake_asked && now - d.frame_oldest_at >= std::chrono::milliseconds(kFrameFlushMs)) {
            d.frame_wake_asked = true;
            wake = true;
        }
    }
    if (wake) {
        std::lock_guard<std::mutex> lock(d.out_mutex);
        if (d.dealer) d.dealer->Wake();
    }
}

void Client::Poll(std::vector<Event>& out) {
    out.clear();
    std::lock_guard<std::mutex> lock(impl_->in_mutex);
    out.swap(impl_->inbox);
}

ConnectionState Client::State() const { return static_cast<ConnectionState>(impl_->state.load()); }

ServerInfo Client::Info() const {
    std::lock_guard<std::mutex> lock(impl_->info_mutex);
    return impl_->shared_info;
}

ClientCounters Client::Counters() const {
    std::lock_guard<std::mutex> lock(impl_->info_mutex);
    return impl_->shared_counters;
}

const std::string& Client::RoutingId() const { return impl_->routing_id; }

}  // namespace igi
