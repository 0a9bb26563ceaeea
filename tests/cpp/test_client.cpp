// The C++ client against the real sidecar (the default model, SmolLM2): hello, streams, cancel,
// priority, list, save/restore, resume after a dropped connection, a sidecar killed mid-stream
// and a new one, goodbye, a refused instance, leases, and a 60 FPS loop whose Poll() never waits.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "IgiClient.h"
#include "sidecar.h"

using igi::Client;
using igi::ClientOptions;
using igi::ConnectionState;
using igi::Event;
using igi::EventKind;
using Clock = std::chrono::steady_clock;

namespace {

const char* const kToken = "cpp-test-launch-token-0123456789";
igitest::Sidecar* g_sidecar = nullptr;

class SharedSidecar : public ::testing::Environment {
public:
    void SetUp() override {
        g_sidecar = new igitest::Sidecar(kToken);
        std::string error;
        if (!g_sidecar->Launch(error)) {
            std::fprintf(stderr, "%s\n", error.c_str());
            delete g_sidecar;
            g_sidecar = nullptr;
        }
    }
    void TearDown() override {
        delete g_sidecar;
        g_sidecar = nullptr;
    }
};

const ::testing::Environment* const g_env = ::testing::AddGlobalTestEnvironment(new SharedSidecar);

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Drains a client's events the way a game does, keeping them for the test to look at.
struct Game {
    explicit Game(ClientOptions o) : client(new Client(std::move(o))) {}
    std::unique_ptr<Client> client;
    std::vector<Event> events;
    std::vector<Event> batch;

    void Pump() {
        client->Poll(batch);
        for (auto& e : batch) events.push_back(std::move(e));
    }

    const Event* Find(uint64_t id, bool terminal) const {
        for (const auto& e : events) {
            if (e.kind == EventKind::State || e.id != id) continue;
            if (!terminal || e.kind == EventKind::Ok || e.kind == EventKind::Error || e.kind == EventKind::Done) return &e;
        }
        return nullptr;
    }

    // polls every 2 ms until pred() or timeout
    bool Until(const std::function<bool()>& pred, double timeout_s) {
        auto start = Clock::now();
        while (Since(start) < timeout_s) {
            Pump();
            if (pred()) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        Pump();
        return pred();
    }

    Event Answer(uint64_t id, double timeout_s = 30) {
        Until([&] { return Find(id, true) != nullptr; }, timeout_s);
        const Event* e = Find(id, true);
        if (e) return *e;
        Event none;
        none.kind = EventKind::Error;
        none.error.code = "test_timeout";
        return none;
    }

    bool SawState(ConnectionState s) const {
        for (const auto& e : events) if (e.kind == EventKind::State && e.state == s) return true;
        return false;
    }

    std::vector<Event> Tokens(uint64_t id) const {
        std::vector<Event> out;
        for (const auto& e : events) if (e.kind == EventKind::Token && e.id == id) out.push_back(e);
        return out;
    }

    std::string OpenSession(const std::string& name = "", const std::string& prompt = "You are Brom, a terse smith. Answer in one sentence.") {
        Event e = Answer(client->OpenSession(prompt, name));
        EXPECT_EQ(e.kind, EventKind::Ok) << e.error.code << ": " << e.error.message;
        return e.body.GetString("session");
    }
};

ClientOptions Options(const std::string& endpoint) {
    ClientOptions o;
    o.endpoint = endpoint;
    o.client_name = "cpp-tests";
    o.launch_token = kToken;
    o.owner_key = "cpp-owner-key-0123456789abcdef";
    return o;
}

#define NEED_SIDECAR() \
    if (!g_sidecar) GTEST_FAIL() << "the sidecar did not start"

// i counts 1, 2, 3, ... none skipped or repeated; the done text is the tokens joined
void ExpectWholeStream(const Game& g, uint64_t id, const Event& end) {
    std::vector<Event> tokens = g.Tokens(id);
    std::string joined;
    for (size_t k = 0; k < tokens.size(); ++k) {
        EXPECT_EQ(tokens[k].index, static_cast<int64_t>(k + 1));
        joined += tokens[k].text;
    }
    EXPECT_EQ(end.kind, EventKind::Done) << end.error.code << ": " << end.error.message;
    EXPECT_EQ(end.text, joined);
}

}  // namespace

TEST(Sidecar, HelloIsTheGameWithLeaseAndFeatures) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    ASSERT_TRUE(g.Until([&] { return g.client->State() == ConnectionState::Ready; }, 20));
    igi::ServerInfo info = g.client->Info();
    EXPECT_GE(info.minor, 2);
    EXPECT_TRUE(info.game);  // the launch token makes this client the game
    EXPECT_EQ(info.owner, "key");
    EXPECT_NEAR(info.lease_s, 15.0, 0.01);
    EXPECT_FALSE(info.model.empty());
    for (const char* f : {"leases", "goodbye", "resume_stream", "set_priority", "list_sessions", "owners", "launch_token"})
        EXPECT_TRUE(info.Has(f)) << f;
    EXPECT_EQ(g.client->RoutingId().size(), 28u);
    // a sidecar started with --instance echoes it (older sidecars: none)
    if (!g_sidecar->Instance().empty()) { EXPECT_EQ(info.instance, g_sidecar->Instance()); }
    g.client->Stop();
    EXPECT_TRUE(g.SawState(ConnectionState::Ready));
}

