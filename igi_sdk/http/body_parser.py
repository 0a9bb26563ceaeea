"""Large request bodies parsed in a child process (:mod:`igi_sdk.http._body_worker`).

Bounded as it is (http/json_bound.py), a body of tens of MiB still costs pydantic tens of
milliseconds in one native call that holds the GIL, and joining its chunks one more copy: on an
H200 host two senders of such bodies put the ZeroMQ face's ping at p99 51 ms and an NPC's
decode at 0.72x its speed alone, with the parse on a worker thread of the sidecar. In the child
the sidecar only moves bytes (each pipe write lets the GIL go) and reads back the texts and
images. One child, kept warm, parses one body at a time (the face lets one large body in at a
time); it is killed and started again when a parse runs past its CPU-time cap or it dies.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence

import msgpack

from igi_sdk.http import _body_worker as wire
from igi_sdk.http.conversations import Turn
from igi_sdk.http.errors import HttpError
from igi_sdk.http.parse import Parsed
from igi_sdk.http.schema import MAX_BODY_BYTES, ChatOptions
from igi_sdk.wire import protocol as P
from igi_sdk.worker_process import CpuTimeCap, WorkerGone, WorkerProcess

# CPU time a parse may use: a body at the caps parses in under a second on a slow core
PARSE_CPU_S = 5.0
# the child's address space: Python with pydantic (~250 MiB mapped), the body (32 MiB), its
# strings, the decoded images (16 MiB) and the reply, with room to spare
PARSE_MEMORY = 1 << 30
_START_S = 30.0  # a child that has not imported pydantic by then never will
# what the reply's header may be at most: the body's texts, with msgpack's framing
_MAX_HEADER = MAX_BODY_BYTES + (1 << 20)


class BodyParser:
    """Parses bodies in the child, one at a time; thread-safe, :meth:`parse` blocks its
    caller (a worker thread of the face, never its event loop)."""

    def __init__(self, cpu_s: float = PARSE_CPU_S, memory_bytes: int = PARSE_MEMORY) -> None:
        self.cpu_s, self.memory_bytes = cpu_s, memory_bytes
        self._lock = threading.Lock()
        self._worker: WorkerProcess | None = None
        self._closed = False
        self.started = 0  # child processes started (observable: a kill starts another)

    def _spawn(self) -> WorkerProcess:
        self.started += 1
        env = {**os.environ, "IGI_SDK_CLIENT_ONLY": "1"}
        return WorkerProcess([sys.executable, "-m", wire.MODULE, str(self.memory_bytes)], env)

    def parse(self, chunks: Sequence[bytes], size: int) -> Parsed:
        """The request in ``chunks`` (``size`` bytes in all); HttpError when it is refused or
        its parse ran past the caps."""
        with self._lock:
            if self._closed:
                raise HttpError(503, "unavailable", "the sidecar is stopping")
            if self._worker is None or not self._worker.alive:
                if self._worker is not None:
                    self._worker.close()
                self._worker = self._spawn()
            worker = self._worker
            cap: CpuTimeCap | None = None
            try:
                worker.wait_ready(wire.READY, _START_S)
                cap = CpuTimeCap(worker, self.cpu_s)
                worker.send(wire.REQUEST.pack(size), *chunks)
                status, head_size, images_size = wire.REPLY.unpack(
                    worker.read_exact(wire.REPLY.size))
                # never allocate what a child says: it may be the broken one
                if head_size > _MAX_HEADER or images_size > P.MAX_IMAGE_BYTES:
                    worker.kill("protocol")
                    raise WorkerGone
                head = msgpack.unpackb(worker.read_exact(head_size))
                if status != wire.OK:
                    http_status, code, message = head
                    raise HttpError(int(http_status), str(code), str(message))
                sizes = [int(n) for n in head["images"]]
                if sum(sizes) != images_size:
                    worker.kill("protocol")
                    raise WorkerGone
                images = [worker.read_exact(n) for n in sizes]
            except WorkerGone:
                raise self._gone(worker) from None
            finally:
                if cap is not None:
                    cap.cancel()
        return Parsed(ChatOptions.model_validate_json(head["options"]), str(head["system"]),
                      [_turn(t) for t in head["history"]], str(head["line"]), images,
                      prefill=bool(head.get("prefill", False)),
                      results=tuple((str(i), str(c)) for i, c in head.get("results", ())))

    def _gone(self, worker: WorkerProcess) -> HttpError:
        why = worker.killed_for
        if why == "timeout":
            return HttpError(413, "request_too_large", "reading the body took more than "
                             f"{self.cpu_s:g} s of CPU time")
        if why == "closed":
            return HttpError(503, "unavailable", "the sidecar is stopping")
        if not worker.ready:  # not the body's fault: this installation cannot start it
            return HttpError(503, "unavailable", "the body parsing process did not start "
                             f"({sys.executable} -m {wire.MODULE})")
        return HttpError(413, "request_too_large", "the body could not be read within the "
                         f"{self.memory_bytes >> 20} MiB a request may use")

    def warm(self) -> None:
        """Start the child now (it imports pydantic while nothing waits on it)."""
        with self._lock:
            if self._worker is None and not self._closed:
                self._worker = self._spawn()

    def close(self) -> None:
        # not under the lock: a parse in flight holds it, and the kill is what ends that parse
        self._closed = True
        worker = self._worker
        if worker is not None:
            worker.close()


def _role(role: object) -> str:
    if role not in ("system", "user", "assistant", "tool"):
        raise HttpError(500, "internal", "the body parsing process answered a malformed turn")
    return str(role)


def _turn(turn: list[object]) -> Turn:
    """A history turn as the parsing process packed it: (role, text[, tool data])."""
    if len(turn) == 3:
        return (_role(turn[0]), str(turn[1]), str(turn[2]))
    if len(turn) != 2:
        raise HttpError(500, "internal", "the body parsing process answered a malformed turn")
    return (_role(turn[0]), str(turn[1]))
