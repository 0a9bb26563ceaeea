// The Unreal layer's FSocket transport (IgiUnrealSocket.cpp, the plugin's own code) under the core
// client against the real sidecar. The engine's socket subsystem is played by BSD sockets with
// FSocketBSD's behaviour as far as the transport uses it: non-blocking, Wait = poll(2) with its
// timeout, Recv returns false on a graceful close, Shutdown = shutdown(2). Checked: a chat
// streams through it; a request wakes the client's I/O thread at once even with a 2 s
// io_wait_ms (without a wake-up it waits out that wait); idle, the reader thread wakes
// a few times a second (a transport waiting in 2 ms slices: about 475); a dropped connection
// reconnects.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <fcntl.h>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "IgiClient.h"
#include "IgiUnrealSocket.h"
#include "sidecar.h"

// ---- the engine's socket layer, over BSD sockets ------------------------------------------------

const FName NAME_Stream;

FTimespan FTimespan::FromMilliseconds(double Milliseconds) {
    FTimespan t;
    t.Ms = Milliseconds;
    return t;
}

namespace {

// FSocket::Wait(WaitForRead) calls that returned, all sockets: how often the transport woke
std::atomic<uint64_t> g_read_waits{0};

class BsdAddr final : public FInternetAddr {
public:
    void SetIp(const TCHAR* In, bool& bIsValid) override {
        std::string ascii;
        for (const TCHAR* c = In; c && *c; ++c) ascii.push_back(static_cast<char>(*c));
        bIsValid = inet_pton(AF_INET, ascii.c_str(), &addr.sin_addr) == 1;
    }
    void SetPort(int32 InPort) override { addr.sin_port = htons(static_cast<uint16_t>(InPort)); }
    FName GetProtocolType() const override { return FName(); }
    sockaddr_in addr{};
};

class BsdFSocket final : public FSocket {
public:
    BsdFSocket() : fd_(::socket(AF_INET, SOCK_STREAM, 0)) {}
    ~BsdFSocket() override { Close(); }
    bool Shutdown(ESocketShutdownMode Mode) override {
        int how = Mode == ESocketShutdownMode::Read ? SHUT_RD : Mode == ESocketShutdownMode::Write ? SHUT_WR : SHUT_RDWR;
        return ::shutdown(fd_, how) == 0;
    }
    bool Close() override {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
        return true;
    }
    bool Connect(const FInternetAddr& Addr) override {
        sockaddr_in a = static_cast<const BsdAddr&>(Addr).addr;
        a.sin_family = AF_INET;
        int r = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a);
        return r == 0 || errno == EINPROGRESS;
    }
    bool Send(const uint8* Data, int32 Count, int32& BytesSent) override {
        ssize_t r = ::send(fd_, Data, static_cast<size_t>(Count), MSG_NOSIGNAL);
        if (r >= 0) { BytesSent = static_cast<int32>(r); return true; }
        BytesSent = 0;
        return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    bool Recv(uint8* Data, int32 BufferSize, int32& BytesRead, ESocketReceiveFlags::Type) override {
        ssize_t r = ::recv(fd_, Data, static_cast<size_t>(BufferSize), 0);
        if (r > 0) { BytesRead = static_cast<int32>(r); return true; }
        BytesRead = 0;
        if (r == 0) return false;  // a graceful close, as FSocketBSD reports it for a stream
        return errno == EAGAIN || errno == EWOULDBLOCK;
    }
    bool Wait(ESocketWaitConditions::Type Condition, FTimespan WaitTime) override {
        pollfd p{fd_, static_cast<short>(Condition == ESocketWaitConditions::WaitForRead ? POLLIN
                                        : Condition == ESocketWaitConditions::WaitForWrite ? POLLOUT : (POLLIN | POLLOUT)), 0};
        int r = ::poll(&p, 1, static_cast<int>(WaitTime.GetTotalMilliseconds()));
        if (Condition == ESocketWaitConditions::WaitForRead) ++g_read_waits;
        return r > 0 && (p.revents & (POLLIN | POLLOUT | POLLHUP | POLLERR));
    }
    ESocketConnectionState GetConnectionState() override {
        int err = 0;
        socklen_t len = sizeof err;
        if (::getsockopt(fd_, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err != 0) return SCS_ConnectionError;
        pollfd p{fd_, POLLOUT, 0};
        return ::poll(&p, 1, 0) > 0 && (p.revents & POLLOUT) ? SCS_Connected : SCS_NotConnected;
    }
    bool SetNonBlocking(bool on) override {
        int flags = fcntl(fd_, F_GETFL, 0);
        return fcntl(fd_, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK)) == 0;
    }
    bool SetNoDelay(bool on) override {
        int v = on ? 1 : 0;
        return setsockopt(fd_, IPPROTO_TCP, TCP_NODELAY, &v, sizeof v) == 0;
    }

private:
    int fd_;
};

class BsdSubsystem final : public ISocketSubsystem {
public:
    FSocket* CreateSocket(const FName&, const FString&, const FName&) override { return new BsdFSocket(); }
    void DestroySocket(FSocket* Socket) override { delete Socket; }
    TSharedRef<FInternetAddr> CreateInternetAddr() override {
        return TSharedRef<FInternetAddr>(std::make_shared<BsdAddr>());
    }
};

}  // namespace

ISocketSubsystem* ISocketSubsystem::Get(const FName&) {
    static BsdSubsystem subsystem;
    return &subsystem;
}

// ---- tests -------------------------------------------------------------------------------------