TEST(Sidecar, StreamedChatDeliversEveryTokenInOrder) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    std::string session = g.OpenSession();
    ASSERT_FALSE(session.empty());
    uint64_t chat = g.client->Chat(session, "What do you sell?", 24);
    Event end = g.Answer(chat, 60);
    ExpectWholeStream(g, chat, end);
    EXPECT_GT(g.Tokens(chat).size(), 0u);
    EXPECT_GT(end.body.Find("usage")->GetInt("prompt_tokens"), 0);
    std::printf("measured: %zu tokens streamed: \"%s\"\n", g.Tokens(chat).size(), end.text.c_str());
}

TEST(Sidecar, CancelEndsTheStreamWithCancelled) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    std::string session = g.OpenSession("", "You are a storyteller. Tell very long stories.");
    uint64_t chat = g.client->Chat(session, "Tell me the longest story you know.", 1000);
    ASSERT_TRUE(g.Until([&] { return !g.Tokens(chat).empty() || g.Find(chat, true); }, 60));
    uint64_t cancel = g.client->Cancel(chat);
    Event answer = g.Answer(cancel);
    EXPECT_EQ(answer.kind, EventKind::Ok);
    EXPECT_TRUE(answer.body.GetBool("cancelled"));
    Event end = g.Answer(chat);
    ExpectWholeStream(g, chat, end);
    EXPECT_EQ(end.finish_reason, "cancelled");
    EXPECT_LT(g.Tokens(chat).size(), 1000u);
}

TEST(Sidecar, SetPriorityListSessionsAndClose) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    std::string session = g.OpenSession("cpp.npc.priority");
    ASSERT_EQ(session, "cpp.npc.priority");
    EXPECT_EQ(g.Answer(g.client->SetPriority(session, 50)).kind, EventKind::Ok);
    Event bad = g.Answer(g.client->SetPriority(session, 500));  // out of range: the sidecar's typed error
    EXPECT_EQ(bad.kind, EventKind::Error);
    EXPECT_EQ(bad.error.code, "invalid_body");
    EXPECT_FALSE(bad.error.retryable);
    Event list = g.Answer(g.client->ListSessions());
    ASSERT_EQ(list.kind, EventKind::Ok);
    bool found = false;
    for (const auto& s : list.body.Find("sessions")->Items()) {
        if (s.GetString("session") == session) {
            found = true;
            EXPECT_EQ(s.GetString("owner"), "you");
            EXPECT_EQ(s.GetInt("priority"), 50);
        }
    }
    EXPECT_TRUE(found);
    EXPECT_GE(list.body.GetInt("free_slots", -1), 0);
    EXPECT_EQ(g.Answer(g.client->CloseSession(session)).kind, EventKind::Ok);
    Event gone = g.Answer(g.client->Chat(session, "hello?", 4));
    EXPECT_EQ(gone.error.code, "unknown_session");
}

