"""Which TCP connection each ROUTER peer is on, so that the flood guard shuts down the right one.

libzmq hands out with every message the descriptor it arrived on (``SRCFD``), and shutting that
descriptor down ends the connection inside libzmq (``serving/flood.py``). But a message can be
read after its connection closed: what a peer sent before it left waits in the ROUTER until it
is read. By then the kernel may have given the descriptor's number to the next connection, and a
cut by that number shut an innocent peer: a flooder's leftovers, read past its rate, cut the
next client to connect, and its first request was never answered.

So each routing id is bound to its connection's socket inode (a socket keeps its inode while
it is open, and a new socket gets a new one, whatever descriptor number it is given), taken at
its first message in each one-second window. A connection is shut only while its descriptor
still names that inode and no other routing id claims it. Two claims mean one of them is a
closed connection's leftovers, read after the descriptor was reused: neither is shut until a
window passes in which only one of them was seen. What remains: leftovers read past their rate
before the reusing connection's first message is, claim its socket alone; a peer's first
message is in the ROUTER as soon as it is sent, and the ROUTER reads its peers in turns, so
that takes a reused descriptor and a read pass that ends between the two.
"""

from __future__ import annotations

import os
import socket

import zmq

Connection = tuple[int, int]  # (descriptor, socket inode)


def _inode(fd: int) -> int | None:
    try:
        return os.fstat(fd).st_ino
    except OSError:
        return None  # closed


class PeerSockets:
    """Routing id -> its connection, for the routing ids seen in this window or the last."""

    def __init__(self) -> None:
        self._bound: dict[bytes, Connection] = {}
        self._claims: dict[Connection, set[bytes]] = {}
        self._seen: set[bytes] = set()  # in this window

    def see(self, identity: bytes, frame: zmq.Frame) -> None:
        """A message from ``identity`` (received with ``copy=False``): at its first in the
        window, (re)bind it to the connection the message names."""
        if identity in self._seen:
            return
        self._seen.add(identity)
        try:
            fd = frame.get(zmq.SRCFD)
        except zmq.ZMQError:
            return
        inode = _inode(fd)
        if inode is None:
            return  # its connection is gone: nothing to shut
        connection = (fd, inode)
        old = self._bound.get(identity)
        if old == connection:
            return
        if old is not None:  # a routing id that reconnected (ROUTER_HANDOVER), or leftovers
            self._unclaim(identity, old)
        self._bound[identity] = connection
        self._claims.setdefault(connection, set()).add(identity)

    def roll(self) -> None:
        """A new window: forget the routing ids not seen in the one that ended."""
        for identity in [i for i in self._bound if i not in self._seen]:
            self._unclaim(identity, self._bound.pop(identity))
        self._seen = set()

    def shut(self, identity: bytes) -> bool:
        """Shut ``identity``'s connection down, if it is still the one it was seen on and
        nobody else claims it; whether it was."""
        connection = self._bound.get(identity)
        if connection is None or len(self._claims.get(connection, ())) != 1:
            return False
        fd, inode = connection
        if _inode(fd) != inode:
            return False  # closed, and perhaps reused
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            return False
        try:
            sock.shutdown(socket.SHUT_RDWR)
            return True
        except OSError:
            return False
        finally:
            sock.detach()  # the descriptor stays libzmq's to close

    def __len__(self) -> int:
        return len(self._bound)

    def _unclaim(self, identity: bytes, connection: Connection) -> None:
        claims = self._claims.get(connection)
        if claims is not None:
            claims.discard(identity)
            if not claims:
                del self._claims[connection]
