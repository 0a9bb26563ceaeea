// A ZeroMQ DEALER speaking ZMTP 3.1 (RFC 37) over an ISocket, so the plugin needs no native
// ZeroMQ library: NULL security mechanism, one connection, single-frame messages.
//
// Wire summary: a 64-byte greeting each way (signature FF 00*8 7F, version 3.1, mechanism "NULL"
// padded to 20 bytes, as-server 0, filler), then a READY command each way (Socket-Type DEALER,
// Identity = the routing id, so a reconnect keeps the sidecar's state for this client), then
// frames: flags (MORE=1, LONG=2, COMMAND=4), a 1- or 8-byte big-endian size, the body.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "IgiSocket.h"
#include "IgiSdkCoreApi.h"

namespace igi {

// Splits a byte stream into ZMTP frames. Pure (no I/O), so it can be fed anything.
class IGISDKCORE_API ZmtpParser {
public:
    enum : uint8_t { kMore = 1, kLong = 2, kCommand = 4 };
    struct Frame {
        uint8_t flags = 0;
        std::string body;
    };
    explicit ZmtpParser(uint64_t max_frame) : max_frame_(max_frame) {}
    void Feed(const uint8_t* data, size_t n) { buffer_.append(reinterpret_cast<const char*>(data), n); }
    // Takes `n` raw bytes (the greeting) if that many are buffered.
    bool TakeRaw(size_t n, std::string& out);
    // 1: a frame, 0: need more bytes, -1: a broken stream (reason in Error()).
    int Next(Frame& out);
    const std::string& Error() const { return error_; }
    size_t Buffered() const { return buffer_.size() - offset_; }
    const std::string& Pending() const { return buffer_; }

private:
    void Compact();
    std::string buffer_;
    size_t offset_ = 0;
    uint64_t max_frame_;
    std::string error_;
};

class IGISDKCORE_API ZmtpDealer {
public:
    // a frame far above the protocol's 17 MiB message size means a broken stream
    static const uint64_t kMaxFrameBytes = 32ull << 20;

    explicit ZmtpDealer(std::unique_ptr<ISocket> socket);
    ZmtpDealer(const ZmtpDealer&) = delete;
    ZmtpDealer& operator=(const ZmtpDealer&) = delete;

    // TCP connect + greeting + READY exchange, all within timeout_ms.
    bool Connect(const std::string& endpoint, const std::string& routing_id, int timeout_ms, std::string& error);
    bool IsConnected() const { return connected_; }
    // One single-frame message. False: the connection broke (it is closed).
    bool Send(const std::string& message);
    // Waits up to timeout_ms for bytes and appends every whole message to `out`. False: the
    // connection is closed (by the peer, an error or a broken stream; reason in LastError()).
    bool Receive(int timeout_ms, std::vector<std::string>& out);
    void Wake() { if (socket_) socket_->Wake(); }
    void Close();
    double SecondsSinceTraffic() const;
    const std::string& LastError() const { return last_error_; }

    static std::string Greeting();
    static std::string ReadyCommand(const std::string& routing_id);

private:
    bool SendFrame(const std::string& body, uint8_t flags);
    bool Fill(int timeout_ms);  // false: closed
    bool HandleFrame(const ZmtpParser::Frame& f, std::vector<std::string>& out);
    bool Fail(const std::string& why);

    std::unique_ptr<ISocket> socket_;
    ZmtpParser parser_;
    bool connected_ = false;
    bool dropping_multipart_ = false;
    std::chrono::steady_clock::time_point heard_at_;
    std::chrono::steady_clock::time_point pinged_at_;
    std::string last_error_;
    std::vector<uint8_t> chunk_;
};

}  // namespace igi
