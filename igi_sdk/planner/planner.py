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
  that fits, as a floor the planner must never fall below;
* ``output-first-copy`` (``Workload.output_first``, off by default: measured slower) —
  ``attn-first-copy`` with the output head (and global norms) before any attention: at small
  budgets the output head is the largest CPU-resident weight, read by the CPU at every token and
  staged whole in the copy-compute buffer;
* with ``Workload.kv_quant`` (off by default), each flash-attention strategy again with a q8_0
  KV cache (``...+kv-q8_0``): half the KV bytes, so more weights fit; only with every layer's
  KV in VRAM, and chosen only for a clearly shorter turn (``choose``).
The filling is a strict prefix of the priority list (no skipping), so a larger budget places a
superset of tensors and the predicted speed never drops as the budget grows.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field

from igi_sdk.errors import BudgetTooSmallError
from igi_sdk.model import ModelInventory, TensorInfo
from igi_sdk.planner.cost import (
    block_ops,
    decode_tps,
    kv_gpu_layers,
    layer_attention_seconds,
    overhead_seconds,
    priced_tensors,
    quantized_kv,
    tensor_seconds,
    ttft_seconds,
    uses_copy_compute,
)
from igi_sdk.planner.plan import Plan
from igi_sdk.profile import Profile

MIB = 1024 * 1024
UBATCHES = (512, 1024, 2048)
# The quantized KV cache the planner may choose (llama.cpp needs flash attention for a quantized
# V cache), and the least predicted gain per turn for which it does: q8_0 KV is not lossless
# (docs/planner.md, "KV cache quantization"), so it must make the turn at least this much
# faster than the best f16-KV plan (``choose``).
KV_QUANT = "q8_0"
KV_QUANT_MIN_GAIN = 0.02
# llama.cpp's small buffers, the CUDA pool for temporaries, fragmentation. On an H100 (n_ubatch
# 512, dry-run-measured compute buffers) a dense 8B Q4_0 plan peaked 120 MB below a 128 MiB
# margin at 2 and 4 GB, while a 30B-A3B MoE plan went 22 MB over a 64 MiB one (the routed
# experts' matmuls take more from the CUDA pool): 64 MiB for dense models, 128 MiB with experts
_MARGIN_BYTES = 64 * MIB
_MARGIN_BYTES_MOE = 128 * MIB
_MARGIN_FRACTION = 0.05


def _margin(inv: ModelInventory, compute: int) -> int:
    fixed = _MARGIN_BYTES_MOE if inv.arch.is_moe else _MARGIN_BYTES
    return fixed + int(_MARGIN_FRACTION * compute)


