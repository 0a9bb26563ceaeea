"""Caps on what one connection may send and have waiting, for a ROUTER without a receive limit.

The sidecar's ROUTER sets no receive high-water mark (with one, a peer can make libzmq 4.3 abort
the process; see ``Server._bind``), so libzmq reads a peer as fast as the peer writes: millions of
tiny messages a second, far more than the socket thread handles, all waiting in memory. The
socket thread counts each routing id's messages per second; past the cap the rest are dropped
unanswered and the peer's connection is shut down (libzmq hands its descriptor out with every
message; ``serving/peer_sockets.py`` makes sure it is still that peer's), which ends it inside
libzmq and frees what it queued. A DEALER reconnects by itself.
Bytes are capped as well as messages: a handful of 17 MiB messages a second outruns the loop's
parsing as surely as millions of tiny ones.

The caps count what the loop reads. When the loop read and handled one message at a time, a
flooder whose messages cost it more than their share (each answered with an error, say) was
read at less than the cap while libzmq queued the rest: it was cut after 108 s, with the
sidecar 43-196 MiB larger. So what waits is bounded where the loop can see it
(:class:`ReceiveQueues`): the loop reads the socket as fast as messages arrive (reading costs
microseconds, handling up to milliseconds) into a queue per connection and handles the queues
in turns, one message per connection per turn, so a busy connection delays another's by one
message a turn. A connection with more than ``MAX_QUEUED_MESSAGES`` or ``MAX_QUEUED_BYTES``
read and not yet handled is cut as a flooder is, and past ``MAX_QUEUED_BYTES_ALL`` over all
connections the one with the most waiting is. libzmq itself then holds only what arrives while
the loop handles one turn. And a loop that stays behind (more than a batch waiting after every
turn) for ``BACKLOG_S`` cuts the connection with the most waiting: a game never keeps it behind
for that long.
"""

from __future__ import annotations

import time
from collections import deque

import zmq

from igi_sdk.serving.peer_sockets import PeerSockets
from igi_sdk.wire.protocol import MAX_MESSAGE_BYTES

MAX_MESSAGES_PER_SECOND = 2000  # per routing id; a game sends tens (frames at 60 Hz, requests)
# per routing id: four of the largest messages (a 16 MiB image each) a second; a game sends a
# screenshot now and then
MAX_BYTES_PER_SECOND = 64 << 20
# how long the loop may stay behind (messages still waiting after every batch) before the peer
# that sent the most in the window is cut
BACKLOG_S = 0.25
# a connection's receive queue (read, not yet handled): a game's requests are handled as they
# come, so thousands waiting is a peer sending faster than its turns. Two seconds of the rate
# cap, so that a flood of small messages meets the rate cap first: each cut makes its DEALER
# reconnect as a new peer, and a bound below the cap cut such a flooder 6 times as often
# (what its connections had queued and were sent piled up with every one). Three of the
# largest messages fit (two chats with a 16 MiB image each, back to back, are a game's worst
# burst): the byte bound is what holds a flood of large messages.
MAX_QUEUED_MESSAGES = 2 * MAX_MESSAGES_PER_SECOND
MAX_QUEUED_BYTES = 3 * MAX_MESSAGE_BYTES
# every connection's together: many connections each under their own bound add up
MAX_QUEUED_BYTES_ALL = 128 << 20


class FloodGuard:
    def __init__(self, per_second: int = MAX_MESSAGES_PER_SECOND,
                 bytes_per_second: int = MAX_BYTES_PER_SECOND,
                 backlog_s: float = BACKLOG_S) -> None:
        self.per_second, self.bytes_per_second = per_second, bytes_per_second
        self.backlog_s = backlog_s
        self.cut = 0  # connections shut down so far
        self._window = time.monotonic()
        self._counts: dict[bytes, tuple[int, int]] = {}  # routing id -> (messages, bytes)
        self._cut_now: set[bytes] = set()  # shut in this window
        self._peers = PeerSockets()  # each peer's connection, to shut the right one
        self._behind_since: float | None = None  # the loop left messages waiting since
        self._waited = 0  # messages waiting in the receive queues after the last turn

    def admit(self, identity: bytes, frame: zmq.Frame) -> bool:
        """Whether to handle this message (received with ``copy=False``) from ``identity``."""
        now = time.monotonic()
        if now - self._window >= 1.0:
            self._window, self._counts, self._cut_now = now, {}, set()
            self._peers.roll()
        self._peers.see(identity, frame)
        if identity in self._cut_now:
            return False  # what a cut connection had queued
        n, size = self._counts.get(identity, (0, 0))
        n, size = n + 1, size + len(frame)
        self._counts[identity] = (n, size)
        if n <= self.per_second and size <= self.bytes_per_second:
            return True
        self.cut_peer(identity)
        return False

    def cut_peer(self, identity: bytes) -> None:
        """Shut ``identity``'s connection and drop what it sends for the rest of the window.
        Once per window: later messages may be its leftovers."""
        if identity not in self._cut_now:
            self._cut_now.add(identity)
            if self._peers.shut(identity):
                self.cut += 1

    def behind(self, emptied: bool, backlog_s: float | None = None) -> bool:
        """After the loop's turn: ``emptied`` when no message was left waiting. True once the
        loop has been behind for ``backlog_s`` in a row (then again a backlog later)."""
        now = time.monotonic()
        if emptied:
            self._behind_since = None
            return False
        if self._behind_since is None:
            self._behind_since = now
            return False
        if now - self._behind_since < (self.backlog_s if backlog_s is None else backlog_s):
            return False
        self._behind_since = now  # the next cut, if still behind, a backlog later
        return True

    def behind_after_turn(self, socket_emptied: bool, waiting: int, batch: int) -> bool:
        """:meth:`behind` for a loop that queues what it reads: it caught up when the socket
        was emptied and at most a batch waits in its queues (a client keeping a window of
        requests in flight waits within it), or fewer than after the last turn: a burst being
        worked off is not a flood, however slow the host."""
        caught_up = waiting <= batch or waiting < self._waited
        self._waited = waiting
        return self.behind(emptied=socket_emptied and caught_up)

    def drained(self, emptied: bool, backlog_s: float | None = None) -> bytes | None:
        """:meth:`behind`, and then the busiest peer of the window (the most messages sent) is
        cut, and returned. (The sidecar's loop, which queues what it reads, cuts the peer with
        the most waiting first: ``ReceiveQueues.cut_busiest``.)"""
        if not self.behind(emptied, backlog_s):
            return None
        return self.cut_busiest_sender()

    def cut_busiest_sender(self, more_than: int = 0) -> bytes | None:
        """Cut the peer that sent the most in this window (more than ``more_than`` messages),
        and return it. A flooder whose handled messages wait nowhere still fills libzmq: each
        of its reconnects is a new peer, read in turns with the leftovers of the last one."""
        busiest = max((ident for ident in self._counts if ident not in self._cut_now),
                      key=lambda ident: self._counts[ident][0], default=None)
        if busiest is None or self._counts[busiest][0] <= more_than:
            return None
        self.cut_peer(busiest)
        return busiest


