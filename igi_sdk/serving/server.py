"""The sidecar's ZeroMQ face: a ROUTER that carries the protocol to a :class:`SessionService`.

The rules live in the service (``serving/service.py``); this is the transport: it binds the
endpoint (loopback, or CurveZMQ), reads messages into a bounded queue per connection, drops
floods (``serving/flood.py``), hands the queued messages to the service in turns, one
connection after another, and it delivers what the service sends. One thread serves both:
the socket is polled together with an ``inproc`` PULL socket through which other threads wake
it (the model side's outbox, the arbiter, loading threads: one PUSH socket shared under a lock,
since ZeroMQ sockets are not thread-safe). It never waits on the model, so control messages
(``ping``, ``frame``, ``stats``, ``cancel``, ``reserve_vram``, heartbeats) are answered from the
service's state at once.

In-process peers (the HTTP face) connect with :meth:`Server.connect_local`: their messages go
straight onto the serving thread, and what the service sends them is handed to their sink
there, with no socket between them.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import logging
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator

from igi_sdk import threads
from igi_sdk.serving.backend import Backend
from igi_sdk.serving.flood import FloodGuard, ReceiveQueues
from igi_sdk.serving.service import PID_POLL_S, ServerConfig, SessionService
from igi_sdk.wire import protocol as P

__all__ = ["PID_POLL_S", "LocalWire", "Server", "ServerConfig", "is_loopback",
           "is_loopback_host"]

log = logging.getLogger("igi_sdk.serving")

_EVENTS = "inproc://igi-events"
_LOCAL = b"\x00local:"  # identities of in-process peers (a ZeroMQ routing id never has it)


def is_loopback(endpoint: str) -> bool:
    """ipc:// and inproc:// never leave the machine; tcp:// only to 127.0.0.0/8 or ::1."""
    if endpoint.startswith(("ipc://", "inproc://")):
        return True
    return is_loopback_host(urlparse(endpoint).hostname or "")


