"""Pipelined sharding: choose the placement and settings that run fastest inside a VRAM budget.

The budget is the inference process's *total* VRAM: the GPU's fixed share (CUDA context), the
resident weights, the KV cache of the layers on the GPU and llama.cpp's compute buffers.

Strategies considered for every budget (each with several ``n_ubatch`` values):
* ``all-gpu`` and ``all-gpu-no-output`` — everything in VRAM (but the token embedding);
* ``attn-first`` — fill VRAM in priority order: attention + norms + KV layer by layer (from the
  last layer, the way llama.cpp assigns KV), router and global norms, output head, dense FFN and
  shared experts layer by layer, then routed experts tensor by tensor. Two variants: ``static``
  (CPU-resident weights always computed on the CPU) and ``copy`` (prefill-sized batches stream
  them to the GPU — copy-compute — with the threshold set per token tier by the cost model);
* ``layer-offload`` — llama.cpp's classic ``n_gpu_layers``: the largest number of whole layers
  that fits, as a floor the planner must never fall below.
The filling is a strict prefix of the priority list (no skipping), so a larger budget places a
superset of tensors and the predicted speed never drops as the budget grows.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from igi_sdk.errors import BudgetTooSmallError
from igi_sdk.model import ModelInventory, TensorInfo
from igi_sdk.planner.cost import decode_tps, kv_gpu_layers, ttft_seconds, ubatch_cost
from igi_sdk.planner.plan import Plan
from igi_sdk.profile import Profile

MIB = 1024 * 1024
UBATCHES = (512, 1024, 2048)
_MARGIN_BYTES = 64 * MIB  # llama.cpp's small buffers (output, sched copies) and fragmentation
_MARGIN_FRACTION = 0.05


@dataclass(frozen=True)
class Workload:
    """What the plan is optimised for: a typical NPC turn.

    ``compute_scale`` corrects the compute-buffer estimate after a dry-run load measured it."""

    n_ctx: int = 4096
    n_seqs: int = 1
    prompt_tokens: int = 1024
    gen_tokens: int = 128
    compute_scale: float = 1.0

    def __post_init__(self) -> None:
        if self.n_ctx < 64 or self.n_seqs < 1 or self.prompt_tokens < 1 or self.gen_tokens < 1:
            raise ValueError(f"invalid workload {self}")


@dataclass
class Candidate:
    plan: Plan
    vram: dict[str, int]
    ttft_s: float
    decode_tps: float
    fits: bool
    score: float = 0.0  # predicted seconds for one turn (prefill + generation)


@dataclass
class PlanResult:
    best: Plan
    candidates: list[Candidate] = field(default_factory=list)
    budget: int | None = None
    minimum_bytes: int = 0

    def why(self) -> str:
        fit = sorted((c for c in self.candidates if c.fits), key=lambda c: c.score)
        if len(fit) < 2:
            return f"'{self.best.name}' is the only plan that fits"
        a, b = fit[0], fit[1]
        return (f"'{a.plan.name}' predicts {a.score:.2f} s per turn "
                f"(TTFT {a.ttft_s:.2f} s, {a.decode_tps:.1f} tok/s) vs {b.score:.2f} s for the "
                f"runner-up '{b.plan.name}'")


# --- VRAM accounting ------------------------------------------------------------------------------


def compute_buffer_estimate(inv: ModelInventory, plan: Plan, wl: Workload) -> int:
    """llama.cpp's GPU compute buffer for a plan (checked against a dry-run load at run time).

    Activations of one ubatch (~12 rows of n_embd and 3 of the FFN width, f32), the attention
    score matrix when flash attention is off, and with copy-compute a staging copy of the
    largest CPU-resident weight."""
    a = inv.arch
    ffw = max(a.n_ff, a.expert_ff * max(1, a.n_expert_used), a.shared_expert_ff)
    ub = plan.n_ubatch
    act = ub * (12 * a.n_embd + 3 * ffw) * 4
    if plan.flash_attn == "off":
        act += a.n_head * ub * wl.n_ctx * 4
    staging = 0
    if plan.op_offload:
        gpu = set(plan.gpu_tensors)
        cpu_sizes = [t.n_bytes for t in inv.tensors if t.name not in gpu
                     and t.group != "token_embd"]
        staging = max(cpu_sizes, default=0)
    return act + staging


def vram_by_category(
    inv: ModelInventory, plan: Plan, prof: Profile, wl: Workload,
    compute_scale: float = 1.0,
) -> dict[str, int]:
    if prof.gpu is None:
        return {"fixed": 0, "weights": 0, "kv": 0, "compute": 0, "margin": 0, "total": 0}
    gpu = set(plan.gpu_tensors)
    weights = sum(t.n_bytes for t in inv.tensors if t.name in gpu)
    layers = kv_gpu_layers(inv, plan, True)
    kv_all = inv.kv_bytes(wl.n_ctx, plan.type_k, plan.type_v, swa_full=True)
    kv = kv_all * len(layers) // max(1, inv.arch.n_layers)
    compute = int(compute_buffer_estimate(inv, plan, wl) * compute_scale)
    margin = _MARGIN_BYTES + int(_MARGIN_FRACTION * compute)
    fixed = prof.gpu_fixed_bytes
    total = fixed + weights + kv + compute + margin
    return {"fixed": fixed, "weights": weights, "kv": kv, "compute": compute, "margin": margin,
            "total": total}


# --- candidate generation -----------------------------------------------------------------------


def _priority_items(inv: ModelInventory) -> list[tuple[list[TensorInfo], int]]:
    """(tensors, layers gaining KV) in VRAM priority order."""
    n = inv.arch.n_layers
    by_layer = {i: inv.layer_tensors(i) for i in range(n)}
    items: list[tuple[list[TensorInfo], int]] = []
    for i in reversed(range(n)):
        items.append(([t for t in by_layer[i] if t.group in ("attn", "attn_norm")], 1))
    glob = [t for t in inv.tensors if t.group in ("ffn_router", "norm", "other")]
    items.append((glob, 0))
    items.append(([t for t in inv.tensors if t.group == "output"], 0))
    for i in reversed(range(n)):
        items.append(([t for t in by_layer[i] if t.group in ("ffn_dense", "ffn_shexp")], 0))
    for i in reversed(range(n)):
        for t in by_layer[i]:
            if t.group == "ffn_exps":
                items.append(([t], 0))
    return [it for it in items if it[0] or it[1]]


def _attn_first(
    inv: ModelInventory, prof: Profile, wl: Workload, budget: int, ubatch: int, copy: bool
) -> Plan:
    base = Plan(name="attn-first-copy" if copy else "attn-first-static", flash_attn="on",
                n_ubatch=ubatch, op_offload=copy, pinned_host=copy, gpu_layers=0)
    placed: list[str] = []
    layers = 0
    for tensors, kv_layers in _priority_items(inv):
        trial = base.model_copy(update={
            "gpu_tensors": tuple(placed + [t.name for t in tensors]),
            "gpu_layers": layers + kv_layers,
        })
        if vram_by_category(inv, trial, prof, wl, wl.compute_scale)["total"] > budget:
            break  # strict prefix: see the module docstring
        placed += [t.name for t in tensors]
        layers += kv_layers
    plan = base.model_copy(update={"gpu_tensors": tuple(placed), "gpu_layers": layers})
    if copy:
        plan = plan.model_copy(update={"copy_compute_min_batch": _copy_threshold(inv, plan, prof)})
    return plan


def _copy_threshold(inv: ModelInventory, plan: Plan, prof: Profile) -> int:
    """Smallest batch from which streaming CPU weights to the GPU beats computing them there."""
    static = plan.model_copy(update={"op_offload": False})
    for tokens in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048):
        on = ubatch_cost(inv, plan.model_copy(update={"copy_compute_min_batch": 1}), prof,
                         tokens, 0)
        off = ubatch_cost(inv, static, prof, tokens, 0)
        if on.total < off.total:
            return tokens
    return 4096


def _layer_offload(
    inv: ModelInventory, prof: Profile, wl: Workload, budget: int, *, tuned: bool
) -> Plan:
    """Largest n_gpu_layers that fits (paper baseline P0, or P1 with expert settings)."""
    n = inv.arch.n_layers
    base = Plan(
        name="layer-offload-tuned" if tuned else "layer-offload",
        flash_attn="on" if tuned else "off",
        n_ubatch=2048 if tuned else 512,
        pinned_host=tuned,
        op_offload=True,
        gpu_layers=0,
    )
    best = base
    for k in range(0, n + 2):  # n layers plus the output layer
        layers = set(range(n - min(k, n), n))
        names = [t.name for t in inv.tensors
                 if (t.layer is not None and t.layer in layers)
                 or (k > n and t.group in ("output", "norm"))]
        trial = base.model_copy(update={"gpu_tensors": tuple(names), "gpu_layers": k})
        if vram_by_category(inv, trial, prof, wl, wl.compute_scale)["total"] > budget:
            break
        best = trial
    return best


def _all_gpu(inv: ModelInventory, ubatch: int, *, output: bool) -> Plan:
    names = tuple(t.name for t in inv.tensors
                  if t.group != "token_embd" and (output or t.group != "output"))
    return Plan(name="all-gpu" if output else "all-gpu-no-output", gpu_tensors=names,
                flash_attn="on", n_ubatch=ubatch, pinned_host=True)


def minimum_budget(inv: ModelInventory, prof: Profile, wl: Workload) -> int:
    """The smallest budget any GPU plan fits: fixed share + smallest compute buffer + margin."""
    plan = Plan(name="min", flash_attn="on", n_ubatch=UBATCHES[0], op_offload=False,
                gpu_layers=0)
    return vram_by_category(inv, plan, prof, wl, wl.compute_scale)["total"]


# --- the planner ---------------------------------------------------------------------------------


def evaluate(inv: ModelInventory, plan: Plan, prof: Profile, wl: Workload,
             budget: int | None) -> Candidate:
    vram = vram_by_category(inv, plan, prof, wl, wl.compute_scale)
    ttft = ttft_seconds(inv, plan, prof, wl.prompt_tokens)
    tps = decode_tps(inv, plan, prof, wl.prompt_tokens + wl.gen_tokens // 2, wl.n_seqs)
    fits = budget is None or vram["total"] <= budget
    score = ttft + wl.gen_tokens * wl.n_seqs / tps
    return Candidate(plan, vram, ttft, tps, fits, score)


def plan_for(
    inv: ModelInventory,
    prof: Profile,
    budget: int | None,
    wl: Workload | None = None,
) -> PlanResult:
    """The fastest plan (predicted time for one turn) whose VRAM fits ``budget`` bytes.

    ``budget=None`` or a CPU-only profile gives the CPU plan. A budget below the smallest GPU
    plan raises :class:`BudgetTooSmallError` naming that minimum."""
    wl = wl or Workload()
    if prof.gpu is None or budget is None:
        cpu = Plan.all_cpu()
        cand = evaluate(inv, cpu, prof.model_copy(update={"gpu": None}), wl, None)
        return PlanResult(_finish(cpu, cand), [cand], budget, 0)
    minimum = minimum_budget(inv, prof, wl)
    if budget < minimum:
        raise BudgetTooSmallError(
            f"a VRAM budget of {budget / MIB:.0f} MiB is below the minimum of "
            f"{minimum / MIB:.0f} MiB for {inv.name} at n_ctx={wl.n_ctx} (CUDA context "
            f"{prof.gpu_fixed_bytes / MIB:.0f} MiB + compute buffers); raise the budget or run "
            f"on the CPU only", minimum)
    plans: list[Plan] = []
    for ub in UBATCHES:
        plans += [_all_gpu(inv, ub, output=True), _all_gpu(inv, ub, output=False)]
        plans += [_attn_first(inv, prof, wl, budget, ub, copy=c) for c in (False, True)]
    plans += [_layer_offload(inv, prof, wl, budget, tuned=t) for t in (False, True)]
    cands = [evaluate(inv, p, prof, wl, budget) for p in plans]
    fitting = [c for c in cands if c.fits]
    # ties (e.g. two identical fills) go to the plan that leaves the game more VRAM
    best = min(fitting, key=lambda c: (round(c.score, 6), c.vram["total"]))
    return PlanResult(_finish(best.plan, best), cands, budget, minimum)


def _finish(plan: Plan, c: Candidate) -> Plan:
    return plan.model_copy(update={
        "predicted": {"ttft_s": c.ttft_s, "decode_tps": c.decode_tps, "turn_s": c.score},
        "vram_bytes": c.vram,
    })
