"""llama.cpp's own samplers as the reference a :class:`SamplerChain`'s picks are checked
against (tests/test_sampling_fast.py, tests/test_line_sampling.py), on the logits rows the
``decoded`` fixture (tests/conftest.py) leaves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import llama_cpp
import numpy as np

from igi_sdk.runtime.sampling import SamplerChain, SamplingParams, logits_row, step_seed


def reference_chain(params: SamplingParams, n_vocab: int, history: list[int]) -> Any:
    """llama.cpp's own chain: logit bias, penalties (repeat, frequency, presence: none apply
    when all are off), then the greedy pick or top-k/top-p/min-p/temperature (the seeded
    draw is added per step by :func:`reference_sample`)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if params.logit_bias:
        arr = (llama_cpp.llama_logit_bias * len(params.logit_bias))(
            *[llama_cpp.llama_logit_bias(t, b) for t, b in params.logit_bias])
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_logit_bias(
            n_vocab, len(params.logit_bias), arr))
    pen = llama_cpp.llama_sampler_init_penalties(
        n_vocab, params.repeat_last_n, params.repeat_penalty, params.frequency_penalty,
        params.presence_penalty)
    for tok in history[-params.repeat_last_n:]:
        llama_cpp.llama_sampler_accept(pen, tok)
    llama_cpp.llama_sampler_chain_add(chain, pen)
    if params.greedy:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        return chain
    for s in (llama_cpp.llama_sampler_init_top_k(params.top_k),
              llama_cpp.llama_sampler_init_top_p(params.top_p, 1),
              llama_cpp.llama_sampler_init_min_p(params.min_p, 1),
              llama_cpp.llama_sampler_init_temp(params.temperature)):
        llama_cpp.llama_sampler_chain_add(chain, s)
    return chain


def reference_sample(chain: Any, params: SamplingParams, ctx: Any, idx: int, step: int) -> int:
    """The reference's pick from logits row ``idx`` at reply step ``step`` (the step's seed
    as a line's reply seeds its draw)."""
    if params.greedy:
        return int(llama_cpp.llama_sampler_sample(chain, ctx, idx))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(
        step_seed(params.seed, step)))
    try:
        return int(llama_cpp.llama_sampler_sample(chain, ctx, idx))
    finally:
        n = llama_cpp.llama_sampler_chain_n(chain)
        llama_cpp.llama_sampler_free(llama_cpp.llama_sampler_chain_remove(chain, n - 1))


def assert_same_picks(decoded: tuple[Any, Any], params: SamplingParams, history: list[int],
                      craft: Callable[[int], np.ndarray], steps: int = 60) -> None:
    """A :class:`SamplerChain` and llama.cpp's own chain pick the same token at each step, from
    logits row ``step % 2`` set to ``craft(step)``; ``history`` (the tokens before) grows with
    the picks, and the row is left as it was crafted."""
    ctx, vocab = decoded
    n = llama_cpp.llama_vocab_n_tokens(vocab)
    ours = SamplerChain(params, vocab, grammar=None, history=history, reply_tokens=[])
    ref = reference_chain(params, n, history)
    try:
        for step in range(steps):
            idx = step % 2
            row = logits_row(ctx, idx, n)
            crafted = craft(step)
            row[:] = crafted
            got = ours.sample(ctx, idx, step)
            assert np.array_equal(row, crafted, equal_nan=True)  # the row is put back
            want = reference_sample(ref, params, ctx, idx, step)
            assert got == want, (step, got, want)
            history.append(got)
    finally:
        ours.close()
        llama_cpp.llama_sampler_free(ref)
