"""Planner and cost model with fixed profiles and synthetic inventories (pure, fast)."""

from __future__ import annotations

import itertools

import pytest

from igi_sdk.errors import BudgetTooSmallError
from igi_sdk.model import read_inventory
from igi_sdk.planner import Plan, Workload, decode_tps, plan_for, ttft_seconds
from igi_sdk.planner.planner import KV_QUANT_MIN_GAIN
from igi_sdk.profile import DeviceProfile, Profile

MIB = 1024 * 1024
TOKENS = (1, 64, 512, 2048)
BPW = {"F16": 2.0, "Q8_0": 1.0625, "Q4_0": 0.5625, "Q4_K": 0.5625}


def _device(kind: str, bandwidth: float, flops: float) -> DeviceProfile:
    # a roofline: bytes/s = min(bandwidth, FLOP/s * bytes-per-weight / (2 FLOP * tokens))
    rates = {ty: {t: min(bandwidth, flops * bpw / (2 * t)) for t in TOKENS}
             for ty, bpw in BPW.items()}
    return DeviceProfile(name=kind, kind=kind, threads=16, matmul_rate=rates)


GPU_PROFILE = Profile(
    fingerprint={"gpu": "test"}, cpu=_device("cpu", 60e9, 1.5e12),
    gpu=_device("gpu", 2.0e12, 300e12), h2d_pinned_bps=50e9, h2d_pageable_bps=8e9,
    gpu_fixed_bytes=300 * MIB,
)
CPU_PROFILE = Profile(fingerprint={"gpu": "none"}, cpu=_device("cpu", 60e9, 1.5e12))
WL = Workload(n_ctx=2048, prompt_tokens=512, gen_tokens=64)


@pytest.fixture(scope="module")
def dense(tiny_llama):
    return read_inventory(tiny_llama)


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    from igi_sdk.model import spec_with, write_synthetic_gguf

    spec = spec_with("tiny-qwen2moe", n_layers=4)
    return read_inventory(write_synthetic_gguf(tmp_path_factory.mktemp("m") / "moe.gguf", spec))


