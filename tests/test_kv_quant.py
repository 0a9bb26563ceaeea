"""KV-cache quantization as a planner lever: the plan carries ``type_k`` /
``type_v`` through JSON, llama.cpp really stores the cache that way (read back from its own
buffer report), and the planner chooses q8_0 only with flash attention and every layer's KV in
VRAM, never for a predicted gain under ``KV_QUANT_MIN_GAIN``, and not at all when told not to."""

from __future__ import annotations

import pytest

from igi_sdk.model import read_inventory
from igi_sdk.planner import Plan, Workload, plan_for
from igi_sdk.planner.cost import kv_gpu_layers, quantized_kv
from igi_sdk.planner.planner import KV_QUANT, KV_QUANT_MIN_GAIN
from igi_sdk.runtime import loader
from tests.test_planner import GPU_PROFILE

MIB = 1024 * 1024


def test_kv_type_round_trips_through_plan_json(tmp_path) -> None:
    plan = Plan(name="q8", flash_attn="on", type_k="q8_0", type_v="q8_0", gpu_layers=0)
    path = tmp_path / "plan.json"
    plan.save(path)
    back = Plan.load(path)
    assert (back.type_k, back.type_v, back.flash_attn) == ("q8_0", "q8_0", "on")
    assert back == plan


@pytest.mark.parametrize("kv", ["f16", "q8_0"])
def test_llama_cpp_stores_the_kv_cache_as_planned(tiny_llama, kv) -> None:
    """CPU only: the KV buffer llama.cpp reports after loading has the size of ``kv`` cells."""
    inv = read_inventory(tiny_llama)
    plan = Plan(name=f"cpu-{kv}", gpu_layers=0, kv_on_gpu=False, op_offload=False,
                flash_attn="on", type_k=kv, type_v=kv)
    n_ctx = 512
    loaded = loader.load(tiny_llama, inv, plan, loader.ContextSettings(n_ctx, 1, 512, 1))
    try:
        reported = sum(loaded.report.kv_buffers.values())
    finally:
        loader.free(loaded)
    expected = inv.kv_bytes(n_ctx, kv, kv, swa_full=True)
    assert abs(reported - expected) <= 0.01 * MIB, (reported, expected)
    if kv != "f16":
        assert reported < 0.6 * inv.kv_bytes(n_ctx, "f16", "f16", swa_full=True)


def _plans(inv, wl: Workload):
    lo = plan_for(inv, GPU_PROFILE, 10**12, wl).minimum_bytes
    hi = lo + inv.total_bytes() * 3 + inv.kv_bytes(wl.n_ctx)
    for i in range(16):
        yield plan_for(inv, GPU_PROFILE, lo + (hi - lo) * i // 15, wl)


def test_planner_chooses_q8_0_only_with_every_layer_kv_in_vram(tiny_llama) -> None:
    inv = read_inventory(tiny_llama)
    wl = Workload(n_ctx=8192, prompt_tokens=512, gen_tokens=64, kv_quant=True)
    chosen = set()
    for res in _plans(inv, wl):
        for c in res.candidates:
            if quantized_kv(c.plan):
                assert c.plan.flash_attn == "on" and c.plan.type_k == c.plan.type_v == KV_QUANT
                assert len(kv_gpu_layers(inv, c.plan, True)) == inv.arch.n_layers, c.plan.name
        best = res.best
        chosen.add(best.type_k)
        if quantized_kv(best):
            f16 = [c for c in res.candidates if c.fits and not quantized_kv(c.plan)]
            assert best.predicted["turn_s"] < min(c.score for c in f16) * (1 - KV_QUANT_MIN_GAIN)
    assert "q8_0" in chosen  # at a long context the freed VRAM buys the weights' place


def test_planner_keeps_f16_kv_unless_asked(tiny_llama) -> None:
    inv = read_inventory(tiny_llama)
    wl = Workload(n_ctx=8192, prompt_tokens=512, gen_tokens=64)  # the default: f16 only
    for res in _plans(inv, wl):
        assert not any(quantized_kv(c.plan) for c in res.candidates)


def test_a_save_from_a_q8_0_cache_restores_on_an_f16_one(tmp_path) -> None:
    """A player's save game outlives the plan it was made on (another budget, another KV
    format): the conversation comes back and is read again, instead of being refused."""
    from igi_sdk.runtime import Engine, EngineConfig, SamplingParams

    greedy = SamplingParams(temperature=0.0, repeat_penalty=1.0)
    cfg = EngineConfig(n_ctx=1024, max_sessions=2, n_threads=2)
    q8 = Plan(name="q8", flash_attn="on", type_k="q8_0", type_v="q8_0", gpu_layers=0)
    with Engine(None, q8, cfg) as eng:
        sid = eng.open_session("You are Mira, an innkeeper.", sampling=greedy)
        eng.chat(sid, "My name is Arin. Remember it.", max_tokens=8).result(timeout=120)
        eng.save_session(sid, tmp_path / "mira.igisession")
    with Engine(None, Plan.all_cpu(), cfg) as eng:
        sid = eng.load_session(tmp_path / "mira.igisession")
        res = eng.chat(sid, "What is my name?", max_tokens=8).result(timeout=120)
        # the whole conversation was read again: far more than this line's tokens
        assert res.prompt_tokens > 30
        info = eng.session_info()[sid]
        assert info["tokens"] >= res.prompt_tokens
