"""The native calls of a steady decode step, counted on the real engine (not timed): each
decoding reply costs one logits read and, when sampled, the reseeding of its draw; a step one
llama_decode. Nothing per token allocates a batch or a sampler chain, copies the logits row
through llama.cpp's own accessor, or runs llama.cpp's penalties sampler where the vocabulary
is large (benchmarks/per_token_overhead.py times the same path)."""

from __future__ import annotations

from collections import Counter

import pytest

from benchmarks.per_token_overhead import NativeProbe
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams, sampling

LOGITS = "igi_sdk.runtime.sampling._logits_at"
# a token's bytes and end flag are asked of llama.cpp the first time the vocabulary sees it
FIRST_SIGHT = {"llama_token_to_piece", "llama_vocab_is_eog"}
RESEED = ("llama_sampler_chain_remove", "llama_sampler_free", "llama_sampler_init_dist",
          "llama_sampler_chain_add")


def _steady_calls(model, params: SamplingParams, replies: int,
                  tokens: int = 40) -> tuple[list[Counter[str]], int]:
    """Per steady step (every reply feeding its one sampled token), the native calls by name
    from its llama_decode to the next step's; and the distinct tokens sampled."""
    cfg = EngineConfig(n_ctx=2048, max_sessions=replies, n_threads=1, context_floor=0,
                       prefill_chunk=512)
    probe = NativeProbe(log=[])
    with Engine(model, Plan.all_cpu(), cfg) as eng:
        sids = [eng.open_session("You are a smith.", sampling=params) for _ in range(replies)]
        probe.install()
        try:
            # steps paused while the replies are submitted one by one: on a busy machine the
            # first ones ran 40 tokens ahead of the last and no step served them all
            eng.set_pacing(0.25)
            hs = [eng.chat(s, "Hello there.", max_tokens=tokens, ignore_eos=True) for s in sids]
            eng.set_pacing(0.0)
            results = [h.result(120) for h in hs]
        finally:
            probe.close()
    assert probe.log is not None
    at = [i for i, name in enumerate(probe.log) if name == "llama_decode"]
    widths = [d[2] for d in probe.decodes]
    steps = [Counter(probe.log[a:b]) for a, b, w, w2 in zip(at, at[1:], widths, widths[1:],
                                                             strict=False)
             if w == replies and w2 == replies]
    assert len(steps) >= 4, len(steps)  # (replies submitted one by one may start a step apart)
    return steps, len({t for r in results for t in r.tokens})


def _per_step(steps: list[Counter[str]], distinct: int) -> Counter[str]:
    """The calls every step makes (first-sight calls checked against the distinct tokens)."""
    total: Counter[str] = sum(steps, Counter())
    for name in FIRST_SIGHT:
        assert total.pop(name, 0) <= distinct, name
    return Counter({name: n / len(steps) for name, n in total.items()})


def test_a_greedy_step_is_one_decode_and_one_logits_read(tiny_llama) -> None:
    steps, distinct = _steady_calls(tiny_llama, SamplingParams(temperature=0.0,
                                                               repeat_penalty=1.0), 1)
    assert _per_step(steps, distinct) == {"llama_decode": 1, LOGITS: 1}


def test_a_sampled_step_reads_the_logits_once_and_reseeds_its_draw(
        tiny_llama, monkeypatch: pytest.MonkeyPatch) -> None:
    # the penalty as large vocabularies get it (numpy on the penalized tokens only)
    monkeypatch.setattr(sampling, "NUMPY_PENALTY_MIN_VOCAB", 0)
    steps, distinct = _steady_calls(tiny_llama, SamplingParams(temperature=0.7, top_p=0.9,
                                                               seed=3), 1)
    want = {"llama_decode": 1, LOGITS: 1, "llama_sampler_sample": 1, **dict.fromkeys(RESEED, 1)}
    assert _per_step(steps, distinct) == want


def test_sixteen_replies_cost_one_decode_and_a_logits_read_each(tiny_llama) -> None:
    steps, distinct = _steady_calls(tiny_llama, SamplingParams(temperature=0.0,
                                                               repeat_penalty=1.0), 16)
    assert _per_step(steps, distinct) == {"llama_decode": 1, LOGITS: 16}