def _budgets(inv, n: int = 24) -> list[int]:
    lo = plan_for(inv, GPU_PROFILE, 10**12, WL).minimum_bytes
    hi = lo + inv.total_bytes() * 3
    return [lo + (hi - lo) * i // (n - 1) for i in range(n)]


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_never_over_budget_and_more_budget_is_never_slower(which, request) -> None:
    inv = request.getfixturevalue(which)
    last, prev_q8 = float("inf"), False
    for budget in _budgets(inv):
        best = plan_for(inv, GPU_PROFILE, budget, WL).best
        assert best.vram_bytes["total"] <= budget
        turn = best.predicted["turn_s"]
        # where more budget brings f16 KV back, the turn may be up to KV_QUANT_MIN_GAIN longer
        # than the q8_0 plan's (choose); otherwise never longer
        tol = KV_QUANT_MIN_GAIN if best.type_k == "f16" and prev_q8 else 0.0
        assert turn <= last * (1 + tol + 1e-9), (budget, best.name)
        last, prev_q8 = turn, best.type_k != "f16"


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_attention_and_kv_first_then_ffn_then_experts(which, request) -> None:
    inv = request.getfixturevalue(which)
    order = ["attn", "ffn_router", "output", "ffn_dense", "ffn_exps"]
    for budget in _budgets(inv):
        for c in plan_for(inv, GPU_PROFILE, budget, WL).candidates:
            if not c.plan.name.startswith("attn-first"):
                continue
            gpu = set(c.plan.gpu_tensors)
            full = {g: all(t.name in gpu for t in inv.tensors if t.group == g) for g in order}
            some = {g: any(t.name in gpu for t in inv.tensors if t.group == g) for g in order}
            for i, g in enumerate(order):
                if some[g]:  # a group only starts once every higher-priority group is in
                    assert all(full[h] for h in order[:i] if any(
                        t.group == h for t in inv.tensors)), (budget, g)
            layers_with_attn = {t.layer for t in inv.tensors
                                if t.group == "attn" and t.name in gpu}
            assert c.plan.gpu_layers == len(layers_with_attn)  # KV goes with attention


def test_budget_below_minimum_names_the_minimum(dense) -> None:
    minimum = plan_for(dense, GPU_PROFILE, 10**12, WL).minimum_bytes
    with pytest.raises(BudgetTooSmallError) as e:
        plan_for(dense, GPU_PROFILE, minimum - 1, WL)
    assert e.value.minimum_bytes == minimum
    assert f"{minimum / MIB:.0f} MiB" in str(e.value)


def test_cpu_only_profile_gives_the_cpu_plan(dense) -> None:
    best = plan_for(dense, CPU_PROFILE, 8 * 1024 * MIB, WL).best
    assert best.name == "all-cpu" and not best.gpu_tensors and not best.uses_gpu()
    assert best.predicted["decode_tps"] > 0


def test_ample_budget_puts_everything_on_the_gpu(dense) -> None:
    best = plan_for(dense, GPU_PROFILE, 10**12, WL).best
    assert set(best.gpu_tensors) == {t.name for t in dense.tensors if t.group != "token_embd"}


def test_never_worse_than_layer_offload(moe) -> None:
    for budget in _budgets(moe):
        res = plan_for(moe, GPU_PROFILE, budget, WL)
        layer = [c for c in res.candidates if c.plan.name.startswith("layer-offload") and c.fits]
        assert all(res.best.predicted["turn_s"] <= c.score + 1e-12 for c in layer)


def test_cost_model_directions(dense) -> None:
    cpu = Plan.all_cpu()
    gpu = Plan.all_gpu(dense)
    assert decode_tps(dense, gpu, GPU_PROFILE, 512) > decode_tps(dense, cpu, GPU_PROFILE, 512)
    assert ttft_seconds(dense, gpu, GPU_PROFILE, 1024) > ttft_seconds(dense, gpu, GPU_PROFILE, 64)
    # decode slows down as the context grows (attention reads more KV)
    assert decode_tps(dense, cpu, CPU_PROFILE, 4096) < decode_tps(dense, cpu, CPU_PROFILE, 16)


def test_copy_compute_threshold_splits_the_token_tiers(dense) -> None:
    res = plan_for(dense, GPU_PROFILE, plan_for(dense, GPU_PROFILE, 10**12, WL).minimum_bytes
                   + 64 * 1024, WL)
    copy = next(c.plan for c in res.candidates if c.plan.name == "attn-first-copy")
    assert 1 < copy.copy_compute_min_batch <= 512  # decode on the CPU, prefill streamed


def test_measured_attention_rates_drive_the_attention_cost(dense) -> None:
    from igi_sdk.planner.cost import layer_attention_seconds

    plan = Plan.all_cpu()
    slow = CPU_PROFILE.model_copy(deep=True)
    slow.cpu.attn_flops, slow.cpu.attn_kv_bps = 1e9, 1e8
    fast = CPU_PROFILE.model_copy(deep=True)
    fast.cpu.attn_flops, fast.cpu.attn_kv_bps = 1e13, 1e12
    args = (dense, plan)
    t_slow = layer_attention_seconds(*args, slow, 0, 512, 1024, 1, on_gpu=False)
    t_fast = layer_attention_seconds(*args, fast, 0, 512, 1024, 1, on_gpu=False)
    assert t_slow > 100 * t_fast
    # unmeasured (0) falls back to the matmul-derived rates
    assert CPU_PROFILE.cpu.attention_flops() == CPU_PROFILE.cpu.flops()


def test_cpu_experts_are_priced_at_the_measured_expert_rate(tiny_moe) -> None:
    """A routed expert on the CPU costs its bytes at the dense rate times the profile's expert
    share: halving the down experts' share doubles their seconds, and nothing else moves."""
    from igi_sdk.planner.cost import tensor_seconds

    inv = read_inventory(tiny_moe)
    slow = CPU_PROFILE.model_copy(deep=True)
    slow.cpu.expert_scale = {"gate_up": 1.0, "down": 0.5}
    for t in inv.tensors:
        base = tensor_seconds(t, inv, CPU_PROFILE, 1, on_gpu=False, copy_compute=False,
                              pinned=False)[1]
        now = tensor_seconds(t, inv, slow, 1, on_gpu=False, copy_compute=False,
                             pinned=False)[1]
        assert now == pytest.approx(base * (2 if "ffn_down_exps" in t.name else 1)), t.name


def test_gpu_experts_pay_their_measured_share_once_per_matmul(tiny_moe) -> None:
    """On the GPU a routed-expert matmul of a few tokens (decode, a few NPCs) costs its bytes at
    the dense rate plus the time the profile's one-token share adds to one token's experts:
    halving the gate/up share adds one token's gate/up bytes at the one-token rate, the same
    at one token and at a few, and nothing to the down experts or any other weight."""
    from igi_sdk.planner.cost import EXPERT_PREFILL_TOKENS, tensor_seconds

    inv = read_inventory(tiny_moe)
    a = inv.arch
    slow = GPU_PROFILE.model_copy(deep=True)
    assert slow.gpu is not None
    slow.gpu.expert_scale = {"gate_up": 0.5, "down": 1.0}
    seen = 0
    for t in inv.tensors:
        for tokens in (1, 4, EXPERT_PREFILL_TOKENS - 1):
            for copy in (False, True):
                on_gpu = not copy
                base = tensor_seconds(t, inv, GPU_PROFILE, tokens, on_gpu=on_gpu,
                                      copy_compute=copy, pinned=True)
                now = tensor_seconds(t, inv, slow, tokens, on_gpu=on_gpu, copy_compute=copy,
                                     pinned=True)
                extra = 0.0
                if t.group == "ffn_exps" and "ffn_down_exps" not in t.name:
                    one_token = t.n_bytes * a.n_expert_used / a.n_expert
                    extra = one_token / slow.gpu.rate(t.ggml_type, 1)
                    seen += 1
                assert now[0] == pytest.approx(base[0] + extra), (t.name, tokens, copy)
                assert now[1:] == pytest.approx(base[1:])
    assert seen  # the model has gate/up experts


def test_a_gpu_prefill_runs_its_experts_at_the_measured_prefill_share(tiny_moe) -> None:
    """A prefill batch's routed experts run llama.cpp's grouped kernels, which reach the
    profile's measured share of the dense rate: a share of a half doubles their GPU time, in
    VRAM and streamed (the copy unchanged), and the one-token fixed cost is not added on top;
    batches of fewer tokens, and every other weight, are priced as before."""
    from igi_sdk.planner.cost import EXPERT_PREFILL_TOKENS, tensor_seconds

    inv = read_inventory(tiny_moe)
    one = GPU_PROFILE.model_copy(deep=True)
    assert one.gpu is not None
    one.gpu.expert_scale = {"gate_up": 0.5, "down": 0.5}
    half = one.model_copy(deep=True)
    assert half.gpu is not None
    half.gpu.expert_scale["prefill"] = 0.5
    experts = 0
    for t in inv.tensors:
        for tokens in (EXPERT_PREFILL_TOKENS - 1, EXPERT_PREFILL_TOKENS, 512):
            for copy in (False, True):
                args = dict(on_gpu=not copy, copy_compute=copy, pinned=True)
                before = tensor_seconds(t, inv, one, tokens, **args)
                now = tensor_seconds(t, inv, half, tokens, **args)
                if t.group == "ffn_exps" and tokens >= EXPERT_PREFILL_TOKENS:
                    experts += 1
                    plain = tensor_seconds(t, inv, GPU_PROFILE, tokens, **args)
                    assert now[0] == pytest.approx(2 * plain[0]), (t.name, tokens, copy)
                else:
                    assert now[0] == pytest.approx(before[0]), (t.name, tokens, copy)
                assert now[1:] == pytest.approx(before[1:])
    assert experts


def test_a_prefill_pays_the_gpus_measured_work_per_token_for_the_blocks_it_runs(dense) -> None:
    """The profile's per-token prefill work is paid per token after the first: half a layer's
    per block the GPU runs (every block in VRAM, every block under copy-compute) and the
    per-ubatch share once; none in a batch the CPU computes (under the copy-compute threshold),
    nothing at one token."""
    from igi_sdk.planner.cost import ubatch_cost

    s, once = 2e-6, 3e-6
    prof = GPU_PROFILE.model_copy(deep=True)
    assert prof.gpu is not None
    prof.gpu.prefill_token_layer_s, prof.gpu.prefill_token_s = s, once
    n = dense.arch.n_layers
    full = Plan.all_gpu(dense)
    cpu = Plan(name="streamed", gpu_tensors=(), op_offload=True, copy_compute_min_batch=32)
    for plan, tokens, layers in ((full, 512, n), (full, 1, 0), (cpu, 512, n),
                                 (cpu, cpu.copy_compute_min_batch - 1, 0)):
        without = ubatch_cost(dense, plan, GPU_PROFILE, tokens, 0)
        with_it = ubatch_cost(dense, plan, prof, tokens, 0)
        expected = (tokens - 1) * (layers * s + once) if layers else 0.0
        assert with_it.prefill_s == pytest.approx(expected), (plan.name, tokens)
        assert with_it.total == pytest.approx(without.total + with_it.prefill_s)


def test_the_prefill_terms_are_what_probes_in_vram_spend_beyond_their_price(tmp_path) -> None:
    """Two all-GPU prefill probes (2 and 6 layers): what the cost model does not price of them
    per added layer and token is the per-layer term, what the smaller one has left beyond its
    layers' share the per-ubatch one; a run faster than its price gives neither."""
    from igi_sdk.model import spec_with, write_synthetic_gguf
    from igi_sdk.planner.cost import ubatch_cost
    from igi_sdk.runtime.step_bench import CopyComputeRun
    from igi_sdk.tuning.measure import prefill_token_seconds

    tokens, s_true, once_true = 1024, 3e-7, 2e-6

    def run(n_layers: int, extra: float) -> CopyComputeRun:
        path = write_synthetic_gguf(tmp_path / f"p{n_layers}.gguf",
                                    spec_with("tiny-llama", n_layers=n_layers), data=False)
        inv = read_inventory(path)
        plan = Plan.all_gpu(inv).model_copy(update={"n_ubatch": tokens})
        priced = ubatch_cost(inv, plan, GPU_PROFILE, tokens, 0, output_tokens=1).total
        return CopyComputeRun(priced + extra, tokens, {}, n_layers, inv, plan)

    def slow(n: int) -> float:
        return (tokens - 1) * (n * s_true + once_true)

    per_layer, once = prefill_token_seconds(GPU_PROFILE, run(2, slow(2)), run(6, slow(6)))
    assert (per_layer, once) == pytest.approx((s_true, once_true))
    assert prefill_token_seconds(GPU_PROFILE, run(2, -0.001), run(6, -0.002)) == (0.0, 0.0)


def test_copy_compute_runs_cpu_kv_attention_on_the_gpu_with_the_kv_copied(dense) -> None:
    # llama.cpp's scheduler extends the offloaded projections' GPU assignment to the attention
    # op: a prefill batch attends on the GPU and pays for copying the layer's used KV cells
    from igi_sdk.planner.cost import layer_attention_seconds

    prof = GPU_PROFILE.model_copy(deep=True)
    prof.cpu.attn_flops, prof.cpu.attn_kv_bps = 1e10, 1e10
    prof.gpu.attn_flops, prof.gpu.attn_kv_bps = 1e15, 1e13
    plan, ctx = Plan.all_cpu(), 4096
    on_cpu = layer_attention_seconds(dense, plan, prof, 0, 512, ctx, 1, on_gpu=False)
    streamed = layer_attention_seconds(dense, plan, prof, 0, 512, ctx, 1, on_gpu=False,
                                       copy_compute=True)
    on_gpu = layer_attention_seconds(dense, plan, prof, 0, 512, ctx, 1, on_gpu=True)
    kv_copy = dense.kv_bytes_per_token_per_layer(plan.type_k, plan.type_v, layer=0) * (ctx + 512)
    assert streamed == pytest.approx(on_gpu + kv_copy / prof.h2d_pageable_bps)
    assert on_gpu < streamed < on_cpu


def test_step_overheads_add_per_block_on_the_device_that_runs_it(dense) -> None:
    prof = GPU_PROFILE.model_copy(deep=True)
    prof.gpu.layer_overhead_s, prof.gpu.step_overhead_s = 40e-6, 300e-6
    prof.cpu.layer_overhead_s, prof.cpu.step_overhead_s = 20e-6, 100e-6
    n = dense.arch.n_layers
    gpu_plan = Plan.all_gpu(dense)
    base = 1 / decode_tps(dense, gpu_plan, GPU_PROFILE, 256)
    assert 1 / decode_tps(dense, gpu_plan, prof, 256) == pytest.approx(base + n * 40e-6 + 300e-6)
    # on the CPU a layer's overhead is its ops' barriers (ATTN + FFN ops = the probe's layer)
    from igi_sdk.planner.cost import block_ops, block_placement, overhead_seconds

    cpu_blocks = block_placement(dense, frozenset())
    assert overhead_seconds(prof.model_copy(update={"gpu": None}), cpu_blocks, False,
                            block_ops(dense)) == pytest.approx(n * 20e-6 + 100e-6)


def test_cpu_overhead_is_charged_per_op_and_taken_out_of_the_measured_rates(dense) -> None:
    from igi_sdk.planner.cost import (
        ATTN_BLOCK_OPS,
        FFN_BLOCK_OPS,
        PROBE_LAYER_OPS,
        block_ops,
        cpu_op_overhead,
        cpu_weight_rate,
        overhead_seconds,
    )

    prof = GPU_PROFILE.model_copy(deep=True)
    prof.cpu.layer_overhead_s = 19 * 25e-6  # 25 us per op, as a VM with passive waits showed
    op = cpu_op_overhead(prof)
    assert op == pytest.approx(prof.cpu.layer_overhead_s / PROBE_LAYER_OPS)
    # the profile timed one 4096x4096 weight per op, barrier included: the rate without it
    w = 4096 * 4096 // 32 * 18  # Q4_0 bytes
    r = prof.cpu.rate("Q4_0", 1)
    assert cpu_weight_rate(prof, "Q4_0", 1) == pytest.approx(w / (w / r - op))
    assert r < cpu_weight_rate(prof, "Q4_0", 1) <= 2 * r
    no_overhead = prof.model_copy(deep=True)
    no_overhead.cpu.layer_overhead_s = 0.0
    assert cpu_weight_rate(no_overhead, "Q4_0", 1) == r
    # an FFN block on the CPU (attention on the GPU, attn-first plans) pays its 7 ops, not half
    # a layer's 19
    n = dense.arch.n_layers
    ops = block_ops(dense)
    assert ops == [ATTN_BLOCK_OPS, FFN_BLOCK_OPS] * n
    attn_gpu = [True, False] * n
    over = overhead_seconds(prof, attn_gpu, False, ops)
    gpu_part = n * prof.gpu.layer_overhead_s / 2 + prof.gpu.step_overhead_s
    assert over == pytest.approx(gpu_part + n * FFN_BLOCK_OPS * op)


def test_a_qwen3_moe_layer_pays_every_op_its_graph_runs_on_the_cpu(tiny_moe) -> None:
    """llama.cpp's Qwen3-MoE layer runs more CPU ops than a Llama layer: its Q and K norms (a
    norm and a scale each), the router's ops, one add per picked expert after the first (the
    outputs are summed pairwise) and the picked weights' renormalisation (sum, clamp,
    division). Each is a barrier on the CPU, so each is priced."""
    import dataclasses

    from igi_sdk.planner.cost import (
        ATTN_BLOCK_OPS,
        FFN_BLOCK_OPS,
        NORMED_WEIGHTS_OPS,
        QK_NORM_OPS,
        ROUTER_OPS,
        block_ops,
        cpu_op_overhead,
        ubatch_cost,
    )

    inv = read_inventory(tiny_moe)
    a = inv.arch
    assert a.architecture == "qwen3moe" and a.n_expert_used > 1
    moe_block = FFN_BLOCK_OPS + ROUTER_OPS + (a.n_expert_used - 1) + NORMED_WEIGHTS_OPS
    assert block_ops(inv) == [ATTN_BLOCK_OPS + 2 * QK_NORM_OPS, moe_block] * a.n_layers
    # an architecture whose graph keeps the softmax's weights as they are: no renormalisation
    plain = dataclasses.replace(inv, arch=dataclasses.replace(a, architecture="qwen2moe"))
    assert block_ops(plain)[1] == moe_block - NORMED_WEIGHTS_OPS
    # all on the CPU, the step's overhead is every block's ops at the per-op barrier
    prof = CPU_PROFILE.model_copy(deep=True)
    prof.cpu.layer_overhead_s = 19 * 25e-6
    cost = ubatch_cost(inv, Plan.all_cpu(), prof, 1, 64)
    ops = sum(block_ops(inv))
    assert cost.overhead_s == pytest.approx(ops * cpu_op_overhead(prof)
                                            + prof.cpu.step_overhead_s)


def test_decode_time_follows_cpu_bytes_when_kv_pushes_ffn_off(dense) -> None:
    # the n_ctx 4096 "drop": a larger context only moves FFN blocks to the CPU;
    # the predicted step grows by their bytes at the CPU rate plus their ops' barriers, and
    # the same placement predicts the same decode at either context
    prof = GPU_PROFILE.model_copy(deep=True)
    prof.cpu.layer_overhead_s = 19 * 25e-6
    from igi_sdk.planner.cost import FFN_BLOCK_OPS, cpu_op_overhead, ubatch_cost

    plan = Plan.attention_on_gpu(dense).model_copy(update={"gpu_layers": -1})
    ffn = [t for t in dense.tensors if t.group == "ffn_dense"]
    last = dense.arch.n_layers - 1
    more_gpu = plan.model_copy(update={"gpu_tensors": plan.gpu_tensors + tuple(
        t.name for t in ffn if t.layer == last)})
    slow = ubatch_cost(dense, plan, prof, 1, 1000).total
    fast = ubatch_cost(dense, more_gpu, prof, 1, 1000).total
    moved = [t for t in ffn if t.layer == last]
    from igi_sdk.planner.cost import cpu_weight_rate

    cpu_s = sum(t.n_bytes / cpu_weight_rate(prof, t.ggml_type, 1) for t in moved)
    gpu_s = sum(t.n_bytes / prof.gpu.rate(t.ggml_type, 1) for t in moved)
    barrier = FFN_BLOCK_OPS * cpu_op_overhead(prof) - prof.gpu.layer_overhead_s / 2
    splits = prof.split_latency_s  # the last block no longer hands over to the CPU
    assert slow - fast == pytest.approx(cpu_s - gpu_s + barrier + splits, rel=1e-6)


def test_prefix_search_prices_plans_as_the_cost_model_does(dense) -> None:
    # the planner scores prefixes from running sums; its pick must score the same when the
    # cost model prices the finished plan from scratch (overheads and hand-overs included)
    prof = GPU_PROFILE.model_copy(deep=True)
    prof.gpu.layer_overhead_s, prof.gpu.step_overhead_s = 40e-6, 300e-6
    prof.cpu.layer_overhead_s, prof.cpu.step_overhead_s = 20e-6, 100e-6
    from igi_sdk.planner.cost import ubatch_cost
    from igi_sdk.planner.planner import _attn_first, _schedule

    lo = plan_for(dense, prof, 10**12, WL).minimum_bytes
    for extra in (1, 4, 16):
        plan = _attn_first(dense, prof, WL, lo + extra * MIB, 512, copy=False)
        direct = sum(ubatch_cost(dense, plan, prof, st.tokens, st.ctx_pos,
                                 output_tokens=st.out_tokens, n_seqs=st.n_seqs).total * st.weight
                     for st in _schedule(WL, plan.n_ubatch))
        res = plan_for(dense, prof, lo + extra * MIB, WL)
        assert direct > 0 and res.best.predicted["turn_s"] > 0
        cand = next(c for c in res.candidates if c.plan.name == plan.name
                    and c.plan.n_ubatch == 512)
        assert cand.score == pytest.approx(direct, rel=0.02)


def test_copy_compute_streams_at_the_measured_prefill_rate(dense) -> None:
    from igi_sdk.planner.cost import tensor_seconds

    t = max((t for t in dense.tensors if t.group.startswith("ffn")), key=lambda t: t.n_bytes)
    raw = tensor_seconds(t, dense, GPU_PROFILE, 512, on_gpu=False, copy_compute=True,
                         pinned=True)[2]
    assert raw == pytest.approx(t.n_bytes / GPU_PROFILE.h2d_pinned_bps)  # unmeasured: raw copy
    prof = GPU_PROFILE.model_copy(update={"stream_pinned_bps": 25e9, "stream_mapped_bps": 2e9})
    for pinned, rate in ((True, 25e9), (False, 2e9)):
        copy = tensor_seconds(t, dense, prof, 512, on_gpu=False, copy_compute=True,
                              pinned=pinned)[2]
        assert copy == pytest.approx(t.n_bytes / rate)


def test_stream_rate_is_what_the_prefill_spends_beyond_its_matmuls() -> None:
    from igi_sdk.runtime.step_bench import CopyComputeRun
    from igi_sdk.tuning.measure import stream_rate

    prof = GPU_PROFILE.model_copy(deep=True)
    prof.gpu.layer_overhead_s, prof.gpu.step_overhead_s = 1e-4, 1e-3
    weights = {"Q4_0": 2 * 10**9}
    matmul_s = 2e9 / prof.gpu.rate("Q4_0", 512)
    fixed_s = 2 * 1e-4 + 1e-3
    run = CopyComputeRun(matmul_s + fixed_s + 0.1, 512, weights, 2)  # 0.1 s of copies
    assert stream_rate(prof, run) == pytest.approx(20e9)
    # a run faster than the priced matmuls cannot say more than the raw copy rate
    fast = CopyComputeRun(matmul_s / 2, 512, weights, 2)
    assert stream_rate(prof, fast) == prof.h2d_pinned_bps
    # ... and without a copy rate it is unmeasured (0), never an infinite rate, which a
    # profile's JSON wrote as null and no planner could read back
    unknown = prof.model_copy(update={"h2d_pinned_bps": 0.0})
    assert stream_rate(unknown, fast) == 0.0
    assert Profile.model_validate_json(unknown.model_copy(
        update={"stream_pinned_bps": stream_rate(unknown, fast)}).model_dump_json())
    # two probe sizes: the marginal rate, what does not grow with the bytes left out
    fixed_extra = 0.002  # per ubatch, whatever the size
    big_w = {t: 3 * b for t, b in weights.items()}
    big_matmul = sum(b / prof.gpu.rate(t, 512) for t, b in big_w.items())
    big_fixed = 6 * prof.gpu.layer_overhead_s + prof.gpu.step_overhead_s
    streamed = sum(weights.values())
    small = CopyComputeRun(matmul_s + fixed_s + streamed / 20e9 + fixed_extra, 512, weights, 2)
    big = CopyComputeRun(big_matmul + big_fixed + 3 * streamed / 20e9 + fixed_extra, 512,
                         big_w, 6)
    assert stream_rate(prof, small) < 20e9  # the fixed share counted as copying
    assert stream_rate(prof, big, small) == pytest.approx(20e9)


def test_the_stream_rate_is_what_a_probe_spends_beyond_the_cost_models_price(tmp_path) -> None:
    """With the probe's model and plan (every weight in host memory, the KV cache in VRAM),
    the stream rate is the streamed bytes over what the two runs spend beyond the cost model's
    price of everything but their copies, the profile's prefill term included."""
    from igi_sdk.model import spec_with, write_synthetic_gguf
    from igi_sdk.planner.cost import ubatch_cost
    from igi_sdk.runtime.step_bench import CopyComputeRun
    from igi_sdk.tuning.measure import stream_rate

    prof = GPU_PROFILE.model_copy(deep=True)
    assert prof.gpu is not None
    prof.gpu.prefill_token_layer_s = 5e-7
    rate, tokens = 20e9, 512

    def run(n_layers: int) -> CopyComputeRun:
        path = write_synthetic_gguf(tmp_path / f"s{n_layers}.gguf",
                                    spec_with("tiny-llama", n_layers=n_layers), data=False)
        inv = read_inventory(path)
        plan = Plan(name="copy-probe", gpu_tensors=(), op_offload=True, pinned_host=True,
                    flash_attn="on", n_ubatch=tokens)
        u = ubatch_cost(inv, plan, prof, tokens, 0, output_tokens=1)
        weights = {"Q4_0": sum(t.n_bytes for t in inv.tensors if t.group != "token_embd")}
        assert u.prefill_s > 0 and u.copy_s > 0
        return CopyComputeRun(u.total - u.copy_s + weights["Q4_0"] / rate + 0.002, tokens,
                              weights, n_layers, inv, plan)

    assert stream_rate(prof, run(6), run(2)) == pytest.approx(rate)


def test_profile_rate_follows_a_roofline_between_measurements() -> None:
    # 1 token: 0.01 s per weight byte (bandwidth-bound); 64 tokens: 0.5 s (compute-bound)
    dev = DeviceProfile(name="x", kind="cpu", matmul_rate={"Q4_0": {1: 100.0, 64: 2.0}})
    assert dev.rate("Q4_0", 1) == 100.0 and dev.rate("Q4_0", 64) == 2.0
    # 1.2 tokens of arithmetic (0.5/64 s each) take less than reading the weight: bandwidth
    assert dev.rate("Q4_0", 1.2) == 100.0
    # 8 tokens: the arithmetic binds, 8 × 0.5/64 s per byte
    assert dev.rate("Q4_0", 8) == pytest.approx(16.0, rel=1e-9)
    # past the last measurement the batch time keeps growing with the token count
    assert dev.rate("Q4_0", 128) == pytest.approx(1.0, rel=1e-9)
    assert dev.rate("Q4_1", 1) == 100.0  # borrows the Q4_0 kernel family
    # measurements that grow faster than linearly still give a continuous, rising curve
    steep = DeviceProfile(name="y", kind="cpu", matmul_rate={"Q4_0": {1: 100.0, 64: 1.0}})
    for d in (dev, steep):
        times = [1 / d.rate("Q4_0", n / 10) for n in range(10, 2000)]
        assert all(0 <= b - a < 0.02 for a, b in itertools.pairwise(times))


def test_plan_json_round_trip_into_the_runtime(tiny_llama, tmp_path) -> None:
    from igi_sdk.runtime import Engine, EngineConfig

    inv = read_inventory(tiny_llama)
    res = plan_for(inv, GPU_PROFILE, 10**12, WL)
    # an attention-first plan: some tensors planned for the GPU, others for the CPU
    plan = next(c.plan for c in res.candidates if c.plan.name == "attn-first-copy")
    plan = plan.model_copy(update={"gpu_tensors": plan.gpu_tensors[: len(plan.gpu_tensors) // 2]})
    assert plan.gpu_tensors
    path = tmp_path / "plan.json"
    plan.save(path)
    loaded = Plan.load(path)
    assert loaded == plan
    with Engine(tiny_llama, loaded, EngineConfig(n_ctx=256, max_sessions=1, n_threads=2)) as e:
        placed = e.placement()
        assert set(placed) == {t.name for t in inv.tensors}
        for name, where in placed.items():
            assert where == (loaded.role_of(name) if e.gpu is not None else "cpu"), name


def test_profile_measured_here_and_cached(tmp_path, monkeypatch) -> None:
    """A real (tiny) measurement through ggml on this machine, saved and found again."""
    from igi_sdk.tuning.measure import fingerprint, measure_profile

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    prof = measure_profile(threads=2, fast=True, k=256, n=256, scale_down=True)
    for table in prof.cpu.matmul_rate.values():
        assert all(r > 0 for r in table.values())
    assert prof.cpu.rate("Q4_0", 1) > prof.cpu.rate("Q4_0", 2048)  # bandwidth vs compute bound
    assert prof.cpu.attn_flops > 0 and prof.cpu.attn_kv_bps > 0  # flash attention measured
    # a real decode's per-layer cost beyond its weights: tens of microseconds, not seconds
    assert 0 < prof.cpu.layer_overhead_s < 0.01 and 0 <= prof.cpu.step_overhead_s < 0.1
    prof.save()
    again = Profile.cached(fingerprint(2))
    assert again is not None and again.key == prof.key
    assert again.cpu.matmul_rate == prof.cpu.matmul_rate


def test_a_cached_profile_that_does_not_read_back_is_measured_again(tmp_path) -> None:
    prof = GPU_PROFILE.model_copy(deep=True)
    path = prof.save(tmp_path)
    assert Profile.cached(prof.fingerprint, tmp_path) is not None
    text = path.read_text()
    path.write_text(text.replace('"stream_pinned_bps": ', '"stream_pinned_bps": null, "x": '))
    assert Profile.cached(prof.fingerprint, tmp_path) is None  # not a failed start
    path.write_text("{")
    assert Profile.cached(prof.fingerprint, tmp_path) is None


def test_cpu_weights_are_timed_in_the_layout_llama_cpp_loads_them_in() -> None:
    """Without a GPU llama.cpp repacks Q4_0/Q4_K CPU weights for faster kernels; the profile
    times them so (its fingerprint says which), and a type it does not repack (Q4_1) is timed
    in plain memory instead of failing."""
    from igi_sdk.runtime import ggml_bench
    from igi_sdk.runtime.devices import list_devices
    from igi_sdk.tuning.measure import cpu_weights_repacked, fingerprint

    has_gpu = any(d.is_gpu for d in list_devices())
    repack = ggml_bench.repack_buffer_type()
    assert fingerprint(2)["cpu_weights"] == (
        "repacked" if cpu_weights_repacked(has_gpu) else "plain")
    if repack is None:
        pytest.skip("this llama.cpp build has no CPU weight repacking")
    assert cpu_weights_repacked(False)
    cpu = next(d for d in list_devices() if d.kind == "cpu")
    with ggml_bench.backend(cpu.index, 1) as be:
        for ty in ("Q4_0", "Q4_1"):
            s = ggml_bench.matmul_seconds(be, ty, 256, 256, 1, reps=1, weights_buft=repack)
            assert 0 < s < 1.0, ty
        s = ggml_bench.expert_matmul_seconds(be, "Q4_0", 256, 96, 16, 8, 1, reps=1,
                                             shared_input=False, weights_buft=repack)
        assert 0 < s < 1.0


def test_a_profile_leaves_no_openmp_team_behind() -> None:
    """The measurement's OpenMP workers end with it: libgomp counts every thread's team
    against the CPUs, and a team left behind cut the engine's spin to 100 rounds for the
    life of the process (a MoE decoded at two thirds of its speed on two cores)."""
    import os
    import time

    from igi_sdk.runtime.threadpool import uses_openmp
    from igi_sdk.tuning.measure import measure_profile

    def threads() -> set[str]:
        return set(os.listdir("/proc/self/task"))

    if not os.path.isdir("/proc/self/task") or not uses_openmp():
        pytest.skip("counts this process's threads in /proc (Linux, llama.cpp with OpenMP)")
    before = threads()
    prof = measure_profile(threads=2, fast=True, k=256, n=256, scale_down=True)
    # (libgomp's workers leave a moment after their team's thread; other tests' may end)
    deadline = time.monotonic() + 5.0
    while threads() - before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert threads() - before == set()
    # and it timed the routed experts beside the dense weights (the cost model's MoE rate)
    assert set(prof.cpu.expert_scale) == {"gate_up", "down"}
    assert all(0 < v <= 2.0 for v in prof.cpu.expert_scale.values())


def test_cli_plan_prints_the_choice_and_writes_json(tiny_llama, tmp_path) -> None:
    import subprocess
    import sys

    profile = tmp_path / "gpu-profile.json"
    profile.write_text(GPU_PROFILE.model_dump_json())
    out = tmp_path / "plan.json"
    r = subprocess.run([sys.executable, "-m", "igi_sdk.cli", "plan", str(tiny_llama), "--vram",
                        "1GiB", "--ctx", "1024", "--profile", str(profile), "--json", str(out)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "chosen:" in r.stdout and "why:" in r.stdout and "layer-offload" in r.stdout
    assert Plan.load(out).gpu_tensors
    r = subprocess.run([sys.executable, "-m", "igi_sdk.cli", "plan", str(tiny_llama), "--vram",
                        "1MiB", "--profile", str(profile)], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "budget_too_small" in r.stderr and "minimum" in r.stderr


def test_a_tied_output_head_is_priced(default_model) -> None:
    """SmolLM2 has no output.weight: the token embedding is its output head, read every token."""
    from igi_sdk.planner import Plan
    from igi_sdk.planner.cost import priced_tensors, ubatch_cost

    inv = read_inventory(default_model)
    assert not any(t.group == "output" for t in inv.tensors)
    heads = [t for t in priced_tensors(inv) if t.group == "output"]
    assert [t.name for t in heads] == ["token_embd.weight"]
    cpu = Profile.model_validate(GPU_PROFILE.model_dump() | {"gpu": None})
    one = ubatch_cost(inv, Plan.all_cpu(), cpu, 1, 64).cpu_s
    head = heads[0].n_bytes / cpu.cpu.rate(heads[0].ggml_type, 1)
    without = ubatch_cost(inv, Plan.all_cpu(), cpu, 1, 64, output_tokens=0).cpu_s
    assert one - without == pytest.approx(head)


def test_models_with_experts_keep_a_larger_margin(tiny_llama, tiny_moe) -> None:
    """The CUDA pool's share for temporaries: 64 MiB for dense models, 128 MiB with routed
    experts (a 30B-A3B plan went over its budget on an H100 with 64 MiB)."""
    from igi_sdk.planner.planner import vram_by_category

    wl = Workload(n_ctx=512)
    plan = Plan(name="cpu-ish", gpu_layers=0, flash_attn="on", n_ubatch=512, op_offload=False)
    dense = vram_by_category(read_inventory(tiny_llama), plan, GPU_PROFILE, wl)
    moe = vram_by_category(read_inventory(tiny_moe), plan, GPU_PROFILE, wl)
    mib = 1024 * 1024
    assert dense["margin"] - int(0.05 * dense["compute"]) == 64 * mib
    assert moe["margin"] - int(0.05 * moe["compute"]) == 128 * mib


# --- pipelined decode (Plan.decode_streamed) ----------------------------------------------------


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory):
    from igi_sdk.model import write_synthetic_gguf

    path = tmp_path_factory.mktemp("h") / "llama3-8b.gguf"
    return read_inventory(write_synthetic_gguf(path, "llama3-8b", data=False))


PIPE_PROFILE = GPU_PROFILE.model_copy(update={"stream_pinned_bps": 50e9,
                                              "stream_cpu_slowdown": 0.25})


def _ffn(inv, layer: int) -> list:
    return [t for t in inv.layer_tensors(layer) if t.group == "ffn_dense"]


def test_a_pipelined_decode_hides_each_streamed_copy_behind_the_cpu_layer_before_it(
        llama8b) -> None:
    from igi_sdk.planner.cost import tensor_seconds, ubatch_cost

    prof = PIPE_PROFILE
    stock = Plan.attention_on_gpu(llama8b)  # every FFN on the CPU, pinned, copy-compute from 32
    odd = range(1, llama8b.arch.n_layers, 2)
    piped = stock.model_copy(update={"decode_streamed": tuple(
        t.name for i in odd for t in _ffn(llama8b, i))})

    def cpu(i: int) -> float:
        return sum(tensor_seconds(t, llama8b, prof, 1, on_gpu=False, copy_compute=False,
                                  pinned=True)[1] for t in _ffn(llama8b, i))

    def copy(i: int) -> float:
        return sum(tensor_seconds(t, llama8b, prof, 1, on_gpu=False, copy_compute=True,
                                  pinned=True)[2] for t in _ffn(llama8b, i))

    a, b = ubatch_cost(llama8b, stock, prof, 1, 1024), ubatch_cost(llama8b, piped, prof, 1, 1024)
    # the streamed layers' bytes leave the CPU and cross PCIe instead
    assert a.cpu_s - b.cpu_s == pytest.approx(sum(cpu(i) for i in odd))
    assert b.copy_s == pytest.approx(sum(copy(i) for i in odd)) and a.copy_s == 0
    # each copy runs while the CPU layer before it computes, that layer slowed by the copy
    assert b.overlap_s == pytest.approx(sum(cpu(i - 1) + copy(i) - max(1.25 * cpu(i - 1), copy(i))
                                            for i in odd))
    assert b.overlap_s > 0.5 * b.copy_s and b.total < 0.8 * a.total
    # (and with twice the CPU slowdown, less of it is hidden)
    slow = ubatch_cost(llama8b, piped, prof.model_copy(update={"stream_cpu_slowdown": 0.5}), 1,
                       1024)
    assert slow.overlap_s < b.overlap_s
    # a prefill streams every CPU-resident weight anyway: priced the same either way
    assert ubatch_cost(llama8b, piped, prof, 512, 0).total == pytest.approx(
        ubatch_cost(llama8b, stock, prof, 512, 0).total)
    # without a GPU nothing streams
    cpu_only = PIPE_PROFILE.model_copy(update={"gpu": None})
    assert ubatch_cost(llama8b, piped, cpu_only, 1, 1024).total == pytest.approx(
        ubatch_cost(llama8b, stock, cpu_only, 1, 1024).total)


def test_the_planner_pipelines_a_decode_only_where_llama_cpp_can(llama8b) -> None:
    import dataclasses

    from igi_sdk.planner.planner import streamed_run_bytes

    wl = Workload(n_ctx=1152, prompt_tokens=1024, gen_tokens=128)
    budget = 2 * 10**9
    stock = plan_for(llama8b, PIPE_PROFILE, budget, wl)
    assert not any(c.plan.decode_streamed for c in stock.candidates)
    res = plan_for(llama8b, PIPE_PROFILE, budget, dataclasses.replace(wl, pipelined=True))
    best = res.best
    assert best.name == "attn-first-pipelined" and best.pinned_host and best.op_offload
    assert best.predicted["turn_s"] < 0.9 * stock.best.predicted["turn_s"]
    streamed = best.streamed_set
    assert streamed and not streamed & best.gpu_set
    layers = sorted({int(n.split(".")[1]) for n in streamed})
    for i in layers:  # whole FFN layers, each after an FFN layer the CPU computes
        assert {t.name for t in _ffn(llama8b, i)} <= streamed
        assert i > 0 and i - 1 not in layers
        assert not any(t.name in best.gpu_set for t in _ffn(llama8b, i - 1))
    # the split that computes a streamed layer holds its weights: in the compute buffer, and
    # the whole plan within the budget
    assert best.vram_bytes["compute"] >= streamed_run_bytes(llama8b, best) > 0
    assert best.vram_bytes["total"] <= budget
    # from memory-mapped host weights a copy cannot run beside the CPU: nothing pipelines
    mapped = plan_for(llama8b, PIPE_PROFILE, budget,
                      dataclasses.replace(wl, pipelined=True, pin_host=False))
    assert not any(c.plan.decode_streamed for c in mapped.candidates)


def test_a_plan_streams_only_pinned_host_weights(llama8b) -> None:
    from pydantic import ValidationError

    names = tuple(t.name for t in _ffn(llama8b, 1))
    plan = Plan(name="p", op_offload=True, pinned_host=True, decode_streamed=names)
    assert Plan.from_json(plan.to_json()) == plan
    with pytest.raises(ValidationError, match="pinned_host"):
        Plan(name="p", op_offload=True, pinned_host=False, decode_streamed=names)
    with pytest.raises(ValidationError, match="gpu_tensors"):
        Plan(name="p", op_offload=True, pinned_host=True, decode_streamed=names,
             gpu_tensors=names[:1])


def test_a_pipelined_plan_runs_on_any_llama_cpp(tiny_llama) -> None:
    # the PyPI wheels carry the stock scheduler: a plan's streamed weights are then computed
    # where the placement puts them, and the plan still loads and answers
    from igi_sdk.runtime import Engine, EngineConfig, SamplingParams, _native

    inv = read_inventory(tiny_llama)
    names = tuple(t.name for t in _ffn(inv, 1))
    assert _native.set_streamed_weights(names) is _native.streams_weights()
    assert _native.set_streamed_weights(()) is True
    stock = Plan.attention_on_gpu(inv)
    piped = stock.model_copy(update={"decode_streamed": names})
    greedy = SamplingParams(temperature=0.0, repeat_penalty=1.0)
    texts = []
    for plan in (stock, piped):
        with Engine(tiny_llama, plan, EngineConfig(n_ctx=256, max_sessions=1,
                                                   n_threads=2)) as e:
            sid = e.open_session(sampling=greedy)
            texts.append(e.chat(sid, "hello there", max_tokens=8, ignore_eos=True).result().text)
    assert all(texts)
    if not _native.streams_weights():  # (a pipelining GPU build computes them on the GPU,
        # whose sums need not round as the CPU's do)
        assert texts[0] == texts[1]


def test_pipelined_plans_never_over_budget_and_more_budget_is_never_slower(llama8b) -> None:
    import dataclasses

    wl = Workload(n_ctx=1152, prompt_tokens=1024, gen_tokens=128, pipelined=True)
    for scale in (1.0, 1.3):  # (a dry run's measured compute scale)
        w = dataclasses.replace(wl, compute_scale=scale)
        lo = plan_for(llama8b, PIPE_PROFILE, 10**12, w).minimum_bytes
        prev = float("inf")
        for k in range(24):
            budget = lo + k * 150_000_000
            best = plan_for(llama8b, PIPE_PROFILE, budget, w).best
            assert best.vram_bytes["total"] <= budget
            assert best.predicted["turn_s"] <= prev * (1 + 1e-9)
            prev = best.predicted["turn_s"]


def test_cli_plan_names_the_layers_a_pipelined_plan_streams(llama8b, tmp_path) -> None:
    import subprocess
    import sys

    profile = tmp_path / "gpu-profile.json"
    profile.write_text(PIPE_PROFILE.model_dump_json())
    out = tmp_path / "plan.json"
    cmd = [sys.executable, "-m", "igi_sdk.cli", "plan", str(llama8b.path), "--vram", "2GB",
           "--ctx", "1152", "--profile", str(profile), "--json", str(out)]
    r = subprocess.run([*cmd, "--pipelined"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    plan = Plan.load(out)
    assert plan.name == "attn-first-pipelined" and plan.decode_streamed
    layers = sorted({int(n.split(".")[1]) for n in plan.decode_streamed})
    assert f"(layers {', '.join(map(str, layers))}) streamed" in r.stdout
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)  # (not that machine)
    assert r.returncode == 0 and "pipelined" not in r.stdout and not Plan.load(out).decode_streamed


def test_only_the_running_models_gpu_placements_name_streamed_weights(tiny_llama) -> None:
    # the names are process-wide: a draft model's load, a dry run, a probe or the CPU placement
    # a reshard keeps open must not take them from the model that decodes
    from igi_sdk.runtime import _native, loader
    from igi_sdk.runtime.devices import Device

    inv = read_inventory(tiny_llama)
    names = tuple(t.name for t in _ffn(inv, 1))
    piped = Plan.attention_on_gpu(inv).model_copy(update={"decode_streamed": names})
    gpu = Device(0, "GPU0", "a GPU", "gpu", 1 << 34, 1 << 34, "CUDA0")
    try:
        loader._name_streamed(piped, gpu)  # the running model's GPU placement
        assert _native.streamed_weights() == names
        loader._name_streamed(Plan.all_cpu(), None)  # a CPU placement beside it
        assert _native.streamed_weights() == names
        settings = loader.ContextSettings(256, 1, 64, 2)
        loader.dry_run(tiny_llama, inv, Plan.attention_on_gpu(inv), settings)  # another plan's
        assert _native.streamed_weights() == names
        drafter = loader.load(tiny_llama, inv, Plan.all_cpu(), settings, names_streamed=False)
        loader.free(drafter)
        assert _native.streamed_weights() == names
        loader._name_streamed(Plan.attention_on_gpu(inv), gpu)  # a GPU placement that streams
        assert _native.streamed_weights() == ()                # nothing clears them
    finally:
        _native.set_streamed_weights(())


def test_a_plan_maps_its_host_weights_where_the_ram_cannot_lock_them(llama8b) -> None:
    from igi_sdk.planner import PIN_RAM_HEADROOM, mapped_where_ram_is_short, pinned_host_bytes

    names = tuple(t.name for t in _ffn(llama8b, 1))
    plan = Plan(name="p", op_offload=True, pinned_host=True, decode_streamed=names,
                gpu_tensors=tuple(t.name for t in llama8b.layer_tensors(0)))
    need = pinned_host_bytes(plan, llama8b)
    assert need == llama8b.total_bytes() - sum(t.n_bytes for t in llama8b.layer_tensors(0))
    assert mapped_where_ram_is_short(plan, llama8b, need + PIN_RAM_HEADROOM) is plan
    assert mapped_where_ram_is_short(plan, llama8b, None) is plan  # unknown: as planned
    short = mapped_where_ram_is_short(plan, llama8b, need + PIN_RAM_HEADROOM - 1)
    # the same rung (name, placement), slower: mapped, nothing streamed
    assert (short.name, short.gpu_tensors) == (plan.name, plan.gpu_tensors)
    assert not short.pinned_host and not short.decode_streamed
    Plan.model_validate(short.model_dump())  # a valid plan
    mapped = Plan(name="m", pinned_host=False)
    assert pinned_host_bytes(mapped, llama8b) == 0
    assert mapped_where_ram_is_short(mapped, llama8b, 0) is mapped