// The game's CPU use in frame reports, on a sidecar of its own (the sidecar keeps the last report,
// so the shared one is left as it was): busy threads show in stats as the game's cores once the
// engine has run a step (it reads the report after each), frames without them change nothing,
// and a figure beyond the protocol's range arrives clamped rather than refused.
TEST(Sidecar, GameCpuUseInFramesShowsAsTheGamesCores) {
    NEED_SIDECAR();
    igitest::Sidecar own(kToken);
    std::string error;
    ASSERT_TRUE(own.Launch(error)) << error;
    Game g(Options(own.Endpoint()));
    ASSERT_TRUE(g.client->Start());
    ASSERT_TRUE(g.Until([&] { return g.client->State() == ConnectionState::Ready; }, 20));
    ASSERT_TRUE(g.client->Info().game);
    std::string session = g.OpenSession();
    // stats.engine.threads after one short reply
    auto threads_after_a_step = [&]() -> igi::MsgValue {
        Event reply = g.Answer(g.client->Chat(session, "Hello!", 2), 60);
        EXPECT_EQ(reply.kind, EventKind::Done) << reply.error.code << ": " << reply.error.message;
        Event stats = g.Answer(g.client->Stats());
        EXPECT_EQ(stats.kind, EventKind::Ok) << stats.error.code;
        const igi::MsgValue* engine = stats.body.Find("engine");
        const igi::MsgValue* threads = engine ? engine->Find("threads") : nullptr;
        EXPECT_NE(threads, nullptr) << "stats.engine.threads";
        return threads ? *threads : igi::MsgValue::Map();
    };
    auto game_cores = [](const igi::MsgValue& threads) -> int64_t {
        const igi::MsgValue* v = threads.Find("game_cores");
        return v == nullptr || v->IsNil() ? -1 : v->AsInt(-2);
    };
    // waits (a step at a time) until the sidecar shows `want`; frame reports have no answer
    auto cores_become = [&](int64_t want) {
        auto start = Clock::now();
        int64_t seen = -3;
        while (Since(start) < 30) {
            seen = game_cores(threads_after_a_step());
            if (seen == want) break;
        }
        return seen;
    };

    EXPECT_EQ(game_cores(threads_after_a_step()), -1) << "no report yet";
    g.client->ReportFrame(1, 16.6, 16.6);
    EXPECT_EQ(game_cores(threads_after_a_step()), -1) << "a frame without the game's CPU use reports none";

    g.client->ReportFrame(2, 16.6, 16.6, -1, -1, 3);
    EXPECT_EQ(cores_become(3), 3);
    igi::MsgValue threads = threads_after_a_step();
    // (these sidecars run a fixed --threads 2: the count stays; the Unity suite's adapting one
    // shows the ceiling lowered)
    int64_t cpus = static_cast<int64_t>(std::thread::hardware_concurrency());
    std::printf("measured: after busy_threads 3 on %lld CPUs the thread ceiling is %lld (setting %s)\n",
                static_cast<long long>(cpus), static_cast<long long>(threads.GetInt("ceiling")),
                threads.GetString("setting").c_str());

    g.client->ReportFrame(3, 16.6, 16.6);  // without: the last report stays
    EXPECT_EQ(game_cores(threads_after_a_step()), 3);

    g.client->ReportFrame(4, 16.6, 16.6, -1, -1, 100000);  // clamped to 4096, not refused
    EXPECT_EQ(cores_become(igi::kMaxBusyThreads), igi::kMaxBusyThreads);
    g.client->ReportFrame(5, 16.6, 16.6, -1, -1, -1, 0.0);  // a share alone replaces the report
    EXPECT_EQ(cores_become(0), 0);
    g.client->Stop();
}

