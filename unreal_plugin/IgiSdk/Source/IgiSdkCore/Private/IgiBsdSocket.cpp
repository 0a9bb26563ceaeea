#include "IgiSocket.h"

#include <cstdlib>
#include <cstring>

namespace igi {

bool ParseTcpEndpoint(const std::string& endpoint, std::string& host, uint16_t& port) {
    static const char scheme[] = "tcp://";
    if (endpoint.compare(0, sizeof(scheme) - 1, scheme) != 0) return false;
    std::string rest = endpoint.substr(sizeof(scheme) - 1);
    size_t colon = rest.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 >= rest.size()) return false;
    std::string digits = rest.substr(colon + 1);
    if (digits.size() > 5) return false;
    long value = 0;
    for (char c : digits) {
        if (c < '0' || c > '9') return false;
        value = value * 10 + (c - '0');
    }
    if (value <= 0 || value > 65535) return false;
    host = rest.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    if (host == "localhost") host = "127.0.0.1";
    port = static_cast<uint16_t>(value);
    return !host.empty();
}

}  // namespace igi

#ifndef IGI_SDK_NO_BSD_SOCKETS

#ifdef _WIN32
#include <winsock2.h>
#include <ws2tcpip.h>
using SocketHandle = SOCKET;
static const SocketHandle kNoSocket = INVALID_SOCKET;
static void CloseHandle_(SocketHandle s) { closesocket(s); }
static bool SetNonBlocking(SocketHandle s, bool on) { u_long v = on ? 1 : 0; return ioctlsocket(s, FIONBIO, &v) == 0; }
static bool InProgress() { return WSAGetLastError() == WSAEWOULDBLOCK; }
static bool WouldBlock() { return WSAGetLastError() == WSAEWOULDBLOCK; }
static bool Interrupted() { return WSAGetLastError() == WSAEINTR; }
#else
#include <arpa/inet.h>
#include <cerrno>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>
using SocketHandle = int;
static const SocketHandle kNoSocket = -1;
static void CloseHandle_(SocketHandle s) { ::close(s); }
static bool SetNonBlocking(SocketHandle s, bool on) {
    int flags = fcntl(s, F_GETFL, 0);
    if (flags < 0) return false;
    return fcntl(s, F_SETFL, on ? (flags | O_NONBLOCK) : (flags & ~O_NONBLOCK)) == 0;
}
static bool InProgress() { return errno == EINPROGRESS; }
static bool WouldBlock() { return errno == EAGAIN || errno == EWOULDBLOCK; }
static bool Interrupted() { return errno == EINTR; }
#endif

namespace igi {
namespace {

// Waits for `s` (and, on POSIX, the wake pipe) to become readable or writable.
// 1: ready, 0: timeout or woken, -1: error.
#ifdef _WIN32
int WaitFor(SocketHandle s, bool write, int timeout_ms, int /*wake_fd*/) {
    fd_set set;
    FD_ZERO(&set);
    FD_SET(s, &set);
    fd_set errors = set;
    timeval tv{timeout_ms / 1000, (timeout_ms % 1000) * 1000};
    int r = select(0, write ? nullptr : &set, write ? &set : nullptr, &errors, &tv);
    if (r < 0) return Interrupted() ? 0 : -1;
    if (FD_ISSET(s, &errors)) return -1;
    return r > 0 ? 1 : 0;
}
#else
int WaitFor(SocketHandle s, bool write, int timeout_ms, int wake_fd) {
    pollfd fds[2];
    fds[0].fd = s;
    fds[0].events = write ? POLLOUT : POLLIN;
    fds[0].revents = 0;
    fds[1].fd = wake_fd;
    fds[1].events = POLLIN;
    fds[1].revents = 0;
    int r = ::poll(fds, wake_fd >= 0 ? 2 : 1, timeout_ms);
    if (r < 0) return Interrupted() ? 0 : -1;
    if (wake_fd >= 0 && (fds[1].revents & POLLIN)) {
        char drain[64];
        while (::read(wake_fd, drain, sizeof drain) > 0) {}
    }
    if (fds[0].revents & (POLLERR | POLLNVAL)) return -1;
    // POLLHUP with bytes still readable: let recv read them (and then see the close)
    if (fds[0].revents & (POLLIN | POLLOUT | POLLHUP)) return 1;
    return 0;
}
#endif

class BsdSocket final : public ISocket {
public:
    BsdSocket() {
#ifdef _WIN32
        WSADATA data;
        wsa_ok_ = WSAStartup(MAKEWORD(2, 2), &data) == 0;
#else
        int fds[2];
        if (::pipe(fds) == 0) {
            wake_read_ = fds[0];
            wake_write_ = fds[1];
            SetNonBlocking(wake_read_, true);
            SetNonBlocking(wake_write_, true);
        }
#endif
    }