namespace {

using Clock = std::chrono::steady_clock;
using igi::Client;
using igi::ClientOptions;
using igi::ConnectionState;
using igi::Event;
using igi::EventKind;

const char* const kToken = "cpp-fsocket-launch-token-0123456789";

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

igitest::Sidecar* SocketSidecar() {
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

struct Game {
    std::unique_ptr<Client> client;
    std::vector<Event> events, batch;

    // unreal: the plugin's FSocket transport; otherwise the core's BSD socket (the baseline)
    bool Start(bool unreal, int io_wait_ms) {
        igitest::Sidecar* sidecar = SocketSidecar();
        if (!sidecar) return false;
        ClientOptions o;
        o.endpoint = sidecar->Endpoint();
        o.client_name = unreal ? "cpp-fsocket" : "cpp-bsd";
        o.launch_token = kToken;
        o.io_wait_ms = io_wait_ms;
        if (unreal) {
            o.socket_factory = []() { return std::unique_ptr<igi::ISocket>(new FIgiUnrealSocket()); };
        }
        client.reset(new Client(o));
        if (!client->Start()) return false;
        auto start = Clock::now();
        while (client->State() != ConnectionState::Ready && Since(start) < 20)
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        return client->State() == ConnectionState::Ready;
    }

    Event Answer(uint64_t id, double timeout_s = 30) {
        auto start = Clock::now();
        while (Since(start) < timeout_s) {
            client->Poll(batch);
            for (auto& e : batch) events.push_back(std::move(e));
            for (const auto& e : events)
                if (e.id == id && (e.kind == EventKind::Ok || e.kind == EventKind::Error || e.kind == EventKind::Done)) return e;
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        Event none;
        none.kind = EventKind::Error;
        none.error.code = "test_timeout";
        return none;
    }

    // seconds from asking to the answer of `n` pings, each after `idle_ms` of silence
    std::vector<double> PingAfterIdle(int n, int idle_ms) {
        std::vector<double> out;
        for (int i = 0; i < n; ++i) {
            std::this_thread::sleep_for(std::chrono::milliseconds(idle_ms));
            auto t0 = Clock::now();
            Event e = Answer(client->Ping(), 10);
            EXPECT_EQ(e.kind, EventKind::Ok) << e.error.code;
            out.push_back(Since(t0));
        }
        std::sort(out.begin(), out.end());
        return out;
    }
};

}  // namespace

TEST(UnrealSocket, AChatStreamsThroughTheFSocketTransport) {
    Game g;
    ASSERT_TRUE(g.Start(true, 50));
    Event open = g.Answer(g.client->OpenSession("You are Brom, a terse smith. Answer in one sentence."));
    ASSERT_EQ(open.kind, EventKind::Ok) << open.error.code << ": " << open.error.message;
    uint64_t id = g.client->Chat(open.body.GetString("session"), "Hello!", 16);
    Event end = g.Answer(id, 60);
    ASSERT_EQ(end.kind, EventKind::Done) << end.error.code << ": " << end.error.message;
    std::string joined;
    int64_t expected = 1;
    for (const auto& e : g.events) {
        if (e.kind != EventKind::Token || e.id != id) continue;
        EXPECT_EQ(e.index, expected++);
        joined += e.text;
    }
    EXPECT_GT(expected, 1);
    EXPECT_EQ(end.text, joined);
    g.client->Stop();
}

// io_wait_ms 2000: a request that did not wake the I/O thread would wait for the end of its
// wait (1 s on average). The core's BSD socket, which wakes through a pipe, is the baseline.
TEST(UnrealSocket, ARequestWakesTheIoThreadAtOnce) {
    const int kWaitMs = 2000;
    Game bsd;
    ASSERT_TRUE(bsd.Start(false, kWaitMs));
    std::vector<double> base = bsd.PingAfterIdle(5, 150);
    bsd.client->Stop();
    Game ue;
    ASSERT_TRUE(ue.Start(true, kWaitMs));
    std::vector<double> got = ue.PingAfterIdle(5, 150);
    std::printf("measured: ping after 150 ms idle, io_wait_ms %d: BSD socket median %.2f ms, FSocket transport median %.2f ms (max %.2f)\n",
                kWaitMs, base[2] * 1000, got[2] * 1000, got.back() * 1000);
    EXPECT_LT(got[2], base[2] + 0.2);
    EXPECT_LT(got.back(), kWaitMs / 1000.0 / 4);
    ue.client->Stop();
}

// Idle and connected: the transport's waits on the FSocket end on traffic (the lease's pings) and
// once per reader slice (250 ms), not every 2 ms.
TEST(UnrealSocket, IdleItWaitsOnTheFSocketOnlyAFewTimesASecond) {
    Game g;
    ASSERT_TRUE(g.Start(true, 50));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    uint64_t before = g_read_waits.load();
    auto start = Clock::now();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    double seconds = Since(start);
    uint64_t wakes = g_read_waits.load() - before;
    std::printf("measured: idle %.2f s: %llu FSocket::Wait(WaitForRead) returns\n", seconds, static_cast<unsigned long long>(wakes));
    // 4 slices a second plus what the sidecar sends (answers to the lease's pings, heartbeats)
    EXPECT_LE(wakes, static_cast<uint64_t>(seconds * 4) + 8);
    g.client->Stop();
}

TEST(UnrealSocket, ADroppedConnectionReconnectsThroughIt) {
    Game g;
    ASSERT_TRUE(g.Start(true, 50));
    g.client->DropConnection();
    auto start = Clock::now();
    while (g.client->Counters().reconnects < 1 && Since(start) < 10)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_GE(g.client->Counters().reconnects, 1u);
    Event e = g.Answer(g.client->Ping(), 10);
    EXPECT_EQ(e.kind, EventKind::Ok) << e.error.code << ": " << e.error.message;
    auto t0 = Clock::now();
    g.client->Stop();
    std::printf("measured: Stop through the FSocket transport took %.0f ms\n", Since(t0) * 1000);
}
