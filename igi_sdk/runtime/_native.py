"""The one place that touches llama.cpp's C API beyond what llama-cpp-python declares.

* ggml backend/device functions (llama-cpp-python loads libggml but declares none of them);
* a process-wide log sink: llama.cpp reports placement decisions (which buffer each tensor
  landed in, per-device buffer sizes) only through its log, so the runtime captures it while a
  model loads and parses it (see ``placement.py``);
* backend initialisation, done once, after the environment the CUDA backend reads at start-up
  (``GGML_OP_OFFLOAD_MIN_BATCH``) has been set; it records the threshold llama.cpp read and the
  VRAM the start took (the CUDA context).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import threading
from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from dataclasses import dataclass

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


class GgmlBackendDevCaps(ctypes.Structure):
    """``struct ggml_backend_dev_caps`` (ggml-backend.h of this build)."""

    _fields_ = [
        ("async_", ctypes.c_bool),  # `async` in C; a keyword in Python
        ("host_buffer", ctypes.c_bool),
        ("buffer_from_host_ptr", ctypes.c_bool),
        ("events", ctypes.c_bool),
        ("mmap_support", ctypes.c_bool),
    ]


class GgmlBackendDevProps(ctypes.Structure):
    """``struct ggml_backend_dev_props``; ``device_id`` is the lower-case PCI bus id
    ("0000:c1:00.0") for PCI devices, NULL where unknown."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("description", ctypes.c_char_p),
        ("memory_free", ctypes.c_size_t),
        ("memory_total", ctypes.c_size_t),
        ("type", ctypes.c_int),
        ("device_id", ctypes.c_char_p),
        ("caps", GgmlBackendDevCaps),
    ]


_declare("ggml_backend_dev_get_props", None, _vp, ctypes.POINTER(GgmlBackendDevProps))
_declare("ggml_backend_dev_buffer_type", _vp, _vp)
_declare("ggml_backend_dev_host_buffer_type", _vp, _vp)
_declare("ggml_backend_buft_name", ctypes.c_char_p, _vp)
_declare("ggml_backend_cpu_buffer_type", _vp)
_declare("ggml_backend_buft_alloc_buffer", _vp, _vp, ctypes.c_size_t)
_declare("ggml_backend_buffer_get_base", _vp, _vp)
_declare("ggml_backend_buffer_free", None, _vp)

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
# What llama.cpp says of a decode the engine interrupted on purpose (runtime/abort.py): the
# engine keeps what was computed, so these are not errors of anyone's.
_INTERRUPTED = ("compute status: 1", "failed to decode, ret = 2",
                "compute_async failed with error 1", "removing memory module entries")
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
    elif py_level is not None and py_level >= logging.WARNING and any(
            s in msg for s in _INTERRUPTED):
        py_level = logging.DEBUG
    if py_level is not None and msg.strip():
        log.log(py_level, "%s", _clip(msg.rstrip()))


_mtmd_log_routed = False


def route_mtmd_log() -> None:
    """Send llama.cpp's multimodal library (mtmd, clip) to the same sink as llama.cpp's log: it
    has its own logger, which writes to stderr unless told otherwise. Loads libmtmd; once."""
    global _mtmd_log_routed
    with _init_lock:
        if _mtmd_log_routed:
            return
        from llama_cpp import mtmd_cpp  # only processes that use vision load libmtmd

        mtmd_cpp.mtmd_helper_log_set(_on_log, ctypes.c_void_p(0))  # sets mtmd's and clip's too
        _mtmd_log_routed = True


# llama.cpp logs a grammar that fails to parse in full: unclipped, one 91-byte request (a
# JSON schema that expands) writes a megabyte of log
_LOG_CLIP = 2000


def _clip(msg: str) -> str:
    if len(msg) <= _LOG_CLIP:
        return msg
    return f"{msg[:_LOG_CLIP // 2]} ... [{len(msg) - _LOG_CLIP} chars cut] ... {msg[-200:]}"


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

OFFLOAD_ENV = "GGML_OP_OFFLOAD_MIN_BATCH"
_CUDA_DEFAULT_MIN_BATCH = 32  # ggml-cuda.cu, when the variable is unset


def threshold_from_env(value: str | None) -> int:
    """What ggml-cuda makes of ``GGML_OP_OFFLOAD_MIN_BATCH``: ``atoi`` of it, 32 when unset."""
    if value is None:
        return _CUDA_DEFAULT_MIN_BATCH
    m = re.match(r"[ \t\n\v\f\r]*([+-]?[0-9]+)", value)
    return int(m.group(1)) if m else 0


