"""Plan automatically: profile → planner → dry-run check → a Plan that fits.

The planner estimates llama.cpp's compute buffers; a ``no_alloc`` dry run of the chosen plan
measures them. If the measured plan would exceed the budget, the estimate is scaled by what was
measured and the planner runs again (at most a few rounds). If it measured clearly less than
estimated, the planner runs once more with the measured scale, so the VRAM the estimate held
back goes to weights, and that plan is kept only if its own dry run fits too.

:class:`BudgetPlanner` is the one way a VRAM budget becomes a plan: ``igi-sdk chat/plan --vram``,
a fixed ``load_model.vram_budget`` and every GPU rung of the arbiter's ladder. What sits in VRAM
beside the model (a draft model, a vision encoder: :class:`Beside`) comes off the budget there and
nowhere else.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from igi_sdk.errors import BudgetTooSmallError
from igi_sdk.model import ModelInventory, read_inventory
from igi_sdk.model.mmproj import read_encoder
from igi_sdk.planner import (
    Plan,
    PlanResult,
    Workload,
    batch_threshold,
    copy_threshold,
    plan_for,
    planned_talkers,
    typical_prompt,
    vram_by_category,
)
from igi_sdk.planner.speculative import draft_vram
from igi_sdk.planner.vision import encoder_vram, flash_attn_for, largest_grid
from igi_sdk.profile import Profile
from igi_sdk.runtime import _native, loader
from igi_sdk.runtime.devices import first_gpu
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.tuning.measure import cached_before_backend, load_or_measure

_ROUNDS = 3


def measured_compute(path: Path, inv: ModelInventory, plan: Plan,
                     settings: ContextSettings) -> int:
    """llama.cpp's compute buffer on the GPU for ``plan``, from a ``no_alloc`` dry-run load."""
    report = loader.dry_run(path, inv, plan, settings)
    gpu = loader.first_gpu()
    return report.bytes_on("gpu", gpu)["compute"] if gpu is not None else 0


# measures one plan's compute buffer: ``measured_compute`` or a cache in front of it
Measure = Callable[[Plan], int]


def measured_vram(
    path: Path, inv: ModelInventory, plan: Plan, prof: Profile, wl: Workload,
    settings: ContextSettings, measure: Measure | None = None,
) -> tuple[dict[str, int], int]:
    """(VRAM by category with llama.cpp's measured compute buffer, measured compute bytes)."""
    measured = (measure(plan) if measure is not None
                else measured_compute(path, inv, plan, settings))
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
    measure: Measure | None = None,
) -> PlanResult:
    """The planner's choice, verified with a dry-run load to fit ``budget`` (``measure``: how a
    plan's compute buffer is measured, default a dry run each time)."""
    result = plan_for(inv, prof, budget, wl)
    if budget is None or prof.gpu is None or loader.first_gpu() is None:
        return result
    for _ in range(_ROUNDS):
        vram, measured = measured_vram(path, inv, result.best, prof, wl, settings, measure)
        est = result.best.vram_bytes.get("compute", 1) or 1
        if vram["total"] <= budget:
            checked = _checked(result, vram)
            if measured < _SLACK * est:
                return _fill_slack(path, inv, prof, budget, wl, settings, checked,
                                   measured / est, measure)
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
    measure: Measure | None = None,
) -> PlanResult:
    """Re-plan with the compute estimate scaled to what the dry run measured (plus 5%), and keep
    the new plan if it places more and its own dry run fits; else ``checked``."""
    tighter = dataclasses.replace(wl, compute_scale=wl.compute_scale * ratio * 1.05)
    result = plan_for(inv, prof, budget, tighter)
    if result.best.gpu_tensors == checked.best.gpu_tensors and \
            result.best.n_ubatch == checked.best.n_ubatch:
        return checked
    vram, _ = measured_vram(path, inv, result.best, prof, tighter, settings, measure)
    if vram["total"] > budget or result.best.predicted.get("turn_s", float("inf")) >= \
            checked.best.predicted.get("turn_s", float("inf")):
        return checked
    return _checked(result, vram)


