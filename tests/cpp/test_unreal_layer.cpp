// The plugin's Unreal layer (UIgiSdkSubsystem, UIgiNpcDialogueComponent, FIgiSidecarHost), its
// own .cpp files compiled and linked against the runnable UE stub (ue_stub/UEStubRuntime.cpp)
// and the core, driven against the real sidecar it starts itself (`igi-sdk serve`, the default
// model): a sidecar killed mid-reply, two PIE game instances in one process, EndPlay and session
// slots, a failed restore, a dedicated server, the level-load hook, a line's options, an NPC's
// actions (protocol 1.3 tools: OnAction, AnswerAction, the reply from the result), and
// Mantella's request with its four Advanced Actions over 20 lines (valid calls or text). The
// engine's main loop is this file's: it ticks the core ticker once per "frame". Not run in the
// Unreal Editor: the engine's own classes are the stub's.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "IgiNpcDialogueComponent.h"
#include "IgiSaveGame.h"
#include "IgiSdkSubsystem.h"
#include "IgiSidecarHost.h"

namespace {

using Clock = std::chrono::steady_clock;
double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::string Env(const char* name, const char* fallback) {
    const char* v = std::getenv(name);
    return v ? v : fallback;
}

FString Wide(const std::string& s) { return IgiUnreal::FromUtf8(s); }
std::string Narrow(const FString& s) { return IgiUnreal::ToUtf8(s); }

std::string g_dir;  // this run's project folder (Saved/, the sidecar's saves and log)

// the checkout's sidecar (run from the repository root, as run.sh does), as an absolute path
std::string SidecarPath() {
    std::string path = Env("IGI_UE_SIDECAR", ".venv/bin/igi-sdk");
    char cwd[4096];
    if (!path.empty() && path[0] != '/' && ::getcwd(cwd, sizeof cwd) != nullptr) path = std::string(cwd) + "/" + path;
    return path;
}

// One frame of the game: the engine ticks the core ticker (every subsystem's Tick)
void Frame() {
    FTSTicker::GetCoreTicker().Tick(1.0f / 60.0f);
    std::this_thread::sleep_for(std::chrono::milliseconds(4));
}

bool FramesUntil(const std::function<bool()>& pred, double timeout_s) {
    const auto start = Clock::now();
    while (Since(start) < timeout_s) {
        Frame();
        if (pred()) return true;
    }
    return pred();
}

// A game instance with its world, as UE makes one per PIE player.
struct FGame {
    UGameInstance* Instance = nullptr;
    UWorld* World = nullptr;
    UIgiSdkSubsystem* Sdk = nullptr;