def is_loopback_host(host: str) -> bool:
    """``localhost``, 127.0.0.0/8 or ::1 (the faces' rule for listening without keys)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# messages read from the socket in one pass: as many as a turn may handle. (Reading 2048 a
# pass drained libzmq into the queues faster than turns emptied them, and a flood of small
# messages was cut more often: each reconnect is a new peer, and the sidecar grew more.)
_READ_BATCH = 256
# messages handled in one turn of the loop, and how long a turn may take before the loop reads
# and polls again (completions, local peers and heartbeats take turns with a socket that never
# empties)
_BATCH = 256
_TURN_S = 0.005


class Server:
    def __init__(self, config: ServerConfig, backend: Backend) -> None:
        self.cfg = config
        self.ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        # the ROUTER has no receive high-water mark (see _bind): what waits is bounded here
        self._flood = FloodGuard()
        self._queues = ReceiveQueues(self._flood)  # read, not yet handled: bounded per peer
        self._signalled: int | None = None  # SIGTERM/SIGINT seen by serve_forever
        self._serving = False  # serve_forever's loop runs (its start is over)
        self._push_lock = threading.Lock()
        # a wake sent and not yet taken by the serving thread: another adds nothing (it runs
        # every queued completion when it takes one), and each costs a send under the lock
        self._wake_pending = False
        self._push_sock: zmq.Socket | None = None
        self._auth: ThreadAuthenticator | None = None
        # in-process peers: identity -> the sink of what the service sends them
        self._local_sinks: dict[bytes, Callable[[bytes], None]] = {}
        self._local_ids = itertools.count(1)
        self.service = SessionService(config, backend, self)
        # called once on the serving thread when the model named at start is loaded and
        # requests are about to be served (the CLI prints "ready" from it)
        self.on_ready: Callable[[], None] | None = None
        self.router = self._bind()
        self.events = self.ctx.socket(zmq.PULL)
        self.events.bind(_EVENTS + uuid.uuid4().hex)
        self._events_addr = self.events.getsockopt_string(zmq.LAST_ENDPOINT)
        self.bound = self.router.getsockopt_string(zmq.LAST_ENDPOINT)

    @property
    def backend(self) -> Backend:
        return self.service.backend

    @property
    def model_name(self) -> str | None:
        return self.service.model_name

    @property
    def stopping(self) -> threading.Event:
        return self.service.stopping

    # --- setup -------------------------------------------------------------------------------

    def _bind(self) -> zmq.Socket:
        cfg = self.cfg
        secure = cfg.curve_secret_file is not None
        if not is_loopback(cfg.endpoint) and not secure:
            raise ValueError(f"refusing to bind {cfg.endpoint}: a non-loopback endpoint needs "
                             "CurveZMQ keys (--curve-secret and --curve-clients; see "
                             "`igi-sdk keys`)")
        sock = self.ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.MAXMSGSIZE, P.MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 0)  # a vanished client must not raise here
        # a client that reconnects with its routing id takes its old identity (and sessions) over
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.setsockopt(zmq.SNDHWM, 10_000)
        sock.setsockopt(zmq.LINGER, 0)
        # libzmq 4.3 aborts the process (`!_io_error`, stream_engine_base.cpp) when it writes to
        # a connection whose input was stopped and then broke. Input stops only on a full receive
        # queue or a connection whose identity was handed over; writes come from ZMTP heartbeat
        # timers and from PONGs to PINGs a peer queued behind the stop. So: no receive
        # high-water mark (the loop drains the socket into queues it bounds per connection,
        # serving/flood.py) and no ZMTP
        # heartbeats (liveness is the application heartbeat and the client lease; TCP
        # keepalive ends connections to peers that vanished)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.HEARTBEAT_IVL, 0)
        sock.setsockopt(zmq.TCP_KEEPALIVE, 1)
        sock.setsockopt(zmq.TCP_KEEPALIVE_IDLE, 30)
        sock.setsockopt(zmq.TCP_KEEPALIVE_INTVL, 5)
        sock.setsockopt(zmq.TCP_KEEPALIVE_CNT, 3)
        if secure:
            self._auth = _start_auth(self.ctx, cfg.curve_clients_dir)
            public, secret = zmq.auth.load_certificate(str(cfg.curve_secret_file))
            if secret is None:
                raise ValueError(f"{cfg.curve_secret_file} holds no secret key")
            sock.curve_secretkey = secret
            sock.curve_publickey = public
            sock.curve_server = True
        if "[" in cfg.endpoint:  # tcp://[::1]:port: ZeroMQ speaks IPv6 only when asked to
            sock.setsockopt(zmq.IPV6, 1)
        try:
            sock.bind(cfg.endpoint)
        except zmq.ZMQError as e:
            sock.close(0)
            if self._auth is not None:
                self._auth.stop()
            hint = (" (another sidecar, or another program, is using that port: choose another "
                    "with --endpoint)" if e.errno == zmq.EADDRINUSE else "")
            raise ValueError(f"cannot listen on {cfg.endpoint}: {e.strerror}{hint}") from None
        return sock

    # --- main loop ---------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Serve until ``shutdown``, the game's end, :meth:`stop`, or (on the main thread)
        SIGTERM or SIGINT: each ends the loop the same way, and returns."""
        with self._stop_on_signals() as wake:
            try:
                self.service.start()
            except BaseException:
                self.close()
                raise
            self._serving = True  # a signal from now on ends the loop, not the start
            if self.on_ready is not None:
                self.on_ready()
            poller = zmq.Poller()
            poller.register(self.router, zmq.POLLIN)
            poller.register(self.events, zmq.POLLIN)
            if wake is not None:
                poller.register(wake, zmq.POLLIN)
            next_beat = time.monotonic() + self.cfg.heartbeat_s
            try:
                while not self.stopping.is_set() and self._signalled is None:
                    # messages waiting in the queues: look at the sockets, do not wait on them
                    timeout = 0.0 if self._queues else max(0.0, next_beat - time.monotonic())
                    ready = dict(poller.poll(int(timeout * 1000)))
                    if self.events in ready:
                        self._drain_events()
                    emptied = self._read_requests() if self.router in ready else True
                    self._handle_turn()
                    # behind for a while: the connection with the most waiting is cut
                    if (self._flood.behind_after_turn(emptied, self._queues.messages, _BATCH)
                            and self._queues.cut_busiest() is None):
                        # nothing waits in the queues, the socket is full all the same: the
                        # window's busiest sender, if it sent more than a batch (not a client
                        # at a game's pace)
                        cut = self._flood.cut_busiest_sender(more_than=_BATCH)
                        if cut is not None:
                            self._queues.drop(cut)
                    if time.monotonic() >= next_beat:
                        self.service.heartbeat()
                        next_beat = time.monotonic() + self.cfg.heartbeat_s
                if self._signalled is not None:
                    log.info("signal %d: stopping as after shutdown", self._signalled)
            finally:
                self.close()

    @contextlib.contextmanager
    def _stop_on_signals(self) -> Iterator[socket.socket | None]:
        """On the main thread: SIGTERM and SIGINT stop the sidecar as ``shutdown`` does, and
        the caller's clean-up runs (the endpoint file is removed), where SIGTERM used to kill
        it on the spot and SIGINT raised wherever the loop was. The handler only notes the
        signal and writes a byte that the loop's poll wakes on (yielded here); before the loop
        runs (the model loading at start) it ends the start by raising SystemExit(0)."""
        if threading.current_thread() is not threading.main_thread():
            yield None
            return
        wake_r, wake_w = socket.socketpair()
        wake_w.setblocking(False)

        def on_signal(signum: int, _frame: Any) -> None:
            self._signalled = signum
            if not self._serving:
                raise SystemExit(0)
            with contextlib.suppress(OSError):
                wake_w.send(b"\0")

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            yield wake_r
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            wake_r.close()
            wake_w.close()

    def close(self) -> None:
        self.service.close()
        self.router.close(0)
        self.events.close(0)
        if self._auth is not None:
            self._auth.stop()

    def _read_requests(self) -> bool:
        """Read what the socket holds (up to a pass) into the connections' queues; whether it
        was emptied. A rate flooder's messages are dropped, and what it had queued with them."""
        for _ in range(_READ_BATCH):
            try:
                frames = self.router.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return True
            if len(frames) != 2:
                continue  # not a DEALER peer speaking one frame per message: nothing to answer
            identity = frames[0].bytes
            if not self._flood.admit(identity, frames[1]):
                self._queues.drop(identity)  # past its rate: cut (serving/flood.py)
                continue
            self._queues.put(identity, frames[1])  # past its queue's bound: cut there
        return False

    def _handle_turn(self) -> None:
        """Hand queued messages to the service, one connection after another, for at most a
        batch or a turn's time."""
        until = time.perf_counter() + _TURN_S
        for _ in range(_BATCH):
            taken = self._queues.take()
            if taken is None:
                return
            identity, frame = taken
            try:
                self.service.handle(identity, frame.bytes)
            except Exception:  # the socket thread serves everyone: keep it
                log.exception("handling a request failed")
            if time.perf_counter() >= until:
                return

    def _drain_events(self) -> None:
        while True:
            try:
                identity, frame = self.events.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if identity == b"":  # internal control message
                if frame == b"stop":
                    self.stopping.set()
                elif frame == b"wake":
                    # cleared before the queue is read: whatever is queued after this is read
                    # now, or wakes the thread again
                    self._wake_pending = False
                    self.service.run_completions()
                continue
            self.send(identity, frame)

    # --- the service's transport -----------------------------------------------------------

    def send(self, identity: bytes, frame: bytes) -> None:
        """(The serving thread.) To an in-process peer's sink, or over the socket."""
        sink = self._local_sinks.get(identity)
        if sink is not None:
            sink(frame)
        elif not identity.startswith(_LOCAL):  # a local peer that has left: nobody to tell
            self.router.send_multipart([identity, frame])

    def wake(self) -> None:
        """(Any thread, after queueing a completion.) One wake in flight at a time."""
        if self._wake_pending:
            return
        self._wake_pending = True
        self._push(b"", b"wake")

    def stop(self) -> None:
        self._push(b"", b"stop")

    def figures(self) -> dict[str, Any]:
        return {"flood_cuts": self._flood.cut, "receive_queue": self._queues.figures()}

    def _push(self, identity: bytes, frame: bytes) -> None:
        """Queue a message for the socket thread (any thread but the engine's may call this).

        One PUSH socket for every sending thread, used under a lock (the lock is ZeroMQ's
        memory barrier between threads): a socket per thread piled up one per load thread
        and reservation timer, each holding a file descriptor until collected."""
        threads.refuse(threads.ENGINE, "sending a protocol frame")
        if self.stopping.is_set():  # nobody reads any more: a PUSH without its peer would block
            return
        with self._push_lock:
            if self._push_sock is None:
                sock = self.ctx.socket(zmq.PUSH)
                sock.setsockopt(zmq.LINGER, 1000)
                sock.connect(self._events_addr)
                self._push_sock = sock
            self._push_sock.send_multipart([identity, frame])

    # --- in-process peers ----------------------------------------------------------------------

    def connect_local(self, on_frame: Callable[[bytes], None]) -> LocalWire:
        """A peer in this process (the HTTP face): its messages reach the service with no
        socket hop, and ``on_frame`` gets what the service sends it, on the serving thread
        (it must only hand the frame over, never wait)."""
        identity = _LOCAL + str(next(self._local_ids)).encode()
        return LocalWire(self, identity, on_frame)

    def _local_request(self, identity: bytes, frame: bytes) -> None:
        """(Any thread.) A local peer's message, handled on the serving thread in order."""
        self.service.later(lambda: self.service.handle(identity, frame, local=True))


