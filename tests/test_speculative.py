"""Speculative decoding: exact greedy output, the target's distribution when sampling, acceptance
tracking, the draft's vocabulary check, dropping the draft mid-reply, and the planner's pricing."""

from __future__ import annotations

import math
import threading

import llama_cpp
import numpy as np
import pytest

from igi_sdk.errors import DraftMismatchError
from igi_sdk.events import ReplyText
from igi_sdk.model import read_inventory, spec_with, write_synthetic_gguf
from igi_sdk.planner import Plan, Workload
from igi_sdk.planner import speculative as pricing
from igi_sdk.runtime.engine import Engine, EngineConfig
from igi_sdk.runtime.sampling import SamplingParams
from igi_sdk.runtime.speculative import (
    SpeculativeConfig,
    common_prefix,
    speculative_pick,
)
from tests.test_planner import GPU_PROFILE

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
ALWAYS = SpeculativeConfig(k=4, adaptive=False)  # draft every eligible step
LINES = ("Tell me about the sword on the wall.", "And what would it cost me?")


def _config(draft: object = None, spec: SpeculativeConfig = ALWAYS) -> EngineConfig:
    return EngineConfig(n_ctx=1024, max_sessions=3, n_threads=2, prefill_chunk=64,
                        draft_model=str(draft) if draft else None, speculative=spec)


def _dialogue(model, draft, sampling: SamplingParams, *, stop: tuple[str, ...] = (),
              n: int = 24, spec: SpeculativeConfig = ALWAYS, npcs: int = 2) -> tuple[list, dict]:
    """NPCs replying at once (one verify batch holds them all), then a snapshot restored into
    a new session (its draft cache is rebuilt from the tokens) that replies again."""
    with Engine(model, Plan.all_cpu(), _config(draft, spec)) as eng:
        sids = [eng.open_session(f"You are NPC {i}, a blacksmith.", sampling=sampling)
                for i in range(npcs)]
        gens = [eng.chat(sid, LINES[0], max_tokens=n, ignore_eos=True, stop=list(stop))
                for sid in sids]
        out = [g.result(timeout=120) for g in gens]
        again = eng.restore(eng.snapshot(sids[0]))
        out.append(eng.chat(again, LINES[1], max_tokens=n, ignore_eos=True,
                            stop=list(stop)).result(timeout=120))
        return [(r.tokens, r.text, r.finish_reason) for r in out], eng.status()["speculative"]


@pytest.fixture(scope="module")
def synthetic_pair(tmp_path_factory) -> tuple:
    """A target and a draft of the same tokenizer (same n_vocab) with unrelated weights."""
    d = tmp_path_factory.mktemp("pair")
    spec = spec_with("tiny-llama", n_vocab=2048)
    return (write_synthetic_gguf(d / "target.gguf", spec, seed=1),
            write_synthetic_gguf(d / "draft.gguf", spec_with("tiny-llama", n_layers=1),
                                 seed=2))


# ------------------------------------------------------------------------------ greedy exactness


def test_default_model_as_its_own_draft_gives_the_same_greedy_output(default_model) -> None:
    ref, _ = _dialogue(default_model, None, GREEDY)
    got, stats = _dialogue(default_model, default_model, GREEDY)
    assert got == ref
    assert stats["drafted"] > 20
    assert stats["accepted"] / stats["drafted"] > 0.8  # its own draft: (nearly) always right


