"""A cap on how fast one connection may send, for a ROUTER without a receive limit.

The sidecar's ROUTER sets no receive limit (with one, a peer can make libzmq 4.3 abort the
process; see ``Server._bind``), so libzmq reads a peer as fast as the peer writes: millions of
tiny messages a second, far more than the socket thread handles, all waiting in memory. The
socket thread counts each routing id's messages per second; past the cap the rest are dropped
unanswered and the peer's connection is shut down (libzmq hands its descriptor out with every
message), which ends it inside libzmq and frees what it queued. A DEALER reconnects by itself.
Bytes are capped as well as messages: a handful of 17 MiB messages a second outruns the loop's
parsing as surely as millions of tiny ones.

The caps count what the loop reads, and a flooder whose messages cost the loop more than their
share (each answered with an error, say) is read at less than the cap while libzmq queues the
rest: it was cut after 108 s, with the sidecar 43-196 MiB larger. So the loop also reports
whether it left messages waiting (it reads a batch at a time): a socket that stays backlogged
for ``BACKLOG_S`` has its busiest peer of the window cut. A game never keeps the loop behind for
that long. What a flooder can make libzmq hold is then what it sends in ``BACKLOG_S`` plus a
window: bounded by the loopback's rate for that time, and freed when its connection is shut.
"""

from __future__ import annotations

import socket
import time

import zmq

MAX_MESSAGES_PER_SECOND = 2000  # per routing id; a game sends tens (frames at 60 Hz, requests)
# per routing id: four of the largest messages (a 16 MiB image each) a second; a game sends a
# screenshot now and then
MAX_BYTES_PER_SECOND = 64 << 20
# how long the loop may stay behind (messages still waiting after every batch) before the peer
# that sent the most in the window is cut
BACKLOG_S = 0.25


class FloodGuard:
    def __init__(self, per_second: int = MAX_MESSAGES_PER_SECOND,
                 bytes_per_second: int = MAX_BYTES_PER_SECOND) -> None:
        self.per_second, self.bytes_per_second = per_second, bytes_per_second
        self.cut = 0  # connections shut down so far
        self._window = time.monotonic()
        self._counts: dict[bytes, tuple[int, int]] = {}  # routing id -> (messages, bytes)
        self._cut_now: set[bytes] = set()  # shut in this window
        # each peer's latest message of the window: its connection, for a backlog cut
        self._latest: dict[bytes, zmq.Frame] = {}
        self._behind_since: float | None = None  # the loop left messages waiting since

    def admit(self, identity: bytes, frame: zmq.Frame) -> bool:
        """Whether to handle this message (received with ``copy=False``) from ``identity``."""
        now = time.monotonic()
        if now - self._window >= 1.0:
            self._window, self._counts, self._cut_now, self._latest = now, {}, set(), {}
        if identity in self._cut_now:
            return False  # what a cut connection had queued
        n, size = self._counts.get(identity, (0, 0))
        n, size = n + 1, size + len(frame)
        self._counts[identity] = (n, size)
        self._latest[identity] = frame
        if n <= self.per_second and size <= self.bytes_per_second:
            return True
        if identity not in self._cut_now:  # once per window: later ones may be its leftovers
            self._cut_now.add(identity)
            self._shut(frame)
        return False

    def drained(self, emptied: bool, backlog_s: float = BACKLOG_S) -> None:
        """After the loop read a batch: ``emptied`` when no message was left waiting. Behind
        for ``backlog_s`` in a row: the busiest peer of the window is cut."""
        now = time.monotonic()
        if emptied:
            self._behind_since = None
            return
        if self._behind_since is None:
            self._behind_since = now
            return
        if now - self._behind_since < backlog_s:
            return
        busiest = max((ident for ident in self._counts if ident not in self._cut_now),
                      key=lambda ident: self._counts[ident][0], default=None)
        frame = self._latest.get(busiest) if busiest is not None else None
        if busiest is not None and frame is not None:
            self._cut_now.add(busiest)
            self._shut(frame)
        self._behind_since = now  # the next cut, if still behind, a backlog later

    def _shut(self, frame: zmq.Frame) -> None:
        try:
            sock = socket.socket(fileno=frame.get(zmq.SRCFD))
        except (OSError, zmq.ZMQError):
            return  # the connection is already gone
        try:
            sock.shutdown(socket.SHUT_RDWR)
            self.cut += 1
        except OSError:
            pass
        finally:
            sock.detach()  # the descriptor stays libzmq's to close