TEST(Sidecar, SaveAndRestoreASession) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    std::string session = g.OpenSession();
    Event first = g.Answer(g.client->Chat(session, "My name is Aldric. Remember it.", 16), 60);
    ASSERT_EQ(first.kind, EventKind::Done);
    Event saved = g.Answer(g.client->SaveSession(session, "cpp_save_brom"));
    ASSERT_EQ(saved.kind, EventKind::Ok) << saved.error.code << ": " << saved.error.message;
    EXPECT_GT(saved.body.GetInt("bytes"), 0);
    EXPECT_EQ(g.Answer(g.client->CloseSession(session)).kind, EventKind::Ok);
    Event restored = g.Answer(g.client->RestoreSession("cpp_save_brom", "cpp.brom.restored"));
    ASSERT_EQ(restored.kind, EventKind::Ok) << restored.error.code << ": " << restored.error.message;
    EXPECT_EQ(restored.body.GetString("session"), "cpp.brom.restored");
    uint64_t chat = g.client->Chat("cpp.brom.restored", "What is my name?", 16);
    ExpectWholeStream(g, chat, g.Answer(chat, 60));
    Event missing = g.Answer(g.client->RestoreSession("cpp_no_such_save"));
    EXPECT_EQ(missing.error.code, "unknown_save");
}

// The TCP connection drops mid-stream (the sidecar lives on): the client reconnects with its
// routing id, resumes from the last token it delivered, and the game sees one whole stream.
TEST(Sidecar, DroppedConnectionResumesTheStream) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    std::string session = g.OpenSession("", "You are a storyteller.");
    uint64_t chat = g.client->Chat(session, "Tell me a story about a dragon.", 96);
    ASSERT_TRUE(g.Until([&] { return g.Tokens(chat).size() >= 3 || g.Find(chat, true); }, 60));
    g.client->DropConnection();
    Event end = g.Answer(chat, 60);
    ExpectWholeStream(g, chat, end);
    igi::ClientCounters c = g.client->Counters();
    EXPECT_GE(c.reconnects, 1u);
    EXPECT_GE(c.resumes, 1u);
    std::printf("measured: resumed after a drop: %zu tokens, %llu duplicates dropped\n", g.Tokens(chat).size(),
                static_cast<unsigned long long>(c.duplicate_tokens));
}

// The sidecar is killed mid-stream: the stream ends with a typed, retryable error (the new
// sidecar does not know it: resume_stream -> unknown_stream -> stream_lost), the client
// connects to the new sidecar by itself, and the game goes on there.
TEST(Sidecar, KilledSidecarMidStreamThenANewOne) {
    NEED_SIDECAR();
    auto first = std::make_unique<igitest::Sidecar>(kToken);
    std::string error;
    ASSERT_TRUE(first->Launch(error)) << error;
    ClientOptions o = Options(first->Endpoint());
    o.expected_instance = first->Instance();
    o.silence_s = 30;  // long enough for the new sidecar to start on this loaded machine
    Game g(o);
    ASSERT_TRUE(g.client->Start());
    std::string session = g.OpenSession("", "You are a storyteller.");
    uint64_t chat = g.client->Chat(session, "Tell me a long story about a dragon.", 400);
    ASSERT_TRUE(g.Until([&] { return !g.Tokens(chat).empty(); }, 60));
    int port = first->Port();
    first->Kill();
    ASSERT_TRUE(g.Until([&] { return g.SawState(ConnectionState::Connecting); }, 10));
    // a new sidecar (on the same port where it cannot choose its own)
    igitest::Sidecar second(kToken, igitest::Env("IGI_SIDECAR_ENDPOINT_FILE") == "1" ? 0 : port);
    ASSERT_TRUE(second.Launch(error)) << error;
    g.client->SetEndpoint(second.Endpoint(), second.Instance());
    Event end = g.Answer(chat, 40);
    ASSERT_EQ(end.kind, EventKind::Error);
    EXPECT_EQ(end.error.code, igi::errc::kStreamLost) << end.error.message;
    EXPECT_TRUE(end.error.retryable);
    ASSERT_TRUE(g.Until([&] { return g.client->State() == ConnectionState::Ready; }, 20));
    // the old session died with its sidecar; a new one works
    EXPECT_EQ(g.Answer(g.client->Chat(session, "Still there?", 4)).error.code, "unknown_session");
    std::string again = g.OpenSession();
    uint64_t next = g.client->Chat(again, "Hello!", 12);
    ExpectWholeStream(g, next, g.Answer(next, 60));
    g.client->Stop();
}