    ~BsdSocket() override {
        Close();
#ifdef _WIN32
        if (wsa_ok_) WSACleanup();
#else
        if (wake_read_ >= 0) ::close(wake_read_);
        if (wake_write_ >= 0) ::close(wake_write_);
#endif
    }

    bool Connect(const std::string& host, uint16_t port, int timeout_ms, std::string& error) override {
        Close();
        sockaddr_storage addr;
        std::memset(&addr, 0, sizeof addr);
        socklen_t len = 0;
        auto* v4 = reinterpret_cast<sockaddr_in*>(&addr);
        auto* v6 = reinterpret_cast<sockaddr_in6*>(&addr);
        if (inet_pton(AF_INET, host.c_str(), &v4->sin_addr) == 1) {
            v4->sin_family = AF_INET;
            v4->sin_port = htons(port);
            len = sizeof(sockaddr_in);
        } else if (inet_pton(AF_INET6, host.c_str(), &v6->sin6_addr) == 1) {
            v6->sin6_family = AF_INET6;
            v6->sin6_port = htons(port);
            len = sizeof(sockaddr_in6);
        } else {
            error = "not an IP address: " + host;
            return false;
        }
        SocketHandle s = ::socket(addr.ss_family, SOCK_STREAM, IPPROTO_TCP);
        if (s == kNoSocket) { error = "socket() failed"; return false; }
        int one = 1;
        setsockopt(s, IPPROTO_TCP, TCP_NODELAY, reinterpret_cast<const char*>(&one), sizeof one);
        // the protocol asks clients for TCP keepalive, so a vanished host is noticed
        setsockopt(s, SOL_SOCKET, SO_KEEPALIVE, reinterpret_cast<const char*>(&one), sizeof one);
        SetNonBlocking(s, true);
        if (::connect(s, reinterpret_cast<sockaddr*>(&addr), len) != 0) {
            if (!InProgress()) { CloseHandle_(s); error = "connection refused"; return false; }
            if (WaitFor(s, true, timeout_ms, -1) != 1) { CloseHandle_(s); error = "connect timed out"; return false; }
            int so_error = 0;
            socklen_t so_len = sizeof so_error;
            getsockopt(s, SOL_SOCKET, SO_ERROR, reinterpret_cast<char*>(&so_error), &so_len);
            if (so_error != 0) { CloseHandle_(s); error = "connection refused"; return false; }
        }
        socket_ = s;
        return true;
    }

    bool SendAll(const uint8_t* data, size_t n, int timeout_ms) override {
        size_t sent = 0;
        while (sent < n) {
            if (socket_ == kNoSocket) return false;
#ifdef _WIN32
            int r = ::send(socket_, reinterpret_cast<const char*>(data + sent), static_cast<int>(n - sent), 0);
#else
            ssize_t r = ::send(socket_, data + sent, n - sent, MSG_NOSIGNAL);
#endif
            if (r > 0) { sent += static_cast<size_t>(r); continue; }
            if (r < 0 && (WouldBlock() || Interrupted())) {
                if (WaitFor(socket_, true, timeout_ms, -1) != 1) return false;
                continue;
            }
            return false;
        }
        return true;
    }

    int Recv(uint8_t* buffer, size_t capacity, int timeout_ms) override {
        if (socket_ == kNoSocket) return -1;
        int w = WaitFor(socket_, false, timeout_ms, wake_read_);
        if (w < 0) return -1;
        if (w == 0) return 0;
#ifdef _WIN32
        int r = ::recv(socket_, reinterpret_cast<char*>(buffer), static_cast<int>(capacity), 0);
#else
        ssize_t r = ::recv(socket_, buffer, capacity, 0);
#endif
        if (r > 0) return static_cast<int>(r);
        if (r < 0 && (WouldBlock() || Interrupted())) return 0;
        return -1;  // 0: the peer closed
    }

    void Wake() override {
#ifndef _WIN32
        if (wake_write_ >= 0) {
            char b = 1;
            ssize_t r = ::write(wake_write_, &b, 1);
            (void)r;  // a full pipe already wakes the reader
        }
#endif
    }

    void Close() override {
        if (socket_ != kNoSocket) {
            CloseHandle_(socket_);
            socket_ = kNoSocket;
        }
    }

private:
    SocketHandle socket_ = kNoSocket;
    int wake_read_ = -1;
    int wake_write_ = -1;
#ifdef _WIN32
    bool wsa_ok_ = false;
#endif
};

}  // namespace

std::unique_ptr<ISocket> MakeBsdSocket() { return std::unique_ptr<ISocket>(new BsdSocket()); }

}  // namespace igi

#endif  // IGI_SDK_NO_BSD_SOCKETS
