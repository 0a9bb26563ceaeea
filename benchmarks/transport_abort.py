"""Transport abort probe: each loop N times against a real ``igi-sdk serve``, aborts/tries.

libzmq 4.3 asserts ``!_io_error`` in ``stream_engine_base_t::out_event`` (libzmq #4364) when
it writes to a connection whose input was stopped (a full receive queue, or a connection whose
routing id another connection took over) and which then broke. Writes come from ZMTP heartbeat
timers and from PONGs to PINGs the peer queued behind the stop. Three ways in from outside:

``shared_id``     two DEALERs with one routing id: the second takes the identity over
                  (ROUTER_HANDOVER), the first keeps sending, then both drop (heartbeat timer).
``burst_upload``  one client uploads 16 MiB image chats while another bursts pings and drops
                  with answers unread, i.e. with a reset (heartbeat timer; racy: the sidecar
                  must stay busy past a heartbeat interval).
``pong_flood``    a hand-written ZMTP peer puts a PING after every ping, floods past the receive
                  queue and resets: the sidecar answers a PING on the broken connection when it
                  drains the queue (no heartbeat of the sidecar's own needed).

Each try is followed by ``--settle`` seconds (two ZMTP heartbeat intervals of 1 s) and a ping
from a fresh client; a sidecar that died is counted as an abort and started again.

    python benchmarks/transport_abort.py --tries 200
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import zmq

from igi_sdk.wire import protocol as P

IMAGE_BYTES = 16 << 20  # the largest image a chat may carry


def free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


@dataclass
class Sidecar:
    """A real ``igi-sdk serve`` subprocess (no model: the transport is what is probed)."""

    endpoint: str
    workdir: Path
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.workdir / "sidecar.log"

    def start(self, ctx: zmq.Context, timeout: float = 60.0) -> None:
        self.starts += 1
        cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", self.endpoint,
               "--model-dir", str(self.workdir), "--threads", "1"]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + timeout
        while not answers(ctx, self.endpoint, 0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the sidecar did not start: {self.log.read_text()[-2000:]}")

    def dead(self) -> bool:
        return self.proc is None or self.proc.poll() is not None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def assertions(self) -> int:
        return self.log.read_text(errors="replace").count("Assertion failed")


def dealer(ctx: zmq.Context, endpoint: str, routing_id: bytes | None = None,
           rcvhwm: int = 1000) -> zmq.Socket:
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)  # a burst is queued whole, never blocked by the client
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    if routing_id is not None:
        sock.setsockopt(zmq.ROUTING_ID, routing_id)
    sock.connect(endpoint)
    return sock


def answers(ctx: zmq.Context, endpoint: str, timeout: float) -> bool:
    """Whether the sidecar answers a ping from a fresh client within ``timeout`` seconds."""
    sock = dealer(ctx, endpoint)
    try:
        sock.send(P.encode(1, "ping", {}))
        return bool(sock.poll(int(timeout * 1000)))
    finally:
        sock.close(0)


def _reply(sock: zmq.Socket, timeout: float = 5.0) -> bool:
    if not sock.poll(int(timeout * 1000)):
        return False
    sock.recv()
    return True


def shared_id(ctx: zmq.Context, endpoint: str) -> None:
    """Two DEALERs with one routing id; the first keeps pinging after the second took over."""
    rid = b"probe-" + os.urandom(6).hex().encode()
    first = dealer(ctx, endpoint, rid)
    first.send(P.encode(1, "ping", {}))
    _reply(first)
    second = dealer(ctx, endpoint, rid)
    second.send(P.encode(1, "ping", {}))
    _reply(second)
    for i in range(3):
        first.send(P.encode(2 + i, "ping", {}))
    time.sleep(0.05)
    first.close(0)
    second.close(0)


def _upload(ctx: zmq.Context, endpoint: str, n: int) -> zmq.Socket:
    up = dealer(ctx, endpoint)
    image = {"data": os.urandom(IMAGE_BYTES)}
    frame = P.encode(1, "chat", {"session": "npc", "text": "look", "images": [image]})
    for _ in range(n):
        up.send(frame, copy=False)
    return up


def _burst_while_uploading(ctx: zmq.Context, endpoint: str) -> None:
    # the burst client reads nothing (a receive queue of one message): the sidecar's answers to
    # its first pings stay in its kernel buffer, so closing it resets the connection
    burst = dealer(ctx, endpoint, rcvhwm=1)
    ping = P.encode(1, "ping", {})
    for _ in range(2):  # the second answers arrive after its input stopped: they stay unread
        for _ in range(10):
            burst.send(ping)
        time.sleep(0.1)
    up = _upload(ctx, endpoint, 4)  # the sidecar's loop is busy while these arrive
    for _ in range(3000):  # more than a receive queue holds: the sidecar stops reading it
        burst.send(ping)
    time.sleep(0.05)
    burst.close(0)
    for _ in range(4):
        if not _reply(up, 10.0):
            break
    up.close(0)


def burst_upload(ctx: zmq.Context, endpoint: str) -> None:
    """A ping burst from one client while another uploads 16 MiB images."""
    _burst_while_uploading(ctx, endpoint)


class RawZmtp:
    """A hand-written ZMTP 3.1 DEALER over a plain TCP socket (NULL mechanism): it puts PING
    commands exactly where it wants in the byte stream and resets the connection at will."""

    def __init__(self, endpoint: str, routing_id: bytes) -> None:
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        self.sock = socket.create_connection((host.strip("[]"), int(port)))
        greeting = b"\xff" + bytes(8) + b"\x7f" + bytes([3, 1]) + b"NULL".ljust(20, b"\0")
        self.sock.sendall(greeting + bytes(32))
        ready = b"\x05READY" + self._prop(b"Socket-Type", b"DEALER") + self._prop(
            b"Identity", routing_id)
        self.sock.sendall(self.frame(ready, command=True))

    @staticmethod
    def _prop(name: bytes, value: bytes) -> bytes:
        return bytes([len(name)]) + name + len(value).to_bytes(4, "big") + value

    @staticmethod
    def frame(body: bytes, command: bool = False) -> bytes:
        flags = 0x04 if command else 0x00
        if len(body) > 255:
            return bytes([flags | 0x02]) + len(body).to_bytes(8, "big") + body
        return bytes([flags, len(body)]) + body

    def reset(self) -> None:
        # SO_LINGER 0: close sends RST, the sidecar sees the connection break, not end
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
        self.sock.close()


def pong_flood(ctx: zmq.Context, endpoint: str, uploads: int = 4) -> None:
    """A client writing a ZMTP PING after every ping floods while another uploads, then resets:
    PINGs wait behind the stopped input until the sidecar drains the queue."""
    raw = RawZmtp(endpoint, b"probe-" + os.urandom(6).hex().encode())
    up = _upload(ctx, endpoint, uploads)
    ping = RawZmtp.frame(P.encode(1, "ping", {}))
    zmtp_ping = RawZmtp.frame(b"\x04PING\0\0", command=True)
    raw.sock.sendall((ping + zmtp_ping) * 3000)
    time.sleep(0.05)
    raw.reset()
    for _ in range(uploads):
        if not _reply(up, 10.0):
            break
    up.close(0)


LOOPS: dict[str, Callable[[zmq.Context, str], None]] = {
    "shared_id": shared_id, "burst_upload": burst_upload, "pong_flood": pong_flood}


def _rss_mib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("VmRSS:")[1].split()[0]) // 1024


def flood(sidecar: Sidecar, ctx: zmq.Context, seconds: float) -> tuple[int, int, int]:
    """(RSS before, peak RSS in MiB, pings written) while one peer writes tiny pings as fast as
    TCP takes them for ``seconds``. libzmq reads a connection without a receive limit faster than
    the socket thread handles messages; what it has read waits in memory. (Linux: /proc.)"""
    if sidecar.dead():
        sidecar.start(ctx)
    assert sidecar.proc is not None
    pid = sidecar.proc.pid
    before = peak = _rss_mib(pid)
    raw = RawZmtp(sidecar.endpoint, b"probe-flood")
    chunk = RawZmtp.frame(P.encode(1, "ping", {})) * 100_000
    view, off, sent = memoryview(chunk * 2), 0, 0
    raw.sock.setblocking(False)
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:  # a partial write goes on where it stopped: frames stay whole
            n = raw.sock.send(view[off:off + len(chunk)])
            sent, off = sent + n, (off + n) % len(chunk)
        except BlockingIOError:
            time.sleep(0.001)
        except OSError:
            break  # the sidecar cut the connection
        peak = max(peak, _rss_mib(pid))
    raw.reset()
    return before, peak, sent // len(RawZmtp.frame(P.encode(1, "ping", {})))


def run_loop(name: str, tries: int, settle: float, sidecar: Sidecar, ctx: zmq.Context,
             verbose: bool = False) -> int:
    """Aborts in ``tries`` runs of loop ``name``; the sidecar is restarted after each."""
    aborts = 0
    for i in range(tries):
        if sidecar.dead():
            sidecar.start(ctx)
        LOOPS[name](ctx, sidecar.endpoint)
        deadline = time.monotonic() + settle
        while time.monotonic() < deadline and not sidecar.dead():
            time.sleep(0.05)
        if sidecar.dead() or not answers(ctx, sidecar.endpoint, 5.0):
            aborts += 1
            sidecar.stop()
            if verbose:
                print(f"  {name} try {i + 1}: sidecar down", flush=True)
    return aborts


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tries", type=int, default=200)
    ap.add_argument("--loops", default=",".join(LOOPS))
    ap.add_argument("--settle", type=float, default=2.5,
                    help="seconds after each try before the liveness ping (>= 2 heartbeats)")
    ap.add_argument("--endpoint", help="default: a free tcp://127.0.0.1 port")
    ap.add_argument("--flood", type=float, default=0.0, metavar="SECONDS",
                    help="instead: the sidecar's memory under a tiny-message flood this long")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    print(f"pyzmq {zmq.__version__}, libzmq {zmq.zmq_version()}", flush=True)
    ctx = zmq.Context()
    if args.flood:
        with tempfile.TemporaryDirectory() as tmp:
            sidecar = Sidecar(args.endpoint or free_endpoint(), Path(tmp))
            try:
                before, peak, pings = flood(sidecar, ctx, args.flood)
                alive = answers(ctx, sidecar.endpoint, 5.0)
            finally:
                sidecar.stop()
        print(f"flood: RSS {before} -> {peak} MiB in {args.flood:.0f} s, {pings} pings written, "
              f"{'answers' if alive else 'does not answer'} after", flush=True)
        ctx.term()
        return 0
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.loops.split(","):
            sidecar = Sidecar(args.endpoint or free_endpoint(), Path(tmp) / name)
            sidecar.workdir.mkdir()
            t0 = time.monotonic()
            try:
                aborts = run_loop(name, args.tries, args.settle, sidecar, ctx, args.verbose)
            finally:
                sidecar.stop()
            print(f"{name}: {aborts}/{args.tries} aborts ({sidecar.assertions()} libzmq "
                  f"assertions in the log, {time.monotonic() - t0:.0f} s)", flush=True)
            failed |= aborts > 0
    ctx.term()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
