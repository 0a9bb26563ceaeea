"""Cost model: predicted time of one ubatch for a plan, hence TTFT and decode speed.

Per tensor, from the machine profile:
* a GPU-resident weight costs ``bytes / gpu_rate(type, tokens)``;
* a CPU-resident weight costs ``bytes / cpu_rate(type, tokens)`` — unless the batch is at least
  the copy-compute threshold, in which case llama.cpp streams it to the GPU and computes it there:
  ``bytes / stream rate + bytes / gpu_rate``. Stock llama.cpp issues the copy and the matmul on
  one CUDA stream, so the two add up rather than overlap; the stream rate is measured on a real
  prefill (``Profile.stream_bps``), since it falls short of a single large copy's;
* routed experts only cost the experts the batch's tokens actually pick (expected fraction),
  on the CPU at the profile's measured expert rate (``DeviceProfile.expert_scale``: small
  experts read slower than the one large weight the rates were timed on); on the GPU at the
  dense rate plus a fixed cost per expert matmul, the time the GPU's measured one-token share
  adds to one token's experts (launches and small matrices, which a batch does not multiply);
* attention over the KV cache costs ``max(FLOPs / device FLOP/s, KV bytes / device bandwidth)`` on
  the device that holds that layer's KV (KV bytes at the plan's ``type_k``/``type_v``: a q8_0
  cache is 34/64 of an f16 one; a batch on the GPU first converts a quantized cache to f16) —
  except that a batch under copy-compute runs the attention of a CPU-KV layer on the GPU too:
  the scheduler extends the GPU assignment of the offloaded projections to the attention op
  and copies the layer's used KV cells over PCIe
  (the KV buffer is ordinary, pageable host memory);
* every hand-over between CPU and GPU inside the graph costs a fixed latency;
* every layer block (attention, FFN) on the GPU costs half the measured per-layer overhead
  (kernel launches), and every ubatch one per-step overhead. On the CPU the overhead is the
  thread pool's barrier after every op (an OpenMP barrier, timed under the wait the profiling
  process had: the SDK's default spin, or a sleep and a wake-up under ``PASSIVE``): the
  measured per-layer overhead is spread over the ops of the probe's layer
  (``PROBE_LAYER_OPS``) and charged per op, so an FFN block (7 ops) costs less than an
  attention block (12). The profile's CPU matmul rates were
  timed with one such barrier per weight (a 4096×4096 weight per op), so the per-op cost is
  taken out of them (``cpu_weight_rate``) rather than counted twice: for a small weight it is
  a seventh of the time, for a real FFN weight (4096×14336) a twentieth.
The ops run one after another (llama.cpp's scheduler does not overlap CPU and GPU splits), so
the ubatch time is the sum, with one exception: a pipelined plan's ``decode_streamed`` weights
(a scheduler patched with igi_sdk/bundle/patches/ggml-stream-prefetch.patch) are computed on the
GPU at every batch, streamed like copy-compute, and their copy starts when the CPU split before
them starts: the copy and that split's CPU work overlap, the CPU reading its weights
``Profile.stream_cpu_slowdown`` slower meanwhile (``pipelined_overlap_seconds``).
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from igi_sdk.model import ArchInfo, ModelInventory, TensorInfo
from igi_sdk.planner.plan import Plan
from igi_sdk.profile import DeviceProfile, Profile

_SKIP_GROUPS = frozenset({"token_embd"})  # a row lookup, not a matmul

# Ops the CPU backend runs (each followed by a thread-pool barrier; views and reshapes are
# skipped) in one Llama layer at decode with flash attention: attention block = norm, scale,
# Q/K/V, two ropes, two KV stores, flash attention, output projection, residual add; dense FFN
# block = norm, scale, gate, up, SwiGLU, down, residual add. A Q or K norm (Qwen3) adds its
# norm and scale. A routed-expert block adds the router, its softmax and top-k, the weights'
# gather and their product with the experts' outputs, then one add per picked expert after the
# first (llama.cpp sums the picked experts' outputs pairwise), and where the graph renormalises
# the picked weights (llama.cpp's ``norm_w``) their sum, clamp and division; a shared expert
# its own gate/up/down/SwiGLU/add (llama.cpp's build_moe_ffn and the models' graphs).
ATTN_BLOCK_OPS = 12
FFN_BLOCK_OPS = 7
QK_NORM_OPS = 2
ROUTER_OPS = 5
NORMED_WEIGHTS_OPS = 3
SHEXP_EXTRA_OPS = 5
# architectures whose graph renormalises the picked experts' weights (Mixtral under "llama",
# Qwen3-MoE); for others the weights go as the softmax gave them
NORMED_ROUTER_ARCHS = frozenset({"llama", "qwen3moe", "qwen3vlmoe"})
PROBE_LAYER_OPS = ATTN_BLOCK_OPS + FFN_BLOCK_OPS  # the decode-overhead probe's tiny Llama layer
# a GPU batch of at least this many tokens runs its routed experts with the grouped prefill
# kernels, priced by the profile's expert prefill share; fewer (decode, a few NPCs) are priced
# as one token's experts plus a fixed cost per matmul
EXPERT_PREFILL_TOKENS = 32
PROFILE_MATMUL_SHAPE = (4096, 4096)  # the weight of one op in the profile's CPU rate graphs


def cpu_op_overhead(prof: Profile) -> float:
    """Seconds of one CPU op's barrier (and wake-up) at decode, from the per-layer probe."""
    return prof.cpu.layer_overhead_s / PROBE_LAYER_OPS


