"""Who owns which session, and the streams a client may resume — the server's bookkeeping,
kept on the socket thread only (no locks), with no sockets or model in it.

A session belongs to the client that opened, restored or adopted it, and lives in that client's
*scope*: its owner key (``hello.owner``) when it gave one, else its connection alone. Names are
scoped: two games may both have "npc.brom", and a client can neither see, adopt, collide with
nor confirm a session of another scope. The engine knows each session by a scoped id
(:func:`engine_id`); the wire shows the name. When the client leaves (``goodbye`` with
``keep_sessions``) or its lease lapses, the session is *orphaned*: the conversation stays in the
model, a client of the same scope may adopt it, and it is closed when it has waited
``orphan_ttl_s`` or when a live client needs its slot (oldest first). So an Editor that enters
play mode many times never fills the model with sessions nobody can reach.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass, field


def key_scope(owner_key: str) -> str:
    """The scope of an owner key: a digest, so the secret itself is kept nowhere."""
    return "k" + hashlib.sha256(owner_key.encode()).hexdigest()[:24]


def connection_scope(identity: bytes) -> str:
    return "c" + hashlib.sha256(identity).hexdigest()[:24]


# The one scope of every client below protocol 1.2 that gives no owner key: 1.1's rules had
# names global and let any client adopt any orphan, which its games rely on (open by name; on
# session_exists, adopt). Only the game's connections are admitted below 1.2 (see
# SessionService._hello), so sharing this scope shares sessions among the game's own runs.
LEGACY_SCOPE = "v1"


def engine_id(scope: str, name: str) -> str:
    """The engine's id of session ``name`` of ``scope``: unique across scopes (``~`` is not a
    name character, and the engine's own ids are 12 hex digits)."""
    return f"{name}~{scope}"


@dataclass
class SessionInfo:
    owner: bytes | None  # the client's identity; None while orphaned
    scope: str = ""  # whose it is (see key_scope, connection_scope)
    name: str = ""  # the session's name on the wire
    persona: str = ""
    since: float = field(default_factory=time.monotonic)  # owned or orphaned since
    used: float = field(default_factory=time.monotonic)  # a reply last started or ended
    replying: int = 0  # replies running
    # the ids of the calls its last reply made, which a line's tool_results may answer
    # (serving/tool_results.py); None: not known (restored from a save)
    calls: frozenset[str] | None = frozenset()


class Sessions:
    """Sessions by engine id, and by (scope, name)."""

    def __init__(self) -> None:
        self.by_id: dict[str, SessionInfo] = {}
        self.by_name: dict[tuple[str, str], str] = {}
        self.naming: set[tuple[str, str]] = set()  # (scope, name) being opened or restored

    def __contains__(self, scoped: tuple[str, str]) -> bool:
        return scoped in self.by_name or scoped in self.naming

    def find(self, scope: str, name: str) -> str | None:
        """The engine id of ``name`` in ``scope``, if there is one."""
        return self.by_name.get((scope, name))

    def in_scope(self, scope: str) -> list[str]:
        return [sid for sid, info in self.by_id.items() if info.scope == scope]

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

    def add(self, sid: str, owner: bytes, scope: str, name: str, persona: str = "",
            calls: frozenset[str] | None = frozenset()) -> None:
        self.by_id[sid] = SessionInfo(owner, scope, name, persona, calls=calls)
        self.by_name[(scope, name)] = sid

    def orphan(self, sid: str) -> None:
        info = self.by_id.get(sid)
        if info is not None:
            info.owner, info.since = None, time.monotonic()

    def adopt(self, sid: str, owner: bytes) -> None:
        info = self.by_id[sid]
        info.owner, info.since = owner, time.monotonic()

    def drop(self, sid: str) -> None:
        info = self.by_id.pop(sid, None)
        if info is not None and self.by_name.get((info.scope, info.name)) == sid:
            del self.by_name[(info.scope, info.name)]

    def reply_started(self, sid: str) -> None:
        info = self.by_id.get(sid)
        if info is not None:
            info.replying += 1
            info.used = time.monotonic()

    def reply_ended(self, sid: str) -> None:
        info = self.by_id.get(sid)
        if info is not None:
            info.replying = max(0, info.replying - 1)
            info.used = time.monotonic()

    def idle(self, owner: bytes, before: float) -> list[str]:
        """``owner``'s sessions with no reply running and none since ``before``."""
        return [sid for sid, info in self.by_id.items()
                if info.owner == owner and not info.replying and info.used < before]

    def least_recent_idle(self, owners: set[bytes]) -> str | None:
        """The session of one of ``owners`` with no reply running, used longest ago."""
        idle = [(info.used, sid) for sid, info in self.by_id.items()
                if info.owner in owners and not info.replying]
        return min(idle)[1] if idle else None

    def least_recent(self, owners: set[bytes]) -> str | None:
        """The session of one of ``owners`` used longest ago, replying or not."""
        held = [(info.used, sid) for sid, info in self.by_id.items() if info.owner in owners]
        return min(held)[1] if held else None

    def expired(self, ttl_s: float) -> list[str]:
        now = time.monotonic()
        return [sid for sid in self.orphans() if now - self.by_id[sid].since > ttl_s]

    def clear(self) -> None:
        self.by_id.clear()
        self.by_name.clear()
        self.naming.clear()


@dataclass
class StreamLog:
    """A stream's events as sent, so a client that lost some (a dropped connection) can have
    them again: ``tokens[k]`` is the event with ``i = k + 1``. Socket thread only: the reply's
    listener encodes the events on the model side's outbox thread and hands them here."""

    tokens: list[bytes] = field(default_factory=list)
    terminal: bytes | None = None
    ended_at: float | None = None  # when the socket thread saw the end

    def replay(self, after: int) -> list[bytes]:
        end = self.terminal
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
