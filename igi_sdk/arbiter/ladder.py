"""The plan ladder: the planner's plan for each budget step, computed once when a model loads,
so that a decision at frame time is a lookup, not a planning run."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass, replace

from igi_sdk.errors import BudgetTooSmallError
from igi_sdk.model import ModelInventory
from igi_sdk.planner import (
    PIN_RAM_HEADROOM,
    Plan,
    PlanResult,
    Workload,
    plan_for,
    planned_talkers,
    typical_prompt,
)
from igi_sdk.profile import Profile

MIB = 1024 * 1024


def arbiter_workload(n_ctx: int, outputs: int | None = None, talking: int = 1,
                     pin_host: bool = False, draft_k: int = 0) -> Workload:
    """What the sidecar's ladder plans for: the turn of ``talking`` NPCs decoding together in a
    context of ``n_ctx`` (``outputs``: logits rows per decode step, at least ``talking``;
    ``draft_k``: drafts a session's verify step carries; ``pin_host``: host weights read into
    page-locked memory, :func:`pins_host_weights` decides). The
    KV cache stays f16 on every rung (a reshard carries the KV bytes over whole, and llama.cpp
    cannot read one format's cells into another's: a q8_0 rung beside the f16 CPU rung would
    lose every conversation's cache at the move). For the same reason every rung runs flash
    attention (one V layout: llama.cpp stores V transposed without it)."""
    return Workload(n_ctx=n_ctx, n_seqs=planned_talkers(talking, outputs),
                    prompt_tokens=typical_prompt(n_ctx), pin_host=pin_host, n_outputs=outputs,
                    kv_quant=False, flash_attn_only=True, draft_k=draft_k)


HOST_WEIGHTS = ("auto", "pinned", "mapped")
GIB = 1024 * MIB


@dataclass(frozen=True)
class HostWeights:
    """How the ladder's rungs hold their CPU-resident weights, and why (the sidecar logs it)."""

    pinned: bool
    why: str


def pins_host_weights(choice: str, *, talking: int, vision_borrow: bool, pipelines: bool,
                      standby: bool, model_bytes: int, available_ram: int | None) -> HostWeights:
    """Whether the ladder's GPU rungs read their host weights into page-locked (pinned) memory
    rather than mapping the file (``choice``: ``serve --host-weights``, one of HOST_WEIGHTS).

    Every reshard loads a placement again: mapped host weights cost nothing to load (the
    page cache holds them), pinned ones are copied into freshly page-locked memory (a 4.5 GiB
    rung loaded 0.3-1.0 s slower on the H200 host, and other threads' allocations wait while
    the memory is locked: benchmarks/load_behind.py). Pinned memory is what lets a decode step
    copy them to the GPU while the CPU computes (a pipelined decode, docs/planner.md) and
    stream them at twice the pageable speed. So ``auto`` pins where a rung gains that on every
    token:

    * NPCs that talk together (``talking`` > 1): their decode steps stream the weights;
    * this llama.cpp pipelines a decode (``pipelines``), and a CPU standby decodes through
      each reload (without one, every NPC would wait out the longer load), and the machine
      has the RAM: the file's mapped pages (the standby computes from them) beside a pinned
      copy of at most the whole model, plus :data:`PIN_RAM_HEADROOM`.

    It never pins where a vision encoder borrows the model's VRAM (two reloads per image
    line, each in its time to first token)."""
    if choice not in HOST_WEIGHTS:
        raise ValueError(f"host weights are one of {HOST_WEIGHTS}; got {choice!r}")
    if choice != "auto":
        return HostWeights(choice == "pinned", f"--host-weights {choice}")
    if vision_borrow:
        return HostWeights(False, "a vision encoder borrows the model's VRAM at each image line: "
                                  "each of its two reloads maps the weights")
    if talking > 1:
        return HostWeights(True, f"{talking} NPCs talk together: their decode steps stream "
                                 "the host weights at pinned speed")
    if not pipelines:
        return HostWeights(False, "this llama.cpp does not pipeline a decode: mapped weights "
                                  "reload at no cost")
    if not standby:
        return HostWeights(False, "no CPU standby decodes through a reload: mapped weights "
                                  "keep each reshard's pause short")
    need = 2 * model_bytes + PIN_RAM_HEADROOM
    if available_ram is None or available_ram < need:
        seen = "unknown" if available_ram is None else f"{available_ram / GIB:.1f} GiB"
        return HostWeights(False, f"available RAM {seen} is below the {need / GIB:.1f} GiB a "
                                  "pinned copy beside the mapped model needs")
    return HostWeights(True, "a pipelined decode streams host weights while the CPU computes; "
                             "the standby decodes through each longer reload")


# How a budget becomes a rung's plan: the plan for ``budget`` bytes of VRAM in all (None: the CPU
# plan), whose ``vram_bytes["total"]`` counts whatever the GPU holds beside the model. The sidecar
# passes the tuning layer's ``BudgetPlanner`` (the path every VRAM budget takes), which raises
# BudgetTooSmallError for a budget that leaves the model too little.
RungPlanner = Callable[[int | None], PlanResult]


def one_v_layout(plan: Plan) -> Plan:
    """``plan`` with flash attention on: every rung stores V in the same (untransposed)
    layout, so a context's state parked on one rung is read back into any other. llama.cpp
    refuses a state whose V layout differs (``incompatible V transposition``), and ``auto``
    resolves per device (on for the CPU, off where CUDA has no kernel for the head size), so
    it is fixed here rather than left to the load. (A plan priced without it only needed
    more compute memory: flash attention never materialises the score matrix.)"""
    return plan if plan.flash_attn == "on" else plan.model_copy(update={"flash_attn": "on"})


@dataclass(frozen=True)
class Rung:
    vram: int  # total VRAM of the process on this plan (bytes)
    plan: Plan

    @property
    def turn_s(self) -> float:
        return self.plan.predicted.get("turn_s", float("inf"))


class PlanLadder:
    """Rungs sorted by VRAM; rung 0 is the CPU plan (only the GPU's fixed share)."""

    def __init__(self, rungs: list[Rung]) -> None:
        if not rungs:
            raise ValueError("a ladder needs at least the CPU rung")
        self.rungs = sorted(rungs, key=lambda r: r.vram)
        self._vram = [r.vram for r in self.rungs]

    @classmethod
    def build(cls, inv: ModelInventory, prof: Profile, wl: Workload,
              step: int = 256 * MIB, planner: RungPlanner | None = None,
              cap: int | None = None) -> PlanLadder:
        """Rungs from the CPU plan up to what unlimited VRAM would run, ``step`` apart, none
        above ``cap`` bytes. ``planner``: how each budget step becomes a plan (default: the
        planner's estimate for ``wl``, nothing beside the model); the sidecar's checks every GPU
        rung with a dry-run load where llama.cpp has a GPU — on a machine without one (CPU CI)
        a rung is the planner's estimate, as here."""
        if planner is None:
            f16 = replace(wl, kv_quant=False, flash_attn_only=True)
            planner = lambda budget: plan_for(inv, prof, budget, f16)  # noqa: E731
        rungs = [Rung(prof.gpu_fixed_bytes if prof.gpu else 0, one_v_layout(planner(None).best))]
        if prof.gpu is None:
            return cls(rungs)
        try:
            top = planner(2**62)  # what unlimited VRAM would run
        except BudgetTooSmallError:
            return cls(rungs)
        ceiling = int(top.best.vram_bytes["total"])
        budget = top.minimum_bytes
        seen: set[tuple] = set()
        while cap is None or budget <= cap:
            try:
                plan: Plan | None = planner(min(budget, ceiling)).best
            except BudgetTooSmallError:  # a dry run measured more than the estimate: a larger
                plan = None  # step may still fit
            if plan is not None and (cap is None or plan.vram_bytes["total"] <= cap):
                if plan.type_k != "f16" or plan.type_v != "f16":
                    raise ValueError(f"ladder rung '{plan.name}' has a {plan.type_k} KV cache: "
                                     "every rung keeps the f16 cache a reshard carries over")
                plan = one_v_layout(plan)
                key = (plan.gpu_tensors, plan.gpu_layers, plan.n_ubatch, plan.op_offload,
                       plan.decode_streamed)
                if key not in seen:
                    seen.add(key)
                    rungs.append(Rung(int(plan.vram_bytes["total"]), plan))
            if budget >= ceiling:
                break
            budget += step
        # a rung that needs more VRAM but predicts no faster turn is never worth climbing to
        kept: list[Rung] = []
        for r in sorted(rungs, key=lambda r: r.vram):
            if not kept or r.turn_s < kept[-1].turn_s or r is rungs[0]:
                kept.append(r)
        return cls(kept)

    def best_within(self, budget: int) -> Rung:
        """The fastest rung whose VRAM fits ``budget`` (the CPU rung if none does)."""
        i = bisect_right(self._vram, budget) - 1
        return self.rungs[max(0, i)]

    def index(self, rung: Rung) -> int:
        return self.rungs.index(rung)

    @property
    def cpu(self) -> Rung:
        return self.rungs[0]
