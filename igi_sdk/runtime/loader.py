"""Load a model and create a context for a Plan — for real, or as a ``no_alloc`` dry run.

The dry run is how a plan is checked before it touches VRAM: llama.cpp resolves every tensor's
buffer (logged, so the placement is read back) and reserves its compute graphs without
allocating, reporting the compute-buffer size per device. Weight and KV bytes come from the
inventory (exact), since a dry run reports those buffers as empty.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp

from igi_sdk.errors import (
    LoadCancelledError,
    ModelLoadError,
    PlanError,
    UnsupportedArchitectureError,
)
from igi_sdk.model import ModelInventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import _native
from igi_sdk.runtime.devices import Device, first_gpu
from igi_sdk.runtime.overrides import LoadReport, Overrides, build_overrides, n_gpu_layers

log = logging.getLogger("igi_sdk.loader")

# keys: exactly the values of planner.plan.KvType / FlashAttn (tested)
_KV_TYPES = {
    "f32": llama_cpp.GGML_TYPE_F32,
    "f16": llama_cpp.GGML_TYPE_F16,
    "q8_0": llama_cpp.GGML_TYPE_Q8_0,
    "q4_0": llama_cpp.GGML_TYPE_Q4_0,
}
_FLASH = {
    "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
    "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
    "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
}


THREADS_ENV = "IGI_SDK_THREADS"  # overrides the default thread count (not an explicit one)


def usable_cpus(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """CPUs this process may use: its affinity mask (a container's cpuset; ``os.cpu_count`` is
    the host's), capped by a cgroup v2 CPU quota (``docker --cpus``) rounded up."""
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    n = max(1, n or 1)
    try:
        quota, period = Path(cpu_max).read_text().split()[:2]
        if quota != "max":
            n = min(n, max(1, -(-int(quota) // int(period))))
    except (OSError, ValueError):
        pass
    return n


def threads_for(cpus: int) -> int:
    """The default thread count on ``cpus`` usable CPUs: the game keeps at least one core, and
    half of them from 4 up (a main thread, a render thread, workers). Decode threads meet at a
    barrier after every op, so one that has no core stalls the others: with the game busy on
    one of 2 cores, 2 threads decoded at 2-40 tok/s and 1 thread at 70-80 (docs/architecture.md,
    "Coexisting with the game's CPU work")."""
    return max(1, min(cpus - 1, (cpus + 1) // 2))


def default_threads() -> int:
    """``IGI_SDK_THREADS`` when set to a positive integer, else :func:`threads_for` of the
    usable CPUs. Used where a thread count is 0 (``--threads 0``, ``EngineConfig.n_threads``)."""
    env = os.environ.get(THREADS_ENV, "").strip()
    if env:
        try:
            if int(env) > 0:
                return int(env)
        except ValueError:
            pass
        log.warning("%s=%r is not a positive integer: ignored", THREADS_ENV, env)
    return threads_for(usable_cpus())


@dataclass(frozen=True)
class ContextSettings:
    n_ctx: int
    n_seq_max: int
    n_batch: int
    n_threads: int
    # Logits rows one llama_decode may ask for (0: one per sequence). llama.cpp sizes its
    # compute buffers for this many output rows; left at its default (n_batch) it reserves the
    # output head's matmul for a whole ubatch, which with op offload stages the CPU-resident
    # head (and ubatch x n_vocab logits) in VRAM although a prompt only needs its last row.
    # A batch asking for more rows than this aborts in llama.cpp: callers must stay below it.
    n_outputs: int = 0
    # llama.cpp's extra buffer types (CPU weight repacking). False: weights stay in their file
    # layout, so a batch of several tokens rounds every row as one-token steps do (exact
    # greedy verification of drafts, at a higher verify cost)
    extra_bufts: bool = True

    @property
    def outputs_max(self) -> int:
        return max(self.n_outputs, self.n_seq_max)


@dataclass
class Loaded:
    model: Any
    ctx: Any
    report: LoadReport
    gpu: Device | None
    # What the model's params point at: llama.cpp keeps a copy of llama_model_params (with these
    # pointers) in the model, so the override array and the progress callback must outlive it.
    overrides: Overrides | None = None
    progress_cb: Any = None


def load(
    path: Path,
    inventory: ModelInventory,
    plan: Plan,
    settings: ContextSettings,
    *,
    progress: Callable[[float], None] | None = None,
    dry_run: bool = False,
    cancelled: Callable[[], bool] | None = None,
    names_streamed: bool = True,
) -> Loaded:
    """Model + context for ``plan``; raises a typed error (and frees everything) on failure.
    ``cancelled``: asked between tensors; once it answers True the load stops (llama.cpp's
    progress callback returning false) and raises :class:`LoadCancelledError`.
    ``names_streamed`` False: the process's streamed weights stay as they are (a draft model's
    context; its graphs are split with the target's names, which name none of its tensors on
    the host)."""
    _native.init_backend(plan.copy_compute_min_batch)
    gpu = first_gpu() if plan.uses_gpu() else None
    _check_threshold(plan, gpu)
    if names_streamed:
        _name_streamed(plan, gpu)
    # built first: a setting llama.cpp has no value for fails before anything is loaded
    cparams = context_params(plan, settings, gpu)
    mparams, overrides = model_params(plan, inventory, gpu, dry_run=dry_run)
    mparams.use_extra_bufts = settings.extra_bufts
    progress_cb = None
    if progress is not None or cancelled is not None:
        user_progress, stop = progress, cancelled

        @llama_cpp.llama_progress_callback
        def progress_cb(p: float, _user: ctypes.c_void_p) -> bool:
            if user_progress is not None:
                user_progress(float(p))
            return not (stop is not None and stop())

        mparams.progress_callback = progress_cb
    report = LoadReport()
    with _native.capture_log() as lines:
        model = llama_cpp.llama_model_load_from_file(str(path).encode(), mparams)
    if not model:
        if cancelled is not None and cancelled():
            raise LoadCancelledError(f"loading plan '{plan.name}' was cancelled")
        if "unknown model architecture" in "".join(lines):
            raise UnsupportedArchitectureError(
                f"llama.cpp cannot run the architecture of {path} "
                f"('{inventory.arch.architecture}')"
            )
        raise ModelLoadError(
            f"llama.cpp could not load {path} with plan '{plan.name}': {_last_error(lines)}"
        )
    try:
        report.parse_model_log(lines)
        with _native.capture_log() as lines:
            ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            raise ModelLoadError(
                f"llama.cpp could not create a context for {path} (n_ctx={settings.n_ctx}, "
                f"plan '{plan.name}'): {_last_error(lines)}"
            )
        report.parse_context_log(lines)
    except BaseException:  # never leak the model (a parse error, an interrupt, ...)
        llama_cpp.llama_model_free(model)
        raise
    return Loaded(model, ctx, report, gpu, overrides=overrides, progress_cb=progress_cb)


_warned_thresholds: set[tuple[int, int]] = set()


def _check_threshold(plan: Plan, gpu: Device | None) -> None:
    """Warn when a plan was priced with a copy-compute threshold llama.cpp is not using (it
    read its own when the backend started; plans from tuning.autoplan never differ)."""
    if gpu is None or not plan.op_offload:
        return
    in_effect = _native.copy_compute_threshold_in_effect()
    pair = (plan.copy_compute_min_batch, in_effect)
    if pair[0] != in_effect and pair not in _warned_thresholds:  # once, not at every reshard
        _warned_thresholds.add(pair)
        log.warning("plan '%s' assumes copy-compute from %d tokens, but llama.cpp started with "
                    "%d (it is fixed per process): its predictions are off",
                    plan.name, plan.copy_compute_min_batch, in_effect)


def _name_streamed(plan: Plan, gpu: Device | None) -> None:
    """Tell ggml's scheduler which host weights this plan streams at every batch (process-wide,
    read whenever a graph is split, so set before the new context computes; they reach only
    host weights of a context that offloads ops to the GPU, docs/architecture.md); warn once
    where this llama.cpp cannot, the plan's decode then computing them on the CPU."""
    if gpu is None:  # (a CPU placement, e.g. the one a reshard keeps open: no GPU split to
        return       # stream to, and the GPU placement's names stay for its next graphs)
    names = plan.decode_streamed
    if not _native.set_streamed_weights(names) and plan.name not in _warned_streaming:
        _warned_streaming.add(plan.name)
        log.warning("plan '%s' streams %d weights at decode, but this llama.cpp lacks the "
                    "pipelined scheduler (igi_sdk/bundle/patches/ggml-stream-prefetch.patch): "
                    "its decode computes them on the CPU, slower than predicted",
                    plan.name, len(names))


_warned_streaming: set[str] = set()


def model_params(plan: Plan, inventory: ModelInventory, gpu: Device | None, *,
                 dry_run: bool = False) -> tuple[Any, Overrides]:
    """llama.cpp's model parameters for the plan's placement: its layers and tensor overrides,
    and the CPU weights read into pinned host memory where the plan pins them (else mapped).
    The overrides must outlive the load (the parameters point into them)."""
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = n_gpu_layers(plan, inventory, gpu)
    overrides = build_overrides(plan, inventory, gpu)
    mparams.tensor_buft_overrides = overrides.pointer
    # a dry run must not map the file (llama.cpp asserts on it)
    pinned = plan.pinned_host or dry_run
    if plan.pinned_host and not dry_run:
        _native.pin_in_pieces()  # no long stall of the process's other threads (_native.py)
    mparams.load_mode = llama_cpp.LLAMA_LOAD_MODE_NONE if pinned else llama_cpp.LLAMA_LOAD_MODE_MMAP
    mparams.no_alloc = dry_run
    return mparams, overrides


def context_params(plan: Plan, s: ContextSettings, gpu: Device | None) -> Any:
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = s.n_ctx
    cparams.n_batch = max(s.n_batch, plan.n_ubatch)
    cparams.n_ubatch = plan.n_ubatch
    cparams.n_seq_max = s.n_seq_max
    cparams.n_outputs_max = s.outputs_max
    cparams.kv_unified = True  # sessions share the cells: an idle NPC holds no reserved KV
    cparams.n_threads = s.n_threads or default_threads()
    cparams.n_threads_batch = cparams.n_threads
    try:  # Plan validates these; a plan made with model_construct() is not validated
        cparams.flash_attn_type = _FLASH[plan.flash_attn]
        cparams.type_k = _KV_TYPES[plan.type_k]
        cparams.type_v = _KV_TYPES[plan.type_v]
    except KeyError as e:
        raise PlanError(f"plan '{plan.name}' has a setting the runtime cannot apply: {e}; "
                        f"KV types {sorted(_KV_TYPES)}, flash_attn {sorted(_FLASH)}") from None
    cparams.offload_kqv = plan.kv_on_gpu and gpu is not None
    cparams.op_offload = plan.op_offload and gpu is not None
    cparams.no_perf = True
    return cparams


def free(loaded: Loaded) -> None:
    if loaded.ctx:
        llama_cpp.llama_free(loaded.ctx)
    if loaded.model:
        llama_cpp.llama_model_free(loaded.model)
    loaded.ctx = loaded.model = None
    loaded.overrides = loaded.progress_cb = None  # nothing points at them any more


def dry_run(
    path: Path, inventory: ModelInventory, plan: Plan, settings: ContextSettings
) -> LoadReport:
    """Placement and compute-buffer sizes of ``plan`` without allocating any memory (its graphs
    split with its own streamed weights, then the process's names as they were)."""
    with _native.streamed_weights_kept():
        loaded = load(path, inventory, plan, settings, dry_run=True)
    try:
        return loaded.report
    finally:
        free(loaded)


def _last_error(lines: list[str]) -> str:
    errs = [ln.strip() for ln in lines if "error" in ln.lower() or "failed" in ln.lower()]
    return errs[-1] if errs else "see the log for details"
