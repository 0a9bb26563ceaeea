"""Micro-benchmarks run through ggml itself (the kernels llama.cpp will use), no torch.

* ``matmul_seconds``: one ``ggml_mul_mat`` of a K×N weight of a given ggml type by T tokens, on
  a given device (the CPU backend with N threads, or a GPU), median of a few runs;
* ``expert_matmul_seconds``: one ``ggml_mul_mat_id`` (a MoE's routed experts: each token
  multiplied by the ``used`` of ``E`` K×N experts its router picked);
* ``h2d_seconds``: copying a weight-sized buffer into VRAM from pinned (the GPU's host buffer
  type) or pageable memory — the transfer that copy-compute pays per CPU-resident weight.
"""

from __future__ import annotations

import ctypes
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np

from igi_sdk.runtime import _native
from igi_sdk.runtime._native import ggml

_vp = ctypes.c_void_p


class _InitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", _vp), ("no_alloc", ctypes.c_bool)]


def _declare(name: str, restype: object, *argtypes: object) -> None:
    fn = getattr(ggml, name)
    fn.restype = restype
    fn.argtypes = list(argtypes)


_declare("ggml_init", _vp, _InitParams)
_declare("ggml_free", None, _vp)
_declare("ggml_new_tensor_2d", _vp, _vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
_declare("ggml_new_tensor_3d", _vp, _vp, ctypes.c_int, ctypes.c_int64, ctypes.c_int64,
         ctypes.c_int64)
_declare("ggml_flash_attn_ext", _vp, _vp, _vp, _vp, _vp, _vp, ctypes.c_float, ctypes.c_float,
         ctypes.c_float)
_declare("ggml_mul_mat", _vp, _vp, _vp, _vp)
_declare("ggml_mul_mat_id", _vp, _vp, _vp, _vp, _vp)
_declare("ggml_new_graph", _vp, _vp)
_declare("ggml_build_forward_expand", None, _vp, _vp)
_declare("ggml_nbytes", ctypes.c_size_t, _vp)
_declare("ggml_backend_dev_init", _vp, _vp, ctypes.c_char_p)
_declare("ggml_backend_free", None, _vp)
_declare("ggml_backend_alloc_ctx_tensors", _vp, _vp, _vp)
_declare("ggml_backend_buffer_free", None, _vp)
_declare("ggml_backend_graph_compute", ctypes.c_int, _vp, _vp)
_declare("ggml_backend_graph_compute_async", ctypes.c_int, _vp, _vp)
_declare("ggml_backend_synchronize", None, _vp)
_declare("ggml_backend_tensor_set", None, _vp, _vp, ctypes.c_size_t, ctypes.c_size_t)
_declare("ggml_backend_buft_alloc_buffer", _vp, _vp, ctypes.c_size_t)
_declare("ggml_backend_alloc_ctx_tensors_from_buft", _vp, _vp, _vp)
_declare("ggml_backend_dev_by_type", _vp, ctypes.c_int)
_declare("ggml_backend_buffer_get_base", _vp, _vp)
_declare("ggml_backend_dev_backend_reg", _vp, _vp)
_declare("ggml_backend_buft_name", ctypes.c_char_p, _vp)
_declare("ggml_backend_reg_get_proc_address", _vp, _vp, ctypes.c_char_p)

_SET_THREADS = ctypes.CFUNCTYPE(None, _vp, ctypes.c_int)
_EXTRA_BUFTS = ctypes.CFUNCTYPE(ctypes.POINTER(_vp), _vp)


class TensorHead(ctypes.Structure):
    """``struct ggml_tensor`` (ggml.h of this build) up to ``extra``, which a repacking buffer
    sets to its kernels for the tensor, or NULL where its layout has none."""

    _fields_ = [("type", ctypes.c_int), ("buffer", _vp), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int),
                ("op_params", ctypes.c_int32 * 16), ("flags", ctypes.c_int32),
                ("src", _vp * 10), ("view_src", _vp), ("view_offs", ctypes.c_size_t),
                ("data", _vp), ("name", ctypes.c_char * 64), ("extra", _vp)]


def repack_buffer_type() -> int | None:
    """The CPU backend's weight-repacking buffer type (``CPU_REPACK``: interleaved blocks that
    its faster matmul kernels read), or None in a build without one. llama.cpp loads CPU
    weights into it where no GPU host buffer comes first (a process without a GPU): their
    matmuls then run those kernels, which a profile must time."""
    _native.init_backend()
    cpu = ggml.ggml_backend_dev_by_type(_native.DEV_CPU)
    reg = ggml.ggml_backend_dev_backend_reg(cpu) if cpu else None
    fn = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_dev_get_extra_bufts") \
        if reg else None
    if not fn:
        return None
    bufts = _EXTRA_BUFTS(fn)(cpu)
    i = 0
    while bufts and bufts[i]:
        name = ggml.ggml_backend_buft_name(bufts[i]) or b""
        if name == b"CPU_REPACK":
            return int(bufts[i])
        i += 1
    return None