def _weight_bytes(ggml_type: str, k: int, n: int) -> int:
    try:
        block, size = GGML_QUANT_SIZES[GGMLQuantizationType[ggml_type]]
    except KeyError:
        block, size = 1, 2
    return k * n // block * size


def cpu_weight_rate(prof: Profile, ggml_type: str, tokens: float) -> float:
    """CPU weight bytes per second for a batch of ``tokens``, without the one barrier per op
    the profile's timing included (that is charged per op by ``overhead_seconds``). The
    correction never takes more than half of the measured time."""
    rate = prof.cpu.rate(ggml_type, tokens)
    op = cpu_op_overhead(prof)
    if op <= 0 or rate <= 0:
        return rate
    w = _weight_bytes(ggml_type, *PROFILE_MATMUL_SHAPE)
    measured = w / rate
    return w / max(measured - op, measured / 2)


@dataclass(frozen=True)
class UbatchCost:
    gpu_s: float
    cpu_s: float
    copy_s: float
    attn_s: float
    split_s: float
    overhead_s: float = 0.0
    prefill_s: float = 0.0  # the GPU's per-token work beyond matmuls and attention
    overlap_s: float = 0.0  # copies that run beside the CPU's work (a pipelined decode)

    @property
    def total(self) -> float:
        return (self.gpu_s + self.cpu_s + self.copy_s + self.attn_s + self.split_s
                + self.overhead_s + self.prefill_s - self.overlap_s)


def _active(t: TensorInfo, inv: ModelInventory, tokens: int) -> tuple[float, float]:
    """(bytes touched, tokens each touched weight sees) for a batch of ``tokens`` tokens."""
    a = inv.arch
    if t.group == "ffn_exps" and a.n_expert > 0:
        k, e = a.n_expert_used, a.n_expert
        frac = 1.0 - (1.0 - k / e) ** tokens  # expected share of experts some token picks
        return t.n_bytes * frac, max(1.0, tokens * k / (e * frac))
    return float(t.n_bytes), float(tokens)


def tensor_seconds(
    t: TensorInfo, inv: ModelInventory, prof: Profile, tokens: int, *, on_gpu: bool,
    copy_compute: bool, pinned: bool,
) -> tuple[float, float, float]:
    """(GPU, CPU, copy) seconds of one weight's matmul over ``tokens`` tokens."""
    if t.group in _SKIP_GROUPS or tokens <= 0:
        return 0.0, 0.0, 0.0
    nbytes, eff_tok = _active(t, inv, tokens)
    if on_gpu or copy_compute:
        gpu = prof.gpu
        assert gpu is not None  # (both are only asked with a GPU profile)
        g = nbytes / gpu.rate(t.ggml_type, eff_tok)
        if t.group == "ffn_exps":
            if tokens >= EXPERT_PREFILL_TOKENS:
                g /= gpu.expert_prefill_scale()
            else:
                g += gpu_expert_fixed_seconds(t, inv, gpu)
        return g, 0.0, 0.0 if on_gpu else nbytes / (prof.stream_bps(pinned) or 1.0)
    rate = cpu_weight_rate(prof, t.ggml_type, eff_tok)
    if t.group == "ffn_exps":
        rate *= prof.cpu.expert_rate_scale(t.name)
    return 0.0, nbytes / rate, 0.0