@dataclass
class BackendState:
    """The process's llama.cpp backend: whether it started, and what it started with.

    ggml's CUDA backend reads ``GGML_OP_OFFLOAD_MIN_BATCH`` once, when its registry is first
    touched (``llama_backend_init`` here, the first thing in this SDK that touches it), so the
    threshold recorded at the start is the one every later plan runs with."""

    started: bool = False
    requested: int | None = None  # threshold asked for before the start
    threshold: int | None = None  # what llama.cpp read at the start
    context_bytes: int = 0  # VRAM the start took on llama.cpp's first GPU (0 without NVML)
    gpu_bus_id: str | None = None

    def threshold_at_start(self, env: MutableMapping[str, str]) -> int:
        """Put the requested threshold into ``env`` (a value the user set there wins) and
        return what llama.cpp will read from it."""
        if self.requested is not None:
            env.setdefault(OFFLOAD_ENV, str(self.requested))
        return threshold_from_env(env.get(OFFLOAD_ENV))


_init_lock = threading.Lock()
_state = BackendState()


def backend_started() -> bool:
    return _state.started


def prepare_backend(copy_compute_min_batch: int) -> int:
    """Ask for this copy-compute threshold without starting the backend; returns the threshold
    the start will use (the user's ``GGML_OP_OFFLOAD_MIN_BATCH`` wins). Once started this changes
    nothing and returns the threshold in effect."""
    with _init_lock:
        if not _state.started:
            _state.requested = copy_compute_min_batch
    return copy_compute_threshold_in_effect()


def init_backend(copy_compute_min_batch: int | None = None) -> None:
    """Initialise llama.cpp once per process.

    ``GGML_OP_OFFLOAD_MIN_BATCH`` is read by the CUDA backend when it starts, so a threshold only
    takes effect if it is asked for (here or with :func:`prepare_backend`) before the first call;
    the first one asked for wins, later plans run with it (docs/architecture.md). The start is
    measured on NVML: on Windows/WDDM it is the only figure for the CUDA context's VRAM."""
    from igi_sdk.runtime.nvml import measure_start, nvml

    with _init_lock:
        st = _state
        if st.started:
            return
        if st.requested is None:
            st.requested = copy_compute_min_batch
        threshold = st.threshold_at_start(os.environ)
        llama_cpp.llama_log_set(_on_log, ctypes.c_void_p(0))
        nv = nvml()
        try:
            bus_id, context = measure_start(nv, _start_llama)
        finally:
            if nv is not None:
                try:
                    nv.nvmlShutdown()  # NVML counts inits; this one was only for the measurement
                except Exception:  # noqa: BLE001 - a failed shutdown must not fail the start
                    pass
        st.threshold, st.context_bytes, st.gpu_bus_id = threshold, context, bus_id
        st.started = True


def _start_llama() -> tuple[bool, str | None]:
    """``llama_backend_init`` and a memory query on every GPU (where CUDA creates its context,
    as ``list_devices`` would right after): (llama.cpp has a GPU, its first GPU's bus id)."""
    llama_cpp.llama_backend_init()
    first: tuple[bool, str | None] = (False, None)
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(dev) not in (DEV_GPU, DEV_IGPU):
            continue
        bus_id = device_pci_bus_id(dev)  # get_props queries the device's memory
        if not first[0]:
            first = (True, bus_id)
    return first


def device_pci_bus_id(dev: int) -> str | None:
    """The PCI bus id llama.cpp reports for a device handle ("0000:c1:00.0"), None if unknown."""
    props = GgmlBackendDevProps()
    ggml.ggml_backend_dev_get_props(dev, ctypes.byref(props))
    return props.device_id.decode() if props.device_id else None


def pinned_host_buffer(size: int) -> tuple[int, int] | None:
    """(ggml buffer, base address) of ``size`` bytes of page-locked host memory from the first
    GPU's host buffer type (CUDA: ``cudaMallocHost``): a copy between it and VRAM is one DMA at
    PCIe speed. None without a GPU backend, or when it cannot be had (free it with
    :func:`free_host_buffer`)."""
    for i in range(ggml.ggml_backend_dev_count()):
        dev = ggml.ggml_backend_dev_get(i)
        if ggml.ggml_backend_dev_type(dev) not in (DEV_GPU, DEV_IGPU):
            continue
        buft = ggml.ggml_backend_dev_host_buffer_type(dev)
        if not buft:
            return None
        buf = ggml.ggml_backend_buft_alloc_buffer(buft, size)
        if not buf:
            return None
        return buf, ggml.ggml_backend_buffer_get_base(buf)
    return None


def free_host_buffer(buf: int) -> None:
    ggml.ggml_backend_buffer_free(buf)


