using System;
using System.Net;
using System.Net.Sockets;

namespace Igi.Sdk.Unity
{
    /// <summary>What a probe of a loopback port found.</summary>
    public enum PortState
    {
        /// <summary>The connection was refused: nobody listens there.</summary>
        Free,
        /// <summary>A connection was made: something listens there.</summary>
        Listening,
        /// <summary>No answer within the time given (a loaded machine, a listener whose
        /// backlog is full): never read as free.</summary>
        Unknown,
    }

    /// <summary>
    /// Is anything listening on a loopback port? Decides between "reuse the sidecar that is
    /// already there" (the Editor's, from the last play mode) and "start one". Blocks for up to
    /// <c>timeoutMs</c>: call it off the main thread. On loopback only a refusal says the port
    /// is free: a probe that timed out on a loaded machine once started a second sidecar on a
    /// port another one held.
    /// </summary>
    public static class PortProbe
    {
        public static PortState Check(int port, int timeoutMs)
        {
            using (var socket = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp))
            {
                try
                {
                    IAsyncResult attempt = socket.BeginConnect(IPAddress.Loopback, port, null, null);
                    if (!attempt.AsyncWaitHandle.WaitOne(timeoutMs)) return PortState.Unknown;
                    socket.EndConnect(attempt);
                    return PortState.Listening;
                }
                catch (SocketException e)
                {
                    return e.SocketErrorCode == SocketError.ConnectionRefused ? PortState.Free : PortState.Unknown;
                }
                catch (ObjectDisposedException)
                {
                    return PortState.Unknown;
                }
            }
        }

        public static bool IsListening(int port, int timeoutMs)
        {
            return Check(port, timeoutMs) == PortState.Listening;
        }
    }
}
