"""Which calls a line's ``tool_results`` may answer (protocol 1.3, bridge/PROTOCOL.md §5.1):
those of the session's last reply. That is the reply the session last made (a reply undone,
failed or cancelled before its first token, leaves the one before), or, where a line or its
``open_session`` gives the conversation (``history``), the assistant turn with calls that the
history's trailing tool turns follow. A result naming any other call is refused before anything
changes (:class:`UnknownToolCallError`, ``invalid_body``): the session stays as it was.

Pure: the session service keeps each session's calls (``SessionInfo.calls``) and asks here.
"""

from __future__ import annotations

from collections.abc import Sequence

from igi_sdk.errors import UnknownToolCallError
from igi_sdk.events import ReplyResult
from igi_sdk.wire import protocol as P

# a session's calls; None: not known here (a session restored from a save, which keeps the
# conversation's text but not its call ids), and its results are not checked
Calls = frozenset[str] | None


def of_history(history: Sequence[P.HistoryTurn]) -> frozenset[str]:
    """The calls a history's last reply made: those of the assistant turn that only tool
    turns follow (none when a user or system turn, or nothing, follows the last call)."""
    for turn in reversed(history):
        if turn.role == "tool":
            continue
        if turn.role == "assistant":
            return frozenset(c.id for c in turn.tool_calls)
        return frozenset()
    return frozenset()


def after_reply(before: Calls, result: ReplyResult) -> Calls:
    """The session's calls once ``result`` ended its reply: the reply's own, unless it was
    cancelled before its first token (undone, as if the line had never been said)."""
    if result.finish_reason == "cancelled" and not result.completion_tokens:
        return before
    return frozenset(c.id for c in result.tool_calls)


def check(results: Sequence[P.ToolResult], calls: Calls) -> None:
    """Refuses results that answer no call of the session's last reply."""
    if calls is None:
        return
    unknown = [r.id for r in results if r.id not in calls]
    if not unknown:
        return
    made = ", ".join(sorted(calls)) if calls else "none"
    raise UnknownToolCallError(
        f"tool_results: {', '.join(unknown)} answers no call of the session's last reply "
        f"(its calls: {made}); send each result with the id of the call it answers")