class LocalWire:
    """An in-process peer's connection: what ``igi_sdk.client.Client`` sends through (in
    place of its socket thread). ``send`` never waits for the service."""

    def __init__(self, server: Server, identity: bytes, on_frame: Callable[[bytes], None]) -> None:
        self.server, self.identity = server, identity
        self._open = True

        def register() -> None:
            server._local_sinks[identity] = on_frame

        server.service.later(register)

    def send(self, frame: bytes) -> None:
        if self._open:  # after close nothing is sent (the client's waits end at its close)
            self.server._local_request(self.identity, frame)

    def close(self, goodbye: bytes | None) -> None:
        """Send ``goodbye`` and leave: nothing is delivered to the sink afterwards."""
        if not self._open:
            return
        if goodbye is not None:
            self.server._local_request(self.identity, goodbye)
        self._open = False
        server, identity = self.server, self.identity

        def forget() -> None:
            server._local_sinks.pop(identity, None)

        server.service.later(forget)


def _start_auth(ctx: zmq.Context, clients_dir: Path | None) -> ThreadAuthenticator:
    if clients_dir is None:
        raise ValueError("CurveZMQ needs --curve-clients: a directory of allowed client keys")
    auth = ThreadAuthenticator(ctx)
    auth.start()
    auth.configure_curve(domain="*", location=str(clients_dir))
    return auth
