"""The plan ladder: the planner's plan for each budget step, computed once when a model loads,
so that a decision at frame time is a lookup, not a planning run."""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, replace

from igi_sdk.errors import BudgetTooSmallError
from igi_sdk.model import ModelInventory
from igi_sdk.planner import Plan, Workload, plan_for
from igi_sdk.profile import Profile

MIB = 1024 * 1024


def arbiter_workload(n_ctx: int, outputs: int | None = None) -> Workload:
    """What the sidecar's ladder plans for: an NPC turn in a context of ``n_ctx`` (``outputs``:
    logits rows per decode step). Host weights stay memory-mapped, since the arbiter reloads the
    model at every reshard."""
    return Workload(n_ctx=n_ctx, prompt_tokens=max(64, min(1024, n_ctx // 4)), pin_host=False,
                    n_outputs=outputs)


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
              step: int = 256 * MIB, extra_vram: int = 0) -> PlanLadder:
        """Rungs from the CPU plan up to what unlimited VRAM would run, ``step`` apart.
        ``extra_vram``: a draft model or a vision encoder held in VRAM beside every GPU plan
        (the arbiter drops the draft first under pressure, so the CPU rung does not count it)."""
        # every rung keeps the f16 KV cache: a reshard carries the KV bytes over whole, and
        # llama.cpp cannot read one format's cells into another's (a q8_0 rung beside the f16
        # CPU rung would lose every conversation's cache at the move)
        wl = replace(wl, kv_quant=False)
        cpu = plan_for(inv, prof, None, wl).best
        rungs = [Rung(prof.gpu_fixed_bytes if prof.gpu else 0, cpu)]
        if prof.gpu is None:
            return cls(rungs)
        try:
            top = plan_for(inv, prof, 2**62, wl).best  # what unlimited VRAM would run
        except BudgetTooSmallError:
            return cls(rungs)
        ceiling = int(top.vram_bytes["total"])
        budget = plan_for(inv, prof, 2**62, wl).minimum_bytes
        seen: set[tuple] = set()
        while True:
            plan = plan_for(inv, prof, min(budget, ceiling), wl).best
            key = (plan.gpu_tensors, plan.gpu_layers, plan.n_ubatch, plan.op_offload)
            if key not in seen:
                seen.add(key)
                rungs.append(Rung(int(plan.vram_bytes["total"]) + extra_vram, plan))
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
