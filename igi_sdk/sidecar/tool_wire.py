"""The protocol's tool fields (1.3) as the engine takes them (runtime/tools.py)."""

from __future__ import annotations

from collections.abc import Sequence

from igi_sdk.runtime.tools import ToolSpec, calls_text
from igi_sdk.wire import protocol as P


def spec(request: P.Chat) -> ToolSpec | None:
    """The chat's tools, or None when it declares none."""
    if not request.tools:
        return None
    return ToolSpec.of([(t.name, t.description, t.parameters) for t in request.tools],
                       request.tool_choice, request.parallel_tool_calls)


def history_turns(history: Sequence[P.HistoryTurn]) -> list[tuple[str, str]]:
    """(role, text) per turn: an assistant turn's calls become the call text a reply with
    tools writes (so that the model reads its earlier calls as it wrote them)."""
    out: list[tuple[str, str]] = []
    for t in history:
        text = t.content
        if t.tool_calls:
            calls = calls_text([(c.id, c.name, c.arguments) for c in t.tool_calls])
            text = f"{text}\n{calls}" if text else calls
        out.append((t.role, text))
    return out
