"""The engine's state in bytes: one session's snapshot (header + KV cells) and its checked
restore, and the whole context's state that a reshard parks in host memory.

Functions of what they need (a llama.cpp context, a session, the model's identity), called on
the engine thread; the file format itself is snapshot.py's, packed and checked on the I/O
thread.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import llama_cpp

from igi_sdk.errors import EngineUnavailableError, InvalidStateError
from igi_sdk.model import ModelInventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import _native, snapshot
from igi_sdk.runtime.memory import MAX_PINNED, MAX_REMINDER_CHARS, Memory
from igi_sdk.runtime.sampling import SamplingParams
from igi_sdk.runtime.session import Session


def fingerprint(inventory: ModelInventory) -> dict[str, Any]:
    """What a save records of its model: restored only into the same one."""
    a = inventory.arch
    return {"arch": a.architecture, "n_layers": a.n_layers, "n_embd": a.n_embd,
            "n_vocab": a.n_vocab, "tensors_bytes": inventory.total_bytes()}


def kv_format(plan: Plan) -> str:
    """The KV cache's cell format ("f16/f16", "q8_0/q8_0"): saves record it, since
    llama.cpp reads a sequence's cells back only into a cache of the same format."""
    return f"{plan.type_k}/{plan.type_v}"


def capture(ctx: Any, s: Session, model: dict[str, Any], kv_fmt: str) -> tuple[bytes, bytes]:
    """(JSON header, KV bytes) of an idle session ``s`` (checked idle by the caller), with the
    ``model`` fingerprint and ``kv_fmt`` it was taken under."""
    if s.reread:
        raise EngineUnavailableError(
            f"session '{s.id}' is re-reading its conversation after a lost placement; save "
            "it after its next reply")
    kv = seq_state(ctx, s.seq)
    meta = {
        "model": model, "kv_format": kv_fmt,
        "params": s.params.model_dump(),
        "priority": s.priority, "messages": s.messages, "committed_text": s.committed_text,
        "tokens": s.tokens, "pending": s.pending, "history": s.history[-4096:],
        "n_sampled": s.n_sampled, "image_cells": s.image_cells, "n_images": s.n_images,
        # the memory policy and the turns folded out of the context: the whole transcript is
        # ``archive`` then ``messages[head:]`` (a save without it: nothing was folded)
        "memory": memory_meta(s.memory),
    }
    return snapshot.header(meta), kv  # the header is encoded here: the lists are live


def seq_state(ctx: Any, seq: int) -> bytes:
    size = llama_cpp.llama_state_seq_get_size(ctx, seq)
    return snapshot.copy_out(size, lambda buf: llama_cpp.llama_state_seq_get_data(
        ctx, buf, size, seq))


def set_seq_state(ctx: Any, mem: Any, seq: int, kv: bytes | memoryview) -> bool:
    llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
    if not kv:
        return True
    buf = (ctypes.c_uint8 * len(kv)).from_buffer_copy(kv)
    return llama_cpp.llama_state_seq_set_data(ctx, buf, len(kv), seq) > 0


@dataclass
class ParkedState:
    """A context's state in host memory, in the engine's :class:`ParkBuffer`: llama.cpp writes
    it and later reads it in place (valid until the buffer parks the next state)."""

    buf: Any  # a ctypes c_uint8 array over the park buffer
    size: int  # bytes llama.cpp wrote