# ggml type ids (ggml.h); Q4_K needs rows that are a multiple of 256
GGML_TYPES = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
_F32 = 0
_I32 = 26


@contextmanager
def backend(device_index: int, n_threads: int) -> Iterator[int]:
    """A ggml backend for one device (CPU backends get ``n_threads``)."""
    _native.init_backend()
    dev = ggml.ggml_backend_dev_get(device_index)
    be = ggml.ggml_backend_dev_init(dev, None)
    if not be:
        raise RuntimeError(f"could not start a ggml backend on device {device_index}")
    reg = ggml.ggml_backend_dev_backend_reg(dev)
    fn = ggml.ggml_backend_reg_get_proc_address(reg, b"ggml_backend_set_n_threads") if reg else None
    if fn:
        _SET_THREADS(fn)(be, n_threads)
    try:
        yield be
    finally:
        ggml.ggml_backend_free(be)


def _fill(tensor: int, rng: np.random.Generator, ggml_type: str) -> bytes:
    """Finite data: float types get small normals, quantised ones random blocks whose f16 scale
    fields are bounded (random bytes could make NaN/denormal scales, which distort timings)."""
    n = ggml.ggml_nbytes(tensor)
    if ggml_type in ("F32", "F16"):
        dt = np.float32 if ggml_type == "F32" else np.float16
        data = (rng.standard_normal(n // np.dtype(dt).itemsize) * 0.02).astype(dt)
        buf = data.tobytes()
    else:
        raw = rng.integers(0, 256, size=n, dtype=np.uint8)
        # every 2-byte pair as f16 in [0.001, 0.01): covers each block's scale field wherever it is
        small = rng.uniform(0.001, 0.01, size=n // 2).astype(np.float16).view(np.uint8)
        if ggml_type in ("Q4_0", "Q8_0", "Q4_1"):
            block = {"Q4_0": 18, "Q8_0": 34, "Q4_1": 20}[ggml_type]
            view = raw.reshape(-1, block)
            view[:, :2] = small[: view.shape[0] * 2].reshape(-1, 2)
            if ggml_type == "Q4_1":
                view[:, 2:4] = small[: view.shape[0] * 2].reshape(-1, 2)
        elif ggml_type == "Q4_K":  # d, dmin at the start of each 144-byte super-block
            view = raw.reshape(-1, 144)
            view[:, :4] = small[: view.shape[0] * 4].reshape(-1, 4)
        elif ggml_type == "Q6_K":  # d at the end of each 210-byte super-block
            view = raw.reshape(-1, 210)
            view[:, 208:210] = small[: view.shape[0] * 2].reshape(-1, 2)
        buf = raw.tobytes()
    ggml.ggml_backend_tensor_set(tensor, buf, 0, n)
    return buf


def matmul_seconds(
    be: int, ggml_type: str, k: int, n: int, tokens: int, *, reps: int = 3, seed: int = 0,
    total_bytes: int = 0, weights_buft: int | None = None,
) -> float:
    """Median seconds of one (K×N weight of ``ggml_type``) × (K×T activations) on ``be``.

    The graph multiplies the same activations by several distinct weights whose sizes add up to
    ``total_bytes``: one small matmul would run from the CPU's cache (overstating its bandwidth)
    or be dominated by launch and synchronisation overhead on a GPU. The time is divided back
    to one weight. ``weights_buft``: the weights in that buffer type (``repack_buffer_type``:
    as a process without a GPU loads them), where it takes them; else in ``be``'s own."""
    m = _copies(ggml_weight_bytes(ggml_type, k, n), total_bytes)

    def build(ctx: int, weights: list[int]) -> tuple[int, list[tuple[int, bytes]]]:
        x = ggml.ggml_new_tensor_2d(ctx, _F32, k, tokens)
        graph = ggml.ggml_new_graph(ctx)
        for w in weights:
            ggml.ggml_build_forward_expand(graph, ggml.ggml_mul_mat(ctx, w, x))
        return graph, [(x, b"")]

    return _timed(be, lambda c: ggml.ggml_new_tensor_2d(c, GGML_TYPES[ggml_type], k, n), m,
                  build, ggml_type, tokens, reps, seed, weights_buft) / m


def expert_matmul_seconds(
    be: int, ggml_type: str, k: int, n: int, n_expert: int, used: int, tokens: int, *,
    reps: int = 3, seed: int = 0, total_bytes: int = 0, shared_input: bool = True,
    weights_buft: int | None = None,
) -> float:
    """Median seconds of one routed-expert matmul (``ggml_mul_mat_id``): ``tokens`` tokens,
    each multiplied by ``used`` distinct experts (of ``n_expert`` K×N weights) drawn at
    random: one input row per token for all its experts (``shared_input``, as llama.cpp
    multiplies a MoE layer's gate and up experts), or one per expert (its down experts, each
    reading its own expert's activations). As ``matmul_seconds``, several distinct expert
    tensors (``total_bytes`` of experts used per token in all) keep it out of the CPU's cache;
    the time is divided back to one such matmul."""
    m = _copies(ggml_weight_bytes(ggml_type, k, n) * used, total_bytes)

    def build(ctx: int, experts: list[int]) -> tuple[int, list[tuple[int, bytes]]]:
        x = ggml.ggml_new_tensor_3d(ctx, _F32, k, 1 if shared_input else used, tokens)
        ids = ggml.ggml_new_tensor_2d(ctx, _I32, used, tokens)
        graph = ggml.ggml_new_graph(ctx)
        for w in experts:
            ggml.ggml_build_forward_expand(graph, ggml.ggml_mul_mat_id(ctx, w, x, ids))
        rng = np.random.default_rng(seed + 1)
        picks = np.stack([rng.choice(n_expert, size=used, replace=False)
                          for _ in range(tokens)]).astype(np.int32)
        return graph, [(x, b""), (ids, picks.tobytes())]

    return _timed(be, lambda c: ggml.ggml_new_tensor_3d(c, GGML_TYPES[ggml_type], k, n, n_expert),
                  m, build, ggml_type, tokens, reps, seed, weights_buft) / m


def _copies(one: int, total_bytes: int) -> int:
    return max(1, min(128, total_bytes // one)) if total_bytes else 1


def _timed(be: int, new_weight: Callable[[int], int], m: int,
           build: Callable[[int, list[int]], tuple[int, list[tuple[int, bytes]]]],
           ggml_type: str, tokens: int, reps: int, seed: int, weights_buft: int | None) -> float:
    """Median seconds of the graph ``build`` makes over ``m`` weights from ``new_weight``: the
    weights in a context of their own (allocated from ``weights_buft`` where every weight's
    layout is one it takes), the inputs ``build`` names (given bytes, or random F32 for none)
    and the ops in another, allocated on ``be``."""
    wctx = ggml.ggml_init(_InitParams(1024 * 1024, None, True))
    ctx = ggml.ggml_init(_InitParams(64 * 1024 * 1024, None, True))
    wbuf = buf = None
    try:
        weights = [new_weight(wctx) for _ in range(m)]
        if weights_buft:
            wbuf = ggml.ggml_backend_alloc_ctx_tensors_from_buft(wctx, weights_buft)
            if wbuf and not all(TensorHead.from_address(w).extra for w in weights):
                # a layout it has no kernels for: the weights again, in plain memory
                ggml.ggml_backend_buffer_free(wbuf)
                wbuf = None
                ggml.ggml_free(wctx)
                wctx = ggml.ggml_init(_InitParams(1024 * 1024, None, True))
                weights = [new_weight(wctx) for _ in range(m)]
        if not wbuf:
            wbuf = ggml.ggml_backend_alloc_ctx_tensors(wctx, be)
        graph, inputs = build(ctx, weights)
        buf = ggml.ggml_backend_alloc_ctx_tensors(ctx, be)
        if not wbuf or not buf:
            raise MemoryError("not enough device memory for the matmul benchmark")
        rng = np.random.default_rng(seed)
        data = _fill(weights[0], rng, ggml_type)
        for w in weights[1:]:  # same bytes, different memory: random data costs time, not speed
            ggml.ggml_backend_tensor_set(w, data, 0, len(data))
        for t, given in inputs:
            if given:
                ggml.ggml_backend_tensor_set(t, given, 0, len(given))
            else:
                _fill(t, rng, "F32")
        # several computes per timing: the Python call and device synchronisation are not part
        # of what a decode step pays per weight
        inner = 8 if tokens <= 64 else 1

        def run() -> None:
            for _ in range(inner - 1):
                ggml.ggml_backend_graph_compute_async(be, graph)
            _compute(be, graph)

        return _median_time(run, reps) / inner
    finally:
        for b in (buf, wbuf):
            if b:
                ggml.ggml_backend_buffer_free(b)
        ggml.ggml_free(ctx)
        ggml.ggml_free(wctx)


def attention_seconds(
    be: int, n_q: int, n_kv: int, *, n_head: int = 32, n_head_kv: int = 8, head_dim: int = 128,
    reps: int = 3, seed: int = 0,
) -> float:
    """Median seconds of one flash-attention op (the kernel llama.cpp runs with flash attention
    on): ``n_q`` query tokens over ``n_kv`` cached tokens with an f16 KV cache."""
    ctx = ggml.ggml_init(_InitParams(16 * 1024 * 1024, None, True))
    buf = None
    try:
        q = ggml.ggml_new_tensor_3d(ctx, _F32, head_dim, n_q, n_head)
        k = ggml.ggml_new_tensor_3d(ctx, GGML_TYPES["F16"], head_dim, n_kv, n_head_kv)
        v = ggml.ggml_new_tensor_3d(ctx, GGML_TYPES["F16"], head_dim, n_kv, n_head_kv)
        out = ggml.ggml_flash_attn_ext(ctx, q, k, v, None, head_dim**-0.5, 0.0, 0.0)
        graph = ggml.ggml_new_graph(ctx)
        ggml.ggml_build_forward_expand(graph, out)
        buf = ggml.ggml_backend_alloc_ctx_tensors(ctx, be)
        if not buf:
            raise MemoryError("not enough device memory for the attention benchmark")
        rng = np.random.default_rng(seed)
        for t, ty in ((q, "F32"), (k, "F16"), (v, "F16")):
            _fill(t, rng, ty)
        inner = 8 if n_q <= 16 else 1
        def run() -> None:
            for _ in range(inner - 1):
                ggml.ggml_backend_graph_compute_async(be, graph)
            _compute(be, graph)

        return _median_time(run, reps) / inner
    finally:
        if buf:
            ggml.ggml_backend_buffer_free(buf)
        ggml.ggml_free(ctx)


def ggml_weight_bytes(ggml_type: str, k: int, n: int) -> int:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    return k * n // block * size


def _compute(be: int, graph: int) -> None:
    status = ggml.ggml_backend_graph_compute(be, graph)
    if status != 0:
        raise RuntimeError(f"ggml graph compute failed (status {status})")
    ggml.ggml_backend_synchronize(be)


@contextmanager
def _h2d_pair(gpu_index: int, n_bytes: int, *, pinned: bool) -> Iterator[Callable[[], None]]:
    """A VRAM tensor of ``n_bytes`` and a host buffer as large (pinned: the GPU's page-locked
    host buffer type; else ordinary memory), freed after the block; yields one copy of the
    host buffer into the tensor."""
    dev = ggml.ggml_backend_dev_get(gpu_index)
    with backend(gpu_index, 1) as be:
        ctx = ggml.ggml_init(_InitParams(1024 * 1024, None, True))
        dst = host = None
        try:
            t = ggml.ggml_new_tensor_2d(ctx, GGML_TYPES["F16"], n_bytes // 2, 1)
            dst = ggml.ggml_backend_alloc_ctx_tensors(ctx, be)
            if not dst:
                raise MemoryError("not enough VRAM for the host-to-GPU copy")
            if pinned:
                hbuft = ggml.ggml_backend_dev_host_buffer_type(dev)
                host = ggml.ggml_backend_buft_alloc_buffer(hbuft, n_bytes) if hbuft else None
                if not host:
                    raise RuntimeError("this device has no pinned host buffer type")
                src: object = ggml.ggml_backend_buffer_get_base(host)
                ctypes.memset(src, 1, n_bytes)
            else:
                arr = np.ones(n_bytes, dtype=np.uint8)
                src = arr.ctypes.data_as(_vp)
            yield lambda: ggml.ggml_backend_tensor_set(t, src, 0, n_bytes)
        finally:
            if host:
                ggml.ggml_backend_buffer_free(host)
            if dst:
                ggml.ggml_backend_buffer_free(dst)
            ggml.ggml_free(ctx)


def h2d_seconds(gpu_index: int, n_bytes: int, *, pinned: bool, reps: int = 3) -> float:
    """Median seconds to copy ``n_bytes`` from host memory into a VRAM tensor."""
    with _h2d_pair(gpu_index, n_bytes, pinned=pinned) as copy:
        return _median_time(copy, reps)


@contextmanager
def h2d_copying(gpu_index: int, n_bytes: int) -> Iterator[Callable[[], int]]:
    """While the block runs, a thread copies ``n_bytes`` of pinned host memory into VRAM over
    and over (as a pipelined decode's copies read host memory beside the CPU's own reads);
    yields how many copies have finished. The buffers are allocated once, before the block:
    page-locking them while the caller times something would stall it (docs/arbiter.md)."""
    stop, done = threading.Event(), [0]
    with _h2d_pair(gpu_index, n_bytes, pinned=True) as copy:

        def loop() -> None:  # ctypes releases the GIL: the caller's ggml work runs beside
            while not stop.is_set():
                copy()
                done[0] += 1

        worker = threading.Thread(target=loop, name="igi-h2d-copy", daemon=True)
        worker.start()
        try:
            yield lambda: done[0]
        finally:
            stop.set()
            worker.join()


def _median_time(fn: Callable[[], object], reps: int) -> float:
    fn()  # warm-up: kernel selection, page faults, CUDA lazy loading
    times = []
    for _ in range(max(1, reps)):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
