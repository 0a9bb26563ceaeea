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
const char* const kInvalidBody = "invalid_body";         // refused here, unsent (the sidecar's code)
}  // namespace errc

struct Error {
    std::string code;
    std::string message;
    bool retryable = false;
};

enum class ConnectionState : uint8_t { Connecting, Ready, Unavailable, Refused, Closed };
IGISDKCORE_API const char* ToString(ConnectionState s);

// ---- NPC actions (protocol 1.3, feature "tools") ----------------------------------------------

// An action the NPC may take with a reply (a tool on the wire).
struct ToolSpec {
    std::string name;             // [A-Za-z0-9_-], 1..64; not auto, none or required
    std::string description;      // at most 2000 characters (what the model reads)
    std::string parameters_json;  // the arguments' JSON Schema (an object's); empty: any object
};

// What came of one call, for the next line's tool_results.
struct ToolResult {
    std::string id;       // the call's id (1..64 characters)
    std::string content;  // what happened, for the model to read
};

// One call the model made: a ToolCall event, or an entry of a Done event's tool_calls.
struct IGISDKCORE_API ToolCall {
    int index = 0;          // its place in the reply (0, 1, ...)
    std::string id;         // "call_..."; what its ToolResult answers
    std::string name;       // a declared action's name
    std::string arguments;  // JSON text of an object valid against the action's schema
    // The arguments parsed (an object as a map); false if they are not a JSON object, which
    // the sidecar never sends.
    bool Arguments(MsgValue& out) const;
};

const int kMaxTools = 32;
const int kMaxToolResults = 16;
const int kMaxParallelToolCalls = 8;

IGISDKCORE_API bool IsValidToolName(const std::string& name);

// A chat's options. Empty fields are not sent.
struct ChatOptions {
    int max_tokens = 256;
    std::vector<ToolSpec> tools;        // at most 32
    std::string tool_choice;            // empty (auto), "none", "required", or a declared tool's name
    int parallel_tool_calls = -1;       // -1: not sent (true); 0: at most one call; 1: up to 8
    std::vector<ToolResult> tool_results;  // the previous reply's calls answered (at most 16)
    MsgValue extra = MsgValue::Map();   // more chat fields as they go on the wire (stop, grammar, images)
};

// Why these options break the protocol's rules for tools (empty when they do not): names,
// counts, lengths, a tool_choice that names no declared tool, parameters that are not a JSON
// object schema, tools with a grammar or json_schema in `extra`. Chat() refuses such a line
// unsent (an Error event, invalid_body).
IGISDKCORE_API std::string ToolsProblem(const ChatOptions& options, int64_t max_text_chars = 32000);

enum class EventKind : uint8_t { Ok, Token, Done, Error, State, ToolCall };

struct Event {
    EventKind kind = EventKind::Ok;
    uint64_t id = 0;
    std::string text;           // Token: the piece; Done: the whole reply
    int64_t index = 0;          // Token and ToolCall: its `i` (1, 2, 3, ... across both kinds)
    std::string finish_reason;  // Done (protocol 1.3: "tool_calls" when the reply ended in calls)
    Error error;                // Error (and State Refused: why)
    ConnectionState state = ConnectionState::Connecting;  // State
    MsgValue body;              // Ok and Done: the reply body (Token: left empty)
    ToolCall call;              // ToolCall: the call, as soon as it is complete
    std::vector<ToolCall> tool_calls;  // Done: every call of the reply (empty: it only talked)
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
    // Protocol 1.3: a line with actions (tools, tool_choice, parallel_tool_calls, tool_results);
    // each call comes as a ToolCall event, and in the Done event's tool_calls. Options that
    // break the rules (ToolsProblem) end in an Error event (invalid_body) without being sent; a
    // sidecar without the "tools" feature: unsupported.
    uint64_t Chat(const std::string& session, const std::string& text, const ChatOptions& options);
    // What came of the last reply's calls: the reply continues from them (a stream like
    // Chat's). `options`: the line's (declare the tools again to let the NPC act once more);
    // its tool_results are replaced by `results`.
    uint64_t AnswerToolCalls(const std::string& session, std::vector<ToolResult> results,
                             ChatOptions options = ChatOptions());
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
