"""Which NPC session an OpenAI-style request continues (pure: no sockets, no model).

OpenAI clients send the whole transcript with every request. The face keeps, per conversation,
the transcript its session's KV cache holds; a request whose transcript (before its new line)
is exactly that continues the session and only the new line is prefilled. A request names its
conversation by ``prompt_cache_key`` (or ``user``, or an ``x-session-id`` header); without a
name, the conversation whose transcript is the longest prefix of the request's is the one. Any
other request starts a session whose history is handed over with it (read once, then kept).
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from dataclasses import dataclass, field

# (role: "user" | "assistant", text), or with tools (http/tools.py) a third item: a tool
# result's call id, or an assistant turn's calls as JSON
Turn = tuple[str, str] | tuple[str, str, str]


@dataclass
class Conversation:
    session: str  # the protocol session's name
    system: str
    turns: list[Turn] = field(default_factory=list)  # what the session's cache holds
    key: str | None = None
    busy: bool = False  # a request is being answered on it

    def continues(self, system: str, history: list[Turn]) -> bool:
        return self.system == system and self.turns == history


@dataclass(frozen=True)
class Match:
    conversation: Conversation
    fresh: bool  # a new session: open it with ``history``
    history: tuple[Turn, ...] = ()
    replaced: str | None = None  # a session to close (its transcript no longer matches)


class Conversations:
    """The face's conversations, at most ``capacity`` (the least recently used go first: their
    sessions are closed by the caller)."""

    def __init__(self, capacity: int = 256) -> None:
        self.capacity = capacity
        self._by_session: OrderedDict[str, Conversation] = OrderedDict()
        self._by_key: dict[str, str] = {}

    def __len__(self) -> int:
        return len(self._by_session)

    def match(self, key: str | None, system: str, history: list[Turn]) -> Match:
        """The conversation a request (``history``: its turns before the new line) continues,
        or a new one to open."""
        if key is not None and (sid := self._by_key.get(key)) is not None:
            conv = self._by_session[sid]
            self._by_session.move_to_end(sid)
            if conv.continues(system, history):
                return Match(conv, fresh=False)
            # the client edited or cut its transcript: a new session with its version
            fresh = self._new(key, system, history)
            return Match(fresh, fresh=True, history=tuple(history), replaced=sid)
        if key is None:
            best: Conversation | None = None
            for conv in self._by_session.values():
                if not conv.busy and conv.key is None and conv.continues(system, history) and (
                        best is None or len(conv.turns) > len(best.turns)):
                    best = conv
            if best is not None:
                self._by_session.move_to_end(best.session)
                return Match(best, fresh=False)
        return Match(self._new(key, system, history), fresh=True, history=tuple(history))

    def evictions(self) -> list[str]:
        """Sessions to close so the table stays within its capacity (least recent first)."""
        out = []
        while len(self._by_session) > self.capacity:
            sid, conv = next(iter(self._by_session.items()))
            if conv.busy:
                self._by_session.move_to_end(sid)
                if all(c.busy for c in self._by_session.values()):
                    break
                continue
            self.forget(sid)
            out.append(sid)
        return out

    def least_recent_idle(self, but: str) -> str | None:
        """The session of the least recently used conversation not answering now (other than
        ``but``): the one to close when the sidecar has no session slot left."""
        return next((sid for sid, c in self._by_session.items()
                     if not c.busy and sid != but), None)

    def answered(self, conv: Conversation, line: str, reply: str) -> None:
        """The session's cache now holds ``line`` and ``reply`` too."""
        conv.turns = [*conv.turns, ("user", line), ("assistant", reply)]

    def answered_turns(self, conv: Conversation, turns: list[Turn]) -> None:
        """The session's cache now holds ``turns`` too (a line with tool results or calls)."""
        conv.turns = [*conv.turns, *turns]

    def forget(self, session: str) -> None:
        conv = self._by_session.pop(session, None)
        if conv is not None and conv.key is not None and self._by_key.get(conv.key) == session:
            del self._by_key[conv.key]

    def _new(self, key: str | None, system: str, history: list[Turn]) -> Conversation:
        conv = Conversation(f"http.{secrets.token_hex(8)}", system, list(history), key)
        self._by_session[conv.session] = conv
        if key is not None:
            old = self._by_key.get(key)
            if old is not None and old in self._by_session:
                self._by_session.pop(old)
            self._by_key[key] = conv.session
        return conv