def test_penalties_and_stop_strings_stay_exact_while_drafting(default_model) -> None:
    """A repeat penalty is applied by the target's own chain as each drafted token is walked;
    a stop string inside a verified run ends the reply where plain decoding would."""
    sampling = SamplingParams(temperature=0.0, repeat_penalty=1.3, repeat_last_n=32)
    ref, _ = _dialogue(default_model, None, sampling)
    text = ref[0][1]
    stop = text[len(text) // 2: len(text) // 2 + 3]  # a piece from the middle of the reply
    ref, _ = _dialogue(default_model, None, sampling, stop=(stop,))
    got, stats = _dialogue(default_model, default_model, sampling, stop=(stop,))
    assert ref[0][2] == "stop_string"
    assert got == ref
    # the draft picks with the session's penalties too: its own draft stays (nearly) right
    assert stats["drafted"] > 0 and stats["accepted"] / stats["drafted"] > 0.8


def test_unrelated_synthetic_draft_is_rarely_right_and_changes_nothing(synthetic_pair) -> None:
    """Random weights flip a greedy choice on any last-bit change, so this is bit-exactness:
    one NPC, as drafts take KV cells beyond the plain layout for a moment, which can change
    how attention is blocked over the cells (docs/architecture.md, "Speculative decoding")."""
    target, draft = synthetic_pair
    ref, _ = _dialogue(target, None, GREEDY, n=32, npcs=1)
    got, stats = _dialogue(target, draft, GREEDY, n=32, npcs=1)
    assert got == ref
    assert stats["drafted"] > 30
    assert stats["accepted"] / stats["drafted"] < 0.3


# ------------------------------------------------------------------------------ sampled drafting


def test_speculative_pick_keeps_the_target_distribution() -> None:
    """Draft from q, keep or resample against p: the result is distributed as p (chi-square,
    p-value far below any flake), including tokens q never proposes and q's tokens p refuses."""
    rng = np.random.default_rng(5)
    p = np.array([0.30, 0.25, 0.15, 0.10, 0.10, 0.06, 0.04, 0.0])
    q = np.array([0.05, 0.40, 0.0, 0.20, 0.05, 0.10, 0.05, 0.15])
    n = 40_000
    counts = np.zeros(len(p))
    kept = 0
    for _ in range(n):
        x = int(rng.choice(len(q), p=q))
        tok, was_kept = speculative_pick(p, q, x, rng)
        counts[tok] += 1
        kept += was_kept
    assert counts[7] == 0  # p(7) = 0: never produced, though q proposes it
    live = p > 0
    chi2 = float((((counts - n * p) ** 2)[live] / (n * p[live])).sum())
    assert chi2 < 29.9  # chi-square, 6 degrees of freedom: P(> 29.9) < 1e-4
    # acceptance is sum(min(p, q)) in expectation
    assert abs(kept / n - np.minimum(p, q).sum()) < 0.02


def test_chain_distribution_is_what_the_chain_samples(synthetic_pair) -> None:
    """The distribution the verifier uses (the chain's transforms read back) matches the
    chain's own draws at the same logits."""
    import llama_cpp

    from igi_sdk.runtime import loader
    from igi_sdk.runtime.loader import ContextSettings
    from igi_sdk.runtime.sampling import SamplerChain

    target, _ = synthetic_pair
    inv = read_inventory(target)
    loaded = loader.load(target, inv, Plan.all_cpu(), ContextSettings(256, 1, 64, 2))
    try:
        vocab = llama_cpp.llama_model_get_vocab(loaded.model)
        n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        batch = llama_cpp.llama_batch_get_one((llama_cpp.llama_token * 3)(5, 77, 300), 3)
        assert llama_cpp.llama_decode(loaded.ctx, batch) == 0
        params = SamplingParams(temperature=1.5, top_k=30, top_p=0.9, min_p=0.02,
                                repeat_penalty=1.0, seed=3)
        chain = SamplerChain(params, vocab, grammar=None, history=[], reply_tokens=[])
        try:
            p = chain.distribution(loaded.ctx, -1, n_vocab)
            n = 6_000
            counts = np.bincount([chain.sample(loaded.ctx, -1, step) for step in range(n)],
                                 minlength=n_vocab)
        finally:
            chain.close()
    finally:
        loader.free(loaded)
    assert abs(p.sum() - 1.0) < 1e-9
    assert 1 < np.count_nonzero(p) <= 30
    assert counts[p == 0].sum() == 0  # the chain never draws what the read-back excludes
    live = p > 0
    chi2 = float((((counts - n * p) ** 2)[live] / (n * p[live])).sum())
    df = int(live.sum()) - 1
    assert chi2 < df + 6 * math.sqrt(2 * df)  # mean df, sd sqrt(2 df): a 6-sigma bound


def test_sampled_sessions_draft_and_finish(default_model) -> None:
    sampling = SamplingParams(temperature=0.8, seed=11)
    got, stats = _dialogue(default_model, default_model, sampling)
    assert all(len(tokens) == 24 for tokens, _, _ in got)
    assert stats["drafted"] > 0 and stats["accepted"] > 0


# ------------------------------------------------------------------------------ tracking


def test_engine_stops_drafting_where_the_draft_loses(synthetic_pair) -> None:
    target, draft = synthetic_pair
    spec = SpeculativeConfig(k=4, warmup_steps=1, reprobe_after=10_000)
    with Engine(target, Plan.all_cpu(), _config(draft, spec)) as eng:
        sid = eng.open_session("You are a guard.", sampling=GREEDY)
        eng.chat(sid, LINES[0], max_tokens=64, ignore_eos=True).result(timeout=120)
        stats = eng.status()["speculative"]
        per_session = eng.session_info()[sid]["draft"]
    assert per_session["drafting"] is False
    # unpriced (no profile): it drafts to measure, then the measured costs and α switch it off
    assert 0 < stats["drafted"] <= 4 * 20


def test_common_prefix() -> None:
    assert common_prefix([1, 2, 3], [1, 2, 3, 4]) == 3
    assert common_prefix([1, 2, 3], [1, 9, 3]) == 1
    assert common_prefix([], [1]) == 0
    assert common_prefix(list(range(1000)), [*range(700), -1]) == 700


# ------------------------------------------------------------------------------ the draft model


def test_draft_with_another_vocabulary_is_refused(tmp_path, synthetic_pair) -> None:
    target, _ = synthetic_pair
    other = write_synthetic_gguf(tmp_path / "other.gguf", spec_with("tiny-llama", n_vocab=1024))
    with pytest.raises(DraftMismatchError):
        Engine(target, Plan.all_cpu(), _config(other))


def test_drop_draft_mid_reply_keeps_the_stream_and_its_output(default_model) -> None:
    with Engine(default_model, Plan.all_cpu(), _config()) as eng:
        sid = eng.open_session("You are a baker.", sampling=GREEDY)
        ref = eng.chat(sid, LINES[0], max_tokens=40, ignore_eos=True).result(timeout=120)
    with Engine(default_model, Plan.all_cpu(), _config(default_model)) as eng:
        sid = eng.open_session("You are a baker.", sampling=GREEDY)
        dropped: list = []
        seen = threading.Event()

        def listener(event: object) -> None:
            drafted = eng.status()["speculative"]["drafted"]
            if isinstance(event, ReplyText) and not dropped and drafted > 8:
                dropped.append(eng.drop_draft_async())  # queued: runs between two steps
                seen.set()

        got = eng.chat(sid, LINES[0], max_tokens=40, ignore_eos=True,
                       listener=listener).result(timeout=120)
        # the listener runs on the outbox thread: it may still be behind the reply's result
        assert seen.wait(30) and dropped[0].result(timeout=30) is True
        assert eng.status()["speculative"]["draft"] is None
        assert eng.drop_draft() is False
        assert len(got.tokens) == 40
        assert got.tokens == ref.tokens and got.text == ref.text
        # and the engine goes on without it
        more = eng.chat(sid, LINES[1], max_tokens=4).result(timeout=120)
        assert more.completion_tokens >= 1


# ------------------------------------------------------------------------------ planner pricing


MIB = 1 << 20


@pytest.fixture(scope="module")
def priced_pair(tmp_path_factory) -> tuple:
    d = tmp_path_factory.mktemp("priced")
    target = write_synthetic_gguf(d / "t.gguf", spec_with(
        "tiny-llama", n_layers=8, n_embd=1024, n_ff=4096, n_vocab=4096))
    draft = write_synthetic_gguf(d / "d.gguf", spec_with("tiny-llama", n_vocab=4096))
    return read_inventory(target), read_inventory(draft)


def test_expected_tokens_and_break_even() -> None:
    assert pricing.expected_tokens_per_pass(0.0, 4) == 1.0
    assert pricing.expected_tokens_per_pass(1.0, 4) == 5.0
    assert pricing.expected_tokens_per_pass(0.5, 2) == pytest.approx(1.75)
    a = pricing.break_even_alpha(4, plain_s=1.0, verify_s=1.1, draft_s=0.1)
    assert pricing.expected_tokens_per_pass(a, 4) == pytest.approx(1.5, rel=1e-6)
    assert pricing.break_even_alpha(4, plain_s=1.0, verify_s=1.0, draft_s=2.0) == math.inf
    assert pricing.break_even_alpha(4, plain_s=1.0, verify_s=0.5, draft_s=0.1) == 0.0


def test_draft_pricing_never_exceeds_the_budget_and_wants_acceptance(priced_pair) -> None:
    target, draft = priced_pair
    wl = Workload(n_ctx=2048, prompt_tokens=512, gen_tokens=64)
    dv = pricing.draft_vram(draft, wl, 4)
    assert dv.weights > 0 and dv.kv > 0 and dv.compute > 0
    lo = pricing.plan_for(target, GPU_PROFILE, 10**12, wl).minimum_bytes
    chosen = []
    for budget in (lo, lo + dv.total // 2, lo + dv.total + target.total_bytes() // 3,
                   lo + 2 * target.total_bytes()):
        for alpha in (0.0, 0.9):
            c = pricing.choose(target, draft, GPU_PROFILE, budget, k=4, alpha=alpha, wl=wl)
            assert c.vram_total <= budget
            if c.use_draft:
                assert c.speculative_plan is not None
                assert c.speculative_plan.vram_bytes["total"] + dv.total <= budget
                assert c.speculative_tps > c.plain_tps
                chosen.append(budget)
            if alpha == 0.0:
                assert not c.use_draft  # one token per pass, plus the draft's work
    assert lo not in chosen  # the draft does not fit the smallest budget
    assert chosen  # and pays somewhere at α = 0.9 (a partly CPU-resident target)


def test_a_drafting_workload_lets_its_verify_batch_stream(priced_pair) -> None:
    """The copy-compute threshold's floor is one more than a step's logits rows, so that the
    rare step of every session never stages a CPU-resident output head; a session's verify
    batch is no rare step, so with drafts the floor is that batch: where the cost model prices
    a streamed k + 1-token batch cheaper than the CPU's, the drafting plan streams it."""
    from igi_sdk.planner.planner import copy_threshold

    plain = Workload(n_ctx=2048, n_outputs=8)
    assert plain.threshold_floor == 9
    assert Workload(n_ctx=2048, n_outputs=40, draft_k=4).threshold_floor == 5
    assert Workload(n_ctx=2048, n_outputs=2, draft_k=4).threshold_floor == 3
    with pytest.raises(ValueError):
        Workload(draft_k=-1)
    target, draft = priced_pair
    # a machine whose link streams fast: a batch of two tokens already streams cheaper
    fast = GPU_PROFILE.model_copy(update={"stream_pinned_bps": 1e12, "h2d_pinned_bps": 1e12})
    assert copy_threshold(target, fast, True, 2) == 2
    wl = Workload(n_ctx=2048, prompt_tokens=512, gen_tokens=64)
    k = 4
    budget = pricing.plan_for(target, fast, 10**12, wl).minimum_bytes \
        + target.total_bytes() // 2
    c = pricing.choose(target, draft, fast, budget, k=k, alpha=0.9, wl=wl)
    spec = c.speculative_plan
    assert spec is not None and spec.op_offload
    assert spec.copy_compute_min_batch == k + 1  # the verify streams (it was k + 2)
    assert c.vram_total <= budget  # a staged output head counted
    assert EngineConfig(draft_model="d.gguf").drafts_per_step == 4
    assert EngineConfig().drafts_per_step == 0


# ------------------------------------------------------------------------------ command line


def test_chat_with_a_draft_says_the_same_greedy_line(default_model, capsys) -> None:
    from igi_sdk import cli

    def say(*extra: str) -> str:
        assert cli.main(["chat", "Hello there, smith.", "--plan", "all-cpu", "--temperature",
                         "0", "--max-tokens", "12", "--threads", "2", *extra]) == 0
        return capsys.readouterr().out

    assert say("--draft", str(default_model), "--draft-k", "3") == say()


def test_plan_shows_the_draft_decision(priced_pair, tmp_path, capsys) -> None:
    from igi_sdk import cli

    target, draft = priced_pair
    prof = tmp_path / "profile.json"
    prof.write_text(GPU_PROFILE.model_dump_json())
    assert cli.main(["plan", str(target.path), "--vram", "600MiB", "--ctx", "2048",
                     "--profile", str(prof), "--draft", str(draft.path), "--alpha", "0.8"]) == 0
    out = capsys.readouterr().out
    assert "tokens per target pass at α=0.80" in out and "speculative: yes" in out


def test_sidecar_host_loads_the_draft_with_the_model(default_model) -> None:
    from igi_sdk.sidecar.host import HostConfig, ModelHost
    from igi_sdk.wire import protocol as P

    host = ModelHost(HostConfig(n_threads=2, arbiter=False, draft_model=default_model,
                                draft_k=2))
    host.load_model(default_model, P.LoadModel(path=default_model.name, n_ctx=512,
                                               max_sessions=2))
    try:
        assert host.engine is not None
        status = host.engine.status()["speculative"]
        assert status["draft"] == str(default_model) and status["k"] == 2
    finally:
        host.engine.close()


def test_arbiter_drops_the_draft_first_when_the_game_needs_memory(tmp_path) -> None:
    from igi_sdk.arbiter import Arbiter, PlanLadder, PolicyConfig, ScriptedTrace

    path = write_synthetic_gguf(tmp_path / "m.gguf", spec_with(
        "tiny-llama", n_layers=4, n_embd=256, n_ff=1024))
    wl = Workload(n_ctx=1024, prompt_tokens=256, gen_tokens=64)
    ladder = PlanLadder.build(read_inventory(path), GPU_PROFILE, wl, step=8 * MIB)
    top = ladder.rungs[-1]
    cfg = EngineConfig(n_ctx=1024, max_sessions=2, n_threads=2, draft_model=str(path))
    with Engine(path, top.plan, cfg) as eng:
        total = top.vram + 64 * MIB + 256 * MIB
        t = [0.0]
        trace = ScriptedTrace(total, [(0.0, 0), (1.0, total), (2.0, 0)],
                              own=lambda: arb.policy.current.vram, clock=lambda: t[0])
        arb = Arbiter(eng, ladder, [trace], config=PolicyConfig(headroom=64 * MIB),
                      clock=lambda: t[0])
        assert arb.policy.current is top
        arb.tick()
        assert eng.status()["speculative"]["draft"] is not None  # no pressure: kept
        t[0] = 1.0
        decision = arb.tick()
        assert decision is not None and decision.action in ("shrink", "fast_shrink")
        assert eng.status()["speculative"]["draft"] is None
        # the game lets go: once the budget has held, the model grows back and the draft
        # comes with it (every GPU rung counts it), and replies draft again
        sid = eng.open_session("You are a guard.", sampling=GREEDY)
        t[0] = 2.0
        while t[0] < 6.0 and eng.status()["speculative"]["draft"] is None:
            arb.tick()
            t[0] += 0.5
        assert eng.status()["speculative"]["draft"] is not None
        assert arb.policy.current is not ladder.cpu
        before = eng.status()["speculative"]["drafted"]
        eng.chat(sid, LINES[0], max_tokens=16, ignore_eos=True).result(timeout=120)
        assert eng.status()["speculative"]["drafted"] > before


def test_reshard_mid_reply_with_a_draft_changes_nothing(default_model) -> None:
    """The draft's cache is its own: a reshard parks and restores the model's state only, and
    the reply goes on drafting with the same tokens."""
    def reply(draft, reshard: bool) -> tuple:
        with Engine(default_model, Plan.all_cpu(), _config(draft)) as eng:
            sid = eng.open_session("You are a guard.", sampling=GREEDY)
            gen = eng.chat(sid, LINES[0], max_tokens=32, ignore_eos=True)
            for i, _piece in enumerate(gen):
                if reshard and i == 3:
                    eng.reshard(Plan.all_cpu())
            res = gen.result(timeout=120)
            return res.tokens, eng.status()["speculative"]["drafted"]

    ref, _ = reply(None, False)
    got, drafted = reply(default_model, True)
    assert got == ref and drafted > 0


def test_grammar_replies_are_not_drafted_and_unchanged(default_model) -> None:
    schema = {"type": "object", "properties": {"mood": {"type": "string"}},
              "required": ["mood"]}

    def reply(draft) -> tuple:
        with Engine(default_model, Plan.all_cpu(), _config(draft)) as eng:
            sid = eng.open_session("You are a guard.", sampling=GREEDY)
            res = eng.chat(sid, "How are you?", max_tokens=24,
                           json_schema=schema).result(timeout=120)
            return res.text, eng.status()["speculative"]["drafted"]

    ref, _ = reply(None)
    got, drafted = reply(default_model)
    assert got == ref and drafted == 0


def test_a_draft_takes_its_vram_from_the_targets_budget(default_model, monkeypatch) -> None:
    """With an explicit budget the target is planned on the one budget path with the draft's
    price beside it (fails before: the target got the whole budget and the draft came on top);
    a budget the draft leaves too little of is a typed error that names the draft."""
    from igi_sdk.errors import BudgetTooSmallError
    from igi_sdk.planner import PlanResult
    from igi_sdk.sidecar import host as host_module
    from igi_sdk.sidecar.host import HostConfig, ModelHost
    from igi_sdk.tuning.autoplan import Beside, BudgetPlanner, draft_bytes
    from igi_sdk.wire import protocol as P

    calls: list[tuple[int, Beside]] = []

    def fake_plan(path, inv, *, budget, beside, **kw):
        calls.append((budget, beside))
        return PlanResult(Plan.all_cpu(), [], budget, 0)

    monkeypatch.setattr(host_module, "plan_for_model", fake_plan)
    request = P.LoadModel(path=default_model.name, n_ctx=512, max_sessions=2,
                          vram_budget=2 * 1024**3)
    drafted = draft_bytes(default_model, 512, 2, 2)
    assert drafted > 0
    host = ModelHost(HostConfig(n_threads=2, arbiter=False, draft_model=default_model,
                                draft_k=2))
    host.load_model(default_model, request)
    try:
        assert calls == [(2 * 1024**3, Beside(draft=drafted))]
    finally:
        assert host.engine is not None
        host.engine.close()
    # the budget path (the planner's estimate on a GPU profile): the target gets what the draft
    # leaves, and a budget the draft leaves too little of names it
    inv = read_inventory(default_model)
    wl = Workload(n_ctx=512)
    alone = BudgetPlanner(inv, GPU_PROFILE, wl)(2 * 1024**3)
    beside = BudgetPlanner(inv, GPU_PROFILE, wl, beside=Beside(draft=drafted))
    assert beside(2 * 1024**3).best.vram_bytes["total"] <= 2 * 1024**3
    assert beside(2 * 1024**3).minimum_bytes == alone.minimum_bytes + drafted
    with pytest.raises(BudgetTooSmallError, match="draft model and the vision encoder"):
        beside(drafted + 1024)


def test_ladder_rungs_on_the_gpu_count_the_draft(tiny_llama) -> None:
    from igi_sdk.arbiter.ladder import PlanLadder, arbiter_workload
    from igi_sdk.tuning.autoplan import Beside, BudgetPlanner

    inv, wl = read_inventory(tiny_llama), arbiter_workload(512)
    plain = PlanLadder.build(inv, GPU_PROFILE, wl)
    drafted = PlanLadder.build(inv, GPU_PROFILE, wl, planner=BudgetPlanner(
        inv, GPU_PROFILE, wl, beside=Beside(draft=100 * 1024 * 1024)))
    assert drafted.cpu.vram == plain.cpu.vram
    assert [r.vram - 100 * 1024 * 1024 for r in drafted.rungs[1:]] == \
        [r.vram for r in plain.rungs[1:]]
    assert all(r.plan.vram_bytes["draft"] == 100 * 1024 * 1024 for r in drafted.rungs[1:])


def test_a_same_size_draft_on_the_cpu_does_no_draft_work(default_model) -> None:
    """The default model drafting for itself on the CPU cannot pay (a draft decode reads as
    many weights as a plain step): decided from the first plain steps, so nothing is drafted
    and the draft never decodes, and the greedy line is the one without a draft."""
    spec = SpeculativeConfig(k=4)  # adaptive, no profile
    ref, _ = _dialogue(default_model, None, GREEDY, spec=spec, npcs=1)
    with Engine(default_model, Plan.all_cpu(), _config(default_model, spec)) as eng:
        drafter = eng._drafting.drafter
        assert drafter is not None
        calls = []
        real = drafter.propose
        drafter.propose = lambda *a, **k: calls.append(1) or real(*a, **k)  # type: ignore[method-assign]
        sid = eng.open_session("You are NPC 0, a blacksmith.", sampling=GREEDY)
        got = eng.chat(sid, LINES[0], max_tokens=24, ignore_eos=True).result(timeout=120)
        stats = eng.status()["speculative"]
    assert got.tokens == ref[0][0]
    assert stats["drafted"] == 0 and calls == []


def test_the_draft_never_runs_more_threads_than_the_target(default_model) -> None:
    """The target's count follows the cores the game leaves; the draft decodes on the same
    thread in turn and follows it: with more threads it would spin or stall beside the game."""
    cfg = EngineConfig(n_ctx=1024, max_sessions=2, n_threads=2, adapt_threads=True,
                       prefill_chunk=64, draft_model=str(default_model), speculative=ALWAYS)
    with Engine(default_model, Plan.all_cpu(), cfg) as eng:
        eng.report_game_cpu(busy_threads=8, cpu_share=None)  # the game holds every core
        sid = eng.open_session("You are a guard.", sampling=GREEDY)
        eng.chat(sid, LINES[0], max_tokens=16, ignore_eos=True).result(timeout=120)
        target = eng._core.threads.count
        drafter = eng._drafting.drafter
        assert drafter is not None
        draft = llama_cpp.llama_n_threads(drafter._ctx)
        assert eng.status()["speculative"]["drafted"] > 0
    assert target == 1
    assert draft == target
