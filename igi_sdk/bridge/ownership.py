"""Who owns which session, and the streams a client may resume — the server's bookkeeping,
kept on the socket thread only (no locks), with no sockets or model in it.

A session belongs to the client that opened, restored or adopted it. When that client leaves
(``goodbye`` with ``keep_sessions``) or its lease lapses, the session is *orphaned*: the
conversation stays in the model, any client may adopt it by name, and it is closed when it has
waited ``orphan_ttl_s`` or when a live client needs its slot (oldest first). So an Editor that
enters play mode many times never fills the model with sessions nobody can reach.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class SessionInfo:
    owner: bytes | None  # the client's identity; None while orphaned
    persona: str = ""
    since: float = field(default_factory=time.monotonic)  # owned or orphaned since


class Sessions:
    def __init__(self) -> None:
        self.by_id: dict[str, SessionInfo] = {}
        self.naming: set[str] = set()  # names of sessions being opened or restored

    def __contains__(self, sid: str) -> bool:
        return sid in self.by_id or sid in self.naming

    def __len__(self) -> int:
        return len(self.by_id)

    def owner_of(self, sid: str) -> bytes | None:
        info = self.by_id.get(sid)
        return info.owner if info else None

    def owned(self, owner: bytes) -> list[str]:
        return [sid for sid, info in self.by_id.items() if info.owner == owner]

    def orphans(self) -> list[str]:
        """Orphaned sessions, the longest-waiting first."""
        waiting = [(info.since, sid) for sid, info in self.by_id.items() if info.owner is None]
        return [sid for _, sid in sorted(waiting)]

    def add(self, sid: str, owner: bytes, persona: str = "") -> None:
        self.by_id[sid] = SessionInfo(owner, persona)

    def orphan(self, sid: str) -> None:
        info = self.by_id.get(sid)
        if info is not None:
            info.owner, info.since = None, time.monotonic()

    def adopt(self, sid: str, owner: bytes) -> None:
        info = self.by_id[sid]
        info.owner, info.since = owner, time.monotonic()

    def drop(self, sid: str) -> None:
        self.by_id.pop(sid, None)

    def expired(self, ttl_s: float) -> list[str]:
        now = time.monotonic()
        return [sid for sid in self.orphans() if now - self.by_id[sid].since > ttl_s]

    def clear(self) -> None:
        self.by_id.clear()
        self.naming.clear()


@dataclass
class StreamLog:
    """A stream's events as sent, so a client that lost some (a dropped connection) can have
    them again: ``tokens[k]`` is the event with ``i = k + 1``. Appended to on the engine thread
    and read on the socket thread: list appends and whole-reference writes are atomic."""

    tokens: list[bytes] = field(default_factory=list)
    terminal: bytes | None = None
    ended_at: float | None = None  # when the socket thread saw the end

    def replay(self, after: int) -> list[bytes]:
        end = self.terminal  # read once: the stream may end while we look
        frames = self.tokens[after:]
        return [*frames, end] if end is not None else frames


# ended streams a client may still resume: this long, and at most this many
RESUME_KEEP_S = 60.0
RESUME_KEEP_ENDED = 64


def prune_logs(logs: dict[int, StreamLog]) -> None:
    now = time.monotonic()
    ended = sorted((log.ended_at, rid) for rid, log in logs.items() if log.ended_at is not None)
    for k, (at, rid) in enumerate(ended):
        if now - at > RESUME_KEEP_S or k < len(ended) - RESUME_KEEP_ENDED:
            del logs[rid]