def gpu_expert_fixed_seconds(t: TensorInfo, inv: ModelInventory, gpu: DeviceProfile) -> float:
    """What a routed-expert matmul costs on the GPU beyond its bytes at the dense rate. The
    profile's one-token expert share (``expert_scale``, under 1 where a token's few small
    expert matmuls read slower than one large weight) is launch and small-matrix time: a fixed
    cost per matmul, the same for a prefill's batch (whose expert matmuls are long enough to
    reach the dense rate) as for one token, so it is priced on one token's experts."""
    scale = gpu.expert_rate_scale(t.name)
    a = inv.arch
    if scale >= 1.0 or a.n_expert <= 0:
        return 0.0
    one_token = t.n_bytes * a.n_expert_used / a.n_expert
    return one_token / gpu.rate(t.ggml_type, 1) * (1.0 / scale - 1.0)


def priced_tensors(inv: ModelInventory) -> list[TensorInfo]:
    """The weights a forward pass multiplies by. A model without ``output.weight`` (tied
    embeddings, e.g. SmolLM2) multiplies by the token embedding as its output head — llama.cpp
    duplicates it under the same name, so it sits where ``token_embd`` sits — and that read is
    priced as the output head's."""
    if any(t.group == "output" for t in inv.tensors):
        return list(inv.tensors)
    tied = [dataclasses.replace(t, group="output") for t in inv.tensors
            if t.group == "token_embd"]
    return [*inv.tensors, *tied]


def uses_copy_compute(plan: Plan, prof: Profile, tokens: int) -> bool:
    return prof.gpu is not None and plan.op_offload and tokens >= plan.copy_compute_min_batch


def ubatch_cost(
    inv: ModelInventory,
    plan: Plan,
    prof: Profile,
    tokens: int,
    ctx_pos: int,
    *,
    output_tokens: int | None = None,
    n_seqs: int = 1,
) -> UbatchCost:
    """Time of one llama_decode of ``tokens`` tokens whose sequences already hold ``ctx_pos``."""
    gpu_set = plan.gpu_set if prof.gpu is not None else frozenset()
    copy = uses_copy_compute(plan, prof, tokens)
    # under the threshold, a pipelined plan's streamed weights still go to the GPU
    streamed = plan.streamed_set if prof.gpu is not None and not copy else frozenset()
    out_tok = tokens if output_tokens is None else output_tokens
    g = c = cp = 0.0
    for t in priced_tensors(inv):
        n_tok = out_tok if t.group == "output" else tokens
        dg, dc, dcp = tensor_seconds(t, inv, prof, n_tok, on_gpu=t.name in gpu_set,
                                     copy_compute=copy or t.name in streamed,
                                     pinned=plan.pinned_host)
        g, c, cp = g + dg, c + dc, cp + dcp
    on_gpu = kv_gpu_layers(inv, plan, prof.gpu is not None)
    attn = sum(layer_attention_seconds(inv, plan, prof, layer, tokens, ctx_pos, n_seqs,
                                       on_gpu=layer in on_gpu, copy_compute=copy)
               for layer in range(inv.arch.n_layers))
    computing = gpu_set | streamed  # where each block runs in this batch
    splits = 0 if copy or prof.gpu is None else count_splits(inv, computing)
    blocks = block_placement(inv, computing)
    overlap = (pipelined_overlap_seconds(inv, plan, prof, tokens, out_tok) if streamed
               else 0.0)
    return UbatchCost(g, c, cp, attn, splits * prof.split_latency_s,
                      overhead_seconds(prof, blocks, copy, block_ops(inv)),
                      prefill_seconds(prof, blocks, copy, tokens), overlap)


