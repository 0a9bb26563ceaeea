"""Draft-free drafting against the real engine: n-gram proposals of the session's own tokens
leave greedy output identical and are accepted on repetitive text; the planner and `plan`
price them; `stats` reports the per-token α."""

from __future__ import annotations

from igi_sdk.planner import Plan
from igi_sdk.planner.speculative import expected_tokens_per_pass
from igi_sdk.runtime.engine import Engine, EngineConfig
from igi_sdk.runtime.sampling import SamplingParams
from igi_sdk.runtime.speculative import SpeculativeConfig
from tests.test_planner import CPU_PROFILE, GPU_PROFILE

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
# the guard's rota, repeated: what the NPC says next is mostly in its prompt already
ROTA = ("Captain Aldric of the Iron Gate, Sergeant Mira of the Iron Gate, Corporal Tobin of the "
        "Iron Gate, Captain Aldric of the Iron Gate, Sergeant Mira of the Iron Gate")
SYSTEM = f"You are a gate guard of Eldham. The night watch: {ROTA}."
LINE = f"Read me the night watch exactly as written, three times: {ROTA}."


def _reply(model, spec: SpeculativeConfig | None, **kw) -> tuple[list[int], dict]:
    cfg = EngineConfig(n_ctx=1024, max_sessions=2, n_threads=2, prefill_chunk=64,
                       speculative=spec or SpeculativeConfig(), **kw)
    with Engine(model, Plan.all_cpu(), cfg) as eng:
        sid = eng.open_session(SYSTEM, sampling=GREEDY)
        r = eng.chat(sid, LINE, max_tokens=64, ignore_eos=True).result(timeout=120)
        return r.tokens, eng.status()["speculative"] | {"session": eng.session_info()[sid]}


def test_ngram_drafting_keeps_greedy_output_and_gets_accepted(default_model) -> None:
    """SmolLM2's Q4_1 weights are not repacked on the CPU (llama.cpp repacks Q4_0, Q4_K,
    IQ4_NL): a verify batch rounds as one-token steps do, so the output is bit-identical."""
    ref, plain = _reply(default_model, None)
    assert plain["drafted"] == 0 and plain["ngram"] is False
    got, stats = _reply(default_model, SpeculativeConfig(k=4, ngram=True, adaptive=False))
    assert got == ref
    ng = stats["by_source"]["ngram"]
    assert ng["passes"] >= 5 and ng["accepted"] >= 20  # the rota is read back from the prompt
    assert stats["alpha"] is not None and stats["alpha"] > 0.5
    # the per-token α and tokens per pass describe the same passes (k ≤ 4 each)
    assert 1.0 < stats["tokens_per_pass"] <= expected_tokens_per_pass(stats["alpha"], 4) + 0.5
    assert stats["session"]["draft"]["accepted"] == stats["accepted"]
    # adaptive (as shipped, no profile): measured, and the same greedy output
    got, stats = _reply(default_model, SpeculativeConfig(k=4, ngram=True))
    assert got == ref and stats["by_source"]["ngram"]["accepted"] > 0


def test_exact_verify_loads_without_repacking_and_changes_nothing(default_model) -> None:
    ref, _ = _reply(default_model, None, exact_verify=True)
    got, stats = _reply(default_model, SpeculativeConfig(k=4, ngram=True, adaptive=False),
                        exact_verify=True)
    assert got == ref and stats["accepted"] > 0


def test_plan_prices_ngram_drafting_and_says_what_alpha_means(tmp_path, capsys,
                                                              tiny_llama) -> None:
    from igi_sdk import cli

    prof = tmp_path / "profile.json"
    prof.write_text(GPU_PROFILE.model_dump_json())
    assert cli.main(["plan", str(tiny_llama), "--ctx", "1024", "--profile", str(prof),
                     "--draft-ngram", "--ngram-alpha", "0.6"]) == 0
    out = capsys.readouterr().out
    assert "n-gram drafting: no draft VRAM" in out and "α=0.60" in out
    assert "speculative (n-gram):" in out and "break-even α" in out
    assert "per-token acceptance" in out and "`stats` reports the same α" in out


def test_a_plan_whose_predicted_costs_cannot_pay_never_drafts(default_model) -> None:
    """A draft as large as the target, on the CPU: the plan's predicted step costs say it
    cannot pay at the assumed α, so the engine never drafts (before, it drafted to measure)."""
    spec = SpeculativeConfig(k=4, profile=CPU_PROFILE)
    cfg = EngineConfig(n_ctx=1024, max_sessions=2, n_threads=2, prefill_chunk=64,
                       draft_model=str(default_model), speculative=spec)
    with Engine(default_model, Plan.all_cpu(), cfg) as eng:
        sid = eng.open_session(SYSTEM, sampling=GREEDY)
        eng.chat(sid, LINE, max_tokens=24, ignore_eos=True).result(timeout=120)
        stats = eng.status()["speculative"]
    assert stats["predicted_step_s"] is not None
    assert stats["drafted"] == 0 and stats["step_s"]["plain"] is not None


def test_a_verify_pass_is_timed_with_its_picks(default_model, monkeypatch) -> None:
    """A verify pass reads and walks k + 1 logits rows where a plain step reads one: its cost
    (what drafting weighs against a plain step) is timed from its llama_decode call to its
    last pick, not the call alone. Picks made 30 ms slower show in every verify mean."""
    import time

    from igi_sdk.runtime import drafting

    real = drafting.Drafting.verify

    def slow(self, *a, **kw):  # type: ignore[no-untyped-def]
        time.sleep(0.03)
        return real(self, *a, **kw)

    monkeypatch.setattr(drafting.Drafting, "verify", slow)
    cfg = EngineConfig(n_ctx=1024, max_sessions=1, n_threads=2, prefill_chunk=64,
                       speculative=SpeculativeConfig(k=4, ngram=True, adaptive=False))
    with Engine(default_model, Plan.all_cpu(), cfg) as eng:
        sid = eng.open_session(SYSTEM, sampling=GREEDY)
        eng.chat(sid, LINE, max_tokens=32, ignore_eos=True).result(timeout=120)
        core = eng._core
        means = eng._call(lambda: {k: m.value for k, m in
                                   core._drafting.costs.verify.items()})
    assert means and all(v is not None and v >= 0.03 for v in means.values()), means
