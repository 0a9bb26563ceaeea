"""Which connection a flood cut shuts (serving/peer_sockets.py), on real sockets: a routing id
is bound to its socket's inode, a descriptor number another socket took since is never shut,
and a socket two routing ids claim is shut for neither until a window passes in which only one
of them was seen."""

from __future__ import annotations

import os
import socket

import zmq

from igi_sdk.serving.peer_sockets import PeerSockets


class _Frame:
    """A received message as PeerSockets reads it: the descriptor it came from."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def get(self, option: int) -> int:
        assert option == zmq.SRCFD
        return self.fd


def _was_shut(peer: socket.socket) -> bool:
    peer.settimeout(1.0)
    try:
        return peer.recv(1) == b""  # the other end shut down: end of stream
    except (TimeoutError, OSError):
        return False


def test_a_routing_id_is_shut_on_its_own_connection() -> None:
    ours, theirs = socket.socketpair()
    peers = PeerSockets()
    peers.see(b"npc", _Frame(ours.fileno()))
    assert peers.shut(b"npc") and _was_shut(theirs)
    assert not peers.shut(b"stranger")  # never seen: nothing to shut
    ours.close()
    theirs.close()


def test_a_descriptor_reused_by_another_connection_is_never_shut() -> None:
    old, old_peer = socket.socketpair()
    fd = old.fileno()
    peers = PeerSockets()
    peers.see(b"flooder", _Frame(fd))
    old.close()  # the flooder left; its leftovers are still to be read
    new, new_peer = socket.socketpair()
    if new.fileno() != fd:  # make the kernel's reuse certain
        os.dup2(new.fileno(), fd)
        new.close()
        new = socket.socket(fileno=fd)
    assert not peers.shut(b"flooder")
    new_peer.setblocking(False)
    try:
        new_peer.recv(1)
        raise AssertionError("the new connection was shut down")
    except BlockingIOError:
        pass  # still open, nothing sent
    for s in (old_peer, new, new_peer):
        s.close()


def test_a_connection_two_routing_ids_claim_is_shut_for_neither_until_one_goes_quiet() -> None:
    ours, theirs = socket.socketpair()
    peers = PeerSockets()
    peers.see(b"leftovers", _Frame(ours.fileno()))  # read after their connection closed
    peers.see(b"client", _Frame(ours.fileno()))  # the connection that took the descriptor
    assert not peers.shut(b"leftovers") and not peers.shut(b"client")
    peers.roll()
    peers.see(b"client", _Frame(ours.fileno()))  # only the client is still heard from
    peers.roll()  # the leftovers' routing id is forgotten
    assert len(peers) == 1
    assert peers.shut(b"client") and _was_shut(theirs)
    ours.close()
    theirs.close()


def test_a_routing_id_that_reconnects_is_bound_to_its_new_connection_next_window() -> None:
    first, first_peer = socket.socketpair()
    second, second_peer = socket.socketpair()
    peers = PeerSockets()
    peers.see(b"game", _Frame(first.fileno()))
    peers.see(b"game", _Frame(second.fileno()))  # same window: the first binding stands
    peers.roll()
    peers.see(b"game", _Frame(second.fileno()))  # ROUTER_HANDOVER: the id moved over
    assert peers.shut(b"game") and _was_shut(second_peer)
    for s in (first, first_peer, second, second_peer):
        s.close()
