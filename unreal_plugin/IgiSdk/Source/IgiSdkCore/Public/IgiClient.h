// The sidecar client: one I/O thread owns the connection; the game thread sends requests (any
// call below, which only queues) and drains events with Poll(), which takes one short lock and
// never waits on the network.
//
// On its own it connects (back-off 100 ms doubling to 2 s), says hello on every new connection
// (protocol 1.2: lease, owner key, launch token from IGI_SDK_TOKEN), keeps the lease with a
// ping every lease_s / 3 without an accepted request, answers hello_required by greeting again
// and resending, resumes open streams after a reconnect (resume_stream from the last token
// delivered, duplicates dropped), declares the sidecar down after `silence_s` without any
// message, and says goodbye on Stop(). Errors are typed: the sidecar's codes, plus local ones
// (igi::errc).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "IgiMsgPack.h"
#include "IgiSdkCoreApi.h"
#include "IgiSocket.h"

namespace igi {

const int kProtocolVersion = 1;
const int kProtocolMinor = 3;
const int64_t kMaxMessageBytes = 17825792;  // PROTOCOL.md §7, until hello's limits say otherwise

// Codes the client itself produces (the sidecar never sends them).
namespace errc {
const char* const kUnavailable = "unavailable";          // retryable: no sidecar answered in time
const char* const kStreamLost = "stream_lost";           // retryable: the stream could not be resumed
const char* const kWrongSidecar = "wrong_sidecar";       // the sidecar is not the instance launched
const char* const kUnsupported = "unsupported";          // the sidecar lacks the protocol feature
const char* const kMessageTooLarge = "message_too_large";  // over the protocol's size limit, not sent
const char* const kStopped = "stopped";                  // the client stopped before an answer
}  // namespace errc

struct Error {
    std::string code;
    std::string message;
    bool retryable = false;
};

enum class ConnectionState : uint8_t { Connecting, Ready, Unavailable, Refused, Closed };
IGISDKCORE_API const char* ToString(ConnectionState s);

enum class EventKind : uint8_t { Ok, Token, Done, Error, State };

struct Event {
    EventKind kind = EventKind::Ok;
    uint64_t id = 0;
    std::string text;           // Token: the piece; Done: the whole reply
    int64_t index = 0;          // Token: its `i` (1, 2, 3, ... none skipped or repeated)
    std::string finish_reason;  // Done
    Error error;                // Error (and State Refused: why)
    ConnectionState state = ConnectionState::Connecting;  // State
    MsgValue body;              // Ok and Done: the reply body (Token: left empty)
};

struct IGISDKCORE_API ServerInfo {
    int minor = 0;
    double lease_s = 0;
    bool game = false;
    std::string model;
    std::string instance;
    std::string owner;
    std::vector<std::string> features;
    int64_t max_message_bytes = kMaxMessageBytes;
    int64_t max_text_chars = 32000;
    bool Has(const char* feature) const;
};

struct ClientOptions {
    std::string endpoint = "tcp://127.0.0.1:5599";
    std::string routing_id;  // empty: "igi-" + 24 random hex digits (kept across reconnects)
    std::string engine = "unreal";
    std::string client_name;
    int64_t game_pid = 0;  // 0: not sent
    double lease_s = 15.0;
    double silence_s = 5.0;  // no message at all for this long: the sidecar is down
    std::string owner_key;   // 16-128 of [A-Za-z0-9_-]; empty: sessions belong to the connection
    std::string launch_token;  // empty: IGI_SDK_TOKEN of this process, if set
    // non-empty: a sidecar whose hello does not echo this instance is refused, never used
    std::string expected_instance;
    bool keep_sessions_on_stop = false;
    int io_wait_ms = 50;  // the I/O thread's longest wait (a socket without Wake() adds this latency)
    SocketFactory socket_factory;  // empty: BSD sockets
};

struct ClientCounters {
    uint64_t reconnects = 0;
    uint64_t resumes = 0;
    uint64_t dropped_messages = 0;  // undecodable frames from the sidecar
    uint64_t duplicate_tokens = 0;  // replayed tokens dropped
};

class IGISDKCORE_API Client {
public:
    explicit Client(ClientOptions options);
    ~Client();  // Stop()
    Client(const Client&) = delete;
    Client& operator=(const Client&) = delete;