def pipelined_overlap_seconds(inv: ModelInventory, plan: Plan, prof: Profile, tokens: int,
                              output_tokens: int | None = None) -> float:
    """The copy time a pipelined batch (under the copy-compute threshold) hides behind the CPU's
    work. The graph alternates CPU splits and GPU splits; the copies of the streamed weights one
    GPU split takes start when the CPU split before it starts, so that pair costs
    ``max(cpu * (1 + slowdown), copy)`` rather than ``cpu + copy``: the saving is their
    difference. Blocks (attention, then FFN, layer by layer) run where the majority of their
    weights compute (``block_placement``); the output head closes the last split."""
    if prof.gpu is None or not plan.decode_streamed:
        return 0.0
    gpu_set, streamed = plan.gpu_set, plan.streamed_set
    out_tok = tokens if output_tokens is None else output_tokens
    cpu_s: dict[str, float] = {}
    copy_s: dict[str, float] = {}
    for t in priced_tensors(inv):
        if t.name in gpu_set:
            continue
        n_tok = out_tok if t.group == "output" else tokens
        if t.name in streamed:
            copy_s[t.name] = tensor_seconds(t, inv, prof, n_tok, on_gpu=False,
                                            copy_compute=True, pinned=plan.pinned_host)[2]
        else:
            cpu_s[t.name] = tensor_seconds(t, inv, prof, n_tok, on_gpu=False,
                                           copy_compute=False, pinned=plan.pinned_host)[1]
    # (on the GPU?, CPU seconds, copy seconds) per block, in graph order
    blocks = layer_blocks(inv)
    seq = [(on, sum(cpu_s.get(t.name, 0.0) for t in ts), sum(copy_s.get(t.name, 0.0) for t in ts))
           for on, ts in zip(block_placement(inv, gpu_set | streamed), blocks, strict=True)]
    head = [t for t in priced_tensors(inv) if t.group == "output"]
    if head:
        on = all(t.name in gpu_set or t.name in streamed for t in head)
        seq.append((on, sum(cpu_s.get(t.name, 0.0) for t in head),
                    sum(copy_s.get(t.name, 0.0) for t in head)))
    slow = 1.0 + prof.stream_cpu_slowdown
    saved = cpu_run = copy_run = 0.0
    in_gpu = False
    for on, c, x in [*seq, (False, 0.0, 0.0)]:  # (a closing CPU block ends the last GPU run)
        if on:
            copy_run += x
            in_gpu = True
            continue
        if in_gpu:  # a GPU run ends: its copies ran beside the CPU run before it
            saved += cpu_run + copy_run - max(cpu_run * slow, copy_run)
            cpu_run = copy_run = 0.0
            in_gpu = False
        cpu_run += c
    return saved


def layer_blocks(inv: ModelInventory) -> list[list[TensorInfo]]:
    """The weights of each layer block, in graph order: per layer its attention, then its FFN
    (a block without weights is left out)."""
    blocks: list[list[TensorInfo]] = []
    for layer in range(inv.arch.n_layers):
        tensors = inv.layer_tensors(layer)
        for block in ([t for t in tensors if t.group == "attn"],
                      [t for t in tensors if t.group.startswith("ffn")]):
            if block:
                blocks.append(block)
    return blocks


def block_placement(inv: ModelInventory, gpu_set: frozenset[str] | set[str]) -> list[bool]:
    """Per layer block (``layer_blocks``), whether it runs on the GPU: the majority of its
    weights are there."""
    return [sum(t.name in gpu_set for t in block) * 2 >= len(block)
            for block in layer_blocks(inv)]


def block_ops(inv: ModelInventory) -> list[int]:
    """CPU ops of each layer block, in ``block_placement``'s order (attention, then FFN)."""
    a = inv.arch
    ops: list[int] = []
    for layer in range(a.n_layers):
        tensors = inv.layer_tensors(layer)
        groups = {t.group for t in tensors}
        if "attn" in groups:
            qk_norms = sum(1 for t in tensors
                           if "attn_q_norm" in t.name or "attn_k_norm" in t.name)
            ops.append(ATTN_BLOCK_OPS + QK_NORM_OPS * qk_norms)
        if any(g.startswith("ffn") for g in groups):
            n = FFN_BLOCK_OPS + (routed_expert_ops(a) if "ffn_exps" in groups else 0)
            ops.append(n + (SHEXP_EXTRA_OPS if "ffn_shexp" in groups and "ffn_exps" in groups
                            else 0))
    return ops


def routed_expert_ops(a: ArchInfo) -> int:
    """The ops a routed-expert FFN block runs beyond a dense one's (see ``ROUTER_OPS``)."""
    return (ROUTER_OPS + max(0, a.n_expert_used - 1)
            + (NORMED_WEIGHTS_OPS if a.architecture in NORMED_ROUTER_ARCHS else 0))


def overhead_seconds(prof: Profile, blocks: list[bool], copy_compute: bool,
                     ops: list[int] | None = None) -> float:
    """Fixed per-block and per-step cost of one ubatch (every block on the GPU under
    copy-compute): half a GPU layer's overhead per GPU block; per CPU block its ops times the
    CPU's per-op barrier (``ops``: each block's, default half a probe layer's)."""
    ops = ops if ops is not None and len(ops) == len(blocks) else (
        [PROBE_LAYER_OPS / 2] * len(blocks))  # type: ignore[list-item]
    op_s = cpu_op_overhead(prof)
    if prof.gpu is None:
        return sum(ops) * op_s + prof.cpu.step_overhead_s
    on_gpu = len(blocks) if copy_compute else sum(blocks)
    cpu_ops = 0 if copy_compute else sum(n for b, n in zip(blocks, ops, strict=True) if not b)
    per_block = on_gpu * prof.gpu.layer_overhead_s / 2 + cpu_ops * op_s
    step = prof.gpu.step_overhead_s if on_gpu else prof.cpu.step_overhead_s
    return per_block + step


