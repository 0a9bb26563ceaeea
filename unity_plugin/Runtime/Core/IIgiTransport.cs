using System;
using System.Collections.Generic;

namespace Igi.Sdk
{
    /// <summary>
    /// One connection to the sidecar that carries single-frame messages (a ZeroMQ DEALER).
    /// Every member is called from the client's I/O thread only, so implementations need no locks.
    /// </summary>
    public interface IIgiTransport : IDisposable
    {
        /// <summary>Connects and completes the handshake within <paramref name="timeoutMs"/>;
        /// throws IgiTransportException on failure. <paramref name="routingId"/> is the DEALER's
        /// fixed identity (the sidecar's ROUTER_HANDOVER keeps it across reconnects).</summary>
        void Connect(string endpoint, byte[] routingId, int timeoutMs);

        bool IsConnected { get; }

        /// <summary>Sends one message (one frame). Throws IgiTransportException when the
        /// connection is gone.</summary>
        void Send(byte[] message);

        /// <summary>Waits at most <paramref name="timeoutMs"/> for traffic and appends every
        /// complete single-frame message to <paramref name="into"/>. Returns false once the
        /// connection has dropped (the caller closes and reconnects).</summary>
        bool Receive(int timeoutMs, List<byte[]> into);

        /// <summary>Seconds since any byte (messages or transport heartbeats) came in.</summary>
        double SecondsSinceTraffic { get; }

        void Close();
    }

    /// <summary>
    /// A transport whose wait in <see cref="IIgiTransport.Receive"/> can be cut short from another
    /// thread. The client's I/O thread then sleeps on the socket until traffic comes or a request
    /// is queued (both built-in transports), instead of polling every few milliseconds.
    /// </summary>
    public interface IIgiWakeableTransport : IIgiTransport
    {
        /// <summary>Called from any thread, at any time (before Connect, after Close): the
        /// <see cref="IIgiTransport.Receive"/> in progress, or else the next one, returns at once.
        /// Allocates nothing (it runs on the game's thread with every request).</summary>
        void Wake();
    }

    public sealed class IgiTransportException : Exception
    {
        public IgiTransportException(string message) : base(message) { }
        public IgiTransportException(string message, Exception inner) : base(message, inner) { }
    }
}
