"""The connected clients and what each may hold — the server's per-client bookkeeping and its
caps, kept on the socket thread only (no locks), with no sockets or model in it.

A client is the game (it gave the sidecar's launch token, or the sidecar has none) or a
stranger. Every cap here keeps what one client can queue or hold within its share: how many
clients are known at all, how many session slots each may take, how many image bytes its
waiting lines may keep in memory.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from igi_sdk.serving.backend import StreamHandle
from igi_sdk.serving.ownership import StreamLog
from igi_sdk.wire import protocol as P


@dataclass
class Client:
    identity: bytes
    name: str = ""
    engine: str = ""
    minor: int = 0  # the protocol minor version it speaks (0: 1.0 liveness rules)
    lease_s: float = 15.0
    scope: str = ""  # whose sessions it opens (ownership.key_scope / connection_scope)
    game: bool = False  # holds the launch token (or none is set): pacing, PID watch, shutdown
    local: bool = False  # a peer in the sidecar's process (the HTTP face): no lease
    image_bytes: int = 0  # of its chats that have not ended
    opening: int = 0  # open/restore requests in flight (count against the session cap)
    streams: dict[int, StreamHandle | None] = field(default_factory=dict)  # chat id -> handle
    cancel_pending: set[int] = field(default_factory=set)  # cancelled before the handle came
    logs: dict[int, StreamLog] = field(default_factory=dict)  # chat id -> events, to resume
    last_seen: float = field(default_factory=time.monotonic)


def slot_cap(c: Client, slots: int, configured: int | None) -> int:
    """How many sessions ``c`` may hold: so a stranger cannot take every slot from the game, a
    client that is not the game gets half of them (``configured``: one cap for all). The HTTP
    face (``local``) may hold every slot: its sessions are many clients' conversations, and
    the game takes a slot from them whenever it needs one, busy or not
    (SessionService._session_room)."""
    if configured is not None:
        return configured
    return slots if c.game or c.local else max(1, -(-slots // 2))


def stream_cap(c: Client, slots: int, configured: int) -> int:
    """How many replies ``c`` may stream at once: the face, one per session slot."""
    return max(configured, slots) if c.local else configured


def make_room(clients: dict[bytes, Client], max_clients: int, holds_sessions: set[bytes]) -> None:
    """Room for one more client in ``clients``: past the cap, the longest-silent client holding
    nothing is forgotten; if every client holds something, the newcomer waits (``busy``)."""
    if len(clients) < max_clients:
        return
    idle = [(c.last_seen, ident) for ident, c in clients.items()
            if not c.streams and not c.opening and ident not in holds_sessions]
    if not idle:
        raise P.ProtocolError("busy", f"{len(clients)} clients are connected, the most this "
                              "sidecar serves; try again later", retryable=True)
    del clients[min(idle)[1]]


class ImageBytes:
    """Image bytes of chats that have not ended, per client and in all: queued lines keep their
    images in memory until they end, so a flood of large images is refused, not held."""

    def __init__(self, per_client: int, in_all: int) -> None:
        self.per_client, self.in_all = per_client, in_all
        self.held = 0

    def take(self, c: Client, nbytes: int) -> None:
        """Count ``nbytes`` for ``c``'s new line, or refuse it ``busy`` (retryable)."""
        if not nbytes:
            return
        if c.image_bytes + nbytes > self.per_client:
            raise P.ProtocolError("busy", f"this client's lines waiting with images hold "
                                  f"{c.image_bytes >> 20} MiB; send this one when one of them "
                                  "ends", retryable=True)
        if self.held + nbytes > self.in_all:
            raise P.ProtocolError("busy", f"lines waiting with images hold {self.held >> 20} "
                                  "MiB; send this one when one of them ends", retryable=True)
        c.image_bytes += nbytes
        self.held += nbytes

    def give_back(self, c: Client, nbytes: int) -> None:
        c.image_bytes -= nbytes
        self.held -= nbytes