TEST(Sidecar, GoodbyeThenTheClientGreetsAgainWhenUsed) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    g.OpenSession();
    Event bye = g.Answer(g.client->Goodbye(false));
    ASSERT_EQ(bye.kind, EventKind::Ok) << bye.error.code;
    EXPECT_EQ(bye.body.GetInt("closed"), 1);
    EXPECT_EQ(bye.body.GetInt("orphaned"), 0);
    // forgotten by the sidecar (hello_required): the client says hello again and resends
    Event list = g.Answer(g.client->ListSessions());
    ASSERT_EQ(list.kind, EventKind::Ok) << list.error.code;
    int mine = 0;
    for (const auto& s : list.body.Find("sessions")->Items()) mine += s.GetString("owner") == "you";
    EXPECT_EQ(mine, 0);
}

TEST(Sidecar, StopSaysGoodbyeAndKeepsSessionsWhenAsked) {
    NEED_SIDECAR();
    ClientOptions o = Options(g_sidecar->Endpoint());
    o.owner_key = "cpp-owner-keep-0123456789abcdef";
    o.keep_sessions_on_stop = true;
    {
        Game g(o);
        ASSERT_TRUE(g.client->Start());
        EXPECT_EQ(g.OpenSession("cpp.kept"), "cpp.kept");
        g.client->Stop();  // goodbye {keep_sessions: true}
    }
    Game h(o);  // the next run of the game, same owner key: the session waits to be adopted
    ASSERT_TRUE(h.client->Start());
    Event list = h.Answer(h.client->ListSessions());
    ASSERT_EQ(list.kind, EventKind::Ok);
    bool orphaned = false;
    for (const auto& s : list.body.Find("sessions")->Items())
        orphaned |= s.GetString("session") == "cpp.kept" && s.GetString("owner") == "orphaned";
    EXPECT_TRUE(orphaned);
    Event adopted = h.Answer(h.client->AdoptSession("cpp.kept"));
    EXPECT_EQ(adopted.kind, EventKind::Ok) << adopted.error.code;
    EXPECT_EQ(h.Answer(h.client->CloseSession("cpp.kept")).kind, EventKind::Ok);
}

TEST(Sidecar, AnotherInstanceIsRefusedNeverUsed) {
    NEED_SIDECAR();
    ClientOptions o = Options(g_sidecar->Endpoint());
    o.expected_instance = "not-the-instance-we-launched";  // another game's sidecar on this port
    Game g(o);
    ASSERT_TRUE(g.client->Start());
    uint64_t id = g.client->ListSessions();
    Event e = g.Answer(id, 20);
    EXPECT_EQ(e.kind, EventKind::Error);
    EXPECT_EQ(e.error.code, igi::errc::kWrongSidecar);
    EXPECT_FALSE(e.error.retryable);
    EXPECT_TRUE(g.SawState(ConnectionState::Refused));
    EXPECT_EQ(g.client->State(), ConnectionState::Refused);
}

TEST(Sidecar, WrongLaunchTokenIsForbidden) {
    NEED_SIDECAR();
    ClientOptions o = Options(g_sidecar->Endpoint());
    o.launch_token = "not-the-token-of-this-sidecar";
    Game g(o);
    ASSERT_TRUE(g.client->Start());
    Event e = g.Answer(g.client->Ping(), 20);
    EXPECT_EQ(e.error.code, "forbidden");
    EXPECT_EQ(g.client->State(), ConnectionState::Refused);
}

// A 2 s lease (the shortest) and a client with nothing to say for 3.5 s: its pings keep it, so
// its session is still its own.
TEST(Sidecar, PingsKeepTheLeaseWhileIdle) {
    NEED_SIDECAR();
    ClientOptions o = Options(g_sidecar->Endpoint());
    o.lease_s = 2.0;
    o.owner_key = "cpp-owner-lease-0123456789abcdef";
    Game g(o);
    ASSERT_TRUE(g.client->Start());
    std::string session = g.OpenSession("cpp.lease");
    EXPECT_NEAR(g.client->Info().lease_s, 2.0, 0.01);
    std::this_thread::sleep_for(std::chrono::milliseconds(3500));
    Event list = g.Answer(g.client->ListSessions());
    bool mine = false;
    for (const auto& s : list.body.Find("sessions")->Items())
        mine |= s.GetString("session") == session && s.GetString("owner") == "you";
    EXPECT_TRUE(mine);
    EXPECT_EQ(g.client->Counters().reconnects, 0u);
}

