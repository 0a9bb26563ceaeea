"""Reshards behind the decode: with the CPU placement kept open as a standby, the GPU placement
is given back at once, the sessions keep decoding on the standby while the next placement loads
on a loader thread, and they switch over at a step boundary (runtime/background_load.py)."""

from __future__ import annotations

import threading
import time

import pytest

from igi_sdk.model import read_inventory, spec_with, write_synthetic_gguf
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams, loader

NPC = "You are Brom, a blacksmith in a small mountain village."


@pytest.fixture(scope="module")
def npc_model(tmp_path_factory: pytest.TempPathFactory):
    # random weights make every choice sensitive to the last bit of the logits
    return write_synthetic_gguf(tmp_path_factory.mktemp("standby") / "npc.gguf", spec_with(
        "tiny-llama", n_layers=8, n_embd=1024, n_ff=4096, n_vocab=4096))


def _cfg(standby: Plan | None) -> EngineConfig:
    # the thread count held: one that follows the host's load changes the logits' last bits
    # (EngineConfig.exact_threads), and seeded replies are compared token for token
    return EngineConfig(n_ctx=1024, max_sessions=4, n_threads=2, prefill_chunk=32,
                        exact_threads=True, standby=standby)


def _wait_standby(eng: Engine, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not eng.standby_ready:
        assert time.monotonic() < end, "the standby placement never opened"
        time.sleep(0.02)


def _slow_loads(monkeypatch: pytest.MonkeyPatch, seconds: float,
                started: threading.Event | None = None) -> None:
    """Every load of a plan with GPU tensors takes ``seconds`` more (as an 8B's does on a GPU
    host), cancellable as llama.cpp's is, between tensors."""
    real = loader.load

    def slow(path, inv, plan, settings, **kw):
        if plan.gpu_tensors:
            if started is not None:
                started.set()
            cancelled = kw.get("cancelled")
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                if cancelled is not None and cancelled():
                    raise loader.LoadCancelledError(f"loading plan '{plan.name}' was cancelled")
                time.sleep(0.01)
        return real(path, inv, plan, settings, **kw)

    monkeypatch.setattr(loader, "load", slow)


def test_replies_keep_streaming_while_the_next_placement_loads(npc_model, monkeypatch) -> None:
    """Two NPCs talk through a move to another placement whose load takes 1.5 s: tokens keep
    coming while it loads (the old engine stopped every reply for the whole load), nothing
    fails, and every token is the one a run without the move gives (CPU to CPU)."""
    inv = read_inventory(npc_model)
    gpu = Plan.attention_on_gpu(inv)  # loads on the CPU here; its load is made slow below
    sampling = [SamplingParams(temperature=0.9, seed=s) for s in (3, 4)]
    lines = ["Tell me about the forest.", "What news from the north road?"]

    def talk(eng: Engine, move: bool) -> tuple[list[list[int]], int]:
        sids = [eng.open_session(NPC, sampling=s) for s in sampling]
        gens = [eng.chat(sid, line, max_tokens=120, ignore_eos=True)
                for sid, line in zip(sids, lines, strict=True)]
        times: list[list[float]] = [[] for _ in gens]

        def read(i: int) -> None:
            for _piece in gens[i]:
                times[i].append(time.monotonic())

        readers = [threading.Thread(target=read, args=(i,)) for i in range(len(gens))]
        for r in readers:
            r.start()
        during = 0
        if move:
            while len(times[0]) < 5:
                time.sleep(0.005)
            eng.release_async().result(30)
            assert eng.status()["standby"]["decoding_on_it"]
            t0 = time.monotonic()
            out = eng.load_first_fitting_async([gpu]).result(60)
            t1 = time.monotonic()
            assert out.landed == gpu.name and not out.failures and not out.state_lost
            during = sum(1 for ts in times for t in ts if t0 <= t <= t1)
        for r in readers:
            r.join(120)
        return [g.result(120).tokens for g in gens], during

    with Engine(npc_model, Plan.all_cpu(), _cfg(None)) as eng:
        ref, _ = talk(eng, move=False)
    _slow_loads(monkeypatch, 1.5)
    with Engine(npc_model, gpu, _cfg(Plan.all_cpu())) as eng:
        _wait_standby(eng)
        moved, during = talk(eng, move=True)
        assert eng.plan.name == gpu.name
    assert during > 0  # the NPCs talked while the placement loaded
    assert moved == ref


def test_a_load_the_game_grows_into_is_given_up(npc_model, monkeypatch) -> None:
    started = threading.Event()
    load_s = 30.0
    _slow_loads(monkeypatch, load_s, started)
    inv = read_inventory(npc_model)
    gpu = Plan.attention_on_gpu(inv)
    with Engine(npc_model, Plan.all_cpu(), _cfg(Plan.all_cpu())) as eng:
        assert eng.standby_ready  # the CPU plan is the standby itself
        sid = eng.open_session(NPC, sampling=SamplingParams(temperature=0.0))
        gen = eng.chat(sid, "Say something.", max_tokens=64, ignore_eos=True)
        fut = eng.load_first_fitting_async([gpu, Plan.all_cpu()])
        assert started.wait(30)
        t0 = time.monotonic()
        assert eng.cancel_load()
        out = fut.result(30)
        assert time.monotonic() - t0 < load_s / 6  # cancelled between tensors, not at its end
        assert out.landed == "all-cpu" and out.failures[0][0] == gpu.name
        assert gen.result(60).completion_tokens == 64  # the reply never noticed
        assert eng.plan.name == "all-cpu"


def test_the_cache_moves_between_flash_and_non_flash_placements(npc_model) -> None:
    """llama.cpp stores V transposed without flash attention and refuses a state of the other
    layout. The arbiter's rungs all run flash attention (one layout); a move between layouts
    anyway (a plan given by hand) re-reads each replying session's tokens and the reply goes
    on: it never fails because the model moved."""
    flash = Plan(name="flash", flash_attn="on")
    plain = Plan(name="plain", flash_attn="off")
    for a, b in ((flash, plain), (plain, flash)):
        with Engine(npc_model, a, _cfg(None)) as eng:
            sid = eng.open_session(NPC, sampling=SamplingParams(temperature=0.0))
            gen = eng.chat(sid, "Tell me about the forest.", max_tokens=40, ignore_eos=True)
            it = iter(gen)
            for _ in range(10):
                next(it)
            eng.release_async().result(30)
            out = eng.load_first_fitting_async([b]).result(60)
            assert out.landed == b.name and out.state_lost  # the layouts differ
            res = gen.result(60)
            assert res.completion_tokens == 40  # the reply went on to its end
            # and the conversation goes on, with its history read again
            assert eng.chat(sid, "And the river?", max_tokens=8).result(60).completion_tokens


def test_every_rung_of_the_ladder_keeps_one_v_layout(npc_model) -> None:
    from igi_sdk.arbiter import PlanLadder
    from igi_sdk.arbiter.ladder import arbiter_workload
    from tests.test_planner import GPU_PROFILE

    ladder = PlanLadder.build(read_inventory(npc_model), GPU_PROFILE, arbiter_workload(1024),
                              step=8 << 20)
    assert len(ladder.rungs) > 2
    assert {r.plan.flash_attn for r in ladder.rungs} == {"on"}
