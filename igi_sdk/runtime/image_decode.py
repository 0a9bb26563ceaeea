"""Images made ready for the encoder before the engine sees them: PNG/JPEG bytes decoded by
Pillow in a separate process, raw pixels checked, and both scaled down to an image-token cap.

Why a process: a legal image can cost far more to decode than its bytes suggest (a progressive
JPEG whose cheapest scan repeats thousands of times; a PNG whose IDAT inflates to gigabytes).
In the process that runs the model that would freeze every reply or take its memory. Here:

* the header is read first, and a file is refused before any decoding when its sides, its
  pixel count or (JPEG) its number of scans is over :class:`DecodeLimits`;
* Pillow decodes in :mod:`~igi_sdk.runtime._image_worker`, a child process that never inflates
  more than the image's own rows, whose address space is capped (POSIX ``RLIMIT_AS``) and which
  is killed when a decode has used ``time_s`` of CPU time (or twelve times that of wall time)
  or its chat is cancelled; one worker is kept warm and a fresh one started after a kill, so
  a normal image costs no process start;
* the result is scaled (Lanczos; a JPEG already while decoding) so that it takes at most
  :class:`ImageBudget` ``max_tokens`` image tokens, and handed on as raw RGB rows.

Every refusal is :class:`~igi_sdk.errors.InvalidImageError` (``invalid_image``) saying why.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from igi_sdk.errors import GenerationCancelled, InvalidImageError, VisionUnavailableError
from igi_sdk.events import ReplyDone, ReplyFailed, ReplyListener
from igi_sdk.runtime import _image_worker as wire
from igi_sdk.runtime.generation import Generation, GenerationResult
from igi_sdk.worker_process import CpuTimeCap, WorkerGone, WorkerProcess

log = logging.getLogger("igi_sdk.runtime")

# Bounds on an image before anything decodes it (a decoder allocates what the header claims):
# 8192 per side and 32 Mpx cover 4K/8K screenshots.
MAX_IMAGE_SIDE = 8192
MAX_IMAGE_PIXELS = 32 << 20
# A baseline JPEG has one scan per component at most (3), a progressive one about 10; every
# scan is a pass over the whole image, so their number is what a decode costs.
MAX_JPEG_SCANS = 64
DECODE_TIME_S = 5.0
# address space of the worker: Python and Pillow (~60 MiB), the file (16 MiB), the largest
# image in RGBA (128 MiB) and its RGB copy and scaled copy, with room to spare
DECODE_MEMORY = 1 << 30

_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# JPEG start-of-frame markers (baseline, progressive, lossless, arithmetic): they carry the size
_JPEG_SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_SOS, _EOI = 0xDA, 0xD9
# the next marker after entropy-coded data: 0xFF followed by neither a stuffed 0x00, a restart
# marker (0xD0-0xD7) nor fill (0xFF) — the encoder stuffs every 0xFF it writes in a scan
_NEXT_MARKER = re.compile(rb"\xff[^\x00\xd0-\xd7\xff]")
_WORKER = Path(wire.__file__)
_MESSAGE_MAX = 4096
_START_S = 30.0  # a worker that has not loaded Pillow by then never will


@dataclass(frozen=True)
class DecodeLimits:
    """What a decode may cost: sides and pixels of the encoded image, JPEG scans, the
    worker's CPU time and its memory (its address space; POSIX only)."""

    max_side: int = MAX_IMAGE_SIDE
    max_pixels: int = MAX_IMAGE_PIXELS
    max_scans: int = MAX_JPEG_SCANS
    time_s: float = DECODE_TIME_S
    memory_bytes: int = DECODE_MEMORY


@dataclass(frozen=True)
class ImageBudget:
    """The image tokens one image may take (0: no cap) and the pixels per token side (the
    encoder's patch size times its merge: 28 for Qwen2.5-VL)."""

    max_tokens: int = 0
    tile: int = 28

    def fit(self, width: int, height: int) -> tuple[int, int]:
        return wire.fit(width, height, self.max_tokens, self.tile)


def image_token_cap(cells: int, model_limit: int, *, floor: int = 64) -> int:
    """Image tokens one image may take: ``cells`` (a session's guaranteed share of the context,
    so that one image line cannot take the cells other sessions need), at least ``floor`` and
    at most ``model_limit`` (the encoder's, or the configured one)."""
    return max(1, min(model_limit, max(floor, cells)))


@dataclass(frozen=True)
class Decoded:
    """Raw 8-bit pixels, rows top to bottom, ``channels`` 3 (RGB) or 4 (RGBA)."""

    pixels: bytes
    width: int
    height: int
    channels: int = 3