def copy_compute_threshold_in_effect() -> int:
    """The copy-compute threshold llama.cpp runs with: what it read when the backend started;
    before the start, what it would read if it started now."""
    if _state.started and _state.threshold is not None:
        return _state.threshold
    return BackendState(requested=_state.requested).threshold_at_start(dict(os.environ))


def cuda_context_bytes() -> int:
    """VRAM the backend start took on llama.cpp's first GPU (the CUDA context), measured on
    NVML; 0 before the start, without NVML or without a GPU."""
    return _state.context_bytes


# --- pipelined decode (igi_sdk/bundle/patches/ggml-stream-prefetch.patch) -----------------------
# A llama.cpp built with that patch exports these from libggml-base; stock builds (the PyPI
# wheels) do not, and there every plan computes its CPU-resident weights on the CPU at decode.
_STREAM_VERSION = 1
try:
    _declare("ggml_backend_sched_stream_version", ctypes.c_int)
    _declare("ggml_backend_sched_set_stream_weights", None, ctypes.c_char_p)
    _declare("ggml_backend_sched_set_prefetch", None, ctypes.c_bool)
    _has_stream = ggml.ggml_backend_sched_stream_version() >= _STREAM_VERSION
except AttributeError:  # (the symbol is absent: ctypes raises on the lookup)
    _has_stream = False
_stream_lock = threading.Lock()
_streamed: tuple[str, ...] = ()


def streams_weights() -> bool:
    """Whether this llama.cpp can compute named host weights on the GPU at every batch, their
    copies started while the CPU split before them computes (a pipelined decode)."""
    return _has_stream


def set_streamed_weights(names: tuple[str, ...]) -> bool:
    """Name the weights ggml's scheduler streams (process-wide; takes effect for graphs split
    afterwards, so before a context computes). False where this llama.cpp cannot (the names
    are still what the process asked for: :func:`streamed_weights`)."""
    global _streamed
    with _stream_lock:
        if names != _streamed and _has_stream:
            ggml.ggml_backend_sched_set_stream_weights(",".join(names).encode() or None)
        _streamed = names
        if names and _has_stream:  # (whatever GGML_SCHED_PREFETCH says: else nothing overlaps)
            ggml.ggml_backend_sched_set_prefetch(True)
    return _has_stream or not names


def streamed_weights() -> tuple[str, ...]:
    """The names the process last gave ggml's scheduler (:func:`set_streamed_weights`)."""
    return _streamed


@contextmanager
def streamed_weights_kept() -> Iterator[None]:
    """The process's streamed names as they are now, restored on leaving: a dry run or a probe
    names its own plan's weights without taking them from the model that runs."""
    kept = streamed_weights()
    try:
        yield
    finally:
        set_streamed_weights(kept)


# --- pinned host weights in pieces (igi_sdk/bundle/patches/ggml-host-chunks.patch) --------------
# llama.cpp allocates a pinned plan's CPU weights with one cudaMallocHost, which holds the
# process's address-space lock while it pins: 1.0-1.2 s for 3 GiB on an H200 host, and every
# other thread's mmap or munmap (the socket thread's large messages, Python's arenas, numpy)
# waited as long (benchmarks/pin_chunks.py, load_behind.py). A build with the patch allocates
# them in pieces of HOST_ALLOC_CHUNK (a tensor larger than that in one of its own: a copy may
# not span two pinned allocations), so that each wait is one piece's.
HOST_ALLOC_CHUNK = 64 << 20
try:
    _declare("ggml_backend_set_host_alloc_chunk", None, ctypes.c_size_t)
    _has_host_chunks = True
except AttributeError:
    _has_host_chunks = False


def pins_in_pieces() -> bool:
    """Whether this llama.cpp can allocate pinned host weights in pieces."""
    return _has_host_chunks


def set_host_alloc_chunk(chunk: int) -> bool:
    """Pinned host weights loaded from now on go into buffers of at most ``chunk`` bytes (0:
    one buffer, as stock llama.cpp); process-wide. False where this llama.cpp cannot."""
    if not _has_host_chunks:
        return False
    ggml.ggml_backend_set_host_alloc_chunk(chunk)
    return True


def pin_in_pieces() -> bool:
    """:func:`set_host_alloc_chunk` to HOST_ALLOC_CHUNK, unless GGML_HOST_ALLOC_CHUNK_MIB is
    set (it then decides)."""
    if "GGML_HOST_ALLOC_CHUNK_MIB" in os.environ:
        return _has_host_chunks
    return set_host_alloc_chunk(HOST_ALLOC_CHUNK)
