"""A line's own sampling and the samplers OpenAI clients send: the frequency and presence
penalties and logit biases pick exactly what llama.cpp's own samplers pick (synthetic model,
crafted logits rows); a line's settings apply to its reply alone; logprobs are those of the row
the token was drawn from (the default model)."""

from __future__ import annotations

import math

import llama_cpp
import numpy as np
import pytest

from igi_sdk.errors import InvalidSamplingError
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams
from igi_sdk.runtime.sampling import SamplerChain, SamplingOverride, logits_row
from tests.reference_sampling import assert_same_picks

PARAMS = [
    SamplingParams(temperature=0.0, repeat_penalty=1.0, frequency_penalty=1.5,
                   presence_penalty=0.5, repeat_last_n=32),
    SamplingParams(temperature=0.0, repeat_penalty=1.2, frequency_penalty=-0.7,
                   presence_penalty=2.0, repeat_last_n=64,
                   logit_bias=((3, 100.0), (9, -100.0), (40, 2.5))),
    SamplingParams(temperature=0.0, repeat_penalty=1.0, logit_bias=((11, 4.0), (12, -4.0))),
    SamplingParams(temperature=0.9, top_k=40, top_p=0.9, min_p=0.02, repeat_penalty=1.1,
                   frequency_penalty=0.8, presence_penalty=0.3, repeat_last_n=16, seed=4,
                   logit_bias=((7, 3.0),)),
]


@pytest.mark.parametrize("params", PARAMS, ids=range(len(PARAMS)))
def test_penalties_and_biases_pick_what_llama_cpp_picks(decoded, params) -> None:
    n = llama_cpp.llama_vocab_n_tokens(decoded[1])
    rng = np.random.default_rng(3)
    history = [int(t) for t in rng.integers(0, 60, 40)]  # repeats: counts above one

    def craft(step: int) -> np.ndarray:
        crafted = rng.standard_normal(n).astype(np.float32) * 3
        # the penalized and biased tokens near the top: the penalties decide the pick
        crafted[history[-6:]] = crafted.max() + np.float32(0.05) * (step % 5)
        return crafted

    assert_same_picks(decoded, params, history, craft)


def test_a_bias_for_a_token_past_the_vocabulary_is_refused(decoded) -> None:
    _, vocab = decoded
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    with pytest.raises(InvalidSamplingError, match=str(n)):
        SamplerChain(SamplingParams(logit_bias={str(n): 1.0}), vocab, grammar=None,
                     history=[], reply_tokens=[])


def test_logprobs_are_the_log_softmax_of_the_row_drawn_from(decoded) -> None:
    ctx, vocab = decoded
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    params = SamplingParams(temperature=0.0, repeat_penalty=1.0, logit_bias=((5, 1.0),))
    chain = SamplerChain(params, vocab, grammar=None, history=[], reply_tokens=[], logprobs=3)
    try:
        row = logits_row(ctx, 0, n)
        row[:] = np.random.default_rng(0).standard_normal(n).astype(np.float32)
        biased = row.astype(np.float64)
        biased[5] += 1.0
        want = biased - (biased.max() + math.log(np.exp(biased - biased.max()).sum()))
        tok = chain.sample(ctx, 0, 0)
        assert chain.last is not None
        logprob, top = chain.last
        assert tok == int(np.argmax(want)) == top[0][0]
        assert logprob == pytest.approx(want[tok], abs=1e-5)
        assert [t for t, _ in top] == list(np.argsort(-want, kind="stable")[:3])
        assert [lp for _, lp in top] == pytest.approx(sorted(want, reverse=True)[:3], abs=1e-5)
    finally:
        chain.close()


def test_a_lines_settings_merge_over_the_sessions() -> None:
    base = SamplingParams(temperature=0.0, top_k=5, seed=1)
    line = SamplingOverride(temperature=1.2, logit_bias={"4": -100})
    merged = line.apply(base)
    assert (merged.temperature, merged.top_k, merged.seed) == (1.2, 5, 1)
    assert merged.logit_bias == ((4, -100.0),)
    assert SamplingOverride().apply(base) is base
    with pytest.raises(InvalidSamplingError):
        SamplingOverride(frequency_penalty=9.0).apply(base)


