"""SamplerChain's own per-token work (the repeat penalty on the penalized tokens only, the greedy
pick as an argmax over the logits row) picks exactly what llama.cpp's samplers pick over the
whole candidate array, on crafted logits rows: ties, zeros, negative and -inf logits, NaN."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import pytest

from igi_sdk.model import read_inventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import loader, sampling
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.runtime.sampling import SamplerChain, SamplingParams, logits_row, step_seed


@pytest.fixture(scope="module")
def decoded(tiny_llama):
    """A context whose last decode left logits rows 0 and 1, and its vocabulary."""
    inv = read_inventory(tiny_llama)
    settings = ContextSettings(256, 1, 64, 1, n_outputs=2)
    loaded = loader.load(tiny_llama, inv, Plan.all_cpu(), settings)
    batch = llama_cpp.llama_batch_init(2, 0, 1)
    for i, tok in enumerate((5, 77)):
        batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, i, 1
        batch.seq_id[i][0], batch.logits[i] = 0, 1
    batch.n_tokens = 2
    assert llama_cpp.llama_decode(loaded.ctx, batch) == 0
    try:
        yield loaded.ctx, llama_cpp.llama_model_get_vocab(loaded.model)
    finally:
        llama_cpp.llama_batch_free(batch)
        loader.free(loaded)


def _reference(params: SamplingParams, vocab, history: list[int]):
    """The chain as llama.cpp's samplers alone build it (penalties first, greedy or the
    top-k/top-p/min-p/temperature/dist chain)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if params.repeat_penalty != 1.0 and params.repeat_last_n > 0:
        pen = llama_cpp.llama_sampler_init_penalties(
            llama_cpp.llama_vocab_n_tokens(vocab), params.repeat_last_n, params.repeat_penalty,
            0.0, 0.0)
        for tok in history[-params.repeat_last_n:]:
            llama_cpp.llama_sampler_accept(pen, tok)
        llama_cpp.llama_sampler_chain_add(chain, pen)
    if params.greedy:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        return chain
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(params.top_k))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(params.temperature))
    return chain


def _reference_sample(chain, params: SamplingParams, ctx, idx: int, step: int) -> int:
    if params.greedy:
        return llama_cpp.llama_sampler_sample(chain, ctx, idx)
    dist = llama_cpp.llama_sampler_init_dist(step_seed(params.seed, step))
    llama_cpp.llama_sampler_chain_add(chain, dist)
    try:
        return llama_cpp.llama_sampler_sample(chain, ctx, idx)
    finally:
        n = llama_cpp.llama_sampler_chain_n(chain)
        llama_cpp.llama_sampler_free(llama_cpp.llama_sampler_chain_remove(chain, n - 1))


def _crafted(rng: np.random.Generator, n: int, kind: int) -> np.ndarray:
    row = rng.standard_normal(n).astype(np.float32) * 4
    if kind % 3 == 1:  # ties at the top, among penalized and unpenalized tokens
        row[rng.integers(0, n, 6)] = row.max()
    if kind % 3 == 2:  # zeros and -inf (a penalty keeps them so)
        row[rng.integers(0, n, 50)] = 0.0
        row[rng.integers(0, n, 50)] = -np.inf
    return row


PARAMS = [
    SamplingParams(temperature=0.0, repeat_penalty=1.0),
    SamplingParams(temperature=0.0, repeat_penalty=1.3, repeat_last_n=16),
    SamplingParams(temperature=0.0, repeat_penalty=0.7, repeat_last_n=64),
    SamplingParams(temperature=0.8, top_k=40, top_p=0.9, min_p=0.02, repeat_penalty=1.2,
                   repeat_last_n=32, seed=5),
    SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=9),
]


@pytest.mark.parametrize("numpy_penalty", [True, False])
@pytest.mark.parametrize("params", PARAMS, ids=range(len(PARAMS)))
def test_picks_match_llama_cpp_samplers(decoded, params: SamplingParams, numpy_penalty: bool,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Both ways of applying the penalty (numpy on the penalized tokens for large
    vocabularies, llama.cpp's sampler for small ones) pick what llama.cpp alone picks."""
    monkeypatch.setattr(sampling, "NUMPY_PENALTY_MIN_VOCAB", 0 if numpy_penalty else 1 << 30)
    ctx, vocab = decoded
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    rng = np.random.default_rng(1)
    history = [int(t) for t in rng.integers(0, n, 40)]
    ours = SamplerChain(params, vocab, grammar=None, history=history, reply_tokens=[])
    ref = _reference(params, vocab, history)
    try:
        for step in range(60):
            idx = step % 2
            row = logits_row(ctx, idx, n)
            crafted = _crafted(rng, n, step)
            # penalized tokens at the top: the penalty decides the pick
            crafted[history[-3:]] = crafted.max() + np.float32(0.01) * step
            row[:] = crafted
            got = ours.sample(ctx, idx, step)
            assert np.array_equal(row, crafted, equal_nan=True)  # the row is put back
            want = _reference_sample(ref, params, ctx, idx, step)
            assert got == want, (step, got, want)
            history.append(got)
    finally:
        ours.close()
        llama_cpp.llama_sampler_free(ref)


def test_a_nan_row_is_left_to_llama_cpp(decoded) -> None:
    ctx, vocab = decoded
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    params = SamplingParams(temperature=0.0, repeat_penalty=1.0)
    ours = SamplerChain(params, vocab, grammar=None, history=[], reply_tokens=[])
    ref = _reference(params, vocab, [])
    try:
        row = logits_row(ctx, 0, n)
        row[:] = np.linspace(-1, 1, n, dtype=np.float32)
        row[3] = np.nan
        assert ours.sample(ctx, 0, 0) == _reference_sample(ref, params, ctx, 0, 0)
    finally:
        ours.close()
        llama_cpp.llama_sampler_free(ref)


def test_logits_row_is_a_view_of_llama_cpp_logits(decoded) -> None:
    ctx, vocab = decoded
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    row = logits_row(ctx, 1, n)
    ptr = llama_cpp.llama_get_logits_ith(ctx, 1)
    assert ctypes.addressof(ptr.contents) == row.ctypes.data
    assert logits_row(ctx, 1, n) is row  # one view per address