TEST(Sidecar, OverLimitMessageFailsAtOnceUnsent) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    auto start = Clock::now();
    uint64_t id = g.client->Chat("anything", std::string(18u << 20, 'a'), 4);
    Event e = g.Answer(id, 5);
    EXPECT_EQ(e.error.code, igi::errc::kMessageTooLarge);
    EXPECT_LT(Since(start), 2.0);
    EXPECT_EQ(g.Answer(g.client->Ping()).kind, EventKind::Ok);  // the connection is untouched
}

TEST(NoSidecar, RequestsFailUnavailableAfterTheSilenceLimit) {
    ClientOptions o = Options("tcp://127.0.0.1:" + std::to_string(igitest::FreePort()));
    o.silence_s = 1.0;
    Game g(o);
    ASSERT_TRUE(g.client->Start());
    auto start = Clock::now();
    Event e = g.Answer(g.client->Ping(), 10);
    EXPECT_EQ(e.error.code, igi::errc::kUnavailable);
    EXPECT_TRUE(e.error.retryable);
    EXPECT_LT(Since(start), 4.0);
}

// A game loop at 60 FPS: Poll() once a frame, a frame report every frame, two NPCs streaming.
// Poll never waits on the network: its longest call is bounded (1 ms is the target; the bound
// asserted is 5 ms, for a loaded 2-core machine and sanitizer builds).
TEST(Sidecar, SixtyFpsLoopIsNeverBlockedByPoll) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    std::string a = g.OpenSession(), b = g.OpenSession();
    uint64_t ca = g.client->Chat(a, "Tell me about your wares.", 64);
    uint64_t cb = g.client->Chat(b, "Tell me about the weather.", 64);
    std::vector<double> polls;
    std::vector<Event> batch;
    size_t tokens = 0;
    int ended = 0;
    auto start = Clock::now();
    int64_t frame = 0;
    auto next = Clock::now();
    while (Since(start) < 4.0 || (ended < 2 && Since(start) < 60.0)) {
        auto t0 = Clock::now();
        g.client->Poll(batch);
        polls.push_back(Since(t0) * 1000.0);
        for (const auto& e : batch) {
            if (e.kind == EventKind::Token) ++tokens;
            if ((e.kind == EventKind::Done || e.kind == EventKind::Error) && (e.id == ca || e.id == cb)) ++ended;
        }
        g.client->ReportFrame(frame++, 16.6, 16.6);
        next += std::chrono::microseconds(16667);
        std::this_thread::sleep_until(next);
    }
    std::sort(polls.begin(), polls.end());
    double max_ms = polls.back();
    double p99 = polls[polls.size() * 99 / 100];
    std::printf("measured: Poll over %zu frames: median %.4f ms, p99 %.4f ms, max %.4f ms; %zu tokens\n", polls.size(),
                polls[polls.size() / 2], p99, max_ms, tokens);
    EXPECT_EQ(ended, 2);
    EXPECT_GT(tokens, 0u);
    EXPECT_LT(max_ms, 5.0);
    EXPECT_LT(p99, 1.0);
}

// ---- NPC actions (protocol 1.3 tools) --------------------------------------------------------

namespace {

std::vector<igi::ToolSpec> NpcTools() {
    return {
        {"follow", "Follow the player at a distance in metres.",
         "{\"type\":\"object\",\"properties\":{\"distance\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":10}},"
         "\"required\":[\"distance\"],\"additionalProperties\":false}"},
        {"trade", "Offer the player an item for gold.",
         "{\"type\":\"object\",\"properties\":{\"item\":{\"type\":\"string\"},\"price\":{\"type\":\"integer\",\"minimum\":1}},"
         "\"required\":[\"item\",\"price\"],\"additionalProperties\":false}"},
        {"attack", "Attack a target.",
         "{\"type\":\"object\",\"properties\":{\"target\":{\"type\":\"string\",\"enum\":[\"player\",\"wolf\",\"bandit\"]}},"
         "\"required\":[\"target\"],\"additionalProperties\":false}"},
    };
}

