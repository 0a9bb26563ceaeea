"""Run the HTTP face beside the protocol server, in the sidecar's process (uvicorn on its own
thread and event loop; the face calls the sidecar's session service in-process)."""

from __future__ import annotations

import errno
import secrets
import socket
import sys
import threading
from dataclasses import dataclass

import uvicorn

from igi_sdk.http.app import HttpConfig, Inward, build_app
from igi_sdk.http.body_parser import BodyParser
from igi_sdk.http.guard import Gate
from igi_sdk.serving.server import Server, is_loopback_host


def parse_bind(bind: str) -> tuple[str, int]:
    """``HOST:PORT`` (``[::1]:PORT`` for IPv6) into (host, port); ValueError when malformed."""
    host, sep, port = bind.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536 or not host:
        raise ValueError(f"--http wants HOST:PORT (e.g. 127.0.0.1:8080), not {bind!r}")
    return host.strip("[]"), int(port)


@dataclass(frozen=True)
class Face:
    """The running face: :meth:`stop` when the sidecar stops."""

    server: uvicorn.Server
    inward: Inward
    bodies: BodyParser

    def stop(self) -> None:
        """Stop answering and end every request in flight at once: their worker threads
        wait on the face's connection to the sidecar, which would otherwise hold the
        process's exit until it timed out (5 s of silence)."""
        self.server.should_exit = True
        self.inward.close()
        self.bodies.close()


def start(bind: str, sidecar: Server, *, api_key: str | None, queue: int = 64,
          queue_wait_s: float = 60.0, memory: str = "fold") -> Face:
    """Serve the face of ``sidecar`` (in this process) on ``bind`` (loopback, or any address
    with an API key). The face is not the game: it never gets the launch token."""
    host, port = parse_bind(bind)
    loopback = is_loopback_host(host)
    if not loopback and not api_key:
        raise ValueError(f"refusing to serve HTTP on {host}: an address other than loopback "
                         "needs --api-key-file (clients send it as a Bearer token)")
    cfg = HttpConfig(endpoint=sidecar.bound, owner=secrets.token_urlsafe(24), token=None,
                     api_key=api_key, gate=Gate.for_bind(host, port, loopback=loopback),
                     connect=sidecar.connect_local, queue=queue, queue_wait_s=queue_wait_s,
                     memory=memory)
    inward, bodies = Inward(cfg), BodyParser()
    app = build_app(cfg, inward, bodies)
    sock = listen(host, port)
    server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                           access_log=False, lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="igi-http",
                              daemon=True)
    thread.start()
    return Face(server, inward, bodies)


def listen(host: str, port: int) -> socket.socket:
    """The face's listening socket, bound here rather than inside uvicorn's thread: a port
    another program holds is refused at start (ValueError), like a taken ZeroMQ endpoint,
    instead of a face that never comes up while mods talk to whoever holds the port."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # IPPROTO_TCP named: asyncio turns Nagle off (TCP_NODELAY) only on sockets whose proto
    # says TCP, and with Nagle on, a reply written in two parts waited for the client's
    # delayed ACK: 44 ms per request instead of 1.5
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    if sys.platform == "win32":  # Windows' SO_REUSEADDR would let two listeners share it
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_EXCLUSIVEADDRUSE, 1)
    else:  # a restart may bind while the old face's connections linger in TIME_WAIT
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        taken = e.errno in (errno.EADDRINUSE, getattr(errno, "WSAEADDRINUSE", -1))
        hint = (" (another program is using that port: choose another with --http)"
                if taken else "")
        raise ValueError(f"cannot listen on http://{host}:{port}: {e.strerror}{hint}") from None
    sock.set_inheritable(False)
    return sock
