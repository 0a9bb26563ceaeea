"""A cap on how fast one connection may send, for a ROUTER without a receive limit.

The sidecar's ROUTER sets no receive limit (with one, a peer can make libzmq 4.3 abort the
process; see ``Server._bind``), so libzmq reads a peer as fast as the peer writes: millions of
tiny messages a second, far more than the socket thread handles, all waiting in memory. The
socket thread counts each routing id's messages per second; past the cap the rest are dropped
unanswered and the peer's connection is shut down (libzmq hands its descriptor out with every
message), which ends it inside libzmq and frees what it queued. A DEALER reconnects by itself.
Bytes are capped as well as messages: a handful of 17 MiB messages a second outruns the loop's
parsing as surely as millions of tiny ones.
"""

from __future__ import annotations

import socket
import time

import zmq

MAX_MESSAGES_PER_SECOND = 2000  # per routing id; a game sends tens (frames at 60 Hz, requests)
# per routing id: four of the largest messages (a 16 MiB image each) a second; a game sends a
# screenshot now and then
MAX_BYTES_PER_SECOND = 64 << 20


class FloodGuard:
    def __init__(self, per_second: int = MAX_MESSAGES_PER_SECOND,
                 bytes_per_second: int = MAX_BYTES_PER_SECOND) -> None:
        self.per_second, self.bytes_per_second = per_second, bytes_per_second
        self.cut = 0  # connections shut down so far
        self._window = time.monotonic()
        self._counts: dict[bytes, tuple[int, int]] = {}  # routing id -> (messages, bytes)
        self._cut_now: set[bytes] = set()  # shut in this window

    def admit(self, identity: bytes, frame: zmq.Frame) -> bool:
        """Whether to handle this message (received with ``copy=False``) from ``identity``."""
        now = time.monotonic()
        if now - self._window >= 1.0:
            self._window, self._counts, self._cut_now = now, {}, set()
        n, size = self._counts.get(identity, (0, 0))
        n, size = n + 1, size + len(frame)
        self._counts[identity] = (n, size)
        if n <= self.per_second and size <= self.bytes_per_second:
            return True
        if identity not in self._cut_now:  # once per window: later ones may be its leftovers
            self._cut_now.add(identity)
            self._shut(frame)
        return False

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
