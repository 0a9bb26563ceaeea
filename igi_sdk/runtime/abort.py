"""Interrupting a long ``llama_decode`` from any thread, at no cost per graph node.

llama.cpp's CPU backend asks an abort callback before every graph node; a decode it aborts
returns 2, keeps the ubatches it finished and removes the one it was in (llama_context::decode).
A Python callback would take the GIL thousands of times per ubatch, so the callback is the C
library's own ``strlen`` and its data a two-byte buffer: ``strlen`` returns 1 (true: abort)
once the first byte is set and 0 while it is clear, without Python on the compute threads.
Setting or clearing the byte is one memory write, safe from any thread.

Only the CPU backend asks the callback: a graph wholly on the GPU runs to its end (it is short).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import sys
from typing import Any

import llama_cpp

log = logging.getLogger("igi_sdk.runtime")

ABORTED = 2  # llama_decode's return value for an aborted decode


def _strlen_address() -> int | None:
    """The address of the C library's ``strlen`` (None where no C library is found)."""
    try:
        if sys.platform == "win32":
            libc = ctypes.cdll.msvcrt
        else:
            name = ctypes.util.find_library("c")
            libc = ctypes.CDLL(name) if name else ctypes.CDLL(None)
        return ctypes.cast(libc.strlen, ctypes.c_void_p).value
    except (OSError, AttributeError):
        return None


_STRLEN = _strlen_address()


class AbortFlag:
    """One engine's interrupt. Engine thread: :meth:`watch` a context before a decode that may
    be interrupted (after :meth:`clear`), :meth:`unwatch` it before one that must run to its
    end. Any thread: :meth:`arm` ends a watched decode at its next graph node."""

    def __init__(self) -> None:
        self._buf = ctypes.create_string_buffer(2)  # [flag, NUL]: strlen reads 0 or 1 byte
        self._never = ctypes.create_string_buffer(1)  # an empty string: strlen is 0, never aborts
        self._fn: Any = (llama_cpp.ggml_abort_callback(_STRLEN) if _STRLEN is not None
                         else None)
        self._watched: tuple[int, bool] | None = None  # (id of the context object, watching)

    @property
    def available(self) -> bool:
        return self._fn is not None

    def forget(self) -> None:
        """The context is freed (a reshard): the next one is pointed afresh."""
        self._watched = None

    def watch(self, ctx: Any) -> None:
        self._point(ctx, True)

    def unwatch(self, ctx: Any) -> None:
        self._point(ctx, False)

    def _point(self, ctx: Any, watching: bool) -> None:
        key = (id(ctx), watching)  # once per decode step: no ctypes cast on the hot path
        if self._fn is None or self._watched == key:
            return
        data = self._buf if watching else self._never
        llama_cpp.llama_set_abort_callback(ctx, self._fn, ctypes.addressof(data))
        self._watched = key

    def arm(self) -> None:
        self._buf[0] = b"\x01"

    def clear(self) -> None:
        self._buf[0] = b"\x00"

    @property
    def armed(self) -> bool:
        return self._buf[0] != b"\x00"
