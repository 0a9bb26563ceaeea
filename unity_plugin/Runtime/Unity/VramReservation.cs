using System.Threading.Tasks;
using UnityEngine;

namespace Igi.Sdk.Unity
{
    /// <summary>
    /// One <c>reserve_vram</c> in flight, for a level load. Await <see cref="Task"/> from async
    /// code or <c>yield return</c> this object from a coroutine; either way it completes on the
    /// main thread, from <see cref="IgiSidecar"/>'s Update (the sidecar answers within 5 s).
    /// <see cref="Granted"/> true: that much VRAM is free now, allocate it. False:
    /// <see cref="ErrorCode"/> says why (<c>cannot_free</c>, <c>deadline_missed</c> which may be
    /// asked again, <c>unavailable</c> when no sidecar is connected).
    /// </summary>
    public sealed class VramReservation : CustomYieldInstruction
    {
        readonly TaskCompletionSource<bool> _done = new TaskCompletionSource<bool>();

        public long Bytes { get; private set; }
        public string ErrorCode { get; private set; }
        public string ErrorMessage { get; private set; }

        public VramReservation(long bytes) { Bytes = bytes; }

        public Task<bool> Task { get { return _done.Task; } }
        public bool IsDone { get { return _done.Task.IsCompleted; } }
        public bool Granted { get { return IsDone && _done.Task.Result; } }
        public override bool keepWaiting { get { return !IsDone; } }

        internal void Grant() { _done.TrySetResult(true); }

        internal void Refuse(string code, string message)
        {
            if (IsDone) return;
            ErrorCode = code;
            ErrorMessage = message;
            _done.TrySetResult(false);
        }
    }
}
