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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import llama_cpp

from igi_sdk.errors import EngineUnavailableError, InvalidStateError
from igi_sdk.model import ModelInventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import snapshot
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
    """A context's state in host memory, in a buffer llama.cpp writes and later reads in place.

    A reshard pauses the replies for as long as the state takes to move, so nothing copies it
    in Python: the buffer is an anonymous mapping (its pages are zero until written, so no
    pass clears it first), handed to llama.cpp as is both ways. Bytes from ``bytes`` and
    ``from_buffer_copy`` cost three more passes over a state of hundreds of MB."""

    buf: Any  # a ctypes c_uint8 array over ``mem``
    size: int  # bytes llama.cpp wrote
    mem: mmap.mmap


def ctx_state(ctx: Any) -> ParkedState:
    size = llama_cpp.llama_state_get_size(ctx)
    mem = mmap.mmap(-1, max(size, 1))
    buf = (ctypes.c_uint8 * max(size, 1)).from_buffer(mem)
    return ParkedState(buf, llama_cpp.llama_state_get_data(ctx, buf, size), mem)


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
                 integer("priority", 0), image_cells, n_images)


def read_save(p: Path) -> tuple[dict[str, Any], memoryview]:
    """A session save file, read and verified (I/O thread); a missing one is
    :class:`InvalidStateError`, other OS failures are typed by :func:`snapshot.io_error`."""
    try:
        data = p.read_bytes()
    except (FileNotFoundError, NotADirectoryError):
        raise InvalidStateError(f"no session save '{p.name}'") from None
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise InvalidStateError(f"no session save '{p.name[:64]}...' (the name is "
                                    "too long for the file system)") from None
        raise snapshot.io_error(e, p.name, "read") from None
    return snapshot.unpack(data)
