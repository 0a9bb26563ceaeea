namespace Igi.Sdk.Unity
{
    public enum SidecarState
    {
        /// <summary>Not started yet (Start runs it), or stopped.</summary>
        Stopped,
        /// <summary>Looking whether a sidecar already listens on the port.</summary>
        Probing,
        /// <summary>Finding and starting <c>igi-sdk serve</c> (off the main thread).</summary>
        Launching,
        /// <summary>Waiting for the sidecar to answer hello (a fresh one loads its model first).</summary>
        Connecting,
        /// <summary>hello answered: requests flow.</summary>
        Ready,
        /// <summary>The sidecar ended; the next start waits for the back-off.</summary>
        Restarting,
        /// <summary>Cannot go on without a change (see <see cref="IgiSidecar.LastError"/>); <see cref="IgiSidecar.Restart"/> tries again.</summary>
        Failed,
    }
}