class ParkBuffer:
    """The one host buffer a reshard parks the context's state in, kept from one reshard to
    the next (one engine, one parked state at a time).

    A reshard stops the replies (and holds the game's VRAM) for as long as the state takes to
    leave the GPU, so nothing copies it in Python, and the buffer is made once: page-locked
    memory of llama.cpp's GPU backend where there is one (a DMA at PCIe speed), else an
    anonymous mapping faulted in when made (``MAP_POPULATE``). A fresh pageable buffer per
    reshard moved the state at about 1 GB/s on an H200 host (26–300 ms for 35–300 MB),
    faulting its zero pages in on the way. It grows (doubling) when a state is larger."""

    def __init__(self) -> None:
        self._pinned: int | None = None  # the ggml buffer of page-locked memory
        self._map: mmap.mmap | None = None
        self._base = 0
        self.capacity = 0

    @property
    def pinned(self) -> bool:
        return self._pinned is not None

    def reserve(self, size: int) -> None:
        """Make room for ``size`` bytes (ahead of a reshard: making it costs time). A state
        parked in it before is gone: call it only while none waits to be restored."""
        if size <= self.capacity:
            return
        self.close()
        size = max(size, 1 << 20)
        got = _native.pinned_host_buffer(size)
        if got is not None:
            self._pinned, self._base = got
        else:
            if hasattr(mmap, "MAP_ANONYMOUS"):  # POSIX: faulted in now, not during a reshard
                flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
                self._map = mmap.mmap(-1, size, flags=flags)
            else:  # Windows: the pagefile-backed mapping has no such flags
                self._map = mmap.mmap(-1, size)
            self._base = ctypes.addressof(ctypes.c_uint8.from_buffer(self._map))
        self.capacity = size

    def view(self, size: int) -> Any:
        """``size`` bytes at the buffer's start, as a ctypes array llama.cpp writes into."""
        if size > self.capacity:
            self.reserve(max(size, 2 * self.capacity))
        return (ctypes.c_uint8 * max(size, 1)).from_address(self._base)

    def close(self) -> None:
        if self._pinned is not None:
            _native.free_host_buffer(self._pinned)
        self._pinned = self._map = None  # a mapping unmaps with its last reference
        self._base = self.capacity = 0


def ctx_state(ctx: Any, into: ParkBuffer) -> ParkedState:
    size = llama_cpp.llama_state_get_size(ctx)
    buf = into.view(size)
    return ParkedState(buf, llama_cpp.llama_state_get_data(ctx, buf, size))


def set_ctx_state(ctx: Any, parked: ParkedState) -> bool:
    return llama_cpp.llama_state_set_data(ctx, parked.buf, parked.size) == parked.size


class Saved(NamedTuple):
    """The typed fields of a snapshot header."""

    params: SamplingParams
    messages: list[dict[str, str]]
    committed: str
    tokens: list[int]
    pending: list[int]
    history: list[int]
    n_sampled: int
    priority: int
    image_cells: int
    n_images: int
    memory: Memory


MEMORY_FORMAT = 1


def memory_meta(m: Memory) -> dict[str, Any]:
    return {"format": MEMORY_FORMAT, "mode": m.mode, "system": m.system,
            "pinned": list(m.pinned), "reminder": m.reminder, "summary": m.summary,
            "head": m.head,
            "archive": m.archive, "folds": m.folds, "summaries": m.summaries,
            "dropped": m.dropped}


def _messages(xs: object) -> bool:
    return isinstance(xs, list) and all(
        isinstance(m, dict) and isinstance(m.get("role"), str)
        and isinstance(m.get("content"), str) for m in xs)


