"""Plan automatically: profile → planner → dry-run check → a Plan that fits.

The planner estimates llama.cpp's compute buffers; a ``no_alloc`` dry run of the chosen plan
measures them. If the measured plan would exceed the budget, the estimate is scaled by what was
measured and the planner runs again (at most a few rounds). If it measured clearly less than
estimated, the planner runs once more with the measured scale, so the VRAM the estimate held
back goes to weights, and that plan is kept only if its own dry run fits too.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from igi_sdk.model import ModelInventory
from igi_sdk.planner import (
    Plan,
    PlanResult,
    Workload,
    copy_threshold,
    plan_for,
    vram_by_category,
)
from igi_sdk.profile import Profile
from igi_sdk.runtime import _native, loader
from igi_sdk.runtime.devices import first_gpu
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.tuning.measure import cached_before_backend, load_or_measure

_ROUNDS = 3


def measured_vram(
    path: Path, inv: ModelInventory, plan: Plan, prof: Profile, wl: Workload,
    settings: ContextSettings,
) -> tuple[dict[str, int], int]:
    """(VRAM by category with llama.cpp's measured compute buffer, measured compute bytes)."""
    report = loader.dry_run(path, inv, plan, settings)
    gpu = loader.first_gpu()
    measured = report.bytes_on("gpu", gpu)["compute"] if gpu is not None else 0
    vram = vram_by_category(inv, plan, prof, wl, wl.compute_scale)
    est = vram["compute"]
    vram = dict(vram, compute=measured, total=vram["total"] - est + measured)
    return vram, measured


def plan_checked(
    path: Path,
    inv: ModelInventory,
    prof: Profile,
    budget: int | None,
    wl: Workload,
    settings: ContextSettings,
) -> PlanResult:
    """The planner's choice, verified with a dry-run load to fit ``budget``."""
    result = plan_for(inv, prof, budget, wl)
    if budget is None or prof.gpu is None or loader.first_gpu() is None:
        return result
    for _ in range(_ROUNDS):
        vram, measured = measured_vram(path, inv, result.best, prof, wl, settings)
        est = result.best.vram_bytes.get("compute", 1) or 1
        if vram["total"] <= budget:
            checked = _checked(result, vram)
            if measured < _SLACK * est:
                return _fill_slack(path, inv, prof, budget, wl, settings, checked, measured / est)
            return checked
        scale = wl.compute_scale * max(1.05, measured / est * 1.05)
        wl = dataclasses.replace(wl, compute_scale=scale)
        result = plan_for(inv, prof, budget, wl)
    return result


_SLACK = 0.85  # a dry run measuring below this share of the compute estimate re-plans once


def _checked(result: PlanResult, vram: dict[str, int]) -> PlanResult:
    return dataclasses.replace(result, best=result.best.model_copy(update={"vram_bytes": vram}))


def _fill_slack(
    path: Path, inv: ModelInventory, prof: Profile, budget: int, wl: Workload,
    settings: ContextSettings, checked: PlanResult, ratio: float,
) -> PlanResult:
    """Re-plan with the compute estimate scaled to what the dry run measured (plus 5%), and keep
    the new plan if it places more and its own dry run fits; else ``checked``."""
    tighter = dataclasses.replace(wl, compute_scale=wl.compute_scale * ratio * 1.05)
    result = plan_for(inv, prof, budget, tighter)
    if result.best.gpu_tensors == checked.best.gpu_tensors and \
            result.best.n_ubatch == checked.best.n_ubatch:
        return checked
    vram, _ = measured_vram(path, inv, result.best, prof, tighter, settings)
    if vram["total"] > budget or result.best.predicted.get("turn_s", float("inf")) >= \
            checked.best.predicted.get("turn_s", float("inf")):
        return checked
    return _checked(result, vram)


def prepare_backend(inv: ModelInventory, prof: Profile, *, pinned: bool = True,
                    outputs: int = 1) -> int | None:
    """Ask llama.cpp, before its backend starts, for the copy-compute threshold the planner
    chooses for this model and machine (``pinned``: host weights pinned, as in
    ``Workload.pin_host``; ``outputs``: logits rows of a decode step, ``Workload.outputs``).
    Starts nothing; does nothing on a profile without a GPU or once the backend has started.
    Returns the threshold the start will use (None: nothing asked)."""
    if prof.gpu is None or _native.backend_started():
        return None
    return _native.prepare_backend(copy_threshold(inv, prof, pinned, outputs + 1))


def with_threshold_in_effect(wl: Workload) -> Workload:
    """``wl`` fixed to the copy-compute threshold llama.cpp runs with (see the module doc)."""
    return dataclasses.replace(wl, copy_min_batch=_native.copy_compute_threshold_in_effect())


def plan_for_model(
    path: Path,
    inv: ModelInventory,
    *,
    budget: int | None,
    n_ctx: int,
    max_sessions: int,
    n_threads: int = 0,
    gen_tokens: int = 128,
    profile: Profile | None = None,
    progress: Callable[[float, str], None] | None = None,
    outputs: int | None = None,
    pin_host: bool = True,
) -> PlanResult:
    """The checked plan for a model on this machine: the CPU plan without a GPU; with one, the
    planner for ``budget`` (default: half the GPU's free memory) from ``profile`` or the cached
    one (measured first if there is none: ``progress`` hears how that goes). ``outputs``:
    logits rows per decode step (``EngineConfig.outputs_per_step``; default one per session).
    ``pin_host`` False: host weights stay memory-mapped (a placement the engine moves away from
    and back to, as for an encoder that borrows VRAM)."""
    outputs = outputs or max_sessions
    wl = Workload(n_ctx=n_ctx, prompt_tokens=max(64, min(1024, n_ctx // 4)),
                  gen_tokens=gen_tokens, n_outputs=outputs, pin_host=pin_host)
    if not _native.backend_started():
        # first_gpu() below starts the backend, and so does load_or_measure (its fingerprint
        # lists llama.cpp's devices): the threshold has to be asked for from a profile found
        # without either
        guess = profile or cached_before_backend(n_threads or None)
        if guess is not None:
            prepare_backend(inv, guess, pinned=wl.pin_host, outputs=outputs)
    gpu = first_gpu()
    if gpu is None:  # nothing to plan: no profile needs measuring either
        return PlanResult(Plan.all_cpu(), [], budget, 0)
    prof = profile or load_or_measure(threads=n_threads or None, fast=True, progress=progress)
    wl = with_threshold_in_effect(wl)
    if budget is None:
        budget = gpu.free_bytes // 2
    settings = ContextSettings(n_ctx, max_sessions, 512, n_threads, n_outputs=outputs)
    return plan_checked(path, inv, prof, budget, wl, settings)
