namespace Igi.Sdk
{
    /// <summary>
    /// A typed failure, as on the wire (PROTOCOL.md §6): <see cref="Code"/> is stable,
    /// <see cref="Message"/> is for humans only, <see cref="Retryable"/> says whether the same
    /// request may succeed later unchanged. Codes the client makes up itself are listed below.
    /// </summary>
    public sealed class IgiError
    {
        /// <summary>Local: nothing came from the sidecar for 5 s (it is down or restarting), or
        /// the connection dropped before the answer came.</summary>
        public const string Unavailable = "unavailable";
        /// <summary>Local: the sidecar is alive but the request got no event within its timeout.</summary>
        public const string Timeout = "timeout";
        /// <summary>Local: a stream could not be resumed after a reconnect (the sidecar
        /// restarted, or does not support resume_stream); send the line again.</summary>
        public const string StreamLost = "stream_lost";
        /// <summary>Local: the client was disposed before the answer came.</summary>
        public const string Disposed = "disposed";
        /// <summary>Local: refused before sending (text too long, message too large, bad argument).</summary>
        public const string InvalidBody = "invalid_body";
        /// <summary>Local: the sidecar does not offer the protocol feature the request needs (not
        /// in its hello's features: an older sidecar, see <see cref="IgiServerInfo.HasFeature"/>).
        /// Nothing was sent.</summary>
        public const string Unsupported = "unsupported";

        // Codes of the sidecar that a game may want to tell apart (PROTOCOL.md §6 has them all).
        /// <summary>chat.images: an image the sidecar cannot decode (corrupt, not PNG/JPEG), or
        /// media markers in the text that do not match the images. The session is unchanged.</summary>
        public const string InvalidImage = "invalid_image";
        /// <summary>chat.images: the model was loaded without its vision projector (mmproj).
        /// The session is unchanged.</summary>
        public const string VisionUnavailable = "vision_unavailable";
        /// <summary>Protocol 1.2: hello with a wrong launch token, or shutdown from a client that
        /// is not the game. Not retryable.</summary>
        public const string Forbidden = "forbidden";
        /// <summary>Local: the sidecar that answered hello is not the one expected (another
        /// <c>instance</c> than <see cref="IgiClientOptions.ExpectedInstance"/>, or another model
        /// than <see cref="IgiClientOptions.ExpectedModel"/>): another game's, another Editor's
        /// or a developer's own. Nothing more is sent to it; not retryable.</summary>
        public const string WrongSidecar = "wrong_sidecar";

        public readonly string Code;
        public readonly string Message;
        public readonly bool Retryable;

        public IgiError(string code, string message, bool retryable)
        {
            Code = code ?? "error";
            Message = message ?? "";
            Retryable = retryable;
        }

        public override string ToString()
        {
            return "[" + Code + "] " + Message + (Retryable ? " (retryable)" : "");
        }
    }
}