@pytest.fixture(scope="module")
def engine(default_model):
    with Engine(default_model, Plan.all_cpu(),
                EngineConfig(n_ctx=2048, max_sessions=4, n_threads=2)) as eng:
        yield eng


def _reply(eng: Engine, session_params: SamplingParams, **options) -> tuple[str, list]:
    sid = eng.open_session("You are a storyteller.", sampling=session_params)
    try:
        events: list = []
        g = eng.chat(sid, "Tell me about dragons.", max_tokens=12, listener=events.append,
                     **options)
        return g.result(120).text, events
    finally:
        eng.close_session(sid)


def test_a_lines_temperature_and_seed_apply_to_its_reply(engine) -> None:
    greedy = SamplingParams(temperature=0.0)
    # the session is greedy: the same reply every time, unless the line samples
    assert _reply(engine, greedy)[0] == _reply(engine, greedy)[0]
    sampled = {_reply(engine, greedy, sampling={"temperature": 1.5, "seed": s})[0]
               for s in (1, 2, 3)}
    assert len(sampled) >= 2
    same = {_reply(engine, greedy, sampling={"temperature": 1.5, "seed": 7})[0]
            for _ in range(2)}
    assert len(same) == 1


def test_a_logit_bias_forces_its_token(engine) -> None:
    (tok,) = engine.tokenize(" banana")
    text, _ = _reply(engine, SamplingParams(temperature=0.8),
                     sampling={"logit_bias": {str(tok): 100.0}})
    assert text == " banana" * 12
    with pytest.raises(InvalidSamplingError):
        _reply(engine, SamplingParams(), sampling={"logit_bias": {"10000000": 1.0}})


def test_each_text_event_carries_its_tokens_logprobs(engine) -> None:
    text, events = _reply(engine, SamplingParams(temperature=0.0), logprobs=4)
    entries = [lp for e in events if hasattr(e, "logprobs") for lp in e.logprobs]
    assert "".join(e.token for e in entries) == text  # every token of the text, in order
    for e in entries:  # greedy: the pick is the likeliest
        assert len(e.top) == 4 and e.top[0] == (e.token, e.logprob)
        assert e.logprob <= 0.0 and sum(math.exp(lp) for _, lp in e.top) <= 1.0 + 1e-9
        assert [lp for _, lp in e.top] == sorted((lp for _, lp in e.top), reverse=True)
    _, plain = _reply(engine, SamplingParams(temperature=0.0))
    assert all(not e.logprobs for e in plain if hasattr(e, "logprobs"))


def test_logprobs_cost_little_per_token(engine) -> None:
    """Tokens per second with and without logprobs, alternated in one run: within 25%."""
    rates: dict[bool, list[float]] = {False: [], True: []}
    for with_lp in (False, True, False, True):
        sid = engine.open_session("You are verbose.", sampling=SamplingParams(temperature=0.0))
        try:
            r = engine.chat(sid, "Tell me a long story.", max_tokens=48, ignore_eos=True,
                            logprobs=5 if with_lp else None).result(120)
        finally:
            engine.close_session(sid)
        rates[with_lp].append(r.decode_tps)
    assert max(rates[True]) > 0.75 * max(rates[False]), rates


def test_an_upstream_line_carries_its_own_sampling() -> None:
    from igi_sdk.upstream.routing import request_body
    from igi_sdk.wire import protocol as P

    chat = P.Chat.model_validate({"session": "s", "text": "hi", "sampling": {
        "temperature": 1.4, "presence_penalty": 0.5, "logit_bias": {"17": -100.0}}})
    body = request_body(chat, P.Sampling(seed=3), [], "k")
    assert (body["temperature"], body["seed"], body["presence_penalty"]) == (1.4, 3, 0.5)
    assert body["logit_bias"] == {"17": -100.0} and "frequency_penalty" not in body