def memory_fields(meta: dict[str, Any], messages: list[dict[str, str]]) -> Memory:
    """The memory of a save (ValueError if it is damaged); a save from before memory
    existed: nothing folded, its system prompt (if any) the whole head."""
    raw = meta.get("memory")
    if raw is None:
        system = (messages[0]["content"] if messages and messages[0]["role"] == "system"
                  else None)
        return Memory(system=system, head=1 if system else 0)
    if not isinstance(raw, dict) or raw.get("format") != MEMORY_FORMAT:
        raise ValueError("'memory' is not a memory of a known format")
    mode, system, pinned, summary = raw["mode"], raw["system"], raw["pinned"], raw["summary"]
    if mode not in ("fold", "off") or not (system is None or isinstance(system, str)):
        raise ValueError("'memory' has a bad mode or system prompt")
    if not isinstance(pinned, list) or len(pinned) > MAX_PINNED or not all(
            isinstance(p, str) for p in pinned) or not isinstance(summary, str):
        raise ValueError("'memory' has bad pinned facts or summary")
    reminder = raw.get("reminder", "")  # saves from before reminders have none
    if not isinstance(reminder, str) or len(reminder) > MAX_REMINDER_CHARS:
        raise ValueError("'memory' has a bad reminder")
    if not _messages(raw["archive"]):
        raise ValueError("'memory.archive' is not a list of chat messages")
    numbers = [raw[k] for k in ("head", "folds", "summaries", "dropped")]
    if not all(type(x) is int and x >= 0 for x in numbers) or raw["head"] > len(messages):
        raise ValueError("'memory' has bad counts")
    return Memory(mode=mode, system=system, pinned=tuple(pinned), reminder=reminder,
                  summary=summary,
                  head=raw["head"], archive=raw["archive"], folds=raw["folds"],
                  summaries=raw["summaries"], dropped=raw["dropped"])


def check(meta: dict[str, Any], kv: bytes | memoryview, *, model: dict[str, Any],
          kv_fmt: str, n_ctx: int, n_vocab: int) -> tuple[Saved, bool]:
    """The fields of a verified snapshot (:func:`snapshot.unpack`) for an engine running
    ``model`` with a ``kv_fmt`` cache of ``n_ctx`` cells, and whether its KV cells can be read
    back as they are (same format); :class:`InvalidStateError` if it cannot be restored here.
    Everything is checked before the caller takes a session slot."""
    if meta.get("model") != model:
        raise InvalidStateError("this session was saved with another model")
    try:
        saved = fields(meta, n_vocab)
    except Exception as e:  # noqa: BLE001 - a well-formed file with bad content
        raise InvalidStateError(f"damaged session snapshot: {e}") from None
    if len(saved.tokens) + saved.image_cells >= n_ctx:
        raise InvalidStateError("the saved session is longer than this engine's context")
    if saved.tokens and not kv:
        raise InvalidStateError("the session snapshot has a conversation but no KV state")
    same_format = meta.get("kv_format", kv_fmt) == kv_fmt
    if saved.n_images and not same_format:
        raise InvalidStateError(
            "this session has images and was saved with another KV cache format: its cells "
            "cannot be read here and saves do not keep images to re-read it")
    return saved, same_format


def apply(s: Session, saved: Saved, same_format: bool) -> None:
    """Give the freshly opened session ``s`` the saved conversation (its KV cells are in)."""
    s.messages, s.committed_text, s.tokens = saved.messages, saved.committed, saved.tokens
    s.pending, s.history, s.n_sampled = saved.pending, saved.history, saved.n_sampled
    s.image_cells, s.n_images = saved.image_cells, saved.n_images
    s.memory = saved.memory
    if not same_format:
        # saved on a plan with another KV format (a q8_0 cache, restored on an f16 one):
        # llama.cpp cannot read those cells, so the conversation is read again on its
        # next turn instead
        s.cache_lost()