    // Starts the I/O thread. False (with a reason) for options that cannot work.
    bool Start(std::string* error = nullptr);
    // Says goodbye (bounded: about a second at most) and joins the I/O thread.
    void Stop();
    // A relaunched sidecar: reconnect there (and expect its instance). Open streams are resumed
    // there or end with stream_lost.
    void SetEndpoint(const std::string& endpoint, const std::string& expected_instance);

    // Every call returns the request's id; its answer is an Ok or Error event with that id (a
    // chat: Token events, then exactly one Done or Error).
    uint64_t Request(const char* type, MsgValue body, const char* feature = nullptr);
    uint64_t OpenSession(const std::string& system_prompt, const std::string& name = std::string(), int priority = 0,
                         const std::string& persona = std::string());
    uint64_t Chat(const std::string& session, const std::string& text, int max_tokens = 256,
                  MsgValue extra = MsgValue::Map());
    uint64_t Cancel(uint64_t chat_id);
    uint64_t SetPriority(const std::string& session, int priority);
    uint64_t ListSessions();
    uint64_t SaveSession(const std::string& session, const std::string& name);
    uint64_t RestoreSession(const std::string& name, const std::string& session = std::string());
    uint64_t CloseSession(const std::string& session);
    uint64_t AdoptSession(const std::string& session);
    uint64_t ReserveVram(int64_t bytes, int deadline_frames);
    uint64_t Stats();
    uint64_t Ping();
    uint64_t Goodbye(bool keep_sessions);
    // One `frame` report; its answer is not forwarded (it comes every frame). Dropped while not
    // connected: a stale frame tells the arbiter nothing. The body is FrameBody's. Made for the
    // game thread's tick: it allocates nothing and does not wake the I/O thread. The thread
    // sends the reports queued since its last wake (in order; 16 at most, a full queue drops its
    // oldest) whenever it wakes: traffic, a request, the end of its io_wait_ms wait, or a report
    // that finds the oldest one waiting kFrameFlushMs or longer.
    void ReportFrame(int64_t frame, double frame_time_ms, double target_frame_time_ms = 0,
                     int64_t vram_used = -1, int64_t vram_budget = -1, int busy_threads = -1,
                     double cpu_share = -1);

    // Moves every event that arrived into `out` (cleared first). Never waits on I/O.
    void Poll(std::vector<Event>& out);

    ConnectionState State() const;
    ServerInfo Info() const;
    ClientCounters Counters() const;
    const std::string& RoutingId() const;

    // Closes the TCP connection under the client, as a network fault would (tests, diagnostics).
    void DropConnection();

    struct Impl;

private:
    std::unique_ptr<Impl> impl_;
};

const int kMaxBusyThreads = 4096;  // PROTOCOL.md `frame`: busy_threads 0..4096
const int kFrameFlushMs = 50;     // the longest a frame report waits for the I/O thread's next wake

// The body of one `frame` report, every figure clamped into the protocol's range (a game's
// figure is never worth a refused report). Left out: target_frame_time_ms <= 0, a negative VRAM
// figure, and the game's CPU use when not given: busy_threads < 0 (the CPU threads the game
// keeps busy now; above 4096: 4096) and a cpu_share that is negative or not finite (its share
// of the machine's CPU time over its last frames, 0..1; above 1: 1). The sidecar keeps the last
// CPU figures it got: a game that goes idle reports 0, not nothing.
IGISDKCORE_API MsgValue FrameBody(int64_t frame, double frame_time_ms, double target_frame_time_ms = 0,
                   int64_t vram_used = -1, int64_t vram_budget = -1, int busy_threads = -1,
                   double cpu_share = -1);

// The envelope of one `frame` report with FrameBody's body, appended to `out` byte for byte as
// EncodeEnvelope(id, "frame", FrameBody(...)) writes it, without building a MsgValue: no
// allocation once `out` has room (about 200 bytes). What ReportFrame sends.
IGISDKCORE_API void AppendFrameEnvelope(std::string& out, uint64_t id, int64_t frame, double frame_time_ms,
                                        double target_frame_time_ms = 0, int64_t vram_used = -1,
                                        int64_t vram_budget = -1, int busy_threads = -1, double cpu_share = -1);

// The reply envelope {v, id, type, body} of one frame. False for anything else.
IGISDKCORE_API bool DecodeEnvelope(const std::string& frame, uint64_t& id, std::string& type, MsgValue& body);
IGISDKCORE_API std::string EncodeEnvelope(uint64_t id, const char* type, const MsgValue& body);

}  // namespace igi
