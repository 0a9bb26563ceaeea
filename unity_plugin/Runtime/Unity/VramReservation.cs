using System.Runtime.CompilerServices;
using System.Threading.Tasks;
using UnityEngine;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// One <c>reserve_vram</c> in flight, for a level load. Await it (or its <see cref="Task"/>)
    /// from async code, or <c>yield return</c> it from a coroutine; either way it completes on
    /// the main thread, from <see cref="IgiSidecar"/>'s Update (the sidecar answers within 5 s;
    /// one made by <see cref="IgiSidecar.BeginLevelLoad"/> also ends when its frames run out).
    /// <see cref="Granted"/> true: that much VRAM is free now, allocate it. False:
    /// <see cref="ErrorCode"/> says why (<see cref="CannotFree"/>, <see cref="DeadlineMissed"/>
    /// which may be asked again, <c>forbidden</c> for a game that is a guest of the sidecar,
    /// <c>unavailable</c> when no sidecar is connected, <c>disposed</c> when the connection closed).
    /// </summary>
    public sealed class VramReservation : CustomYieldInstruction
    {
        /// <summary>The model cannot give that much back (a fixed GPU plan, or already on the CPU
        /// with the rest held by other processes): load anyway, or load less.</summary>
        public const string CannotFree = "cannot_free";
        /// <summary>Not free in time: the sidecar's 5 s, or the frames given to
        /// <see cref="IgiSidecar.BeginLevelLoad"/> passed first (the sidecar goes on freeing).
        /// Retryable.</summary>
        public const string DeadlineMissed = "deadline_missed";
        /// <summary>The sidecar answered without granting (a sidecar older than protocol 1.2's answer).</summary>
        public const string NotGranted = "not_granted";

        readonly TaskCompletionSource<bool> _done = new TaskCompletionSource<bool>();

        public long Bytes { get; private set; }
        /// <summary>The frames the game gave the sidecar (<c>deadline_frames</c>).</summary>
        public int DeadlineFrames { get; private set; }
        public string ErrorCode { get; private set; }
        public string ErrorMessage { get; private set; }

        public VramReservation(long bytes) : this(bytes, 0) { }

        public VramReservation(long bytes, int deadlineFrames)
        {
            Bytes = bytes;
            DeadlineFrames = deadlineFrames;
        }

        public Task<bool> Task { get { return _done.Task; } }
        public bool IsDone { get { return _done.Task.IsCompleted; } }
        public bool Granted { get { return IsDone && _done.Task.Result; } }
        public override bool keepWaiting { get { return !IsDone; } }

        /// <summary><c>bool granted = await reservation;</c></summary>
        public TaskAwaiter<bool> GetAwaiter() { return _done.Task.GetAwaiter(); }

        // IgiSidecar's update count at which a level load stops waiting; -1: only the sidecar ends it
        internal int EndsAtUpdate = -1;

        internal void Grant() { _done.TrySetResult(true); }

        internal void Refuse(string code, string message)
        {
            if (IsDone) return;
            ErrorCode = code;
            ErrorMessage = message;
            _done.TrySetResult(false);
        }

        public override string ToString()
        {
            if (!IsDone) return "reserving " + Bytes + " B";
            return Granted ? "granted " + Bytes + " B" : ErrorCode + ": " + ErrorMessage;
        }
    }
}
