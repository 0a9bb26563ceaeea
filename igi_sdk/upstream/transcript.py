"""A conversation as text, kept for every session the sidecar routes: what the upstream is sent
(OpenAI clients send the whole transcript each time) and what the local model rereads when a
session moves back to it. Pure: no I/O, no threads."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from igi_sdk.wire.protocol import MAX_HISTORY_TURNS, Sampling

Role = Literal["system", "user", "assistant", "tool"]  # protocol 1.3 history roles
# the most text one routed conversation keeps (the oldest exchanges go first): what a session
# costs the sidecar's memory is bounded, whatever the upstream's context
MAX_TRANSCRIPT_CHARS = 1 << 20
Where = Literal["local", "remote"]


@dataclass
class Transcript:
    system: str
    sampling: Sampling
    priority: int
    turns: list[tuple[Role, str]] = field(default_factory=list)
    # turns the local session holds in its KV cache; None: there is no local session. Less than
    # len(turns): lines were answered upstream since, and the local copy is stale
    local_turns: int | None = None
    restored: bool = False  # from a save: its text is in the local KV cache only
    busy: bool = False
    where: Where = "local"  # where its last line was answered
    dropped: int = 0  # oldest turns let go past MAX_HISTORY_TURNS

    @property
    def local_fresh(self) -> bool:
        return self.local_turns is not None and self.local_turns == len(self.turns)

    def commit(self, line: str, reply: str, *, local: bool) -> None:
        """One exchange ended; ``local``: the local session holds it too."""
        self.turns += [("user", line), ("assistant", reply)]
        excess = max(0, len(self.turns) - MAX_HISTORY_TURNS)
        size = sum(len(text) for _, text in self.turns)
        while size > MAX_TRANSCRIPT_CHARS and excess < len(self.turns) - 2:
            size -= len(self.turns[excess][1]) + len(self.turns[excess + 1][1])
            excess += 2
        if excess > 0:  # whole exchanges go, oldest first: the protocol's history bound
            excess += excess % 2
            del self.turns[:excess]
            self.dropped += excess
            if self.local_turns is not None:
                self.local_turns = max(0, self.local_turns - excess)
        if local:
            self.local_turns = len(self.turns)

    def messages(self, line: str) -> list[dict[str, object]]:
        """OpenAI chat messages for the next line (text only; images are added by the caller)."""
        out: list[dict[str, object]] = []
        if self.system:
            out.append({"role": "system", "content": self.system})
        out += [{"role": r, "content": t} for r, t in self.turns]
        out.append({"role": "user", "content": line})
        return out