    explicit FGame(const std::function<void(UIgiSdkSubsystem&)>& configure = nullptr) {
        Instance = new UGameInstance();
        World = new UWorld();
        World->StubGameInstance = Instance;
        Sdk = Instance->StubAddSubsystem<UIgiSdkSubsystem>();
        // the project's DefaultGame.ini: the sidecar of this checkout, small and quick on 2 cores
        Sdk->SidecarExecutable = Wide(SidecarPath());
        Sdk->ExtraArguments = Wide("--threads 2 --ctx 2048 --save-dir \"" + g_dir + "/saves\"");
        Sdk->RestartMinSeconds = 0.5f;
        Sdk->RestartMaxSeconds = 4.f;
        if (configure) configure(*Sdk);
        FSubsystemCollectionBase Collection;
        Sdk->Initialize(Collection);
    }
    ~FGame() {
        Sdk->Deinitialize();
        delete World;
        delete Instance;  // deletes its subsystems
    }
    bool Ready(double timeout_s = 120) {
        return FramesUntil([this] { return Sdk->GetConnectionState() == EIgiConnectionState::Ready; }, timeout_s);
    }
};

// An NPC in a world: BeginPlay at once, EndPlay and destruction with End().
struct FNpc {
    UIgiNpcDialogueComponent* C = nullptr;
    FNpc(FGame& game, const std::string& name, bool keep = false,
         const std::function<void(UIgiNpcDialogueComponent&)>& configure = nullptr) {
        C = NewObject<UIgiNpcDialogueComponent>();
        C->StubWorld = game.World;
        C->SessionName = Wide(name);
        C->SystemPrompt = TEXT("You are Brom, a blacksmith. Answer in one short sentence.");
        C->MaxTokens = 8;
        C->bKeepSessionOnEndPlay = keep;
        if (configure) configure(*C);
        C->BeginPlay();
    }
    ~FNpc() { End(); }
    FNpc(const FNpc&) = delete;
    FNpc& operator=(const FNpc&) = delete;
    void End() {
        if (C == nullptr) return;
        C->EndPlay(EEndPlayReason::Destroyed);
        delete C;
        C = nullptr;
    }
    bool Open(double timeout_s = 30) {
        return FramesUntil([this] { return C->IsSessionOpen(); }, timeout_s);
    }
};

// What one line heard.
struct FReply {
    int tokens = 0;
    bool done = false;
    bool failed = false;
    FString text;
    FString finish;
    FIgiError error;
    int64_t prompt_tokens = -1;
    bool Ended() const { return done || failed; }
};

FIgiCallbacks Listen(const std::shared_ptr<FReply>& r, const std::function<void()>& on_first_token = nullptr) {
    FIgiCallbacks cb;
    cb.OnToken = [r, on_first_token](const FString&) {
        if (++r->tokens == 1 && on_first_token) on_first_token();
    };
    cb.OnDoneBody = [r](const igi::MsgValue& body) {
        if (const igi::MsgValue* usage = body.Find("usage")) r->prompt_tokens = usage->GetInt("prompt_tokens", -1);
    };
    cb.OnDone = [r](const FString& text, const FString& finish) { r->done = true; r->text = text; r->finish = finish; };
    cb.OnError = [r](const FIgiError& e) { r->failed = true; r->error = e; };
    return cb;
}

std::shared_ptr<FReply> SayAndWait(FNpc& npc, const std::string& line, double timeout_s = 60,
                                   const FIgiChatOptions* options = nullptr) {
    auto r = std::make_shared<FReply>();
    if (options) npc.C->Say(Wide(line), *options, Listen(r));
    else npc.C->Say(Wide(line), Listen(r));
    FramesUntil([&] { return r->Ended(); }, timeout_s);
    return r;
}

// the sessions the sidecar lists for this game instance: "name(owner) ..."
std::string ListSessions(FGame& game) {
    std::string out;
    bool answered = false;
    FIgiCallbacks cb;
    cb.OnOk = [&](const igi::MsgValue& body) {
        answered = true;
        if (const igi::MsgValue* sessions = body.Find("sessions")) {
            for (const auto& s : sessions->Items()) out += s.GetString("session") + "(" + s.GetString("owner") + ") ";
        }
        out += "free " + std::to_string(body.GetInt("free_slots"));
    };
    cb.OnError = [&](const FIgiError& e) { answered = true; out = "error " + Narrow(e.Code); };
    game.Sdk->Send("list_sessions", igi::MsgValue::Map(), cb);
    FramesUntil([&] { return answered; }, 10);
    return out;
}

std::string Describe(const FReply& r) {
    if (r.failed) return "error " + Narrow(r.error.Code) + ": " + Narrow(r.error.Message);
    if (r.done) return "done (" + Narrow(r.finish) + "): " + Narrow(r.text);
    return "no end";
}

class UnrealLayer : public ::testing::Test {
protected:
    static void SetUpTestSuite() {
        g_dir = Env("IGI_CPP_TMP", "/tmp") + "/ue." + std::to_string(::getpid());
        ::mkdir(g_dir.c_str(), 0700);
        ::mkdir((g_dir + "/saves").c_str(), 0700);
        GStubProjectDir = Wide(g_dir + "/");
        // the sidecars' output, for a failure's diagnosis
        ::setenv("IGI_UE_SIDECAR_LOG", (g_dir + "/sidecar.log").c_str(), 1);
    }
    void TearDown() override {
        if (HasFailure()) {
            std::string tail = "tail -25 '" + g_dir + "/sidecar.log' 1>&2";
            (void)std::system(tail.c_str());
        }
    }
};

// ---- one sidecar per process ----------------------------------------------------------------

TEST_F(UnrealLayer, TwoGameInstancesShareOneSidecarAndBothChat) {
    FIgiSidecarHost& host = FIgiSidecarHost::Get();
    const uint32 generation = host.GetGeneration();
    // PIE with two players: both game instances start in the same frame, before any endpoint
    FGame first, second;
    ASSERT_TRUE(first.Ready()) << Narrow(first.Sdk->LastError.Message);
    ASSERT_TRUE(second.Ready()) << Narrow(second.Sdk->LastError.Message);
    EXPECT_EQ(host.NumUsers(), 2);
    EXPECT_LE(host.GetGeneration(), generation + 1) << "one sidecar started, not one per game instance";
    EXPECT_EQ(first.Sdk->GetClient()->Info().instance, second.Sdk->GetClient()->Info().instance);
    // both hold the launch token: both are the game (the first was refused `forbidden` before)
    EXPECT_TRUE(first.Sdk->GetClient()->Info().game);
    EXPECT_TRUE(second.Sdk->GetClient()->Info().game);

    // the same NPC in both worlds: two conversations, each instance's own
    FNpc a(first, "npc.brom"), b(second, "npc.brom");
    ASSERT_TRUE(a.Open()) << "first instance's NPC";
    ASSERT_TRUE(b.Open()) << "second instance's NPC";
    auto ra = std::make_shared<FReply>(), rb = std::make_shared<FReply>();
    a.C->Say(TEXT("Hello there."), Listen(ra));
    b.C->Say(TEXT("Good morning."), Listen(rb));
    ASSERT_TRUE(FramesUntil([&] { return ra->Ended() && rb->Ended(); }, 90));
    EXPECT_TRUE(ra->done) << Describe(*ra);
    EXPECT_TRUE(rb->done) << Describe(*rb);
    EXPECT_GT(ra->tokens, 0);
    EXPECT_GT(rb->tokens, 0);
}

// ---- EndPlay --------------------------------------------------------------------------------

TEST_F(UnrealLayer, EndPlayClosesSessionsSoNewNpcsFindSlots) {
    FGame game;
    ASSERT_TRUE(game.Ready());
    // 12 NPCs come and go (the model has 8 slots): in threes, some leaving before their session
    // opened (its answer arrives after EndPlay and the session is closed then)
    int n = 0;
    for (int round = 0; round < 4; ++round) {
        std::vector<std::unique_ptr<FNpc>> npcs;
        for (int i = 0; i < 3; ++i) npcs.emplace_back(new FNpc(game, "npc.gone" + std::to_string(n++)));
        if (round % 2 == 0) {
            for (auto& npc : npcs) ASSERT_TRUE(npc->Open()) << "round " << round;
        }
        npcs.clear();  // EndPlay
        Frame();
    }
    ASSERT_EQ(n, 12);
    for (int i = 0; i < 10; ++i) Frame();  // the last closes are answered
    const std::string before = ListSessions(game);
    EXPECT_EQ(before.find("npc.gone"), std::string::npos) << before;
    // 8 more can open: every slot the 12 held is free again
    std::vector<std::unique_ptr<FNpc>> later;
    std::vector<FIgiError> errors;
    for (int i = 0; i < 8; ++i) {
        later.emplace_back(new FNpc(game, "npc.later" + std::to_string(i)));
    }
    for (auto& npc : later) {
        EXPECT_TRUE(npc->Open()) << "NPC " << Narrow(npc->C->SessionName) << " found no slot";
    }
    auto r = SayAndWait(*later.back(), "Hello.");
    EXPECT_TRUE(r->done) << Describe(*r);
}

TEST_F(UnrealLayer, EndPlayWithTheKeepFlagLeavesTheSessionForTheNextComponent) {
    FGame game;
    ASSERT_TRUE(game.Ready());
    {
        FNpc kept(game, "npc.kept", /*keep=*/true);
        ASSERT_TRUE(kept.Open());
        auto r = SayAndWait(kept, "Remember: the password is copper.");
        ASSERT_TRUE(r->done) << Describe(*r);
    }  // EndPlay: kept
    // the sidecar still holds it, as this client's
    auto listed = std::make_shared<igi::MsgValue>();
    bool answered = false;
    FIgiCallbacks cb;
    cb.OnOk = [&](const igi::MsgValue& body) { *listed = body; answered = true; };
    game.Sdk->Send("list_sessions", igi::MsgValue::Map(), cb);
    ASSERT_TRUE(FramesUntil([&] { return answered; }, 10));
    bool found = false;
    if (const igi::MsgValue* sessions = listed->Find("sessions")) {
        for (const auto& s : sessions->Items()) {
            if (s.GetString("session") == "npc.kept") {
                found = true;
                EXPECT_EQ(s.GetString("owner"), "you");
                EXPECT_GT(s.GetInt("tokens"), 0) << "the conversation is in it";
            }
        }
    }
    EXPECT_TRUE(found) << "npc.kept was closed at EndPlay";
    // the next component of that name takes it over (adopt) and goes on
    FNpc again(game, "npc.kept");
    ASSERT_TRUE(again.Open());
    EXPECT_EQ(Narrow(again.C->GetSessionId()), "npc.kept");
    auto r = SayAndWait(again, "What was the password?");
    EXPECT_TRUE(r->done) << Describe(*r);
}

// ---- restore ----------------------------------------------------------------------------------

TEST_F(UnrealLayer, AFailedRestoreKeepsTheLiveConversation) {
    FGame game;
    ASSERT_TRUE(game.Ready());
    FNpc npc(game, "npc.restore");
    ASSERT_TRUE(npc.Open());
    auto first = SayAndWait(npc, "My name is Ada.");
    ASSERT_TRUE(first->done) << Describe(*first);

    UIgiSaveGame* save = NewObject<UIgiSaveGame>();
    save->NpcSaves.Add(TEXT("npc.restore"), TEXT("slot1.no-such-save"));
    bool failed = false, ok = false;
    FIgiError error;
    FIgiCallbacks cb;
    cb.OnOk = [&](const igi::MsgValue&) { ok = true; };
    cb.OnError = [&](const FIgiError& e) { failed = true; error = e; };
    npc.C->RestoreFromSaveGame(save, cb);
    ASSERT_TRUE(FramesUntil([&] { return failed || ok; }, 20));
    EXPECT_TRUE(failed);
    EXPECT_EQ(Narrow(error.Code), "unknown_save");
    // the live session is untouched and answers, its conversation read from the cache
    EXPECT_TRUE(npc.C->IsSessionOpen());
    EXPECT_EQ(Narrow(npc.C->GetSessionId()), "npc.restore");
    auto after = SayAndWait(npc, "What is my name?");
    EXPECT_TRUE(after->done) << Describe(*after);

    // a restore that works replaces it (through the pair's other name), and again back
    bool saved = false;
    FIgiCallbacks scb;
    scb.OnOk = [&](const igi::MsgValue&) { saved = true; };
    scb.OnError = [&](const FIgiError& e) { ADD_FAILURE() << Narrow(e.Code) << ": " << Narrow(e.Message); saved = true; };
    npc.C->SaveToSaveGame(save, TEXT("slot1"), scb);
    ASSERT_TRUE(FramesUntil([&] { return saved; }, 20));
    ASSERT_NE(save->NpcSaves.Find(TEXT("npc.restore")), nullptr);
    for (const char* expected : {"npc.restore.b", "npc.restore"}) {
        ok = failed = false;
        npc.C->RestoreFromSaveGame(save, cb);
        ASSERT_TRUE(FramesUntil([&] { return failed || ok; }, 20));
        ASSERT_TRUE(ok) << Narrow(error.Code) << ": " << Narrow(error.Message);
        EXPECT_EQ(Narrow(npc.C->GetSessionId()), expected);
        auto r = SayAndWait(npc, "And now?");
        EXPECT_TRUE(r->done) << Describe(*r);
    }
    delete save;
}

// ---- dedicated servers --------------------------------------------------------------------------

TEST_F(UnrealLayer, ADedicatedServerStartsNoSidecarUnlessAsked) {
    FIgiSidecarHost& host = FIgiSidecarHost::Get();
    const int32 users = host.NumUsers();
    GStubIsDedicatedServer = true;
    {
        FGame server;
        EXPECT_EQ(host.NumUsers(), users) << "the server became a user of the sidecar";
        EXPECT_EQ(server.Sdk->GetClient(), nullptr);
        EXPECT_EQ(server.Sdk->GetConnectionState(), EIgiConnectionState::Closed);
        EXPECT_EQ(Narrow(server.Sdk->LastError.Code), "disabled_on_server");
        // an NPC on the server fails its line at once, typed; a level load goes ahead at once
        FNpc npc(server, "npc.server");
        auto r = std::make_shared<FReply>();
        npc.C->Say(TEXT("Hello."), Listen(r));
        Frame();
        EXPECT_TRUE(r->failed);
        bool loaded = false;
        server.Sdk->BeginLevelLoad(1 << 20, 30, [&](const FIgiLevelLoadResult& result) {
            loaded = true;
            EXPECT_EQ(result.Outcome, EIgiLevelLoadOutcome::NoSidecar);
        });
        EXPECT_TRUE(loaded);
    }
    {
        FGame asked([](UIgiSdkSubsystem& s) { s.bStartOnDedicatedServer = true; });
        EXPECT_TRUE(asked.Ready());
    }
    GStubIsDedicatedServer = false;
}

// ---- the level-load hook ----------------------------------------------------------------------

TEST_F(UnrealLayer, BeginLevelLoadAnswersOnceWithATypedResult) {
    FGame game;
    ASSERT_TRUE(game.Ready());
    int answers = 0;
    FIgiLevelLoadResult got;
    game.Sdk->BeginLevelLoad(256ll << 20, 120, [&](const FIgiLevelLoadResult& result) {
        ++answers;
        got = result;
    });
    ASSERT_TRUE(FramesUntil([&] { return answers > 0; }, 10));
    // a sidecar on the CPU holds no VRAM: granted at once, well within the deadline
    EXPECT_EQ(got.Outcome, EIgiLevelLoadOutcome::Granted) << Narrow(got.Error.Code) << ": " << Narrow(got.Error.Message);
    EXPECT_LT(got.FramesWaited, 120);
    for (int i = 0; i < 30; ++i) Frame();
    EXPECT_EQ(answers, 1);
}

// ---- a line's options -------------------------------------------------------------------------

TEST_F(UnrealLayer, GrammarSchemaSamplingStopAndImagesReachTheSidecar) {
    FGame game;
    ASSERT_TRUE(game.Ready());
    FNpc npc(game, "npc.options", false, [](UIgiNpcDialogueComponent& c) {
        c.Sampling.Temperature = 0.f;
        c.Sampling.Seed = 7;
    });
    ASSERT_TRUE(npc.Open());

    FIgiChatOptions grammar;
    grammar.Grammar = TEXT("root ::= \"yes\" | \"no\"");
    grammar.MaxTokens = 4;
    auto g = SayAndWait(npc, "Are you a blacksmith?", 60, &grammar);
    ASSERT_TRUE(g->done) << Describe(*g);
    EXPECT_TRUE(g->text == TEXT("yes") || g->text == TEXT("no")) << Narrow(g->text);

    FIgiChatOptions schema;
    schema.JsonSchema = TEXT("{\"type\":\"object\",\"properties\":{\"mood\":{\"type\":\"string\",\"enum\":[\"calm\",\"angry\"]}},\"required\":[\"mood\"]}");
    schema.MaxTokens = 24;
    auto j = SayAndWait(npc, "How do you feel?", 60, &schema);
    ASSERT_TRUE(j->done) << Describe(*j);
    EXPECT_NE(Narrow(j->text).find("\"mood\""), std::string::npos) << Narrow(j->text);

    // a stop string that the grammar's only reply holds ends the reply there, unsaid
    FIgiChatOptions stop;
    stop.Grammar = TEXT("root ::= \"forge hammer\"");
    stop.Stop.Add(TEXT(" hammer"));
    stop.MaxTokens = 8;
    auto s = SayAndWait(npc, "What do you hold?", 60, &stop);
    ASSERT_TRUE(s->done) << Describe(*s);
    EXPECT_EQ(Narrow(s->finish), "stop_string");
    EXPECT_EQ(Narrow(s->text), "forge");

    // an image goes as the file's bytes; this model has no vision projector: refused, typed
    static const uint8 kPng[] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    FIgiChatOptions image;
    FIgiImage picture;
    for (uint8 byte : kPng) picture.Data.Add(byte);
    image.Images.Add(picture);
    auto i = SayAndWait(npc, "What is this?", 60, &image);
    ASSERT_TRUE(i->failed) << Describe(*i);
    EXPECT_TRUE(i->error.Code == TEXT("vision_unavailable") || i->error.Code == TEXT("invalid_image")) << Narrow(i->error.Code);

    // sampling reaches open_session: a temperature out of range is refused by the sidecar
    FNpc hot(game, "npc.hot", false, [](UIgiNpcDialogueComponent& c) { c.Sampling.Temperature = 9.f; });
    auto h = SayAndWait(hot, "Hello.", 20);
    ASSERT_TRUE(h->failed) << Describe(*h);
    EXPECT_EQ(Narrow(h->error.Code), "invalid_body") << Narrow(h->error.Message);
}

// ---- NPC actions (protocol 1.3 tools) ---------------------------------------------------------

// What a game's Blueprint would bind to OnAction: it records the call, does it, and answers.
class UActionListener : public UObject {
public:
    UIgiNpcDialogueComponent* Npc = nullptr;
    std::vector<FIgiActionCall> Calls;
    std::vector<std::string> Order;
    bool bAnswered = false;
    void HandleAction(const FIgiActionCall& Call) {
        Calls.push_back(Call);
        Order.push_back("action " + Narrow(Call.Name));
        bAnswered = Npc->AnswerAction(Call.CallId, TEXT("Done: ") + Call.Name);
    }
    void HandleDone(const FString&, const FString& Finish) { Order.push_back("done " + Narrow(Finish)); }
    void HandleError(const FIgiError& Error) { Order.push_back("error " + Narrow(Error.Code)); }
};

// An action as a game declares it: a name, what it does, its parameters' JSON Schema.
FIgiAction MakeAction(const char* name, const char* description, const char* schema) {
    FIgiAction a;
    a.Name = Wide(name);
    a.Description = Wide(description);
    a.ParametersJson = Wide(schema);
    return a;
}

TEST_F(UnrealLayer, AnNpcActsTheGameAnswersAndTheNpcRepliesFromTheResult) {
    FGame game;
    ASSERT_TRUE(game.Ready());
    FNpc npc(game, "npc.actions", false, [&](UIgiNpcDialogueComponent& c) {
        c.SystemPrompt = TEXT("You are Brom, a blacksmith in a fantasy game. You can follow the player, trade and attack.");
        c.Sampling.Temperature = 0.f;
        c.MaxTokens = 32;
        c.Actions.Add(MakeAction("follow", "Follow the player.",
            "{\"type\":\"object\",\"properties\":{\"distance\":{\"type\":\"integer\",\"minimum\":1,\"maximum\":10}},\"required\":[\"distance\"]}"));
        c.Actions.Add(MakeAction("trade", "Offer the player an item for gold.",
            "{\"type\":\"object\",\"properties\":{\"item\":{\"type\":\"string\"},\"price\":{\"type\":\"integer\",\"minimum\":1}},\"required\":[\"item\",\"price\"]}"));
        c.Actions.Add(MakeAction("attack", "Attack a target.",
            "{\"type\":\"object\",\"properties\":{\"target\":{\"type\":\"string\",\"enum\":[\"player\",\"wolf\",\"bandit\"]}},\"required\":[\"target\"]}"));
        c.ActionChoice = TEXT("required");
        c.bParallelActions = false;
    });
    ASSERT_TRUE(npc.Open());
    UActionListener* listener = NewObject<UActionListener>();
    listener->Npc = npc.C;
    npc.C->OnAction.AddDynamic(listener, &UActionListener::HandleAction);
    npc.C->OnDone.AddDynamic(listener, &UActionListener::HandleDone);
    npc.C->OnError.AddDynamic(listener, &UActionListener::HandleError);

    npc.C->Say(TEXT("Follow me to the mill, smith."));
    // the reply that acts (its call answered from OnAction), then the one from the result
    FramesUntil([&] { return listener->Order.size() >= 3; }, 300);
    std::string order;
    for (const auto& o : listener->Order) order += o + "; ";
    ASSERT_EQ(listener->Calls.size(), 1u) << order;
    const FIgiActionCall& call = listener->Calls[0];
    const std::string name = Narrow(call.Name);
    EXPECT_TRUE(name == "follow" || name == "trade" || name == "attack") << name;
    EXPECT_EQ(Narrow(call.CallId).rfind("call_", 0), 0u);
    igi::ToolCall parsed;
    parsed.arguments = Narrow(call.ArgumentsJson);
    igi::MsgValue args;
    EXPECT_TRUE(parsed.Arguments(args)) << parsed.arguments;
    EXPECT_TRUE(listener->bAnswered) << "answered from OnAction, during the reply";
    ASSERT_EQ(listener->Order.size(), 3u) << order;
    EXPECT_EQ(listener->Order[0], "action " + name);
    EXPECT_EQ(listener->Order[1], "done tool_calls");
    EXPECT_TRUE(listener->Order[2] == "done stop" || listener->Order[2] == "done length") << order;
    EXPECT_EQ(npc.C->GetLastActionCalls().Num(), 0) << "the reply after the result only talked (choice none)";
    EXPECT_EQ(npc.C->GetUnansweredActions().Num(), 0);

    // a broken declaration: the line fails typed, unsent; a call nobody made cannot be answered
    npc.C->Actions.Add(MakeAction("open door", "", ""));
    npc.C->Say(TEXT("Open the door."));
    FramesUntil([&] { return listener->Order.size() >= 4; }, 10);
    ASSERT_GE(listener->Order.size(), 4u);
    EXPECT_EQ(listener->Order[3], "error invalid_body");
    EXPECT_FALSE(npc.C->AnswerAction(TEXT("call_nope"), TEXT("x")));
    EXPECT_EQ(listener->Order.back(), "error unknown_action_call");
    std::printf("measured: the NPC called %s%s\n", name.c_str(), parsed.arguments.c_str());
    delete listener;
}

// ---- Mantella's request: its Advanced Actions, tool_choice auto, 20 lines --------------------

// What a game's Blueprint would bind for Mantella's NPC: each call, each reply's end, errors.
class UMantellaListener : public UObject {
public:
    std::vector<FIgiActionCall> Calls;
    std::vector<std::pair<std::string, std::string>> Replies;  // (text, finish reason)
    std::vector<std::string> Errors;
    void HandleAction(const FIgiActionCall& Call) { Calls.push_back(Call); }
    void HandleDone(const FString& Text, const FString& Finish) { Replies.emplace_back(Narrow(Text), Narrow(Finish)); }
    void HandleError(const FIgiError& Error) { Errors.push_back(Narrow(Error.Code) + ": " + Narrow(Error.Message)); }
};

// The actions as Mantella's function manager declares them (its own "scope" keys in the
// properties; Inventory takes no parameters).
TArray<FIgiAction> MantellaActions() {
    TArray<FIgiAction> out;
    out.Add(MakeAction("Follow", "Start following the player.",
        "{\"type\": \"object\", \"properties\": {\"source\": {\"type\": \"string\", \"description\": \"Who follows: one of Lydia\", "
        "\"scope\": \"conversation\"}}, \"required\": [\"source\"]}"));
    out.Add(MakeAction("Attack", "Attack someone nearby.",
        "{\"type\": \"object\", \"properties\": {\"source\": {\"type\": \"string\", \"scope\": \"conversation\"}, "
        "\"target\": {\"type\": \"string\", \"description\": \"Who is attacked: a nearby NPC\", \"scope\": \"nearby_w_player\"}}, "
        "\"required\": [\"source\", \"target\"]}"));
    out.Add(MakeAction("Inventory", "Open your inventory to trade with the player.", ""));
    out.Add(MakeAction("Wait", "Wait here.",
        "{\"type\": \"object\", \"properties\": {\"minutes\": {\"type\": \"integer\", \"minimum\": 1, \"maximum\": 120}}, "
        "\"required\": [\"minutes\"]}"));
    return out;
}

// What is wrong with a call against the four schemas (empty: nothing). Each object is closed (no
// keys besides its properties) and every property is required: Follow a string source, Attack
// string source and target, Inventory nothing, Wait an integer 1..120 (5.0 is an integer to JSON
// Schema).
std::string MantellaCallProblem(const FIgiActionCall& call) {
    const std::string name = Narrow(call.Name);
    igi::ToolCall parsed;
    parsed.arguments = Narrow(call.ArgumentsJson);
    igi::MsgValue args;
    if (!parsed.Arguments(args) || !args.IsMap()) return "arguments are not a JSON object: " + parsed.arguments;
    std::vector<const char*> strings;
    if (name == "Follow") strings = {"source"};
    else if (name == "Attack") strings = {"source", "target"};
    else if (name == "Inventory") strings = {};
    else if (name != "Wait") return "undeclared action " + name;
    const size_t expected = name == "Wait" ? 1 : strings.size();
    if (args.Size() != expected) return name + " takes " + std::to_string(expected) + " arguments: " + parsed.arguments;
    if (name == "Wait") {
        const igi::MsgValue* minutes = args.Find("minutes");
        if (minutes == nullptr) return "Wait without minutes: " + parsed.arguments;
        const bool number = minutes->IsInt() || minutes->Type() == igi::MsgType::Float;
        const double value = minutes->AsDouble();
        if (!number) return "Wait's minutes is not a number: " + parsed.arguments;
        if (!(value >= 1 && value <= 120)) return "Wait's minutes outside 1..120: " + parsed.arguments;
        return value == static_cast<double>(static_cast<int64_t>(value)) ? std::string() : "Wait's minutes is not an integer: " + parsed.arguments;
    }
    for (const char* key : strings) {
        const igi::MsgValue* v = args.Find(key);
        if (v == nullptr) return name + " without " + key + ": " + parsed.arguments;
        if (!v->IsStr()) return name + "'s " + key + " is not a string: " + parsed.arguments;
    }
    return std::string();
}

TEST_F(UnrealLayer, MantellasActionsOver20LinesAreValidCallsOrTextAndTheResultIsAnswered) {
    FGame game;  // the process's sidecar, already started by the tests before
    ASSERT_TRUE(game.Ready());
    static const char* const kLines[] = {"Follow me, Lydia.", "Attack that bandit!", "Let's trade.", "Wait here for me.",
                                         "How are you today?"};
    int calls = 0, text = 0, invalid = 0, followed = 0;
    std::string problems;
    for (int k = 0; k < 20; ++k) {
        // an NPC per line: the seed goes with the session (open_session's sampling)
        FNpc npc(game, "npc.lydia" + std::to_string(k), false, [k](UIgiNpcDialogueComponent& c) {
            c.SystemPrompt = TEXT("You are Lydia, a Nord housecarl in Whiterun. You are talking with the Dragonborn. "
                                  "Speak briefly, in character.");
            c.Sampling.Temperature = 0.9f;
            c.Sampling.Seed = 100 + k;
            c.MaxTokens = 64;
            c.ChatOptions.Stop.Add(TEXT("\n"));  // a spoken line ends at its newline; a call is never cut by it
            c.Actions = MantellaActions();
        });
        UMantellaListener* listener = NewObject<UMantellaListener>();
        npc.C->OnAction.AddDynamic(listener, &UMantellaListener::HandleAction);
        npc.C->OnDone.AddDynamic(listener, &UMantellaListener::HandleDone);
        npc.C->OnError.AddDynamic(listener, &UMantellaListener::HandleError);
        const std::string line = kLines[k % 5];
        npc.C->Say(Wide(line));  // sent once its session is open
        ASSERT_TRUE(FramesUntil([&] { return !listener->Replies.empty() || !listener->Errors.empty(); }, 420))
            << "line " << k << ": no reply";

        std::string problem;
        TArray<FIgiActionCall> ended = npc.C->GetLastActionCalls();
        if (!listener->Errors.empty()) {
            problem = listener->Errors[0];
        } else if (ended.Num() > 0) {
            if (!listener->Replies[0].first.empty()) problem = "text with calls: " + listener->Replies[0].first;
            for (const FIgiActionCall& call : ended) {
                if (problem.empty()) problem = MantellaCallProblem(call);
            }
            // OnAction raised each call once, in order, before OnDone
            EXPECT_EQ(listener->Calls.size(), static_cast<size_t>(ended.Num())) << "line " << k;
            for (size_t i = 0; i < listener->Calls.size() && i < static_cast<size_t>(ended.Num()); ++i) {
                EXPECT_EQ(Narrow(listener->Calls[i].CallId), Narrow(ended[static_cast<int32>(i)].CallId)) << "line " << k;
            }
        } else {
            const std::string& said = listener->Replies[0].first;
            if (said.find_first_not_of(" \t\r\n") == std::string::npos || said.find("<tool_call>") != std::string::npos) {
                problem = "neither text nor a call: '" + said + "' (" + listener->Replies[0].second + ")";
            }
        }
        if (!problem.empty()) {
            ++invalid;
            problems += "line " + std::to_string(k) + " (" + line + "): " + problem + "\n";
        } else if (ended.Num() > 0) {
            ++calls;
        } else {
            ++text;
        }

        // the game does the first replies' actions and says what came of them, as Mantella
        // sends tool messages: the NPC goes on in words
        if (problem.empty() && ended.Num() > 0 && followed < 2) {
            ++followed;
            for (const FIgiActionCall& call : ended) {
                EXPECT_TRUE(npc.C->AnswerAction(call.CallId, TEXT("done"))) << "line " << k;
            }
            ASSERT_TRUE(FramesUntil([&] { return listener->Replies.size() > 1 || !listener->Errors.empty(); }, 420))
                << "line " << k << ": no reply after the results";
            ASSERT_TRUE(listener->Errors.empty()) << listener->Errors[0];
            const std::string& after = listener->Replies[1].first;
            EXPECT_NE(after.find_first_not_of(" \t\r\n"), std::string::npos)
                << "line " << k << ": the reply after the results (" << listener->Replies[1].second << ")";
            EXPECT_EQ(npc.C->GetLastActionCalls().Num(), 0) << "line " << k << ": choice after results none";
            std::printf("measured: Unreal NPC line %d called %s%s; after the result it said: %s\n", k,
                        Narrow(ended[0].Name).c_str(), Narrow(ended[0].ArgumentsJson).c_str(), after.c_str());
        }
        npc.End();  // its session closed: the next NPC opens its own
        delete listener;
    }
    std::printf("measured: Unreal UIgiNpcDialogueComponent, Mantella's 4 actions over 20 lines: %d call, %d text, %d invalid; "
                "%d answered with AnswerAction and continued in words\n", calls, text, invalid, followed);
    EXPECT_EQ(invalid, 0) << problems;
    EXPECT_EQ(calls + text, 20);
}

// ---- crash recovery (last: it replaces the process's sidecar) ----------------------------------

TEST_F(UnrealLayer, ASidecarKilledMidReplyIsRestartedAndTheNpcComesBack) {
    FIgiSidecarHost& host = FIgiSidecarHost::Get();
    FGame game;
    ASSERT_TRUE(game.Ready());
    ASSERT_TRUE(FramesUntil([&] { return game.Sdk->GetSidecarGeneration() > 0; }, 5));
    const int32 generation = game.Sdk->GetSidecarGeneration();
    const int32 restarts = game.Sdk->GetSidecarRestarts();

    FNpc npc(game, "npc.ada");
    ASSERT_TRUE(npc.Open());
    EXPECT_EQ(npc.C->GetSessionGeneration(), generation);
    auto first = SayAndWait(npc, "My name is Ada and I buy swords.");
    ASSERT_TRUE(first->done) << Describe(*first);

    // the baseline: the same question in a fresh conversation reads this many prompt tokens
    FNpc fresh(game, "npc.fresh");
    ASSERT_TRUE(fresh.Open());
    auto baseline = SayAndWait(fresh, "What is my name?");
    ASSERT_TRUE(baseline->done) << Describe(*baseline);
    ASSERT_GT(baseline->prompt_tokens, 0);
    fresh.End();

    // a long reply; the sidecar is killed (SIGKILL: no goodbye, no flush) at its first token
    const uint32 pid = host.GetPid();
    ASSERT_GT(pid, 0u);
    Clock::time_point killed_at;
    auto cut = std::make_shared<FReply>();
    FIgiChatOptions long_reply;
    long_reply.MaxTokens = 400;
    npc.C->Say(TEXT("Tell me a long story about your forge."), long_reply, Listen(cut, [&] {
        killed_at = Clock::now();
        ::kill(static_cast<pid_t>(pid), SIGKILL);
    }));
    ASSERT_TRUE(FramesUntil([&] { return cut->Ended(); }, 60)) << "the cut reply never ended";
    // it ends with a typed, retryable error, before the client's own silence rule would have
    // ended it (the only end it had before: `unavailable` after silence_s, 5 s)
    ASSERT_TRUE(cut->failed) << Describe(*cut);
    EXPECT_EQ(Narrow(cut->error.Code), "unavailable");
    EXPECT_TRUE(cut->error.bRetryable);
    const double ended_after = Since(killed_at);
    EXPECT_LT(ended_after, igi::ClientOptions().silence_s);

    // started again after its back-off (0.5 s, the first delay), once
    ASSERT_TRUE(FramesUntil([&] { return host.GetRestarts() > restarts; }, 10)) << "not started again";
    const double down_for = host.GetLastLaunchTime() - host.GetLastDeathTime();
    EXPECT_GE(down_for, 0.5 - 0.01);
    EXPECT_LT(down_for, 0.5 + 1.0);
    EXPECT_NE(host.GetPid(), pid);
    std::printf("measured: the cut reply ended %.3f s after the kill; the sidecar was started again %.3f s after its exit was seen\n",
                ended_after, down_for);

    // the client reconnects there; the NPC is opened again, in a session of the new sidecar,
    // with the conversation it had
    ASSERT_TRUE(FramesUntil([&] { return game.Sdk->GetSidecarGeneration() > generation && npc.C->IsSessionOpen()
                                         && npc.C->GetSessionGeneration() == game.Sdk->GetSidecarGeneration(); }, 120))
        << "state " << static_cast<int>(game.Sdk->GetConnectionState()) << ", " << Narrow(game.Sdk->LastError.Message);
    EXPECT_EQ(npc.C->GetRecoveries(), 1);
    EXPECT_EQ(game.Sdk->GetSidecarRestarts(), restarts + 1);
    auto answer = SayAndWait(npc, "What is my name?");
    ASSERT_TRUE(answer->done) << Describe(*answer);
    EXPECT_GT(answer->tokens, 0);
    // the first line after the crash carried the earlier turns: more prompt than a fresh start
    EXPECT_GT(answer->prompt_tokens, baseline->prompt_tokens);
}

}  // namespace
