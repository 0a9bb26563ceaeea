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

    /// <summary>An action the NPC called, for the Inspector: its name, its arguments (JSON
    /// text) and the call's id (what <see cref="NpcDialogue.AnswerAction"/> answers).</summary>
    [Serializable]
    public sealed class ActionEvent : UnityEvent<string, string, string> { }
}
