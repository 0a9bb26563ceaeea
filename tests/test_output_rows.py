"""Logits rows per decode step (llama.cpp's n_outputs_max): the compute buffers are sized for the
rows the engine asks for, not for a whole ubatch of them, and the planner accounts the same."""

from __future__ import annotations

import dataclasses

import pytest

from igi_sdk.model import read_inventory
from igi_sdk.planner import Plan, Workload, plan_for
from igi_sdk.planner.planner import compute_buffer_estimate, copy_threshold
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams, loader
from igi_sdk.runtime.speculative import SpeculativeConfig
from tests.test_planner import GPU_PROFILE

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)


def _compute_bytes(path, inv, settings) -> int:
    plan = Plan(name="cpu", gpu_layers=0, kv_on_gpu=False, op_offload=False,
                flash_attn="on", n_ubatch=512)
    loaded = loader.load(path, inv, plan, settings)
    try:
        return sum(loaded.report.compute_buffers.values())
    finally:
        loader.free(loaded)


@pytest.fixture(scope="module")
def big_head(tmp_path_factory):
    """A model whose output head and logits dwarf its activations (the 128K-vocabulary case)."""
    from igi_sdk.model import spec_with, write_synthetic_gguf

    return write_synthetic_gguf(tmp_path_factory.mktemp("m") / "head.gguf",
                                spec_with("tiny-llama", n_vocab=32000))


@pytest.fixture(scope="module")
def big_head_inventory(big_head):
    return read_inventory(big_head)


def test_compute_buffer_holds_the_rows_asked_for_not_a_ubatch_of_logits(big_head) -> None:
    """Real llama.cpp (CPU): with one logits row per session the compute buffer is smaller by
    the logits of the rest of the ubatch than with llama.cpp's default (a row per token):
    7 MB against 67 MB here."""
    inv = read_inventory(big_head)
    one = _compute_bytes(big_head, inv, loader.ContextSettings(512, 1, 512, 1))
    many = _compute_bytes(big_head, inv, loader.ContextSettings(512, 1, 512, 1, n_outputs=512))
    logits_row = inv.arch.n_vocab * 4
    assert many - one >= 400 * logits_row, (one, many)


def test_context_params_ask_for_one_row_per_session_at_least() -> None:
    plan = Plan.all_cpu()
    assert loader.context_params(plan, loader.ContextSettings(256, 4, 64, 1), None
                                 ).n_outputs_max == 4
    assert loader.context_params(plan, loader.ContextSettings(256, 4, 64, 1, n_outputs=20), None
                                 ).n_outputs_max == 20


def test_engine_rows_cover_every_session_and_its_drafts(tmp_path) -> None:
    cfg = EngineConfig(max_sessions=3)
    assert cfg.outputs_per_step == 3
    drafting = dataclasses.replace(cfg, draft_model=str(tmp_path / "d.gguf"),
                                   speculative=SpeculativeConfig(k=4))
    assert drafting.outputs_per_step == 15


def test_drafting_sessions_decode_within_the_rows_the_context_holds(tiny_llama) -> None:
    """Two sessions drafting k=4 each fill the step's logits rows exactly (llama.cpp aborts the
    process past n_outputs_max): replies come back whole and identical to undrafted ones."""
    cfg = EngineConfig(n_ctx=512, max_sessions=2, n_threads=1, prefill_chunk=64)
    spec = dataclasses.replace(cfg, draft_model=str(tiny_llama),
                               speculative=SpeculativeConfig(k=4, adaptive=False))

    def replies(config: EngineConfig) -> list[str]:
        with Engine(tiny_llama, Plan.all_cpu(), config) as eng:
            sids = [eng.open_session(f"NPC {i}.", sampling=GREEDY) for i in range(2)]
            futures = [eng.chat_async(s, "Hello there.", max_tokens=12, ignore_eos=True)
                       for s in sids]
            return [f.result(timeout=60).result(timeout=120).text for f in futures]

    drafted = replies(spec)
    assert all(drafted) and drafted == replies(cfg)


def test_estimate_stages_the_head_only_when_its_rows_reach_the_threshold(
        big_head_inventory) -> None:
    inv = big_head_inventory
    head = max(t.n_bytes for t in inv.tensors if t.group == "output")
    rest = max(t.n_bytes for t in inv.tensors if t.group not in ("output", "token_embd"))
    plan = Plan(name="attn-first-copy", gpu_layers=0, flash_attn="on", n_ubatch=512,
                op_offload=True, copy_compute_min_batch=4)
    one = compute_buffer_estimate(inv, plan, Workload(n_ctx=512))
    eight = compute_buffer_estimate(inv, plan, Workload(n_ctx=512, n_outputs=8))
    # eight rows reach the threshold: the head is the largest weight staged, its logits on the GPU
    assert eight - one == head - rest + 8 * inv.arch.n_vocab * 4


def test_threshold_stays_above_the_decode_rows(big_head_inventory) -> None:
    inv = big_head_inventory
    free = copy_threshold(inv, GPU_PROFILE)
    assert copy_threshold(inv, GPU_PROFILE, at_least=free + 3) == free + 3
    assert copy_threshold(inv, GPU_PROFILE, at_least=1) == free
    wl = Workload(n_ctx=512, n_outputs=2 * free)
    lo = plan_for(inv, GPU_PROFILE, 10**12, wl).minimum_bytes
    copy_plans = [c.plan for i in range(8)
                  for c in plan_for(inv, GPU_PROFILE, lo + i * 2 * 1024**2, wl).candidates
                  if c.plan.name.startswith("attn-first-copy")]
    assert copy_plans
    assert all(p.copy_compute_min_batch == 2 * free + 1 for p in copy_plans)


def test_dry_run_slack_goes_to_weights(monkeypatch, big_head, big_head_inventory) -> None:
    """A dry run that measures half the compute estimate re-plans with the measured scale: more
    weights in VRAM, still within the budget by the second dry run; and a second dry run that
    would not fit keeps the first plan."""
    from igi_sdk.tuning import autoplan

    inv = big_head_inventory
    wl = Workload(n_ctx=512, prompt_tokens=256, gen_tokens=32)
    lo = plan_for(inv, GPU_PROFILE, 10**12, wl).minimum_bytes
    budget = lo + inv.total_bytes() // 3
    first = plan_for(inv, GPU_PROFILE, budget, wl).best
    monkeypatch.setattr(autoplan.loader, "first_gpu", lambda: object())
    calls: list[Plan] = []
    overshoot = {"by": 0}

    def fake_measure(path, inv_, plan, prof, wl_, settings, measure=None):
        calls.append(plan)
        vram = dict(plan.vram_bytes)
        measured = int(compute_buffer_estimate(inv_, plan, wl) * 0.5)
        total = vram["total"] - vram["compute"] + measured
        if len(calls) > 1:
            total += overshoot["by"]
        return dict(vram, compute=measured, total=total), measured

    monkeypatch.setattr(autoplan, "measured_vram", fake_measure)
    settings = loader.ContextSettings(512, 1, 512, 1)
    got = autoplan.plan_checked(big_head, inv, GPU_PROFILE, budget, wl, settings).best
    assert len(calls) == 2 and len(got.gpu_tensors) > len(first.gpu_tensors)
    assert got.vram_bytes["total"] <= budget

    calls.clear()
    overshoot["by"] = budget  # the re-planned placement's own dry run does not fit
    kept = autoplan.plan_checked(big_head, inv, GPU_PROFILE, budget, wl, settings).best
    assert len(calls) == 2 and kept.gpu_tensors == first.gpu_tensors