# --- checks before decoding ----------------------------------------------------------------------


def check_size(width: int, height: int, limits: DecodeLimits | None = None) -> None:
    lim = limits or DecodeLimits()
    if not (isinstance(width, int) and isinstance(height, int)):
        raise InvalidImageError("width and height must be integers")
    if width <= 0 or height <= 0:
        raise InvalidImageError(f"an image of {width}x{height} pixels has nothing in it")
    if max(width, height) > lim.max_side or width * height > lim.max_pixels:
        raise InvalidImageError(
            f"a {width}x{height} image is larger than the {lim.max_side}-pixel sides and "
            f"{lim.max_pixels >> 20} Mpx accepted: scale it down first")


def encoded_size(data: bytes) -> tuple[int, int]:
    """(width, height) from a PNG's IHDR or a JPEG's start-of-frame, without decoding."""
    if data.startswith(_PNG_MAGIC):
        if len(data) < 24 or data[12:16] != b"IHDR":
            raise InvalidImageError("the PNG data is corrupt (no IHDR header)")
        return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
    if data.startswith(b"\xff\xd8"):
        return _jpeg_walk(data, count_scans=False)[0]
    raise InvalidImageError("the image is neither PNG nor JPEG")


def jpeg_scans(data: bytes, stop_after: int = 1 << 30) -> int:
    """Start-of-scan markers of a JPEG (counted up to ``stop_after``), found by walking its
    segments and skipping each scan's entropy-coded data to the next real marker."""
    return _jpeg_walk(data, count_scans=True, stop_after=stop_after)[1]


def _jpeg_walk(data: bytes, *, count_scans: bool,
               stop_after: int = 1 << 30) -> tuple[tuple[int, int], int]:
    size: tuple[int, int] | None = None
    scans, i, n = 0, 2, len(data)
    while i + 4 <= n:
        if data[i] != 0xFF:
            break
        marker = data[i + 1]
        if marker == 0xFF:  # fill byte
            i += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            i += 2
            continue
        if marker == _EOI:
            break
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        if length < 2:
            break
        if marker in _JPEG_SOF and size is None and i + 9 <= n:
            size = (int.from_bytes(data[i + 7 : i + 9], "big"),
                    int.from_bytes(data[i + 5 : i + 7], "big"))
            if not count_scans:
                return size, 0
        i += 2 + length
        if marker == _SOS:
            scans += 1
            if scans >= stop_after and size is not None:
                break
            found = _NEXT_MARKER.search(data, i)
            i = found.start() if found else n
    if size is None:
        raise InvalidImageError("the JPEG data is corrupt (no frame header)")
    return size, scans


def check_encoded(data: bytes, limits: DecodeLimits | None = None) -> tuple[int, int]:
    """The encoded image's size, after refusing what would cost too much to decode."""
    lim = limits or DecodeLimits()
    width, height = encoded_size(data)
    check_size(width, height, lim)
    if data.startswith(b"\xff\xd8"):
        scans = jpeg_scans(data, stop_after=lim.max_scans + 1)
        if scans > lim.max_scans:
            raise InvalidImageError(
                f"the JPEG has more than {lim.max_scans} scans, the most accepted (a progressive "
                "JPEG has about 10): save it again as a baseline JPEG or PNG")
    return width, height


# --- raw pixels ----------------------------------------------------------------------------------


def fit_pixels(image: Decoded, budget: ImageBudget | None = None,
               limits: DecodeLimits | None = None) -> Decoded:
    """Raw pixels checked (size, buffer length) and scaled down to ``budget`` (RGB then);
    returned as they are when they fit."""
    if image.channels not in (3, 4):
        raise InvalidImageError(f"channels must be 3 (RGB) or 4 (RGBA), not {image.channels}")
    check_size(image.width, image.height, limits)
    expected = image.width * image.height * image.channels
    if len(image.pixels) != expected:
        raise InvalidImageError(
            f"{image.width}x{image.height} {('RGB', 'RGBA')[image.channels - 3]} needs "
            f"{expected} bytes, got {len(image.pixels)}")
    target = (budget or ImageBudget()).fit(image.width, image.height)
    if target == (image.width, image.height):
        return image
    from PIL import Image  # Pillow's resampling runs without the GIL

    mode = ("RGB", "RGBA")[image.channels - 3]
    im = Image.frombuffer(mode, (image.width, image.height), image.pixels, "raw", mode, 0, 1)
    if mode == "RGBA":
        im = im.convert("RGB")  # alpha dropped, as for encoded images
    im = im.resize(target, Image.Resampling.LANCZOS, reducing_gap=3.0)
    return Decoded(im.tobytes(), im.width, im.height)