def prepare_backend(inv: ModelInventory, prof: Profile, wl: Workload,
                    budget: int | None = None) -> int | None:
    """Ask llama.cpp, before its backend starts, for the copy-compute threshold the planner
    chooses for this model, machine and workload: from ``wl.threshold_floor`` (one more than
    a decode step's logits rows, or a session's verify batch), streamed at ``wl.pin_host``
    speed; where ``wl`` has sessions decoding together and ``budget`` is known, the best plan's
    for that budget, which may be low enough that their decode batch streams its CPU-resident
    weights (``planner.batch_threshold``).
    Starts nothing; does nothing on a profile without a GPU or once the backend has started.
    Returns the threshold the start will use (None: nothing asked)."""
    if prof.gpu is None or _native.backend_started():
        return None
    threshold = copy_threshold(inv, prof, wl.pin_host, wl.threshold_floor)
    if budget is not None and batch_threshold(inv, prof, wl):
        try:
            best = plan_for(inv, prof, budget, wl).best
        except BudgetTooSmallError:
            best = None
        if best is not None and best.op_offload:
            threshold = best.copy_compute_min_batch
    return _native.prepare_backend(threshold)


def with_threshold_in_effect(wl: Workload) -> Workload:
    """``wl`` fixed to what this process's llama.cpp runs with: the copy-compute threshold it
    read at its start (see the module doc), and whether its scheduler pipelines a decode."""
    return dataclasses.replace(wl, copy_min_batch=_native.copy_compute_threshold_in_effect(),
                               pipelined=_native.streams_weights())


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
    beside: Beside | None = None,
    n_batch: int = 512,
    talking: int = 1,
    draft_k: int = 0,
) -> PlanResult:
    """The checked plan for a model on this machine: the CPU plan without a GPU; with one,
    :class:`BudgetPlanner`'s for ``budget`` (default: half the GPU's free memory) from
    ``profile`` or the cached one (measured first if there is none: ``progress`` hears how that
    goes). ``outputs``: logits rows per decode step (``EngineConfig.outputs_per_step``; default
    one per session). ``pin_host`` False: host weights stay memory-mapped (a placement the
    engine moves away from and back to, as for an encoder that borrows VRAM). ``beside``: what
    the GPU holds beside the model (a draft, a vision encoder), out of ``budget``.
    ``talking``: sessions expected to decode together (the planned turn is theirs)."""
    outputs = outputs or max_sessions
    wl = Workload(n_ctx=n_ctx, n_seqs=planned_talkers(talking, outputs),
                  prompt_tokens=typical_prompt(n_ctx), gen_tokens=gen_tokens,
                  n_outputs=outputs, pin_host=pin_host, draft_k=draft_k)
    if not _native.backend_started():
        # first_gpu() below starts the backend, and so does load_or_measure (its fingerprint
        # lists llama.cpp's devices): the threshold has to be asked for from a profile found
        # without either
        guess = profile or cached_before_backend(n_threads or None)
        if guess is not None:
            prepare_backend(inv, guess, wl, budget or half_free(guess))
    gpu = first_gpu()
    simulated = gpu is None and profile is not None and profile.gpu is not None
    if gpu is None and not (simulated and budget is not None):
        return PlanResult(Plan.all_cpu(), [], budget, 0)  # nothing to plan, nothing to measure
    # (a given GPU profile and budget without a GPU: the planner's estimate, as every rung of
    # a simulated arbiter's ladder is; its GPU plans load on the CPU here)
    prof = profile or load_or_measure(threads=n_threads or None, fast=True, progress=progress)
    wl = with_threshold_in_effect(wl)
    if budget is None:
        assert gpu is not None
        budget = gpu.free_bytes // 2
    settings = ContextSettings(n_ctx, max_sessions, n_batch, n_threads, n_outputs=outputs)
    return BudgetPlanner(inv, prof, wl, beside=beside or Beside(),
                         check=DryRun(path, settings))(budget)


def half_free(prof: Profile) -> int | None:
    """The default budget (half the GPU's free memory) as the profile recorded it: what a
    threshold is asked for before the backend starts, when the live figure is not yet read."""
    return prof.gpu.free_bytes // 2 if prof.gpu is not None else None


# --- one path from a VRAM budget to a plan -------------------------------------------------------


