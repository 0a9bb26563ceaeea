// The byte stream the ZMTP layer runs over: BSD sockets in standalone builds and tests
// (IgiBsdSocket), an FSocket adapter inside Unreal. Implementations never throw; every call
// reports failure by its return value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include "IgiSdkCoreApi.h"

namespace igi {

class IGISDKCORE_API ISocket {
public:
    virtual ~ISocket() = default;
    // Connects to host:port (an IPv4/IPv6 literal or "localhost") within timeout_ms.
    virtual bool Connect(const std::string& host, uint16_t port, int timeout_ms, std::string& error) = 0;
    // Sends all n bytes (blocking up to timeout_ms). False: the connection is broken.
    virtual bool SendAll(const uint8_t* data, size_t n, int timeout_ms) = 0;
    // Waits up to timeout_ms for bytes: > 0 bytes read, 0 nothing yet (or woken), -1 closed.
    virtual int Recv(uint8_t* buffer, size_t capacity, int timeout_ms) = 0;
    // Makes a Recv that is waiting return early (from another thread). May do nothing, then the
    // caller's wait simply runs to its timeout.
    virtual void Wake() {}
    virtual void Close() = 0;
};

using SocketFactory = std::function<std::unique_ptr<ISocket>()>;

// BSD sockets (POSIX, Winsock). Not compiled where IGI_SDK_NO_BSD_SOCKETS is defined.
IGISDKCORE_API std::unique_ptr<ISocket> MakeBsdSocket();

// "tcp://HOST:PORT" -> host, port. HOST may be [v6]. False for anything else.
IGISDKCORE_API bool ParseTcpEndpoint(const std::string& endpoint, std::string& host, uint16_t& port);

}  // namespace igi
