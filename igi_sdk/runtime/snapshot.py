"""The session snapshot format: a magic, a JSON header (conversation + sampling state), then
llama.cpp's KV bytes for the session's sequence."""

from __future__ import annotations

import ctypes
import json
import struct
from collections.abc import Callable
from typing import Any

from igi_sdk.errors import InvalidStateError

MAGIC = b"IGISESS1"


def pack(meta: dict[str, Any], kv: bytes) -> bytes:
    head = json.dumps(meta).encode()
    return MAGIC + struct.pack("<Q", len(head)) + head + kv


def unpack(data: bytes) -> tuple[dict[str, Any], bytes]:
    if len(data) < 16 or not data.startswith(MAGIC):
        raise InvalidStateError("not an igi-sdk session snapshot")
    (n,) = struct.unpack_from("<Q", data, 8)
    if 16 + n > len(data):
        raise InvalidStateError("the session snapshot is truncated")
    try:
        meta = json.loads(data[16 : 16 + n])
    except ValueError:
        raise InvalidStateError("the session snapshot header is damaged") from None
    if not isinstance(meta, dict):
        raise InvalidStateError("the session snapshot header is damaged")
    return meta, data[16 + n :]


def copy_out(size: int, fill: Callable[[Any], int]) -> bytes:
    """Bytes that ``fill`` writes into a fresh ``size``-byte buffer (returning how many)."""
    buf = (ctypes.c_uint8 * max(size, 1))()
    return ctypes.string_at(buf, fill(buf))  # one memcpy; slicing a ctypes array builds a list
