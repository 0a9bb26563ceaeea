"""The one place that touches llama.cpp's C API beyond what llama-cpp-python declares.

* ggml backend/device functions (llama-cpp-python loads libggml but declares none of them);
* a process-wide log sink: llama.cpp reports placement decisions (which buffer each tensor
  landed in, per-device buffer sizes) only through its log, so the runtime captures it while a
  model loads and parses it (see ``placement.py``);
* backend initialisation, done once, after the environment the CUDA backend reads at start-up
  (``GGML_OP_OFFLOAD_MIN_BATCH``) has been set.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import llama_cpp
from llama_cpp._ggml import libggml

log = logging.getLogger("igi_sdk.llama")

# enum ggml_log_level (ggml.h of this build; older ggml numbered these differently)
LOG_NONE, LOG_DEBUG, LOG_INFO, LOG_WARN, LOG_ERROR, LOG_CONT = range(6)
# enum ggml_backend_dev_type
DEV_CPU, DEV_GPU, DEV_IGPU, DEV_ACCEL = range(4)

_vp = ctypes.c_void_p


def _declare(name: str, restype: object, *argtypes: object) -> None:
    fn = getattr(libggml, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


_declare("ggml_backend_dev_count", ctypes.c_size_t)
_declare("ggml_backend_dev_get", _vp, ctypes.c_size_t)
_declare("ggml_backend_dev_name", ctypes.c_char_p, _vp)
_declare("ggml_backend_dev_description", ctypes.c_char_p, _vp)
_declare("ggml_backend_dev_type", ctypes.c_int, _vp)
_declare(
    "ggml_backend_dev_memory",
    None,
    _vp,
    ctypes.POINTER(ctypes.c_size_t),
    ctypes.POINTER(ctypes.c_size_t),
)
_declare("ggml_backend_dev_buffer_type", _vp, _vp)
_declare("ggml_backend_dev_host_buffer_type", _vp, _vp)
_declare("ggml_backend_buft_name", ctypes.c_char_p, _vp)
_declare("ggml_backend_cpu_buffer_type", _vp)

ggml = libggml


class LlamaModelTensorBuftOverride(ctypes.Structure):
    """``struct llama_model_tensor_buft_override`` (llama.h); llama-cpp-python leaves it out."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", _vp)]


# --- logging -------------------------------------------------------------------------------------

_capture_lock = threading.Lock()
_capture: list[str] | None = None
_last_level = LOG_INFO
# Warnings about choices a Plan makes on purpose (mmap host weights with CPU overrides).
_DELIBERATE = ("tensor overrides to CPU are used with mmap enabled",)
_PY_LEVEL = {LOG_ERROR: logging.ERROR, LOG_WARN: logging.WARNING, LOG_INFO: logging.DEBUG}


@llama_cpp.llama_log_callback
def _on_log(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
    global _last_level
    if level == LOG_CONT:
        level = _last_level
    _last_level = level
    msg = text.decode("utf-8", "replace")
    cap = _capture
    if cap is not None:
        cap.append(msg)
    py_level = _PY_LEVEL.get(level)
    if py_level == logging.WARNING and any(s in msg for s in _DELIBERATE):
        py_level = logging.DEBUG
    if py_level is not None and msg.strip():
        log.log(py_level, "%s", msg.rstrip())


@contextmanager
def capture_log() -> Iterator[list[str]]:
    """Collect every llama.cpp/ggml log line (debug included) emitted inside the block.

    Loads are serialised by the caller (one engine thread per process owns llama.cpp calls);
    the lock guards against two engines loading at once in one process."""
    global _capture
    with _capture_lock:
        lines: list[str] = []
        _capture = lines
        try:
            yield lines
        finally:
            _capture = None


# --- backend start-up ----------------------------------------------------------------------------

_init_lock = threading.Lock()
_initialised = False


def init_backend(copy_compute_min_batch: int | None = None) -> None:
    """Initialise llama.cpp once per process.

    ``GGML_OP_OFFLOAD_MIN_BATCH`` is read by the CUDA backend when it starts, so a plan's
    copy-compute threshold only takes effect if it is set before the first call here; later
    plans with another threshold keep the first (documented in docs/architecture.md)."""
    global _initialised
    with _init_lock:
        if _initialised:
            return
        if copy_compute_min_batch is not None:
            os.environ.setdefault("GGML_OP_OFFLOAD_MIN_BATCH", str(copy_compute_min_batch))
        llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        _initialised = True


def copy_compute_threshold_in_effect() -> int:
    return int(os.environ.get("GGML_OP_OFFLOAD_MIN_BATCH", "32"))