# --- the worker ----------------------------------------------------------------------------------


class _Worker(WorkerProcess):
    """One decoding process (Pillow loaded, one image at a time)."""

    def __init__(self, memory_bytes: int) -> None:
        super().__init__([sys.executable, "-I", str(_WORKER), str(memory_bytes)])

    def run(self, head: bytes, data: bytes, max_payload: int) -> tuple[int, int, int, bytes]:
        """(status, width, height, payload) of one request; WorkerGone if it ended."""
        self.send(head, data)
        status, width, height, n = wire.REPLY.unpack(self.read_exact(wire.REPLY.size))
        if n > max_payload:  # never allocate what a child says: it may be the broken one
            self.kill("protocol")
            raise WorkerGone
        return status, width, height, self.read_exact(n)


class DecodeCancel:
    """Cancels a decode from any thread: the worker doing it is killed at once."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._worker: _Worker | None = None

    @property
    def is_set(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        # under the lock: a worker detached (and maybe serving another image) is never killed
        with self._lock:
            self._event.set()
            if self._worker is not None:
                self._worker.kill("cancelled")

    def _attach(self, worker: _Worker | None) -> None:
        with self._lock:
            if self._event.is_set():
                raise GenerationCancelled("the chat was cancelled while its image was decoded")
            self._worker = worker

    def _detach(self) -> None:
        with self._lock:
            self._worker = None


class ImageDecoder:
    """Decodes PNG/JPEG bytes in worker processes (at most ``max_workers`` at once; one kept
    warm). Thread-safe; :meth:`decode` blocks its caller, never the engine thread."""

    def __init__(self, limits: DecodeLimits | None = None, max_workers: int = 2) -> None:
        self.limits = limits or DecodeLimits()
        self._slots = threading.BoundedSemaphore(max_workers)
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._closed = False
        self.started = 0  # worker processes started (observable: a kill starts one)
        self.pool = ThreadPoolExecutor(max_workers, thread_name_prefix="igi-image")

    def warm(self) -> None:
        """Start a worker now (it loads Pillow while nothing waits on it)."""
        with self._lock:
            if not self._idle and not self._closed:
                self._idle.append(self._spawn())

    def _spawn(self) -> _Worker:
        self.started += 1
        return _Worker(self.limits.memory_bytes)

    def _take(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise GenerationCancelled("the image decoder is closed")
            while self._idle:
                worker = self._idle.pop()
                if worker.alive:
                    return worker
                worker.close()
            return self._spawn()

    def _give_back(self, worker: _Worker) -> None:
        with self._lock:
            if worker.alive and not self._closed:
                self._idle.append(worker)
                return
        worker.close()
        self.warm()  # the next image must not wait for a process to start

    def decode(self, data: bytes, budget: ImageBudget | None = None,
               cancel: DecodeCancel | None = None) -> Decoded:
        """RGB pixels of PNG/JPEG ``data``, scaled to ``budget``; InvalidImageError if it is
        refused, corrupt or takes longer than the time cap; GenerationCancelled if ``cancel``
        came first."""
        lim = self.limits
        check_encoded(data, lim)
        budget = budget or ImageBudget()
        cancel = cancel or DecodeCancel()
        while not self._slots.acquire(timeout=0.05):  # all workers busy: wait, cancellably
            cancel._attach(None)
        try:
            worker = self._take()
            cap: CpuTimeCap | None = None
            try:
                cancel._attach(worker)
                worker.wait_ready(wire.READY, _START_S)
                cap = CpuTimeCap(worker, lim.time_s)
                head = wire.REQUEST.pack(lim.max_side, lim.max_pixels, budget.max_tokens,
                                         budget.tile, len(data))
                status, width, height, payload = worker.run(
                    head, data, max(_MESSAGE_MAX, lim.max_pixels * 3))
            except WorkerGone:
                raise self._gone(worker) from None
            finally:
                if cap is not None:
                    cap.cancel()
                cancel._detach()
                self._give_back(worker)
        finally:
            self._slots.release()
        if status != wire.OK:
            raise InvalidImageError(payload.decode(errors="replace"))
        out = Decoded(payload, width, height)
        expect = budget.fit(width, height)
        if len(payload) != width * height * 3 or expect != (width, height):
            raise InvalidImageError("the image could not be decoded (the decoder's reply was "
                                    "malformed)")
        return out

    def _gone(self, worker: _Worker) -> Exception:
        why = worker.killed_for
        if why == "cancelled":
            return GenerationCancelled("the chat was cancelled while its image was decoded")
        if why == "timeout":
            return InvalidImageError(
                f"decoding the image took more than {self.limits.time_s:g} s of CPU time: "
                "refused; send it smaller, or as a baseline JPEG or PNG")
        if why == "closed":
            return GenerationCancelled("the image decoder is closed")
        if not worker.ready:  # not the image's fault: this installation cannot decode
            return VisionUnavailableError(
                "images cannot be decoded here: the image decoding process did not start "
                f"({sys.executable} -I {_WORKER.name}; is Pillow installed?)")
        return InvalidImageError(
            "the image could not be decoded: the decoder stopped (out of its "
            f"{self.limits.memory_bytes >> 20} MiB, or corrupt data)")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


_shared: ImageDecoder | None = None
_shared_lock = threading.Lock()


def shared_decoder() -> ImageDecoder:
    """The process's decoder with the default limits (started on first use)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = ImageDecoder()
            import atexit

            atexit.register(_shared.close)
        return _shared


