"""Sampling settings and the llama.cpp sampler chain built from them.

A chain is rebuilt from data (settings, seed, tokens sampled so far) rather than kept as opaque
native state: that is what lets a session survive a reshard, a snapshot or a save to disk and
continue exactly as it would have. The random draw of step *t* uses a seed derived from the
session seed and *t*, so no RNG state has to be carried.
"""

from __future__ import annotations

import math

import llama_cpp
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from igi_sdk.errors import InvalidGrammarError, InvalidSamplingError


class SamplingParams(BaseModel):
    """How a session picks tokens. ``temperature == 0`` is greedy (deterministic)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(0.7, ge=0.0, le=5.0)
    top_p: float = Field(0.95, gt=0.0, le=1.0)
    top_k: int = Field(40, ge=0, le=100_000)  # 0 = off
    min_p: float = Field(0.05, ge=0.0, le=1.0)
    repeat_penalty: float = Field(1.1, ge=0.5, le=3.0)
    repeat_last_n: int = Field(64, ge=0, le=4096)
    seed: int = Field(0, ge=0, le=2**32 - 1)

    @field_validator("temperature", "top_p", "min_p", "repeat_penalty")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @classmethod
    def create(cls, **values: object) -> SamplingParams:
        """Validate user values, raising :class:`InvalidSamplingError` with a readable message."""
        try:
            return cls(**values)  # type: ignore[arg-type]
        except ValidationError as e:
            parts = [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
            raise InvalidSamplingError("invalid sampling settings: " + "; ".join(parts)) from None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def step_seed(seed: int, step: int) -> int:
    """Seed of the random draw at a session's ``step``-th sampled token (splitmix-style mix)."""
    x = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + 1) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    return x & 0xFFFFFFFF


class SamplerChain:
    """One llama.cpp sampler chain for one reply. Free with :meth:`close`."""

    def __init__(
        self,
        params: SamplingParams,
        vocab: llama_cpp.llama_vocab_p,
        *,
        grammar: str | None,
        history: list[int],
        reply_tokens: list[int],
    ) -> None:
        self.params = params
        sparams = llama_cpp.llama_sampler_chain_default_params()
        self.chain = llama_cpp.llama_sampler_chain_init(sparams)
        self._has_dist = False
        if grammar is not None:
            g = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")
            if not g:
                llama_cpp.llama_sampler_free(self.chain)
                raise InvalidGrammarError(
                    "the grammar does not parse as GBNF (llama.cpp's log has the position)"
                )
            for tok in reply_tokens:  # replay: the grammar's parse state after this reply so far
                llama_cpp.llama_sampler_accept(g, tok)
            llama_cpp.llama_sampler_chain_add(self.chain, g)
        if params.repeat_penalty != 1.0 and params.repeat_last_n > 0:
            pen = llama_cpp.llama_sampler_init_penalties(
                llama_cpp.llama_vocab_n_tokens(vocab),
                params.repeat_last_n, params.repeat_penalty, 0.0, 0.0
            )
            for tok in history[-params.repeat_last_n :]:
                llama_cpp.llama_sampler_accept(pen, tok)
            llama_cpp.llama_sampler_chain_add(self.chain, pen)
        if params.greedy:
            llama_cpp.llama_sampler_chain_add(self.chain, llama_cpp.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            llama_cpp.llama_sampler_chain_add(
                self.chain, llama_cpp.llama_sampler_init_top_k(params.top_k)
            )
        if params.top_p < 1.0:
            llama_cpp.llama_sampler_chain_add(
                self.chain, llama_cpp.llama_sampler_init_top_p(params.top_p, 1)
            )
        if params.min_p > 0.0:
            llama_cpp.llama_sampler_chain_add(
                self.chain, llama_cpp.llama_sampler_init_min_p(params.min_p, 1)
            )
        llama_cpp.llama_sampler_chain_add(
            self.chain, llama_cpp.llama_sampler_init_temp(params.temperature)
        )
        self._has_dist = True
        llama_cpp.llama_sampler_chain_add(self.chain, llama_cpp.llama_sampler_init_dist(0))

    def sample(self, ctx: llama_cpp.llama_context_p, batch_index: int, step: int) -> int:
        """Sample (and accept) the next token from the logits at ``batch_index``."""
        if self._has_dist:
            last = llama_cpp.llama_sampler_chain_n(self.chain) - 1
            llama_cpp.llama_sampler_free(llama_cpp.llama_sampler_chain_remove(self.chain, last))
            llama_cpp.llama_sampler_chain_add(
                self.chain, llama_cpp.llama_sampler_init_dist(step_seed(self.params.seed, step))
            )
        return llama_cpp.llama_sampler_sample(self.chain, ctx, batch_index)

    def close(self) -> None:
        if self.chain:
            llama_cpp.llama_sampler_free(self.chain)
            self.chain = None


def json_schema_grammar(schema: str | dict) -> str:
    """GBNF for a JSON schema (llama-cpp-python's converter, which tracks llama.cpp's)."""
    import json

    from llama_cpp.llama_grammar import json_schema_to_gbnf

    text = schema if isinstance(schema, str) else json.dumps(schema)
    try:
        json.loads(text)
        return json_schema_to_gbnf(text)
    except Exception as e:  # noqa: BLE001 - the converter raises bare Exceptions/KeyErrors on bad schemas
        raise InvalidGrammarError(f"cannot turn this JSON schema into a grammar: {e}") from None
