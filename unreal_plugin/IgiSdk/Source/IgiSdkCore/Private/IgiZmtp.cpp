#include "IgiZmtp.h"

#include <cstring>

namespace igi {

namespace {
const size_t kGreetingBytes = 64;
// a PING after this much silence: the sidecar's libzmq answers PONG from its own I/O thread
// even while the sidecar is busy (loading its model), so silence means a dead process
const double kPingAfterSeconds = 1.0;

std::string CommandName(const std::string& body) {
    if (body.empty()) return std::string();
    size_t n = static_cast<uint8_t>(body[0]);
    if (n + 1 > body.size()) return std::string();
    return body.substr(1, n);
}

std::string ErrorReason(const std::string& body) {
    size_t at = 1 + static_cast<uint8_t>(body[0]);
    if (at >= body.size()) return "(no reason)";
    size_t n = static_cast<uint8_t>(body[at]);
    if (n > body.size() - at - 1) n = body.size() - at - 1;
    return body.substr(at + 1, n);
}

void ShortString(std::string& o, const char* s) {
    size_t n = std::strlen(s);
    o.push_back(static_cast<char>(n));
    o.append(s, n);
}

void Property(std::string& o, const char* name, const std::string& value) {
    ShortString(o, name);
    uint32_t n = static_cast<uint32_t>(value.size());
    o.push_back(static_cast<char>(n >> 24));
    o.push_back(static_cast<char>(n >> 16));
    o.push_back(static_cast<char>(n >> 8));
    o.push_back(static_cast<char>(n));
    o += value;
}
}  // namespace

// ---- parser ----------------------------------------------------------------------------------

void ZmtpParser::Compact() {
    // drop consumed bytes once they dominate, so the buffer does not grow without end
    if (offset_ > 0 && offset_ * 2 >= buffer_.size()) {
        buffer_.erase(0, offset_);
        offset_ = 0;
    }
}

bool ZmtpParser::TakeRaw(size_t n, std::string& out) {
    if (Buffered() < n) return false;
    out.assign(buffer_, offset_, n);
    offset_ += n;
    Compact();
    return true;
}

int ZmtpParser::Next(Frame& out) {
    size_t left = Buffered();
    if (left < 2) return 0;
    const uint8_t* p = reinterpret_cast<const uint8_t*>(buffer_.data()) + offset_;
    uint8_t flags = p[0];
    if (flags & ~(kMore | kLong | kCommand)) {
        error_ = "a frame with reserved flag bits set";
        return -1;
    }
    uint64_t size;
    size_t header;
    if (flags & kLong) {
        if (left < 9) return 0;
        size = 0;
        for (int i = 1; i <= 8; ++i) size = (size << 8) | p[i];
        header = 9;
    } else {
        size = p[1];
        header = 2;
    }
    if (size > max_frame_) {
        error_ = "a frame of " + std::to_string(size) + " bytes is too large";
        return -1;
    }
    if (left - header < size) return 0;
    out.flags = flags;
    out.body.assign(buffer_, offset_ + header, static_cast<size_t>(size));
    offset_ += header + static_cast<size_t>(size);
    Compact();
    return 1;
}

// ---- dealer ----------------------------------------------------------------------------------

ZmtpDealer::ZmtpDealer(std::unique_ptr<ISocket> socket)
    : socket_(std::move(socket)), parser_(kMaxFrameBytes), chunk_(64 * 1024) {}

std::string ZmtpDealer::Greeting() {
    std::string g(kGreetingBytes, '\0');
    g[0] = static_cast<char>(0xff);  // signature: FF, 8 padding bytes, 7F
    g[9] = 0x7f;
    g[10] = 3;  // ZMTP 3.1
    g[11] = 1;
    std::memcpy(&g[12], "NULL", 4);
    g[32] = 0;  // as-server: we are the client
    return g;
}

std::string ZmtpDealer::ReadyCommand(const std::string& routing_id) {
    std::string body;
    ShortString(body, "READY");
    Property(body, "Socket-Type", "DEALER");
    if (!routing_id.empty()) Property(body, "Identity", routing_id);
    return body;
}

bool ZmtpDealer::Fail(const std::string& why) {
    last_error_ = why;
    Close();
    return false;
}

bool ZmtpDealer::Connect(const std::string& endpoint, const std::string& routing_id, int timeout_ms, std::string& error) {
    Close();
    auto start = std::chrono::steady_clock::now();
    auto left = [&]() {
        auto used = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start).count();
        return static_cast<int>(timeout_ms - used);
    };
    std::string host;
    uint16_t port = 0;
    if (!ParseTcpEndpoint(endpoint, host, port)) {
        error = "endpoint must be tcp://HOST:PORT: " + endpoint;
        return false;
    }
    if (!socket_ || !socket_->Connect(host, port, timeout_ms, error)) {
        if (error.empty()) error = "cannot connect";
        error = "cannot connect to " + endpoint + ": " + error;
        return false;
    }
    parser_ = ZmtpParser(kMaxFrameBytes);
    dropping_multipart_ = false;
    connected_ = true;
    heard_at_ = pinged_at_ = std::chrono::steady_clock::now();
    std::string greeting = Greeting();
    if (!socket_->SendAll(reinterpret_cast<const uint8_t*>(greeting.data()), greeting.size(), timeout_ms)) {
        error = "send failed during the handshake";
        Close();
        return false;
    }
    std::string peer;
    while (!parser_.TakeRaw(kGreetingBytes, peer)) {
        if (left() <= 0 || !Fill(left() < 50 ? left() : 50)) {
            // libzmq hangs up on a mechanism it does not want, often after sending its own
            const std::string& got = parser_.Pending();
            if (got.size() >= 32 && static_cast<uint8_t>(got[0]) == 0xff && got.compare(12, 4, "NULL") != 0)
                error = "the sidecar wants a security mechanism other than NULL (CurveZMQ is not supported by this client)";
            else
                error = left() <= 0 ? "handshake timed out" : "the peer closed the connection during the handshake";
            Close();
            return false;
        }
    }
    if (static_cast<uint8_t>(peer[0]) != 0xff || peer[9] != 0x7f) { error = "the peer is not a ZeroMQ socket (bad greeting)"; Close(); return false; }
    if (peer[10] < 3) { error = "the peer speaks ZMTP " + std::to_string(peer[10]) + ".x; 3.x is needed"; Close(); return false; }
    if (peer.compare(12, 5, std::string("NULL\0", 5)) != 0) {
        error = "the sidecar wants a security mechanism other than NULL (CurveZMQ is not supported by this client)";
        Close();
        return false;
    }
    if (!SendFrame(ReadyCommand(routing_id), ZmtpParser::kCommand)) { error = "send failed during the handshake"; return false; }
    // the peer's READY: the first command after the greeting
    while (true) {
        ZmtpParser::Frame f;
        int r = parser_.Next(f);
        if (r < 0) { error = parser_.Error(); Close(); return false; }
        if (r > 0) {
            if (!(f.flags & ZmtpParser::kCommand)) { error = "the peer sent data before READY"; Close(); return false; }
            std::string name = CommandName(f.body);
            if (name == "READY") return true;
            if (name == "ERROR") { error = "the peer refused the handshake: " + ErrorReason(f.body); Close(); return false; }
            continue;
        }
        if (left() <= 0) { error = "handshake timed out"; Close(); return false; }
        if (!Fill(left() < 50 ? left() : 50)) { error = "the peer closed the connection during the handshake"; Close(); return false; }
    }
}