class ReceiveQueues:
    """Messages read from the socket and not yet handled, a queue per connection, taken in
    turns (one message per connection per turn). A connection past its bound, or the one with
    the most waiting when all of them together are past theirs, is cut through ``guard`` and
    what it had waiting is dropped unanswered."""

    def __init__(self, guard: FloodGuard, max_messages: int = MAX_QUEUED_MESSAGES,
                 max_bytes: int = MAX_QUEUED_BYTES,
                 max_bytes_all: int = MAX_QUEUED_BYTES_ALL) -> None:
        self.guard = guard
        self.max_messages, self.max_bytes, self.max_bytes_all = max_messages, max_bytes, \
            max_bytes_all
        self._queues: dict[bytes, deque[zmq.Frame]] = {}
        self._bytes: dict[bytes, int] = {}
        self._turns: deque[bytes] = deque()  # connections with messages waiting, in turn order
        self.messages = 0  # waiting now, all connections
        self.total = 0  # bytes waiting now, all connections
        self.cuts = 0  # connections cut by these bounds
        self.peak_messages = 0  # the most one connection had waiting (within its bound)
        self.peak_bytes = 0

    def __bool__(self) -> bool:
        return self.messages > 0

    def put(self, identity: bytes, frame: zmq.Frame) -> None:
        q = self._queues.get(identity)
        if q is None:
            q = self._queues[identity] = deque()
            self._bytes[identity] = 0
            self._turns.append(identity)
        size = len(frame)
        q.append(frame)
        self._bytes[identity] += size
        self.messages += 1
        self.total += size
        if len(q) > self.max_messages or self._bytes[identity] > self.max_bytes:
            self._cut(identity)
            return
        self.peak_messages = max(self.peak_messages, len(q))
        self.peak_bytes = max(self.peak_bytes, self._bytes[identity])
        if self.total > self.max_bytes_all:
            self._cut(max(self._bytes, key=self._bytes.__getitem__))

    def take(self) -> tuple[bytes, zmq.Frame] | None:
        """The next connection's oldest message, or None when nothing waits."""
        while self._turns:
            identity = self._turns.popleft()
            q = self._queues[identity]
            frame = q.popleft()
            size = len(frame)
            self._bytes[identity] -= size
            self.messages -= 1
            self.total -= size
            if q:
                self._turns.append(identity)
            else:
                del self._queues[identity], self._bytes[identity]
            return identity, frame
        return None

    def drop(self, identity: bytes) -> None:
        """Forget what ``identity`` had waiting (its connection was cut)."""
        q = self._queues.pop(identity, None)
        if q is None:
            return
        self.messages -= len(q)
        self.total -= self._bytes.pop(identity)
        self._turns.remove(identity)

    def cut_busiest(self) -> bytes | None:
        """Cut the connection with the most messages waiting (the loop stayed behind: see
        ``FloodGuard.behind``). A peer with nothing waiting is never the one: leftovers of a
        connection already cut keep the socket busy but wait nowhere."""
        if not self._queues:
            return None
        busiest = max(self._queues, key=lambda ident: len(self._queues[ident]))
        self._cut(busiest)
        return busiest

    def _cut(self, identity: bytes) -> None:
        self.guard.cut_peer(identity)
        self.cuts += 1
        self.drop(identity)

    def figures(self) -> dict[str, int]:
        return {"messages": self.messages, "bytes": self.total,
                "peak_messages": self.peak_messages, "peak_bytes": self.peak_bytes,
                "max_messages": self.max_messages, "max_bytes": self.max_bytes,
                "max_bytes_all": self.max_bytes_all, "cuts": self.cuts}
