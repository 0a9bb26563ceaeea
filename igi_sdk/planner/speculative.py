"""Pricing a draft model for speculative decoding against a VRAM budget (pure functions).

With a draft, one decode step of the target verifies the last token plus ``k`` drafted ones in a
single batch (k + 1 tokens, its own token tier: ``cost.ubatch_cost`` applies the copy-compute
threshold to it like to any batch) and yields on average ``E(α, k) = (1 - α^(k+1)) / (1 - α)``
tokens, α being the chance that the target keeps a drafted token. The step also pays ``k``
single-token decodes of the draft. So drafting pays where

    E(α, k) / (k · draft_s + verify_s)  >  1 / plain_s

and, at a fixed budget, the draft's VRAM (weights, KV cache, compute buffer) is VRAM the target's
weights no longer get: :func:`choose` prices both sides with the planner's own cost model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from igi_sdk.model import ModelInventory
from igi_sdk.planner.cost import ubatch_cost
from igi_sdk.planner.plan import Plan
from igi_sdk.planner.planner import (
    Workload,
    compute_buffer_estimate,
    minimum_budget,
    plan_for,
)
from igi_sdk.profile import Profile

DRAFT_UBATCH = 64  # the draft decodes one token per session, or catch-up chunks of a prompt


def expected_tokens_per_pass(alpha: float, k: int) -> float:
    """Tokens one verify pass yields on average: the accepted prefix of ``k`` drafts (each kept
    with probability ``alpha`` given the previous ones were) plus the target's own token."""
    if not 0.0 <= alpha <= 1.0 or k < 0:
        raise ValueError(f"alpha must be in [0, 1] and k >= 0 (got {alpha}, {k})")
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def speculative_tps(alpha: float, k: int, *, verify_s: float, draft_s: float) -> float:
    """Decode tokens per second with drafting (one session)."""
    return expected_tokens_per_pass(alpha, k) / (k * draft_s + verify_s)


# what α means wherever it is printed (``stats`` reports the same quantity as "alpha")
ALPHA_MEANING = ("α = per-token acceptance: the chance the target keeps a drafted token given "
                 "it kept the ones before")


def break_even_alpha(k: int, *, plain_s: float, verify_s: float, draft_s: float) -> float:
    """The acceptance above which drafting ``k`` tokens beats plain decoding (a target step of
    ``plain_s``); ``math.inf`` when even a draft that is always right loses."""
    need = (k * draft_s + verify_s) / max(plain_s, 1e-12)  # tokens a step must yield
    if need <= 1.0:
        return 0.0
    if expected_tokens_per_pass(1.0, k) < need:
        return math.inf
    lo, hi = 0.0, 1.0  # E is increasing in alpha
    for _ in range(40):
        mid = (lo + hi) / 2
        if expected_tokens_per_pass(mid, k) < need:
            lo = mid
        else:
            hi = mid
    return hi


def draft_plan(draft: ModelInventory, *, gpu: bool) -> Plan:
    """Where the runtime puts a draft: every tensor in VRAM (but the token embedding, which
    llama.cpp reads on the CPU) when there is a GPU, else all on the CPU."""
    if not gpu:
        return Plan.all_cpu().model_copy(update={"name": "draft-cpu"})
    return Plan.all_gpu(draft).model_copy(update={"name": "draft-gpu", "flash_attn": "on",
                                                  "n_ubatch": DRAFT_UBATCH})


def draft_n_ctx(n_ctx: int, n_seqs: int, k: int) -> int:
    """KV cells of the draft's context: the target's, plus ``k`` drafts per session beyond it."""
    return n_ctx + n_seqs * (k + 1)


@dataclass(frozen=True)
class DraftVram:
    weights: int
    kv: int
    compute: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.compute


def draft_vram(draft: ModelInventory, wl: Workload, k: int) -> DraftVram:
    """VRAM of a draft held wholly on the GPU (the CUDA context is the target's, already
    counted in its plan)."""
    plan = draft_plan(draft, gpu=True)
    gpu = plan.gpu_set
    weights = sum(t.n_bytes for t in draft.tensors if t.name in gpu)
    kv = draft.kv_bytes(draft_n_ctx(wl.n_ctx, wl.n_seqs, k), plan.type_k, plan.type_v,
                        swa_full=True)
    return DraftVram(weights, kv, compute_buffer_estimate(draft, plan, wl))


@dataclass(frozen=True)
class StepSeconds:
    plain_s: float  # one target decode step (1 token)
    verify_s: float  # one target step verifying k + 1 tokens
    draft_s: float  # one draft decode (1 token)


def step_seconds(target: ModelInventory, plan: Plan, draft: ModelInventory | None,
                 prof: Profile, ctx: int, k: int) -> StepSeconds:
    """Predicted seconds of the three kinds of decode at context ``ctx`` (``draft`` None: no
    draft model, as with n-gram proposals: ``draft_s`` is 0)."""
    draft_s = 0.0
    if draft is not None:
        dplan = draft_plan(draft, gpu=prof.gpu is not None)
        draft_s = ubatch_cost(draft, dplan, prof, 1, ctx).total
    return StepSeconds(
        plain_s=ubatch_cost(target, plan, prof, 1, ctx).total,
        verify_s=ubatch_cost(target, plan, prof, k + 1, ctx).total,
        draft_s=draft_s,
    )