@dataclass(frozen=True)
class Beside:
    """VRAM the GPU holds beside the model on a GPU plan: a draft model held wholly in VRAM, and
    a vision encoder on the GPU sized for the largest image it takes. The CPU plan counts
    neither (the arbiter drops the draft first under pressure, and from the CPU plan the
    encoder runs on the CPU)."""

    draft: int = 0
    encoder: int = 0

    @property
    def total(self) -> int:
        return self.draft + self.encoder

    @classmethod
    def priced(cls, *, n_ctx: int, max_sessions: int, draft: Path | None = None,
               draft_k: int = 4, encoder: Path | None = None,
               max_image_tokens: int = 0) -> Beside:
        """The planner's price of a ``draft`` GGUF (its KV cache for every session plus
        ``draft_k`` drafts each, compute buffer) and of an ``encoder`` (mmproj) on the GPU for
        images of at most ``max_image_tokens`` tokens (0: the model's limit)."""
        return cls(draft_bytes(draft, n_ctx, max_sessions, draft_k) if draft else 0,
                   encoder_bytes(encoder, max_image_tokens) if encoder else 0)


def draft_bytes(draft: Path, n_ctx: int, max_sessions: int, k: int) -> int:
    """VRAM of a draft held wholly on the GPU beside the target (weights, its KV cache for
    every session plus ``k`` drafts each, compute buffer): planner.speculative's pricing."""
    wl = Workload(n_ctx=n_ctx, n_seqs=max_sessions)
    return draft_vram(read_inventory(draft), wl, k).total


def encoder_bytes(mmproj: Path, max_tokens: int) -> int:
    """VRAM of the vision encoder on the GPU for the largest image it takes (weights, compute
    buffer with flash attention where the GPU has it, margin): planner.vision's pricing."""
    enc = read_encoder(mmproj)
    return encoder_vram(enc, largest_grid(enc, max_tokens), flash_attn_for(enc, gpu=True))


@dataclass(frozen=True)
class DryRun:
    """What a ``no_alloc`` dry-run load of a plan needs: the model file and the context the
    engine will run it with."""

    path: Path
    settings: ContextSettings


@dataclass
class BudgetPlanner:
    """The one way a VRAM budget becomes a plan (``igi-sdk chat/plan --vram``, a fixed
    ``load_model.vram_budget``, every GPU rung of the arbiter's ladder): what is ``beside`` the
    model comes off the budget, the planner plans the rest, and with ``check`` a dry-run load
    verifies the compute buffers where llama.cpp has a GPU (:func:`plan_checked`). Without a
    GPU (CPU CI) or a ``check``, a plan is the planner's estimate."""

    inv: ModelInventory
    prof: Profile
    wl: Workload
    beside: Beside = field(default_factory=Beside)
    check: DryRun | None = None
    # measured compute buffers by placement: a ladder's budget steps plan the same placement
    # many times, and one dry run per placement keeps its build fast
    _measured: dict[str, int] = field(default_factory=dict, repr=False)

    def __call__(self, budget: int | None) -> PlanResult:
        """The plan for ``budget`` bytes of VRAM in all (None: the CPU plan). A GPU plan's
        ``vram_bytes`` (``draft``, ``encoder``, ``total``) and the result's ``minimum_bytes``
        count what is beside the model. Raises :class:`BudgetTooSmallError` for a budget that
        leaves the model too little, naming what is beside it."""
        if budget is None:
            return plan_for(self.inv, self.prof, None, self.wl)
        taken = self.beside.total
        own = max(0, budget - taken)
        try:
            if self.check is None:
                result = plan_for(self.inv, self.prof, own, self.wl)
            else:
                result = plan_checked(self.check.path, self.inv, self.prof, own, self.wl,
                                      self.check.settings, self._measure)
        except BudgetTooSmallError as e:
            if not taken:
                raise
            raise BudgetTooSmallError(
                f"{e} (the draft model and the vision encoder on the GPU take "
                f"{taken >> 20} MiB of the {budget >> 20} MiB budget; load without them, "
                "lower --vision-max-tokens or raise the budget)",
                e.minimum_bytes + taken) from None
        if not taken or not result.best.uses_gpu():
            return result
        v = result.best.vram_bytes
        extra = {k: n for k, n in (("draft", self.beside.draft),
                                   ("encoder", self.beside.encoder)) if n}
        best = result.best.model_copy(update={"vram_bytes": {
            **{k: n for k, n in v.items() if k != "total"}, **extra,
            "total": v.get("total", 0) + taken}})
        return dataclasses.replace(result, best=best, budget=budget,
                                   minimum_bytes=result.minimum_bytes + taken)

    def _measure(self, plan: Plan) -> int:
        assert self.check is not None
        key = plan.model_dump_json(exclude={"name", "predicted", "vram_bytes"})
        if key not in self._measured:
            self._measured[key] = measured_compute(self.check.path, self.inv, plan,
                                                   self.check.settings)
        return self._measured[key]