// a call of a declared action whose arguments are valid against its schema
void ExpectValidCall(const igi::ToolCall& call) {
    igi::MsgValue args;
    ASSERT_TRUE(call.Arguments(args)) << call.arguments;
    EXPECT_EQ(call.id.rfind("call_", 0), 0u) << call.id;
    if (call.name == "follow") {
        ASSERT_TRUE(args.Find("distance") && args.Find("distance")->IsInt()) << call.arguments;
        EXPECT_GE(args.GetInt("distance"), 1);
        EXPECT_LE(args.GetInt("distance"), 10);
        EXPECT_EQ(args.Size(), 1u);
    } else if (call.name == "trade") {
        ASSERT_TRUE(args.Find("item") && args.Find("item")->IsStr()) << call.arguments;
        ASSERT_TRUE(args.Find("price") && args.Find("price")->IsInt()) << call.arguments;
        EXPECT_GE(args.GetInt("price"), 1);
        EXPECT_EQ(args.Size(), 2u);
    } else if (call.name == "attack") {
        std::string target = args.GetString("target");
        EXPECT_TRUE(target == "player" || target == "wolf" || target == "bandit") << call.arguments;
        EXPECT_EQ(args.Size(), 1u);
    } else {
        ADD_FAILURE() << "a call of an undeclared action: " << call.name;
    }
}

std::vector<Event> Calls(const Game& g, uint64_t id) {
    std::vector<Event> out;
    for (const auto& e : g.events) if (e.kind == EventKind::ToolCall && e.id == id) out.push_back(e);
    return out;
}

// one ToolCall event per call, in order, as the Done event lists them; i counts across tokens and calls
void ExpectCallsOnce(const Game& g, uint64_t id, const Event& end) {
    std::vector<Event> calls = Calls(g, id);
    ASSERT_EQ(calls.size(), end.tool_calls.size());
    std::set<std::string> ids;
    for (size_t k = 0; k < calls.size(); ++k) {
        EXPECT_EQ(calls[k].call.index, static_cast<int>(k));
        EXPECT_EQ(calls[k].call.id, end.tool_calls[k].id);
        EXPECT_EQ(calls[k].call.name, end.tool_calls[k].name);
        EXPECT_EQ(calls[k].call.arguments, end.tool_calls[k].arguments);
        EXPECT_EQ(calls[k].index, static_cast<int64_t>(g.Tokens(id).size() + k + 1));
        ids.insert(calls[k].call.id);
    }
    EXPECT_EQ(ids.size(), calls.size()) << "ids are unique";
}

const double kCallSeconds = 300;  // no event comes until a call is whole: slow on a loaded 2-core machine

}  // namespace

TEST(Sidecar, ToolsRequiredGivesAValidCallOfADeclaredAction) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    std::string session = g.OpenSession("", "You are Brom, a blacksmith in a fantasy game. You can follow the player, trade and attack.");
    igi::ChatOptions o;
    o.max_tokens = 96;
    o.tools = NpcTools();
    o.tool_choice = "required";
    uint64_t chat = g.client->Chat(session, "Follow me to the mill, then we talk about swords.", o);
    Event end = g.Answer(chat, kCallSeconds);
    ASSERT_EQ(end.kind, EventKind::Done) << end.error.code << ": " << end.error.message;
    EXPECT_EQ(end.finish_reason, "tool_calls");
    ASSERT_GE(end.tool_calls.size(), 1u);
    EXPECT_LE(end.tool_calls.size(), static_cast<size_t>(igi::kMaxParallelToolCalls));
    for (const auto& call : end.tool_calls) ExpectValidCall(call);
    ExpectCallsOnce(g, chat, end);
    EXPECT_TRUE(g.Tokens(chat).empty()) << "a reply that is calls streams no text";
    EXPECT_EQ(end.text, "");
    std::printf("measured: required: %zu call(s), the first %s%s\n", end.tool_calls.size(), end.tool_calls[0].name.c_str(),
                end.tool_calls[0].arguments.c_str());
}