bool ZmtpDealer::SendFrame(const std::string& body, uint8_t flags) {
    if (!connected_) return false;
    std::string frame;
    uint64_t n = body.size();
    if (n <= 255) {
        frame.reserve(2 + n);
        frame.push_back(static_cast<char>(flags));
        frame.push_back(static_cast<char>(n));
    } else {
        frame.reserve(9 + n);
        frame.push_back(static_cast<char>(flags | ZmtpParser::kLong));
        for (int i = 7; i >= 0; --i) frame.push_back(static_cast<char>(n >> (8 * i)));
    }
    frame += body;
    // bounded: a sidecar that stops reading must not hold the I/O thread for long
    if (!socket_->SendAll(reinterpret_cast<const uint8_t*>(frame.data()), frame.size(), 2000))
        return Fail("send failed");
    return true;
}

bool ZmtpDealer::Send(const std::string& message) { return SendFrame(message, 0); }

bool ZmtpDealer::Fill(int timeout_ms) {
    if (!connected_) return false;
    int n = socket_->Recv(chunk_.data(), chunk_.size(), timeout_ms < 0 ? 0 : timeout_ms);
    if (n < 0) return Fail("the connection closed");
    if (n > 0) {
        parser_.Feed(chunk_.data(), static_cast<size_t>(n));
        heard_at_ = std::chrono::steady_clock::now();
    }
    return true;
}

bool ZmtpDealer::HandleFrame(const ZmtpParser::Frame& f, std::vector<std::string>& out) {
    if (f.flags & ZmtpParser::kCommand) {
        std::string name = CommandName(f.body);
        if (name == "PING") {
            // PING = name, TTL (2 bytes), context; PONG echoes the context
            size_t context_at = 1 + static_cast<uint8_t>(f.body[0]) + 2;
            std::string pong;
            ShortString(pong, "PONG");
            if (context_at < f.body.size()) pong.append(f.body, context_at, std::string::npos);
            return SendFrame(pong, ZmtpParser::kCommand);
        }
        if (name == "ERROR") return Fail("the peer sent ERROR: " + ErrorReason(f.body));
        return true;  // PONG and unknown commands need nothing from us
    }
    bool more = (f.flags & ZmtpParser::kMore) != 0;
    if (more || dropping_multipart_) {
        // the protocol is one frame per message: a multipart message is dropped whole
        dropping_multipart_ = more;
        return true;
    }
    out.push_back(f.body);
    return true;
}

bool ZmtpDealer::Receive(int timeout_ms, std::vector<std::string>& out) {
    if (!connected_) return false;
    auto now = std::chrono::steady_clock::now();
    if (std::chrono::duration<double>(now - heard_at_).count() >= kPingAfterSeconds &&
        std::chrono::duration<double>(now - pinged_at_).count() >= kPingAfterSeconds) {
        std::string ping;
        ShortString(ping, "PING");
        ping.append(2, '\0');  // TTL 0
        pinged_at_ = now;
        if (!SendFrame(ping, ZmtpParser::kCommand)) return false;
    }
    bool first = true;
    while (true) {
        ZmtpParser::Frame f;
        int r;
        while ((r = parser_.Next(f)) > 0) {
            if (!HandleFrame(f, out)) return false;
        }
        if (r < 0) return Fail(parser_.Error());
        // wait only for the first read, then take what is already here
        size_t before = parser_.Buffered();
        if (!Fill(first ? timeout_ms : 0)) return false;
        if (!first && parser_.Buffered() == before) return true;
        if (first && parser_.Buffered() == before) return true;
        first = false;
    }
}

double ZmtpDealer::SecondsSinceTraffic() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - heard_at_).count();
}

void ZmtpDealer::Close() {
    if (socket_) socket_->Close();
    connected_ = false;
}

}  // namespace igi
