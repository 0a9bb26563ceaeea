"""The blocking client's DEALER socket and the one thread that owns it.

A ZeroMQ socket may be used by one thread at a time. The client used to share its socket under
a lock, and a thread waiting for a reply polled while holding it: every request of another
thread (the HTTP face shares one client between requests) waited up to a poll slice for the
socket, and often several, since a lock is not fair. Here one thread polls the socket and a
wake-up socket together: requests of any thread are queued and sent within microseconds,
received frames are handed to ``on_frame`` as they arrive, and nothing waits on a lock that is
held across a poll.
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections import deque
from collections.abc import Callable

import zmq

_WAKES = itertools.count()


class SendFailed(Exception):
    """The frame could not be handed to ZeroMQ in time (no connection to queue it on)."""


class _Ticket:
    """A queued frame: sent, or failed, once the socket's thread has tried it."""

    __slots__ = ("deadline", "done", "failed", "frame")

    def __init__(self, frame: bytes, deadline: float) -> None:
        self.frame, self.deadline = frame, deadline
        self.done = threading.Event()
        self.failed = False


class SocketThread:
    """Owns ``sock`` on a daemon thread named ``name``.

    ``on_frame(frame)`` runs on that thread for every received frame; ``on_idle()`` runs there
    when nothing was sent for ``idle_s`` seconds and returns a frame to send then (a keep-alive
    ping) or None. ``send`` blocks until the frame is with ZeroMQ, at most ``send_timeout_s``
    (a DEALER holds a frame only once a connection exists; a refused CurveZMQ handshake never
    makes one), and raises :class:`SendFailed` past it."""

    def __init__(self, ctx: zmq.Context, sock: zmq.Socket, *, name: str,
                 on_frame: Callable[[bytes], None], on_idle: Callable[[], bytes | None],
                 idle_s: float, send_timeout_s: float) -> None:
        self._sock, self._on_frame, self._on_idle = sock, on_frame, on_idle
        self._idle_s, self._send_timeout_s = idle_s, send_timeout_s
        address = f"inproc://igi-client-wake-{os.getpid()}-{next(_WAKES)}"
        self._wake_in = ctx.socket(zmq.PAIR)
        self._wake_in.setsockopt(zmq.LINGER, 0)
        self._wake_in.bind(address)
        self._wake_out = ctx.socket(zmq.PAIR)
        self._wake_out.setsockopt(zmq.LINGER, 0)
        self._wake_out.connect(address)
        # guards the queue and the wake-up socket's sending side; held for microseconds only
        self._lock = threading.Lock()
        self._queue: deque[_Ticket] = deque()
        self._closing: bytes | None = None  # the goodbye frame, once close() was asked
        self._close_asked = False
        self._last_sent = time.monotonic()  # written by the socket's thread only
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, frame: bytes) -> None:
        ticket = _Ticket(frame, time.monotonic() + self._send_timeout_s)
        self._put(ticket)
        # the socket's thread decides by the deadline; the margin covers a thread that is late
        if not ticket.done.wait(self._send_timeout_s + 5.0) or ticket.failed:
            raise SendFailed

    def close(self, goodbye: bytes | None) -> None:
        """Send ``goodbye`` (if any) without blocking, close the socket, end the thread."""
        with self._lock:
            if self._close_asked:
                return
            self._close_asked, self._closing = True, goodbye
            self._wake()
        if threading.current_thread() is not self._thread:
            self._thread.join(5.0)

    def _put(self, ticket: _Ticket) -> None:
        with self._lock:
            if self._close_asked:
                ticket.failed = True
                ticket.done.set()
                return
            self._queue.append(ticket)
            self._wake()

    def _wake(self) -> None:  # with self._lock held
        try:
            self._wake_out.send(b"", zmq.NOBLOCK)
        except zmq.Again:
            pass  # wake-ups already queued: the thread is about to look

    # --- the socket's thread -----------------------------------------------------------------

    def _run(self) -> None:
        waiting: deque[_Ticket] = deque()  # taken from the queue, not yet with ZeroMQ
        poller = zmq.Poller()
        poller.register(self._wake_in, zmq.POLLIN)
        try:
            while True:
                with self._lock:
                    waiting.extend(self._queue)
                    self._queue.clear()
                    closing = self._close_asked
                if closing:
                    break
                self._send_waiting(waiting)
                now = time.monotonic()
                if not waiting and now - self._last_sent >= self._idle_s:
                    ping = self._on_idle()
                    if ping is not None:
                        waiting.append(_Ticket(ping, now + self._send_timeout_s))
                        self._send_waiting(waiting)
                    self._last_sent = max(self._last_sent, now)  # at most one idle call a period
                poller.register(self._sock, zmq.POLLIN | (zmq.POLLOUT if waiting else 0))
                until = min([self._last_sent + self._idle_s, *(t.deadline for t in waiting)])
                ready = dict(poller.poll(max(1, int((until - time.monotonic()) * 1000) + 1)))
                if self._wake_in in ready:
                    while self._wake_in.poll(0):
                        self._wake_in.recv()
                if ready.get(self._sock, 0) & zmq.POLLIN:
                    self._receive()
        finally:
            self._finish(waiting)

    def _send_waiting(self, waiting: deque[_Ticket]) -> None:
        now = time.monotonic()
        while waiting:
            ticket = waiting[0]
            try:
                self._sock.send(ticket.frame, zmq.NOBLOCK, copy=len(ticket.frame) < 65536)
            except zmq.Again:
                if now < ticket.deadline:
                    return  # no connection yet: the poll waits for one (POLLOUT)
                ticket.failed = True
            waiting.popleft()
            if not ticket.failed:
                self._last_sent = now
            ticket.done.set()

    def _receive(self) -> None:
        # at most a batch a wake-up, so that queued requests are not held behind a flood
        for _ in range(256):
            try:
                frame = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self._on_frame(frame)
            except Exception:  # noqa: BLE001 - a frame that does not decode is dropped: the
                pass  # request it answered times out (typed) instead of this thread ending

    def _finish(self, waiting: deque[_Ticket]) -> None:
        with self._lock:
            self._close_asked = True
            waiting.extend(self._queue)
            self._queue.clear()
            goodbye = self._closing
        for ticket in waiting:
            ticket.failed = True
            ticket.done.set()
        linger = 0
        if goodbye is not None:
            try:
                self._sock.send(goodbye, zmq.NOBLOCK)
                linger = 200  # long enough for the goodbye to leave
            except zmq.ZMQError:
                pass  # not connected: the lease ends the sessions instead
        self._sock.close(linger=linger)
        self._wake_in.close(0)
        with self._lock:
            self._wake_out.close(0)