def prefill_seconds(prof: Profile, blocks: list[bool], copy_compute: bool,
                    tokens: int) -> float:
    """The GPU's per-token work of a ubatch beyond its matmuls and attention: the profile's
    ``prefill_token_layer_s`` (half a layer's per block) for the blocks it runs (every block
    under copy-compute), and its ``prefill_token_s`` once where it runs any. At one token both
    are part of the measured step and layer overheads, so they count from the second token."""
    if prof.gpu is None or tokens <= 1:
        return 0.0
    on_gpu = len(blocks) if copy_compute else sum(blocks)
    if not on_gpu:
        return 0.0
    g = prof.gpu
    return (tokens - 1) * (on_gpu * g.prefill_token_layer_s / 2 + g.prefill_token_s)


def kv_gpu_layers(inv: ModelInventory, plan: Plan, has_gpu: bool) -> set[int]:
    """Layers whose KV cache llama.cpp puts in VRAM (n_gpu_layers counts from the last layer)."""
    n = inv.arch.n_layers
    if not has_gpu or not plan.kv_on_gpu or plan.gpu_layers == 0:
        return set()
    k = n if plan.gpu_layers < 0 else min(plan.gpu_layers, n)
    return set(range(n - k, n))


def layer_attention_seconds(
    inv: ModelInventory, plan: Plan, prof: Profile, layer: int, tokens: int, ctx_pos: int,
    n_seqs: int, *, on_gpu: bool, copy_compute: bool = False,
) -> float:
    """Attention over the KV cache for one layer: on the device holding that layer's KV, or on
    the GPU with the used KV cells copied there when the batch is under copy-compute."""
    a = inv.arch
    streamed = not on_gpu and copy_compute and prof.gpu is not None
    dev = prof.gpu if (on_gpu or streamed) and prof.gpu is not None else prof.cpu
    per_seq = tokens / max(1, n_seqs)
    flops = 4.0 * a.n_head * a.head_dim_k * tokens * (ctx_pos + per_seq / 2)
    kv_tok = inv.kv_bytes_per_token_per_layer(plan.type_k, plan.type_v, layer=layer)
    kv_bytes = kv_tok * (ctx_pos + per_seq) * n_seqs
    seconds = max(flops / dev.attention_flops(), kv_bytes / dev.attention_kv_bps())
    if tokens > 1 and dev is prof.gpu and quantized_kv(plan):
        # a batch's flash attention on CUDA (the tensor-core kernel) takes f16 K/V: a quantized
        # cache is first converted, one read of its used cells and one f16 write per ubatch
        f16_tok = inv.kv_bytes_per_token_per_layer("f16", "f16", layer=layer)
        seconds += (kv_tok + f16_tok) * (ctx_pos + per_seq) * n_seqs / dev.attention_kv_bps()
    if streamed:
        seconds += kv_bytes / (prof.h2d_bps(pinned=False) or 1.0)
    return seconds


def quantized_kv(plan: Plan) -> bool:
    """Whether the plan's KV cache is stored quantized (q8_0 / q4_0: flash attention only)."""
    return plan.type_k not in ("f16", "f32") or plan.type_v not in ("f16", "f32")


def count_splits(inv: ModelInventory, gpu_set: frozenset[str] | set[str]) -> int:
    """CPU<->GPU hand-overs along the layer sequence (attention block, then FFN block)."""
    seq = block_placement(inv, gpu_set)
    return sum(1 for x, y in itertools.pairwise(seq) if x != y)


def ttft_seconds(inv: ModelInventory, plan: Plan, prof: Profile, prompt_tokens: int) -> float:
    """Prefill of one prompt in ubatches of ``plan.n_ubatch`` (logits for the last token only)."""
    done, total = 0, 0.0
    while done < prompt_tokens:
        n = min(plan.n_ubatch, prompt_tokens - done)
        last = done + n >= prompt_tokens
        total += ubatch_cost(inv, plan, prof, n, done, output_tokens=1 if last else 0).total
        done += n
    return total


def decode_tps(inv: ModelInventory, plan: Plan, prof: Profile, ctx: int, n_seqs: int = 1) -> float:
    """Tokens per second summed over ``n_seqs`` sessions decoding together at context ``ctx``."""
    return n_seqs / ubatch_cost(inv, plan, prof, n_seqs, ctx, n_seqs=n_seqs).total
