// Frame reports on the game thread's tick: ReportFrame allocates nothing (counted by replacing the
// global operator new in this binary, on the calling thread only) and does not wake the I/O
// thread every frame (counted by a socket that wraps the real BSD socket and counts Wake()),
// while every report still reaches the real sidecar (its stats.last_frame). The direct encoding
// is the same bytes as EncodeEnvelope(id, "frame", FrameBody(...)).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "IgiClient.h"
#include "sidecar.h"

namespace {

// allocations made by this thread while counting is on
thread_local bool t_counting = false;
thread_local uint64_t t_allocations = 0;

void* Allocate(std::size_t n) {
    if (t_counting) ++t_allocations;
    void* p = std::malloc(n == 0 ? 1 : n);
    return p;
}

}  // namespace

// Every replaceable allocation form funnels into the counter. No exceptions in this build: a
// failed allocation aborts, as Unreal's allocator does.
void* operator new(std::size_t n) {
    void* p = Allocate(n);
    if (!p) std::abort();
    return p;
}
void* operator new[](std::size_t n) {
    void* p = Allocate(n);
    if (!p) std::abort();
    return p;
}
void* operator new(std::size_t n, const std::nothrow_t&) noexcept { return Allocate(n); }
void* operator new[](std::size_t n, const std::nothrow_t&) noexcept { return Allocate(n); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }

namespace {

using Clock = std::chrono::steady_clock;
using igi::Client;
using igi::ClientOptions;
using igi::ConnectionState;
using igi::Event;
using igi::EventKind;

const char* const kToken = "cpp-frames-launch-token-0123456789";

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// The real BSD socket, counting the wake-ups asked of it and the waits it returns from.
class CountingSocket final : public igi::ISocket {
public:
    CountingSocket(std::atomic<uint64_t>* wakes, std::atomic<uint64_t>* recvs)
        : inner_(igi::MakeBsdSocket()), wakes_(wakes), recvs_(recvs) {}
    bool Connect(const std::string& host, uint16_t port, int timeout_ms, std::string& error) override {
        return inner_->Connect(host, port, timeout_ms, error);
    }
    bool SendAll(const uint8_t* data, size_t n, int timeout_ms) override { return inner_->SendAll(data, n, timeout_ms); }
    int Recv(uint8_t* buffer, size_t capacity, int timeout_ms) override {
        ++*recvs_;
        return inner_->Recv(buffer, capacity, timeout_ms);
    }
    void Wake() override {
        ++*wakes_;
        inner_->Wake();
    }
    void Close() override { inner_->Close(); }

private:
    std::unique_ptr<igi::ISocket> inner_;
    std::atomic<uint64_t>* wakes_;
    std::atomic<uint64_t>* recvs_;
};

// one sidecar for this file's tests, launched on first use, stopped when the process exits
igitest::Sidecar* FramesSidecar() {
    static std::unique_ptr<igitest::Sidecar> sidecar = [] {
        std::unique_ptr<igitest::Sidecar> s(new igitest::Sidecar(kToken));
        std::string error;
        if (!s->Launch(error)) {
            std::fprintf(stderr, "%s\n", error.c_str());
            s.reset();
        }
        return s;
    }();
    return sidecar.get();
}

struct Connected {
    std::atomic<uint64_t> wakes{0}, recvs{0};
    std::unique_ptr<Client> client;
    std::vector<Event> events, batch;

    bool Start() {
        igitest::Sidecar* sidecar = FramesSidecar();
        if (!sidecar) return false;
        ClientOptions o;
        o.endpoint = sidecar->Endpoint();
        o.client_name = "cpp-frames";
        o.launch_token = kToken;
        o.socket_factory = [this]() { return std::unique_ptr<igi::ISocket>(new CountingSocket(&wakes, &recvs)); };
        client.reset(new Client(o));
        if (!client->Start()) return false;
        auto start = Clock::now();
        while (client->State() != ConnectionState::Ready && Since(start) < 20)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return client->State() == ConnectionState::Ready;
    }

    // the frame number the sidecar last got from this game (-1: none yet)
    int64_t LastFrame() {
        uint64_t id = client->Stats();
        auto start = Clock::now();
        while (Since(start) < 10) {
            client->Poll(batch);
            for (const auto& e : batch) {
                if (e.id != id) continue;
                if (e.kind != EventKind::Ok) return -2;
                const igi::MsgValue* last = e.body.Find("last_frame");
                return last && last->IsMap() ? last->GetInt("frame", -1) : -1;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(2));
        }
        return -3;
    }