# --- a chat whose images are being decoded -------------------------------------------------------

T = TypeVar("T")


class DecodingChat(Generic[T]):
    """The stream handle of a chat while its images are prepared off the engine thread (``T``:
    what :func:`start` needs). ``cancel`` before the reply starts ends it at once, ``cancelled``
    with nothing said (the decode is killed); after, it cancels the reply. The listener hears
    what a reply's listener hears: a ``ReplyDone`` or ``ReplyFailed`` (reply id 0) if the line
    ends before its reply starts, else the reply's own events."""

    def __init__(self, session_id: str, listener: ReplyListener | None,
                 prepare: Callable[[DecodeCancel], T],
                 start: Callable[[T], Future[Generation]]) -> None:
        self.session_id = session_id
        self._listener = listener
        self._prepare, self._start = prepare, start
        self._decode = DecodeCancel()
        self._lock = threading.Lock()
        self._handle: Generation | None = None
        self._started = self._settled = self._cancel_later = False
        self._t0 = time.perf_counter()

    def run(self) -> None:
        """Prepare, then start the reply (on a decoder thread)."""
        try:
            ready = self._prepare(self._decode)
        except BaseException as e:  # noqa: BLE001 - handed to the listener, typed
            if not (isinstance(e, GenerationCancelled) and self._decode.is_set):
                self._settle(ReplyFailed(0, e))  # (a cancel has answered already)
            return
        with self._lock:
            if self._settled:  # cancelled as the decode ended
                return
            self._started = True
        try:
            fut = self._start(ready)
        except BaseException as e:  # noqa: BLE001
            self._settle(ReplyFailed(0, e))
            return
        fut.add_done_callback(self._attach)

    def _attach(self, fut: Future[Generation]) -> None:
        try:
            handle = fut.result()
        except BaseException as e:  # noqa: BLE001 - the engine refused the line
            self._settle(ReplyFailed(0, e))
            return
        with self._lock:
            self._handle = handle
            cancel = self._cancel_later
        if cancel:
            handle.cancel()

    def cancel(self) -> None:
        with self._lock:
            handle = self._handle
            if handle is None and self._started:
                self._cancel_later = True  # the reply is starting: cancelled when it has
                return
        if handle is not None:
            handle.cancel()
            return
        self._decode.cancel()
        took = time.perf_counter() - self._t0
        self._settle(ReplyDone(0, GenerationResult(self.session_id, "", (), "cancelled", 0, 0,
                                                   took, took)))

    def _settle(self, event: ReplyDone | ReplyFailed) -> None:
        with self._lock:
            if self._settled:
                return
            self._settled = True
        if self._listener is not None:
            try:
                self._listener(event)
            except Exception:
                log.exception("chat listener failed")


def decoding_chat(decoder: ImageDecoder, session_id: str,
                  listener: ReplyListener | None,
                  prepare: Callable[[DecodeCancel], T],
                  start: Callable[[T], Future[Generation]]) -> DecodingChat[T]:
    """A :class:`DecodingChat` whose preparation runs on the decoder's threads."""
    chat = DecodingChat(session_id, listener, prepare, start)
    try:
        decoder.pool.submit(chat.run)
    except RuntimeError:  # the decoder is closed: the sidecar is stopping
        chat._settle(ReplyFailed(0, GenerationCancelled("the image decoder is closed")))
    return chat


__all__ = [
    "MAX_IMAGE_PIXELS",
    "MAX_IMAGE_SIDE",
    "MAX_JPEG_SCANS",
    "DecodeCancel",
    "DecodeLimits",
    "Decoded",
    "DecodingChat",
    "ImageBudget",
    "ImageDecoder",
    "check_encoded",
    "decoding_chat",
    "fit_pixels",
    "image_token_cap",
    "shared_decoder",
]
