using System;
using System.Net;
using System.Net.Sockets;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// Is anything listening on a loopback port? Decides between "reuse the sidecar that is
    /// already there" (the Editor's, from the last play mode) and "start one". Blocks for up to
    /// <c>timeoutMs</c>: call it off the main thread.
    /// </summary>
    public static class PortProbe
    {
        public static bool IsListening(int port, int timeoutMs)
        {
            using (var socket = new Socket(AddressFamily.InterNetwork, SocketType.Stream, ProtocolType.Tcp))
            {
                try
                {
                    IAsyncResult attempt = socket.BeginConnect(IPAddress.Loopback, port, null, null);
                    if (!attempt.AsyncWaitHandle.WaitOne(timeoutMs)) return false;
                    socket.EndConnect(attempt);
                    return true;
                }
                catch (SocketException)
                {
                    return false; // refused: nobody there
                }
                catch (ObjectDisposedException)
                {
                    return false;
                }
            }
        }
    }
}
