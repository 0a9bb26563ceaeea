"""A child process that answers framed requests on its stdin/stdout, killed from any thread.

The sidecar hands work that a hostile input can make expensive to such a child rather than
doing it in its own process: decoding an image (runtime/image_decode.py) and parsing a large
HTTP body (http/body_parser.py). A native parser or decoder holds the GIL for as long as its
input lasts, and in the sidecar that is every NPC's decode and the control plane waiting; in a
child it is one core, at a lower priority than the game, with its memory capped, killed when it
runs past a CPU-time cap or its caller gives up.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import psutil

log = logging.getLogger("igi_sdk.worker_process")


class WorkerGone(Exception):
    """The worker ended (killed, or it crashed) before it answered."""


class WorkerProcess:
    """One child; :meth:`kill` may come from any thread (a time cap, a cancel)."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        flags = 0
        if sys.platform == "win32":  # no console window; the work gives way to the game
            flags = subprocess.CREATE_NO_WINDOW | subprocess.BELOW_NORMAL_PRIORITY_CLASS
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            bufsize=0, creationflags=flags, env=env)
        self.killed_for: str | None = None
        self.ready = False

    def wait_ready(self, marker: bytes, start_s: float) -> None:
        """Wait until the child has written ``marker`` (its imports are done; at once for a
        warm one); WorkerGone if it does not within ``start_s``."""
        if self.ready:
            return
        timer = threading.Timer(start_s, self.kill, ("start",))
        timer.daemon = True
        timer.start()
        try:
            if self.read_exact(len(marker)) != marker:
                self.kill("start")
                raise WorkerGone
        finally:
            timer.cancel()
        self.ready = True

    @property
    def alive(self) -> bool:
        return self.killed_for is None and self.proc.poll() is None

    def kill(self, why: str) -> None:
        if self.killed_for is None:
            self.killed_for = why
        try:
            self.proc.kill()
        except OSError:
            pass

    def close(self) -> None:
        self.kill("closed")
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                if pipe is not None:
                    pipe.close()
            except OSError:
                pass
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            log.warning("worker process %d did not end", self.proc.pid)

    def send(self, *parts: bytes | bytearray | memoryview) -> None:
        """Write ``parts`` in order (each write lets the GIL go while the pipe takes it)."""
        assert self.proc.stdin is not None
        try:
            for part in parts:
                self.proc.stdin.write(part)
            self.proc.stdin.flush()
        except OSError as e:
            raise WorkerGone from e

    def read_exact(self, n: int) -> bytes:
        """``n`` bytes from the child; WorkerGone if it ends first."""
        assert self.proc.stdout is not None
        buf = bytearray()
        while len(buf) < n:
            try:
                piece = self.proc.stdout.read(n - len(buf))
            except OSError as e:
                raise WorkerGone from e
            if not piece:
                raise WorkerGone
            buf += piece
        return bytes(buf)


# how often the time cap reads the worker's CPU time, and the wall time, as a multiple of the
# cap, after which the work ends even if the worker got no CPU (a host busy for a minute)
_WATCH_S = 0.02
_WALL_TIMES = 12


class CpuTimeCap:
    """Kills ``worker`` ("timeout") once its current work has used ``cpu_s`` of CPU time.

    CPU time, not wall time: a worker runs at a lower priority than the game (nice 10,
    BELOW_NORMAL on Windows), so a game that keeps every core busy stretches its wall time
    tenfold and more without making the input any more expensive; a wall cap refused an 8K
    screenshot that decodes in 0.14 s on an idle core. What the work costs is its CPU time, and
    that is what a hostile input runs up."""

    def __init__(self, worker: WorkerProcess, cpu_s: float) -> None:
        self._worker, self._cpu_s = worker, cpu_s
        self._stop = threading.Event()
        self._lock = threading.Lock()  # no kill once cancel() returned: the worker is reused
        try:
            self._proc = psutil.Process(worker.proc.pid)
            self._start = _cpu_s(self._proc)
        except psutil.Error:  # it ended already: the work finds that out itself
            return
        threading.Thread(target=self._watch, name="igi-worker-time-cap", daemon=True).start()

    def cancel(self) -> None:
        with self._lock:
            self._stop.set()

    def _watch(self) -> None:
        wall_end = time.monotonic() + _WALL_TIMES * self._cpu_s
        while not self._stop.wait(_WATCH_S):
            try:
                used = _cpu_s(self._proc) - self._start
            except psutil.Error:
                return  # the worker ended (its caller sees that)
            if used >= self._cpu_s or time.monotonic() >= wall_end:
                with self._lock:
                    if not self._stop.is_set():
                        self._worker.kill("timeout")
                return


def _cpu_s(proc: psutil.Process) -> float:
    times = proc.cpu_times()
    return float(times.user + times.system)


def lower_priority(memory_bytes: int) -> None:
    """In the child: cap its address space (POSIX; elsewhere the time cap is what bounds the
    work) and let the game and the model go first."""
    import os

    try:
        import resource
    except ImportError:
        return
    if memory_bytes > 0:
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    if hasattr(os, "nice"):
        os.nice(10)
