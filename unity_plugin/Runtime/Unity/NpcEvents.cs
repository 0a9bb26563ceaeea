using System;
using UnityEngine.Events;

namespace Igi.Sdk.Unity
{
    /// <summary>A piece of text (a streamed token, a whole reply) for the Inspector.</summary>
    [Serializable]
    public sealed class TextEvent : UnityEvent<string> { }

    /// <summary>An error's stable code and its human message, for the Inspector.</summary>
    [Serializable]
    public sealed class ErrorEvent : UnityEvent<string, string> { }
}