    // waits until the sidecar's last frame is `want`
    bool Delivered(int64_t want, double timeout_s = 5) {
        auto start = Clock::now();
        int64_t seen = -1;
        while (Since(start) < timeout_s) {
            seen = LastFrame();
            if (seen == want) return true;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        ADD_FAILURE() << "the sidecar's last frame is " << seen << ", not " << want;
        return false;
    }
};

}  // namespace

TEST(Frames, EnvelopeIsEncodeEnvelopeOfFrameBody) {
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double inf = std::numeric_limits<double>::infinity();
    struct Case { int64_t frame; double ms, target; int64_t used, budget; int busy; double share; };
    const Case cases[] = {
        {0, 16.6, 0, -1, -1, -1, -1},
        {1, 16.6, 16.6, -1, -1, -1, -1},
        {42, 8.3, 8.3, 1ll << 30, 8ll << 30, 3, 0.25},
        {-5, nan, -1, -7, -7, -7, nan},                 // clamped or left out
        {1ll << 40, 1e9, 5000, 0, 0, 100000, 7.0},      // clamped to the ranges
        {7, -3, inf, -1, 1ll << 33, 0, inf},
        {9007199254740991ll, 0, 1e-9, -1, -1, 4096, 0.0},
    };
    // ids of every width the protocol allows (up to 2^53 - 1)
    const uint64_t ids[] = {1, 200, 70000, 1ull << 31, 1ull << 40, (1ull << 53) - 1, 5};
    static_assert(sizeof(ids) / sizeof(ids[0]) == sizeof(cases) / sizeof(cases[0]), "an id per case");
    for (size_t k = 0; k < sizeof(ids) / sizeof(ids[0]); ++k) {
        const Case& c = cases[k];
        const uint64_t id = ids[k];
        std::string direct;
        igi::AppendFrameEnvelope(direct, id, c.frame, c.ms, c.target, c.used, c.budget, c.busy, c.share);
        std::string built = igi::EncodeEnvelope(id, "frame", igi::FrameBody(c.frame, c.ms, c.target, c.used, c.budget, c.busy, c.share));
        EXPECT_EQ(direct, built) << "frame " << c.frame;
        EXPECT_LE(direct.size(), 256u);
        uint64_t got_id = 0;
        std::string type;
        igi::MsgValue body;
        ASSERT_TRUE(igi::DecodeEnvelope(direct, got_id, type, body));
        EXPECT_EQ(got_id, id);
        EXPECT_EQ(type, "frame");
    }
}

// After the first reports (none is needed: the buffers are sized when the client is made),
// ReportFrame allocates nothing on the calling thread, at a game's pace and in bursts, while
// the I/O thread takes the reports away; the last one reaches the sidecar.
TEST(Frames, ReportFrameAllocatesNothing) {
    Connected c;
    ASSERT_TRUE(c.Start());
    int64_t frame = 0;
    for (; frame < 8; ++frame) c.client->ReportFrame(frame, 16.6, 16.6);
    uint64_t allocations = 0;
    const int kCalls = 600;
    for (int i = 0; i < kCalls; ++i, ++frame) {
        t_allocations = 0;
        t_counting = true;
        c.client->ReportFrame(frame, 16.6, 16.6, 1ll << 30, 8ll << 30, 3, 0.5);
        t_counting = false;
        allocations += t_allocations;
        // bursts of 40 reports (more than the queue holds), then a pause the I/O thread uses
        if (i % 40 == 39) std::this_thread::sleep_for(std::chrono::milliseconds(15));
        else if (i % 3 == 0) std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    std::printf("measured: %llu allocations in %d ReportFrame calls\n", static_cast<unsigned long long>(allocations), kCalls);
    EXPECT_EQ(allocations, 0u);
    EXPECT_TRUE(c.Delivered(frame - 1));
    c.client->Stop();
}

// A game reporting every frame does not wake the I/O thread every frame: reports wait for its
// next wake (at most kFrameFlushMs for a report that finds one waiting that long). 300 reports
// at 120 FPS ask for few wakes; every one arrives (the last one, and none is sent twice or out
// of order: the sidecar keeps the last it got).
TEST(Frames, ReportsDoNotWakeTheIoThreadEachFrame) {
    Connected c;
    ASSERT_TRUE(c.Start());
    const int kFrames = 300;
    uint64_t wakes_before = c.wakes.load();
    auto start = Clock::now();
    auto next = Clock::now();
    for (int frame = 0; frame < kFrames; ++frame) {
        c.client->ReportFrame(frame, 8.3, 8.3);
        next += std::chrono::microseconds(8333);
        std::this_thread::sleep_until(next);
    }
    double seconds = Since(start);
    uint64_t wakes = c.wakes.load() - wakes_before;
    std::printf("measured: %d frame reports in %.2f s asked for %llu I/O-thread wake-ups\n", kFrames, seconds,
                static_cast<unsigned long long>(wakes));
    // at most one per kFrameFlushMs window (plus one for the window a slow machine splits)
    EXPECT_LE(wakes, static_cast<uint64_t>(seconds * 1000.0 / igi::kFrameFlushMs) + 2);
    EXPECT_LT(wakes, static_cast<uint64_t>(kFrames / 4));
    EXPECT_TRUE(c.Delivered(kFrames - 1));
    c.client->Stop();
}

// With nothing to say, the I/O thread wakes once per io_wait_ms wait, not more: a baseline for
// the transports (the Unreal FSocket one has the same contract).
TEST(Frames, IdleClientWakesOncePerWait) {
    Connected c;
    ASSERT_TRUE(c.Start());
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the hello's traffic settles
    uint64_t recvs_before = c.recvs.load();
    auto start = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    double seconds = Since(start);
    uint64_t recvs = c.recvs.load() - recvs_before;
    std::printf("measured: idle for %.2f s: %llu socket waits (io_wait_ms 50)\n", seconds, static_cast<unsigned long long>(recvs));
    // 20 waits of 50 ms, plus the answers to the lease's pings and ZMTP heartbeats
    EXPECT_LE(recvs, static_cast<uint64_t>(seconds * 1000.0 / 50.0 * 2) + 4);
    c.client->Stop();
}