def fields(meta: dict[str, Any], n_vocab: int) -> Saved:
    """The typed fields of a snapshot header (ValueError/TypeError/KeyError if any is wrong)."""

    def token_list(key: str) -> list[int]:
        xs = meta[key]
        if not isinstance(xs, list) or not all(
                type(x) is int and 0 <= x < n_vocab for x in xs):
            raise ValueError(f"'{key}' is not a list of token ids")
        return xs

    def integer(key: str, default: int | None = None) -> int:
        x = meta.get(key, default)
        if type(x) is not int:
            raise ValueError(f"'{key}' is not an integer")
        return x

    messages, committed = meta["messages"], meta["committed_text"]
    if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str)
            and isinstance(m.get("content"), str) for m in messages):
        raise ValueError("'messages' is not a list of chat messages")
    if not isinstance(committed, str):
        raise ValueError("'committed_text' is not text")
    if not isinstance(meta["params"], dict):
        raise ValueError("'params' is not a map")
    n_sampled = integer("n_sampled")
    if n_sampled < 0:
        raise ValueError("'n_sampled' is negative")
    image_cells, n_images = integer("image_cells", 0), integer("n_images", 0)
    if image_cells < 0 or n_images < 0:
        raise ValueError("'image_cells' or 'n_images' is negative")
    return Saved(SamplingParams(**meta["params"]), messages, committed, token_list("tokens"),
                 token_list("pending"), token_list("history"), n_sampled,
                 integer("priority", 0), image_cells, n_images,
                 memory_fields(meta, messages))


# what a save's header may take beside its KV bytes: the conversation's text, its tokens and
# the last 4096 history entries (a JSON header), with room to spare
SAVE_HEADER_BYTES = 64 << 20


def max_save_bytes(inventory: ModelInventory, n_ctx: int) -> int:
    """The largest save a session of this model and context can write: the whole context's KV
    at 32-bit precision (no KV format is larger) and a header. A file past it was not written
    by a session here, and is refused before a byte of it is read."""
    return inventory.kv_bytes(n_ctx, "f32", "f32", swa_full=True) + SAVE_HEADER_BYTES + n_ctx * 64


def read_save(p: Path, max_bytes: int) -> tuple[dict[str, Any], memoryview]:
    """A session save file, read and verified (I/O thread); a missing one is
    :class:`InvalidStateError`, other OS failures are typed by :func:`snapshot.io_error`.

    Only a regular file is read (not a link, a FIFO or a device: a FIFO blocked this thread,
    and with it every save, forever; ``/dev/zero`` grew the sidecar past 3 GiB), and only once
    its size is known to be at most ``max_bytes``."""
    flags = (os.O_RDONLY | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)
             | getattr(os, "O_NONBLOCK", 0))
    try:
        fd = os.open(p, flags)
    except (FileNotFoundError, NotADirectoryError):
        raise InvalidStateError(f"no session save '{p.name}'") from None
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise InvalidStateError(f"no session save '{p.name[:64]}...' (the name is "
                                    "too long for the file system)") from None
        if e.errno == errno.ELOOP:  # O_NOFOLLOW: a link where a save should be
            raise InvalidStateError(f"the session save '{p.name}' is a link, not a file "
                                    "this sidecar wrote: refused") from None
        raise snapshot.io_error(e, p.name, "read") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise InvalidStateError(f"the session save '{p.name}' is not a regular file: "
                                    "refused")
        if st.st_size > max_bytes:
            raise InvalidStateError(
                f"the session save '{p.name}' is {st.st_size} bytes, more than any session of "
                f"this model and context can save ({max_bytes}): refused")
        data = _read_at_most(fd, st.st_size, p.name)
    except OSError as e:
        raise snapshot.io_error(e, p.name, "read") from None
    finally:
        os.close(fd)
    return snapshot.unpack(data)


def _read_at_most(fd: int, size: int, label: str) -> bytearray:
    """``size`` bytes of ``fd`` (a file that grew or shrank since its size was read is
    refused: it is being written by someone else)."""
    buf = bytearray(size)
    view, got = memoryview(buf), 0
    while got < size:
        n = os.readv(fd, [view[got:]]) if hasattr(os, "readv") else _read_into(fd, view[got:])
        if n <= 0:
            break
        got += n
    if got != size or os.read(fd, 1):
        raise InvalidStateError(f"the session save '{label}' changed while it was read: "
                                "refused")
    return buf


def _read_into(fd: int, view: memoryview) -> int:
    chunk = os.read(fd, min(len(view), 1 << 24))
    view[:len(chunk)] = chunk
    return len(chunk)
