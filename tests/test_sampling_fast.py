"""SamplerChain's own per-token work (the repeat penalty on the penalized tokens only, the greedy
pick as an argmax over the logits row) picks exactly what llama.cpp's samplers pick over the
whole candidate array, on crafted logits rows: ties, zeros, negative and -inf logits, NaN."""

from __future__ import annotations

import ctypes

import llama_cpp
import numpy as np
import pytest

from igi_sdk.runtime import sampling
from igi_sdk.runtime.sampling import SamplingParams, logits_row
from tests.reference_sampling import assert_same_picks


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
    n = llama_cpp.llama_vocab_n_tokens(decoded[1])
    rng = np.random.default_rng(1)
    history = [int(t) for t in rng.integers(0, n, 40)]

    def craft(step: int) -> np.ndarray:
        crafted = _crafted(rng, n, step)
        # penalized tokens at the top: the penalty decides the pick
        crafted[history[-3:]] = crafted.max() + np.float32(0.01) * step
        return crafted

    assert_same_picks(decoded, params, history, craft)


def test_a_nan_row_is_left_to_llama_cpp(decoded) -> None:
    n = llama_cpp.llama_vocab_n_tokens(decoded[1])
    row = np.linspace(-1, 1, n, dtype=np.float32)
    row[3] = np.nan
    assert_same_picks(decoded, SamplingParams(temperature=0.0, repeat_penalty=1.0), [],
                      lambda step: row, steps=1)


def test_logits_row_is_a_view_of_llama_cpp_logits(decoded) -> None:
    ctx, vocab = decoded
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    row = logits_row(ctx, 1, n)
    ptr = llama_cpp.llama_get_logits_ith(ctx, 1)
    assert ctypes.addressof(ptr.contents) == row.ctypes.data
    assert logits_row(ctx, 1, n) is row  # one view per address