TEST(Sidecar, ToolsNamedChoiceCallsThatActionAndAResultGetsAnAnswer) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    std::string session = g.OpenSession("", "You are Brom, a blacksmith in a fantasy game. You can follow the player, trade and attack.");
    igi::ChatOptions o;
    o.max_tokens = 96;
    o.tools = NpcTools();
    o.tool_choice = "trade";
    o.parallel_tool_calls = 0;
    uint64_t chat = g.client->Chat(session, "What would you sell me?", o);
    Event end = g.Answer(chat, kCallSeconds);
    ASSERT_EQ(end.kind, EventKind::Done) << end.error.code << ": " << end.error.message;
    EXPECT_EQ(end.finish_reason, "tool_calls");
    ASSERT_EQ(end.tool_calls.size(), 1u) << "parallel_tool_calls false: one call";
    EXPECT_EQ(end.tool_calls[0].name, "trade");
    ExpectValidCall(end.tool_calls[0]);
    ExpectCallsOnce(g, chat, end);

    // the game does it and says what came of it; the NPC answers in words (choice none)
    igi::ChatOptions then;
    then.max_tokens = 24;
    then.tools = NpcTools();
    then.tool_choice = "none";
    uint64_t answer = g.client->AnswerToolCalls(session, {{end.tool_calls[0].id, "The player bought it."}}, then);
    Event reply = g.Answer(answer, kCallSeconds);
    ExpectWholeStream(g, answer, reply);
    EXPECT_GT(g.Tokens(answer).size(), 0u);
    EXPECT_TRUE(Calls(g, answer).empty());
    EXPECT_TRUE(reply.tool_calls.empty());
    EXPECT_NE(reply.finish_reason, "tool_calls");
    std::printf("measured: trade call %s; answer: \"%s\"\n", end.tool_calls[0].arguments.c_str(), reply.text.c_str());
}

TEST(Sidecar, ToolsInvalidDeclarationsAreRefusedTyped) {
    NEED_SIDECAR();
    Game g(Options(g_sidecar->Endpoint()));
    ASSERT_TRUE(g.client->Start());
    std::string session = g.OpenSession();
    // refused here, unsent
    igi::ChatOptions bad;
    bad.tools = {{"open door", "", ""}};
    Event local = g.Answer(g.client->Chat(session, "Open it.", bad), 5);
    EXPECT_EQ(local.kind, EventKind::Error);
    EXPECT_EQ(local.error.code, igi::errc::kInvalidBody);
    EXPECT_NE(local.error.message.find("tools[0].name"), std::string::npos) << local.error.message;
    EXPECT_FALSE(local.error.retryable);
    EXPECT_EQ(g.Answer(g.client->AnswerToolCalls(session, {}), 5).error.code, igi::errc::kInvalidBody);
    // the same sent raw: the sidecar refuses it with the same code
    for (const char* name : {"open door", "auto"}) {
        igi::MsgValue body = igi::MsgValue::Map();
        body.Set("session", igi::MsgValue::Str(session));
        body.Set("text", igi::MsgValue::Str("Open it."));
        igi::MsgValue tools = igi::MsgValue::Array();
        igi::MsgValue tool = igi::MsgValue::Map();
        tool.Set("name", igi::MsgValue::Str(name));
        tools.Push(std::move(tool));
        body.Set("tools", std::move(tools));
        Event remote = g.Answer(g.client->Request("chat", body), 30);
        EXPECT_EQ(remote.kind, EventKind::Error) << name;
        EXPECT_EQ(remote.error.code, "invalid_body") << name;
    }
    // the session talks on
    Event fine = g.Answer(g.client->Chat(session, "Hello.", 4), 60);
    EXPECT_EQ(fine.kind, EventKind::Done) << fine.error.code;
}