@dataclass(frozen=True)
class DraftChoice:
    use_draft: bool
    k: int
    alpha: float
    tokens_per_pass: float
    plain_tps: float  # the best plan without a draft, at the whole budget
    speculative_tps: float  # the best plan for what the draft leaves, with the draft (0: none)
    plain_plan: Plan
    speculative_plan: Plan | None  # None: the draft does not fit the budget
    draft_vram: DraftVram
    vram_total: int  # of the chosen side: target plan + draft when drafting
    why: str


def choose(target: ModelInventory, draft: ModelInventory, prof: Profile, budget: int | None,
           *, k: int = 4, alpha: float = 0.7, wl: Workload | None = None) -> DraftChoice:
    """Whether a draft pays within ``budget``: the best plan without one, at the whole budget,
    against the best plan for ``budget`` minus the draft's VRAM, plus the draft. A CPU-only
    profile (or no budget) keeps the draft on the CPU and weighs its decode time only."""
    wl = wl or Workload()
    ctx = wl.prompt_tokens + wl.gen_tokens // 2
    plain = plan_for(target, prof, budget, wl).best
    plain_tps = 1.0 / step_seconds(target, plain, draft, prof, ctx, k).plain_s
    on_gpu = prof.gpu is not None and budget is not None
    dv = draft_vram(draft, wl, k) if on_gpu else DraftVram(0, 0, 0)
    plain_total = plain.vram_bytes.get("total", 0)
    left = None if budget is None else budget - dv.total
    if on_gpu and left is not None and left < minimum_budget(target, prof, wl):
        return DraftChoice(False, k, alpha, expected_tokens_per_pass(alpha, k), plain_tps, 0.0,
                           plain, None, dv, plain_total,
                           f"the draft's {dv.total >> 20} MiB leave the target less than its "
                           "minimum budget")
    # the verify step asks for k + 1 logits rows per session: its output head is sized for them
    verify_wl = replace(wl, n_outputs=wl.n_seqs * (k + 1), draft_k=k)
    spec = plan_for(target, prof, left, verify_wl).best if on_gpu else plain
    sec = step_seconds(target, spec, draft, prof, ctx, k)
    spec_tps = speculative_tps(alpha, k, verify_s=sec.verify_s, draft_s=sec.draft_s)
    use = spec_tps > plain_tps
    spec_total = spec.vram_bytes.get("total", 0) + dv.total
    why = (f"with the draft (k={k}, α={alpha:.2f}) '{spec.name}' predicts {spec_tps:.1f} tok/s, "
           f"without '{plain.name}' {plain_tps:.1f} tok/s")
    return DraftChoice(use, k, alpha, expected_tokens_per_pass(alpha, k), plain_tps, spec_tps,
                       plain, spec, dv, spec_total if use else plain_total, why)


NGRAM_LOOKUP_S = 3e-5  # one n-gram lookup per step and session (Python dict probes)


@dataclass(frozen=True)
class NgramChoice:
    use_ngram: bool
    k: int  # the best k at ``alpha`` (1..k_max)
    alpha: float
    tokens_per_pass: float
    plain_tps: float
    speculative_tps: float
    break_even: float  # α above which proposals of ``k`` tokens pay
    why: str


def choose_ngram(target: ModelInventory, prof: Profile, budget: int | None, *,
                 k_max: int = 4, alpha: float = 0.5, wl: Workload | None = None,
                 lookup_s: float = NGRAM_LOOKUP_S) -> NgramChoice:
    """Whether n-gram proposals of the session's own tokens pay at per-token ``alpha`` (when a
    proposal is found): no draft model, so no VRAM beside the target; a step costs one lookup
    and a verify batch of k + 1 tokens (its output head sized for them)."""
    wl = wl or Workload()
    ctx = wl.prompt_tokens + wl.gen_tokens // 2
    plain = plan_for(target, prof, budget, wl).best
    plain_s = ubatch_cost(target, plain, prof, 1, ctx).total
    verify_wl = replace(wl, n_outputs=wl.n_seqs * (k_max + 1), draft_k=k_max)
    spec = plan_for(target, prof, budget, verify_wl).best \
        if prof.gpu is not None and budget is not None else plain
    best: tuple[float, int, float] | None = None  # (tok/s, k, verify_s)
    for k in range(1, k_max + 1):
        verify_s = ubatch_cost(target, spec, prof, k + 1, ctx).total
        tps = expected_tokens_per_pass(alpha, k) / (lookup_s + verify_s)
        if best is None or tps > best[0]:
            best = (tps, k, verify_s)
    assert best is not None
    tps, k, verify_s = best
    plain_tps = 1.0 / plain_s
    be = break_even_alpha(k, plain_s=plain_s, verify_s=verify_s + lookup_s, draft_s=0.0)
    why = (f"n-gram proposals (k={k}, α={alpha:.2f}) predict {tps:.1f} tok/s where one is "
           f"found, plain '{plain.name}' {plain_tps:.1f} tok/s; break-even α "
           f"{'never' if math.isinf(be) else f'{be:.2f}'}")
    return NgramChoice(tps > plain_tps, k, alpha, expected_tokens_per_pass(alpha, k),
                       plain_tps, tps, be, why)