def typical_prompt(n_ctx: int) -> int:
    """Prompt tokens of a typical NPC turn in a context of ``n_ctx``: a quarter of it, from 64
    to 1024 (a chat line with its history; the one rule every plan for a budget uses)."""
    return max(64, min(1024, n_ctx // 4))


def planned_talkers(talking: int, outputs: int | None) -> int:
    """Sessions a plan's decode steps carry: the NPCs expected to talk together, no more than
    the logits rows a step has (``outputs``; None: as many as talk)."""
    return max(1, min(talking, outputs or talking))


@dataclass(frozen=True)
class Workload:
    """What the plan is optimised for: a typical NPC turn.

    ``compute_scale`` corrects the compute-buffer estimate after a dry-run load measured it."""

    n_ctx: int = 4096
    n_seqs: int = 1
    prompt_tokens: int = 1024
    gen_tokens: int = 128
    compute_scale: float = 1.0
    # False: CPU-resident weights stay memory-mapped instead of being copied into pinned memory.
    # Copy-compute then streams at pageable speed, but a reload (a reshard) costs far less:
    # pinning 4 GB of host memory took 3-4 s per reload on the H200 host, mapping it nothing.
    pin_host: bool = True
    # The copy-compute threshold the process runs with, where it is already fixed (llama.cpp
    # reads it once, when its backend starts): every plan that offloads ops uses and is priced
    # with it. None: the planner chooses (``copy_threshold``).
    copy_min_batch: int | None = None
    # Whether the planner may store the KV cache as q8_0 (K and V; flash attention on) where
    # the VRAM it frees buys weights on the GPU (``KV_QUANT_MIN_GAIN``). Off by default: on
    # H100s it decoded +1%, +30% and -0.3% at 4 GB but 10.6 tok/s against 14.3 at 2 GB (one
    # run each, docs/planner.md), so the lossy cache is not yet a reliable gain.
    kv_quant: bool = False
    # Whether the planner also tries the output head before attention (``output-first-copy``):
    # off by default, since on an H100 at 2 GB it decoded 6.6 tok/s against attn-first's 9.2,
    # one run each (predicted 12.9 vs 11.9; docs/planner.md, "Output head first").
    output_first: bool = False
    # Logits rows one decode step asks for (the runtime's n_outputs_max): one per session, more
    # where a draft's tokens are verified. None: n_seqs.
    n_outputs: int | None = None
    # Drafted tokens a session's verify step carries (speculative decoding: a draft model or
    # n-gram proposals), so its batch is draft_k + 1 tokens; 0: none.
    draft_k: int = 0
    # Only plans with flash attention on (every V cache in one, untransposed layout). A context
    # state is read back only into a cache of the same V layout, so the arbiter's ladder, whose
    # reshards carry the KV bytes between rungs, plans with it (a flash-attention-off rung
    # would lose every conversation's cache at the move).
    flash_attn_only: bool = False
    # Whether the process's llama.cpp pipelines a decode (its scheduler streams named host
    # weights at every batch, their copies beside the CPU's work: runtime._native.
    # streams_weights()): the planner then also offers ``attn-first-pipelined`` plans, with
    # pinned host weights only.
    pipelined: bool = False

    def __post_init__(self) -> None:
        if self.n_ctx < 64 or self.n_seqs < 1 or self.prompt_tokens < 1 or self.gen_tokens < 1:
            raise ValueError(f"invalid workload {self}")
        if self.n_outputs is not None and self.n_outputs < 1:
            raise ValueError(f"invalid workload {self}: n_outputs must be at least 1")
        if self.copy_min_batch is not None and self.copy_min_batch < 1:
            raise ValueError(f"invalid workload {self}: copy_min_batch must be at least 1")
        if self.draft_k < 0:
            raise ValueError(f"invalid workload {self}: draft_k must not be negative")

    @property
    def outputs(self) -> int:
        """Logits rows of one decode step."""
        return max(self.n_outputs or 0, self.n_seqs)

    @property
    def threshold_floor(self) -> int:
        """The least copy-compute threshold the planner asks for (``copy_threshold``'s
        ``at_least``): one more than a decode step's logits rows, so that the rare step of that
        many sessions never has llama.cpp stage a CPU-resident output head in VRAM; but no more
        than one session's verify batch where a draft is verified, a step that is not rare: a
        5-token verify of an 8B at 4 GB on an H200 took 39.5 ms streamed against 51.6 ms for a
        2-token one computed on the CPU (docs/benchmarks.md), and the cost model prices the
        streamed one cheaper too. (A staged head's VRAM is counted in the plan either way.)"""
        floor = self.outputs + 1
        return min(floor, self.draft_k + 1) if self.draft_k else floor


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

        def label(c: Candidate) -> str:
            copy = (f", copy-compute from {c.plan.copy_compute_min_batch}"
                    if c.plan.op_offload and a.plan.copy_compute_min_batch
                    != b.plan.copy_compute_min_batch else "")
            return f"'{c.plan.name}' (n_ubatch {c.plan.n_ubatch}{copy})"

        return (f"{label(a)} predicts {a.score:.2f} s per turn "
                f"(TTFT {a.ttft_s:.2f} s, {a.decode_tps:.1f} tok/s) vs {b.score:.2f} s for the "
                f"runner-up {label(b)}")


# --- VRAM accounting ------------------------------------------------------------------------------


def compute_buffer_estimate(inv: ModelInventory, plan: Plan, wl: Workload) -> int:
    """llama.cpp's GPU compute buffer for a plan (checked against a dry-run load at run time).

    Activations of one ubatch, the logits rows when the output head runs on the GPU, and with
    copy-compute a staging copy of the largest CPU-resident weight that is offloaded. The output
    head's matmul has ``wl.outputs`` rows (the runtime sets llama.cpp's n_outputs_max to that),
    so a CPU-resident head is offloaded, and staged, only when that many rows reach the
    copy-compute threshold."""
    gpu = plan.gpu_set
    head = [t for t in inv.tensors if t.group == "output"]
    head_on_gpu = bool(head) and all(t.name in gpu for t in head)
    offloaded = _head_offloaded(plan, wl, head_on_gpu)
    staging = max((t.n_bytes for t in inv.tensors if t.name not in gpu and _staged(t, offloaded)),
                  default=0) if plan.op_offload else 0
    return (_activation_bytes(inv, plan, wl) + _logits_bytes(inv, plan, wl, head_on_gpu)
            + staging + streamed_run_bytes(inv, plan))


def streamed_run_bytes(inv: ModelInventory, plan: Plan) -> int:
    """The most bytes of ``decode_streamed`` weights one GPU split holds at once: the weights of
    consecutive streamed layers share a split and are all copied before it starts."""
    by_layer: dict[int, int] = {}
    streamed = plan.streamed_set
    for t in inv.tensors:
        if t.name in streamed and t.layer is not None:
            by_layer[t.layer] = by_layer.get(t.layer, 0) + t.n_bytes
    best = run = 0
    for layer in range(inv.arch.n_layers):
        run = run + by_layer[layer] if layer in by_layer else 0
        best = max(best, run)
    return best


def _activation_bytes(inv: ModelInventory, plan: Plan, wl: Workload) -> int:
    """One ubatch's activations (~12 rows of n_embd and 3 of the FFN width, f32), and the
    attention score matrix when flash attention is off."""
    a = inv.arch
    ffw = max(a.n_ff, a.expert_ff * max(1, a.n_expert_used), a.shared_expert_ff)
    act = plan.n_ubatch * (12 * a.n_embd + 3 * ffw) * 4
    if plan.flash_attn == "off":
        act += a.n_head * plan.n_ubatch * wl.n_ctx * 4
    return act


def _head_offloaded(plan: Plan, wl: Workload, head_on_gpu: bool) -> bool:
    """Whether a CPU-resident output head is streamed to the GPU for the reserved graph."""
    rows = min(plan.n_ubatch, wl.outputs)
    return plan.op_offload and not head_on_gpu and rows >= plan.copy_compute_min_batch


def _logits_bytes(inv: ModelInventory, plan: Plan, wl: Workload, head_on_gpu: bool) -> int:
    if head_on_gpu or _head_offloaded(plan, wl, head_on_gpu):
        return min(plan.n_ubatch, wl.outputs) * inv.arch.n_vocab * 4
    return 0


def _staged(t: TensorInfo, head_offloaded: bool) -> bool:
    """Whether a CPU-resident weight can be streamed (the token embedding is read by row)."""
    return t.group != "token_embd" and (t.group != "output" or head_offloaded)


def vram_by_category(
    inv: ModelInventory, plan: Plan, prof: Profile, wl: Workload,
    compute_scale: float = 1.0,
) -> dict[str, int]:
    if prof.gpu is None:
        return {"fixed": 0, "weights": 0, "kv": 0, "compute": 0, "margin": 0, "total": 0}
    gpu = plan.gpu_set
    weights = sum(t.n_bytes for t in inv.tensors if t.name in gpu)
    layers = kv_gpu_layers(inv, plan, True)
    kv_all = inv.kv_bytes(wl.n_ctx, plan.type_k, plan.type_v, swa_full=True)
    kv = kv_all * len(layers) // max(1, inv.arch.n_layers)
    compute = int(compute_buffer_estimate(inv, plan, wl) * compute_scale)
    margin = _margin(inv, compute)
    fixed = prof.gpu_fixed_bytes
    total = fixed + weights + kv + compute + margin
    return {"fixed": fixed, "weights": weights, "kv": kv, "compute": compute, "margin": margin,
            "total": total}


# --- candidate generation -----------------------------------------------------------------------


Item = tuple[list[TensorInfo], int]  # (tensors moved to VRAM together, layers whose KV follows)


def _attention_first_items(inv: ModelInventory, *, output_first: bool = False) -> list[Item]:
    """VRAM priority: attention + norms + KV layer by layer (from the last layer, the way
    llama.cpp assigns KV), router + global norms, output head, dense FFN / shared experts layer by
    layer, then routed experts tensor by tensor. ``output_first``: the output head (and the
    global norms) before any attention: at a small budget it is the largest CPU-resident
    weight, which a copy-compute plan also stages in its compute buffer, so moving it costs
    little more VRAM than that buffer saves, and takes its bytes off the CPU at every token."""
    n = inv.arch.n_layers
    by_layer = {i: inv.layer_tensors(i) for i in range(n)}
    items: list[Item] = []
    head = [([t for t in inv.tensors if t.group in ("ffn_router", "norm", "other")], 0),
            ([t for t in inv.tensors if t.group == "output"], 0)]
    if output_first:
        items += head[::-1]
    for i in reversed(range(n)):
        items.append(([t for t in by_layer[i] if t.group in ("attn", "attn_norm")], 1))
    if not output_first:
        items += head
    for i in reversed(range(n)):
        items.append(([t for t in by_layer[i] if t.group in ("ffn_dense", "ffn_shexp")], 0))
    for i in reversed(range(n)):
        items += [([t], 0) for t in by_layer[i] if t.group == "ffn_exps"]
    return [it for it in items if it[0]]


def _layer_items(inv: ModelInventory) -> list[Item]:
    """llama.cpp's n_gpu_layers order: whole layers from the last, then the output layer."""
    n = inv.arch.n_layers
    items: list[Item] = [(inv.layer_tensors(i), 1) for i in reversed(range(n))]
    items.append(([t for t in inv.tensors if t.group in ("output", "norm", "other")], 0))
    return items


@dataclass(frozen=True)
class _Step:
    tokens: int
    ctx_pos: int
    out_tokens: int
    n_seqs: int
    weight: float  # how many times the step counts in one turn


def _schedule(wl: Workload, ubatch: int) -> list[_Step]:
    steps, done = [], 0
    while done < wl.prompt_tokens:
        n = min(ubatch, wl.prompt_tokens - done)
        steps.append(_Step(n, done, 1 if done + n >= wl.prompt_tokens else 0, 1, 1.0))
        done += n
    ctx = wl.prompt_tokens + wl.gen_tokens // 2
    steps.append(_Step(wl.n_seqs, ctx, wl.n_seqs, wl.n_seqs, float(wl.gen_tokens)))
    return steps


def _best_prefix(
    inv: ModelInventory, prof: Profile, wl: Workload, budget: int, base: Plan, items: list[Item],
    *, longest: bool = False,
) -> Plan:
    """The best-scoring prefix of ``items`` that fits the budget.

    Every prefix is considered (not only the longest): a layer whose attention is on the GPU
    and FFN on the CPU pays two hand-overs, so more VRAM is not always faster, and considering
    every prefix keeps the result monotone in the budget. Costs are additive per tensor and per
    layer, so each prefix is priced from running sums, not by re-running the cost model."""
    if prof.gpu is None:
        return base
    schedule = _schedule(wl, base.n_ubatch)
    copy = [uses_copy_compute(base, prof, st.tokens) for st in schedule]

    def tensor_cost(t: TensorInfo, st: _Step, cp: bool, on_gpu: bool) -> float:
        n_tok = st.out_tokens if t.group == "output" else st.tokens
        g, c, x = tensor_seconds(t, inv, prof, n_tok, on_gpu=on_gpu, copy_compute=cp,
                                 pinned=base.pinned_host)
        return (g + c + x) * st.weight

    def attn_cost(layer: int, st: _Step, cp: bool, on_gpu: bool) -> float:
        return layer_attention_seconds(inv, base, prof, layer, st.tokens, st.ctx_pos, st.n_seqs,
                                       on_gpu=on_gpu, copy_compute=cp) * st.weight

    n = inv.arch.n_layers
    score = sum(tensor_cost(t, st, cp, False) for t in priced_tensors(inv)
                for st, cp in zip(schedule, copy, strict=True))
    score += sum(attn_cost(layer, st, cp, False) for layer in range(n)
                 for st, cp in zip(schedule, copy, strict=True))
    split_weight = sum(st.weight for st, cp in zip(schedule, copy, strict=True) if not cp)
    # per-layer placement flags for counting hand-overs (majority of the block's tensors)
    attn_n = {i: 0 for i in range(n)}
    ffn_n = {i: 0 for i in range(n)}
    attn_tot = {i: sum(1 for t in inv.layer_tensors(i) if t.group == "attn") for i in range(n)}
    ffn_tot = {i: sum(1 for t in inv.layer_tensors(i) if t.group.startswith("ffn"))
               for i in range(n)}

    def blocks() -> list[bool]:
        seq: list[bool] = []
        for i in range(n):
            if attn_tot[i]:
                seq.append(attn_n[i] * 2 >= attn_tot[i])
            if ffn_tot[i]:
                seq.append(ffn_n[i] * 2 >= ffn_tot[i])
        return seq

    ops = block_ops(inv)

    def fixed_costs() -> float:
        """Hand-overs and per-block/per-step overheads of the current prefix, over the turn."""
        seq = blocks()
        splits = sum(1 for x, y in itertools.pairwise(seq) if x != y)
        over = sum(overhead_seconds(prof, seq, cp, ops) * st.weight
                   for st, cp in zip(schedule, copy, strict=True))
        return splits * prof.split_latency_s * split_weight + over

    # VRAM of each prefix (compute_buffer_estimate's terms from running sums): weights and KV
    # grow, the copy-compute staging buffer is the largest weight still on the CPU (a suffix
    # maximum), the logits rows appear once the output head is in VRAM
    offloaded = _head_offloaded(base, wl, False)
    staging_suffix = [0] * (len(items) + 1)
    for k in range(len(items) - 1, -1, -1):
        staging_suffix[k] = max(staging_suffix[k + 1],
                                max((t.n_bytes for t in items[k][0] if _staged(t, offloaded)),
                                    default=0))
    head_in = next((k for k, (tensors, _) in enumerate(items, start=1)
                    if any(t.group == "output" for t in tensors)), None)
    act = _activation_bytes(inv, base, wl)
    kv_layer = inv.kv_bytes(wl.n_ctx, base.type_k, base.type_v, swa_full=True) // max(1, n)

    def vram(weights: int, kv_layers: int, k: int) -> int:
        staging = staging_suffix[k] if base.op_offload else 0
        logits = _logits_bytes(inv, base, wl, head_in is not None and k >= head_in)
        compute = int((act + logits + staging) * wl.compute_scale)
        margin = _margin(inv, compute)
        return prof.gpu_fixed_bytes + weights + kv_layers * kv_layer + compute + margin

    weights = kv_layers = 0
    # a quantized KV cache only where every layer's KV is in VRAM: with q8_0 KV on CPU layers
    # an H100 plan decoded 5.6 tok/s where 12.5 was predicted (docs/planner.md)
    whole_kv = quantized_kv(base)
    best_k, best_score = 0, float("inf") if whole_kv else score + fixed_costs()
    if vram(0, 0, 0) > budget:
        return base
    for k, (tensors, kv_add) in enumerate(items, start=1):
        w = weights + sum(t.n_bytes for t in tensors)
        if vram(w, kv_layers + kv_add, k) > budget:
            break
        weights = w
        for t in tensors:
            score += sum(tensor_cost(t, st, cp, True) - tensor_cost(t, st, cp, False)
                         for st, cp in zip(schedule, copy, strict=True))
            if t.layer is not None and t.group == "attn":
                attn_n[t.layer] += 1
            elif t.layer is not None and t.group.startswith("ffn"):
                ffn_n[t.layer] += 1
        if kv_add:
            layer = n - 1 - kv_layers
            score += sum(attn_cost(layer, st, cp, True) - attn_cost(layer, st, cp, False)
                         for st, cp in zip(schedule, copy, strict=True))
            kv_layers += kv_add
        total = score + fixed_costs()
        if whole_kv and kv_layers < n:
            continue
        if longest or total < best_score - 1e-12:
            best_k, best_score = k, total
    chosen = [t.name for tensors, _ in items[:best_k] for t in tensors]
    layers = sum(kv for _, kv in items[:best_k])
    return base.model_copy(update={"gpu_tensors": tuple(chosen), "gpu_layers": layers})


def _with_kv(plan: Plan, kv: str) -> Plan:
    """``plan`` with its K and V cache stored as ``kv`` (named ``...+kv-q8_0`` unless f16)."""
    if kv == "f16":
        return plan
    return plan.model_copy(update={"type_k": kv, "type_v": kv, "flash_attn": "on",
                                   "name": f"{plan.name}+kv-{kv}"})


def _attn_first(
    inv: ModelInventory, prof: Profile, wl: Workload, budget: int, ubatch: int, copy: bool,
    kv: str = "f16", *, output_first: bool = False, ffn: bool = True,
) -> Plan:
    pinned = copy and wl.pin_host
    base = Plan(name="attn-first-copy" if copy else "attn-first-static", flash_attn="on",
                n_ubatch=ubatch, op_offload=copy, pinned_host=pinned, gpu_layers=0)
    base = _with_kv(base, kv)
    if copy:
        threshold = wl.copy_min_batch or copy_threshold(inv, prof, pinned, wl.threshold_floor)
        base = base.model_copy(update={"copy_compute_min_batch": threshold})
    if output_first:
        base = base.model_copy(update={"name": base.name.replace("attn-first", "output-first")})
    items = _attention_first_items(inv, output_first=output_first)
    if not ffn:  # attention, norms, router and output head only
        items = [it for it in items if not any(t.group.startswith("ffn_") and
                                               t.group != "ffn_router" for t in it[0])]
    return _best_prefix(inv, prof, wl, budget, base, items)


# Which dense FFN layers a pipelined plan streams: layer i where i % stride is in residues.
# Every second layer overlaps each streamed layer's copy with one CPU layer's work (the best
# pattern on an H200 host, where the CPU reads its weights about as fast as PCIe streams them);
# the others suit a CPU faster or slower than the copy.
PIPELINE_PATTERNS: tuple[tuple[int, tuple[int, ...]], ...] = ((2, (1,)), (3, (2,)), (3, (1, 2)))


def _pipelined(inv: ModelInventory, prof: Profile, wl: Workload, budget: int,
               ubatch: int) -> list[Plan]:
    """``attn-first-pipelined`` plans: attn-first-copy placements (searched with the VRAM a
    streamed split needs set aside) whose CPU-resident dense FFN layers of each pattern
    stream at decode (``Plan.decode_streamed``)."""
    ffn = {i: [t for t in inv.layer_tensors(i) if t.group in ("ffn_dense", "ffn_shexp")]
           for i in range(inv.arch.n_layers)}
    plans: list[Plan] = []
    for stride, residues in PIPELINE_PATTERNS:
        layers = [i for i in ffn if ffn[i] and i % stride in residues]
        wanted = Plan(name="probe", op_offload=True, pinned_host=True, decode_streamed=tuple(
            t.name for i in layers for t in ffn[i]))
        # (the streamed split's weights are compute buffer: scaled and margined as it is)
        room = budget - int(streamed_run_bytes(inv, wanted) * wl.compute_scale
                            * (1 + _MARGIN_FRACTION)) - 1
        # the prefix search prices a decode without the overlap, so an FFN layer it moves to
        # VRAM can break a streamed pair: the placement with no FFN in VRAM is offered too
        # (once it all fits, the same at every larger budget: more VRAM is never slower)
        for base in (_attn_first(inv, prof, wl, room, ubatch, copy=True),
                     _attn_first(inv, prof, wl, room, ubatch, copy=True, ffn=False)):
            if not base.pinned_host:
                continue
            gpu = base.gpu_set
            names = tuple(t.name for i in layers if not any(t.name in gpu for t in ffn[i])
                          for t in ffn[i])
            plan = base.model_copy(update={"name": "attn-first-pipelined",
                                           "decode_streamed": names})
            if names and plan not in plans:  # (both searches may place the same)
                plans.append(plan)
    return plans


def _fixed_threshold(plan: Plan, wl: Workload) -> Plan:
    """``plan`` with the process's fixed copy-compute threshold, if the workload has one: set
    before pricing, so that the plan is priced as llama.cpp will run it."""
    if wl.copy_min_batch is None or not plan.op_offload:
        return plan
    return plan.model_copy(update={"copy_compute_min_batch": wl.copy_min_batch})


def copy_threshold(inv: ModelInventory, prof: Profile, pinned: bool = True,
                   at_least: int = 1) -> int:
    """Smallest batch from which streaming CPU-resident weights to the GPU beats computing them
    on the CPU (the token tier split), and at least ``at_least``. Judged on the whole model, so
    it does not depend on the budget.

    Callers pass one more than the logits rows of a decode step (``Workload.outputs``): below
    that, a CPU-resident output head is never offloaded, so llama.cpp reserves no staging copy
    of it (for an 8B model with a 128K vocabulary, 290 MiB of VRAM held for the rare step that
    decodes that many sessions at once) and those steps read it on the CPU, which for a few
    rows costs about what streaming it would."""
    tiers = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048)
    for tokens in sorted({max(2, at_least), *(t for t in tiers if t > at_least)}):
        streamed = computed = 0.0
        for t in inv.tensors:
            g, _, x = tensor_seconds(t, inv, prof, tokens, on_gpu=False, copy_compute=True,
                                     pinned=pinned)
            streamed += g + x
            computed += tensor_seconds(t, inv, prof, tokens, on_gpu=False, copy_compute=False,
                                       pinned=pinned)[1]
        if streamed < computed:
            return tokens
    return max(4096, at_least)


def _layer_offload(
    inv: ModelInventory, prof: Profile, wl: Workload, budget: int, *, tuned: bool,
    kv: str = "f16",
) -> Plan:
    """Whole layers from the last (llama.cpp's n_gpu_layers): the paper's baseline P0, or P1
    with what an expert sets by hand (flash attention, n_ubatch 2048, pinned host weights)."""
    base = Plan(
        name="layer-offload-tuned" if tuned else "layer-offload",
        flash_attn="on" if tuned else "off",
        n_ubatch=2048 if tuned else 512,
        pinned_host=tuned and wl.pin_host,
        op_offload=True,
        gpu_layers=0,
    )
    base = _fixed_threshold(_with_kv(base, kv), wl)
    return _best_prefix(inv, prof, wl, budget, base, _layer_items(inv))


PEERS = ("P0", "P1", "P2")


def peer_plan(inv: ModelInventory, prof: Profile, wl: Workload, budget: int, peer: str) -> Plan:
    """What a llama.cpp user gets without this planner, for benchmarks, filling the budget:

    * P0 — the paper's baseline: the largest ``n_gpu_layers`` that fits, flash attention off,
      n_ubatch 512, mmap;
    * P1 — the same layers with flash attention, n_ubatch 2048 and pinned host weights;
    * P2 — llama.cpp's ``--fit`` / ``--n-cpu-moe`` placement: every dense weight (attention,
      norms, router, output, dense FFN, shared experts) first, routed experts overflow to the
      CPU from the first layer on; llama.cpp's default settings (flash attention auto,
      n_ubatch 512, mmap)."""
    if peer in ("P0", "P1"):
        tuned = peer == "P1"
        base = Plan(name=peer, flash_attn="on" if tuned else "off",
                    n_ubatch=2048 if tuned else 512, pinned_host=tuned, gpu_layers=0)
        base = _fixed_threshold(base, wl)
        return _best_prefix(inv, prof, wl, budget, base, _layer_items(inv), longest=True)
    if peer == "P2":
        base = Plan(name=peer, flash_attn="auto", n_ubatch=512, pinned_host=False, gpu_layers=0)
        base = _fixed_threshold(base, wl)
        return _best_prefix(inv, prof, wl, budget, base, _attention_first_items(inv),
                            longest=True)
    raise ValueError(f"unknown peer {peer}; expected one of {PEERS}")


def _all_gpu(inv: ModelInventory, ubatch: int, *, output: bool) -> Plan:
    names = tuple(t.name for t in inv.tensors
                  if t.group != "token_embd" and (output or t.group != "output"))
    # with the output head on the GPU nothing streams from the host (llama.cpp reads the token
    # embedding's rows on the CPU), so pinning it would only cost: ~0.2 s per load and ~30 ms
    # per close of an 8B on an H200 host (benchmarks/release_cost.py), the close being what a
    # game's reserve_vram waits for
    return Plan(name="all-gpu" if output else "all-gpu-no-output", gpu_tensors=names,
                flash_attn="on", n_ubatch=ubatch, pinned_host=not output)


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
    plan raises :class:`BudgetTooSmallError` naming that minimum.

    Where the workload has sessions talking together and the process's copy-compute threshold
    is not fixed yet, the plans are searched with two thresholds: one more than a step's logits
    rows (no staging copy of a CPU-resident output head) and the lower one from which their
    decode batch streams its CPU-resident weights (:func:`batch_threshold`)."""
    wl = wl or Workload()
    batch = batch_threshold(inv, prof, wl) if budget is not None else None
    if batch is None:
        return _plan_at(inv, prof, budget, wl)
    one = _plan_at(inv, prof, budget, wl)
    try:
        streamed = _plan_at(inv, prof, budget, dataclasses.replace(wl, copy_min_batch=batch))
    except BudgetTooSmallError:  # its staging copy does not fit
        return one
    # a plan the threshold does not change (nothing offloaded, nothing left on the CPU) once
    def same(c: Candidate) -> tuple[str, int, float, int]:
        return c.plan.name, c.plan.n_ubatch, round(c.score, 9), c.vram["total"]

    seen = {same(c) for c in one.candidates}
    cands = one.candidates + [c for c in streamed.candidates if same(c) not in seen]
    best = choose(cands)
    return PlanResult(_finish(best.plan, best), cands, budget, one.minimum_bytes)


def batch_threshold(inv: ModelInventory, prof: Profile, wl: Workload) -> int | None:
    """A copy-compute threshold low enough that a decode step of ``wl.n_seqs`` sessions talking
    together streams the CPU-resident weights to the GPU, where streaming them beats computing
    them on the CPU at that batch; None where one session talks, the threshold is fixed
    already, there is no GPU, or streaming does not pay at that batch."""
    if wl.n_seqs < 2 or wl.copy_min_batch is not None or prof.gpu is None:
        return None
    low = copy_threshold(inv, prof, wl.pin_host, 1)
    return low if low <= wl.n_seqs else None


def _plan_at(
    inv: ModelInventory, prof: Profile, budget: int | None, wl: Workload,
) -> PlanResult:
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
        plans += [_fixed_threshold(_all_gpu(inv, ub, output=o), wl) for o in (True, False)]
        plans += [_attn_first(inv, prof, wl, budget, ub, copy=c) for c in (False, True)]
        if wl.pipelined and wl.pin_host:
            plans += _pipelined(inv, prof, wl, budget, ub)
    plans += [_layer_offload(inv, prof, wl, budget, tuned=t)
              for t in ((True,) if wl.flash_attn_only else (False, True))]
    if wl.kv_quant:  # the same searches with a q8_0 KV cache (flash attention on)
        for ub in UBATCHES:
            plans += [_fixed_threshold(_with_kv(_all_gpu(inv, ub, output=o), KV_QUANT), wl)
                      for o in (True, False)]
            plans += [_attn_first(inv, prof, wl, budget, ub, copy=c, kv=KV_QUANT)
                      for c in (False, True)]
        plans.append(_layer_offload(inv, prof, wl, budget, tuned=True, kv=KV_QUANT))
    if wl.output_first:  # the output head before attention (copy-compute plans); last, so
        # that where it places the same tensors as attn-first, attn-first's name is kept
        for kv in ("f16", KV_QUANT) if wl.kv_quant else ("f16",):
            plans += [_attn_first(inv, prof, wl, budget, ub, copy=True, kv=kv,
                                  output_first=True) for ub in UBATCHES]
    n = inv.arch.n_layers  # quantized KV only with every layer's KV in VRAM (_best_prefix)
    plans = [p for p in plans
             if not quantized_kv(p) or len(kv_gpu_layers(inv, p, True)) == n]
    cands = [evaluate(inv, p, prof, wl, budget) for p in plans]
    best = choose(cands)
    return PlanResult(_finish(best.plan, best), cands, budget, minimum)


def choose(cands: list[Candidate]) -> Candidate:
    """The fitting candidate with the shortest predicted turn, a quantized-KV candidate's turn
    counted ``KV_QUANT_MIN_GAIN`` longer (the KV cache's precision is not traded for noise: in
    practice q8_0 wins where the VRAM it frees puts weights on the GPU); ties (e.g. two
    identical fills) go to the plan that leaves the game more VRAM. So more budget never makes
    the predicted turn longer by more than ``KV_QUANT_MIN_GAIN`` (where f16 KV comes back)."""
    def key(c: Candidate) -> tuple[float, int]:
        penalty = 1 + KV_QUANT_MIN_GAIN if quantized_kv(c.plan) else 1.0
        return (round(c.score * penalty, 6), c.vram["total"])

    return min((c for c in cands if c.fits), key=key)


def _finish(plan: Plan, c: Candidate) -> Plan:
    return plan.model_copy(update={
        "predicted": {"ttft_s": c.ttft_s, "decode_tps": c.decode_tps, "turn_s": c.score},
        "vram_bytes": c.vram,
    })
