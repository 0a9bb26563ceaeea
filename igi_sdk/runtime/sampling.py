"""Sampling settings and the llama.cpp sampler chain built from them.

A chain is rebuilt from data (settings, seed, tokens sampled so far) rather than kept as opaque
native state: that is what lets a session survive a reshard, a snapshot or a save to disk and
continue exactly as it would have. The random draw of step *t* uses a seed derived from the
session seed and *t*, so no RNG state has to be carried.
"""

from __future__ import annotations

import ctypes
import functools
import json
import math
import re
from collections import deque
from collections.abc import Mapping
from typing import Any

import llama_cpp
import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from igi_sdk.errors import InferenceError, InvalidGrammarError, InvalidSamplingError
from igi_sdk.runtime.grammar import (
    COMPILED_PREFIX,
    GrammarMatcher,
    compile_gbnf,
    compile_json_schema,
)

try:  # the stdlib's own regular-expression parser: re._parser since 3.11, sre_parse before
    from re import _parser as _re_parser
except ImportError:  # pragma: no cover - without it, patterns are checked as before
    try:
        import sre_parse as _re_parser  # type: ignore[no-redef]
    except ImportError:
        _re_parser = None  # type: ignore[assignment]

# --- limits on constrained replies (documented in bridge/PROTOCOL.md, section 7) ---------------
# Grammars are compiled by llguidance (runtime/grammar.py) on the I/O thread and applied without
# recursion, so no thread needs a larger stack than its platform's default; the depth bound
# keeps the converter's work small (llama.cpp's own recursive GBNF parser, which needed a 64 MiB
# engine-thread stack for such grammars, is not used).
MAX_GRAMMAR_CHARS = 65_536  # a GBNF grammar, given or made from a JSON schema
MAX_GRAMMAR_DEPTH = 1_024  # ( ) nesting in a grammar
# llama-cpp-python's schema converter writes repetition bounds out as text (maxLength n becomes
# n nested groups, minLength n n rule references), builds rule names from key names and
# recurses on nesting: its time and output grow with these, not with the schema's size.
# llama.cpp refuses the converter's nesting past 1 000 repetitions anyway.
MAX_SCHEMA_CHARS = 32_000  # the schema as JSON text
MAX_SCHEMA_DEPTH = 32  # nested objects/arrays
MAX_SCHEMA_REPEAT = 1_000  # each minLength/maxLength/minItems/maxItems and {m,n} in a pattern
MAX_SCHEMA_NAME_CHARS = 128  # property (and other key) names
MAX_SCHEMA_PROPERTIES = 64  # per object: optional ones cost quadratically
# rule text the converter may write, duplicates included: optional properties cost
# quadratically and allOf/$ref merges repeat work without growing the schema
MAX_SCHEMA_WORK_CHARS = 1 << 19
# A `pattern` whose repeated group can match nothing ((a?){0,n}, (a{0,m}){0,n}, (a*)*) is
# refused whatever its bounds: llama.cpp's grammar sampler keeps a stack per way of skipping
# the empty repeats and slows with about the cube of the count, in one native call on the
# engine thread (7 tokens, 2 cores: (a?){0,30} 0.7 s, (a?b?){0,30} 7 s, (a?){0,100} 10-24 s,
# ((a{0,60}){0,60}) 13 s, (a?){0,1000} > 60 s). Nested repetitions of groups that cannot
# match nothing measured 0.2-0.55 s at any size ((a{1,1000}){100,1000}, ((a{1,1000}){1,1000})
# {1,1000}); their upper bounds multiplied (unbounded counted as MAX_SCHEMA_REPEAT) are still
# capped at two full bounds, for the shapes not measured.
MAX_PATTERN_REPEAT_PRODUCT = MAX_SCHEMA_REPEAT**2


def bias_pairs(v: object) -> object:
    """A logit_bias map ({token id or its decimal text: bias}) as sorted (id, bias) pairs."""
    if isinstance(v, dict):
        v = list(v.items())
    if isinstance(v, (list, tuple)):
        try:  # "15" and 15 are one token: the last given counts
            pairs = sorted({int(k): float(b) for k, b in v}.items())
        except (TypeError, ValueError):
            raise ValueError("logit_bias maps token ids to numbers") from None
        if any(k < 0 or not -100.0 <= b <= 100.0 for k, b in pairs):
            raise ValueError("logit_bias maps token ids (>= 0) to biases from -100 to 100")
        return tuple(pairs)
    return v


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
    # OpenAI's penalties, over the repeat penalty's window (as llama.cpp's penalties sampler)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0)
    # (token id, bias added to its logit), sorted by id; given as a map too (wire keys: text)
    logit_bias: tuple[tuple[int, float], ...] = Field((), max_length=300)

    @field_validator("temperature", "top_p", "min_p", "repeat_penalty", "frequency_penalty",
                     "presence_penalty")
    @classmethod
    def _finite(cls, v: float) -> float:
        if not math.isfinite(v):
            raise ValueError("must be a finite number")
        return v

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bias(cls, v: object) -> object:
        return bias_pairs(v)

    def merged(self, line: dict[str, object]) -> SamplingParams:
        """These settings with ``line``'s (a line's own sampling: its fields that are set)."""
        given = {k: v for k, v in line.items() if v is not None}
        if not given:
            return self
        return SamplingParams.create(**{**self.model_dump(), **given})

    def check_vocab(self, n_vocab: int) -> None:
        """InvalidSamplingError for a logit_bias token the vocabulary does not have."""
        bad = [k for k, _ in self.logit_bias if k >= n_vocab]
        if bad:
            raise InvalidSamplingError(f"logit_bias names token {bad[0]}; this model's "
                                       f"vocabulary has {n_vocab} tokens (0 to {n_vocab - 1})")

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


class SamplingOverride(BaseModel):
    """A line's own sampling (``chat.sampling``): the fields it sets replace the session's
    for that reply only."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repeat_penalty: float | None = None
    seed: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: tuple[tuple[int, float], ...] | None = None

    @field_validator("logit_bias", mode="before")
    @classmethod
    def _bias_pairs(cls, v: object) -> object:
        return None if v is None else bias_pairs(v)

    def apply(self, params: SamplingParams) -> SamplingParams:
        """``params`` with this line's settings (InvalidSamplingError if they break a bound)."""
        return params.merged(self.model_dump(exclude_none=True))


MAX_LOGPROBS = 20
# where the likeliest tokens are looked for first: within exp(-3) and exp(-9.2) of the best
_LP_NEAR = (np.float32(0.05), np.float32(1e-4))


def line_sampling(sampling: SamplingOverride | Mapping[str, object] | None,
                  logprobs: int | None) -> SamplingOverride | None:
    """A line's sampling checked (InvalidSamplingError), as the engine thread takes it."""
    if logprobs is not None and not 0 <= logprobs <= MAX_LOGPROBS:
        raise InvalidSamplingError(f"logprobs is from 0 to {MAX_LOGPROBS}")
    if sampling is None or isinstance(sampling, SamplingOverride):
        return sampling
    try:
        line = SamplingOverride(**sampling)  # type: ignore[arg-type]
        line.apply(SamplingParams())  # its bounds, checked here rather than on the engine
    except ValidationError as e:
        parts = [f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in e.errors()]
        raise InvalidSamplingError("invalid sampling settings: " + "; ".join(parts)) from None
    return line


# llama_token_data as numpy sees it (id, logit, p)
_TOKEN_DATA = np.dtype([("id", np.int32), ("logit", np.float32), ("p", np.float32)])


# Vocabularies from this size on have the repeat penalty applied by numpy to the penalized
# tokens' logits (a fixed ~20 µs); llama.cpp's penalties sampler looks every entry up (~3.4 ns
# each), which is cheaper below it. Both compute the same logits.
NUMPY_PENALTY_MIN_VOCAB = 8192

# a view per logits row address: the row of one batch index sits at the same address from step
# to step, and a new numpy view costs more than the argmax over it (engine thread only)
_rows: dict[int, np.ndarray] = {}
_NEG_INF = np.float32(-np.inf)
# llama_get_logits_ith returning the address as an int (llama_cpp's own binding returns a
# float pointer, which costs a cast per token); bound once
_logits_at = llama_cpp.llama_cpp._lib["llama_get_logits_ith"]
_logits_at.argtypes = [ctypes.c_void_p, ctypes.c_int32]
_logits_at.restype = ctypes.c_void_p


def logits_row(ctx: llama_cpp.llama_context_p, batch_index: int, n_vocab: int) -> np.ndarray:
    """The logits at ``batch_index`` of the last decode, as a float32 view (no copy; on a GPU
    this is where the step's work is waited for)."""
    addr = _logits_at(ctx, batch_index)
    if not addr:
        raise InferenceError(f"no logits at batch index {batch_index}")
    row = _rows.get(addr)
    if row is None or len(row) != n_vocab:
        if len(_rows) >= 1024:  # contexts come and go: a bounded cache
            _rows.clear()
        row = _rows[addr] = np.ctypeslib.as_array((ctypes.c_float * n_vocab).from_address(addr))
    return row


@functools.lru_cache(maxsize=4)
def _ids(n_vocab: int) -> np.ndarray:
    return np.arange(n_vocab, dtype=np.int32)


def step_seed(seed: int, step: int) -> int:
    """Seed of the random draw at a session's ``step``-th sampled token (splitmix-style mix)."""
    x = (seed * 0x9E3779B97F4A7C15 + step * 0xBF58476D1CE4E5B9 + 1) & 0xFFFFFFFFFFFFFFFF
    x ^= x >> 31
    return x & 0xFFFFFFFF


class SamplerChain:
    """One llama.cpp sampler chain for one reply. Free with :meth:`close`.

    Per token it costs O(vocabulary) only where llama.cpp's samplers need the whole row: the
    repeat penalty touches the last ``repeat_last_n`` tokens' logits in place (llama.cpp's
    penalties sampler looks every vocabulary entry up in a hash map: ~0.4 ms at 128k tokens),
    and a greedy pick is an argmax over the logits row (llama.cpp first copies the row into a
    candidate array). Both are exactly what llama.cpp's samplers compute (test_sampling.py)."""

    def __init__(
        self,
        params: SamplingParams,
        vocab: llama_cpp.llama_vocab_p,
        *,
        grammar: str | None,
        history: list[int],
        reply_tokens: list[int],
        logprobs: int | None = None,
    ) -> None:
        self.params = params
        self.n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
        params.check_vocab(self.n_vocab)
        # logprobs: how many alternatives each sampled token reports (None: no logprobs);
        # ``last``: the sampled token's (logprob, [(id, logprob)] of the likeliest), set by
        # every sample (engine thread)
        self.logprobs = logprobs
        self.last: tuple[float, list[tuple[int, float]]] | None = None
        self._lp_row: np.ndarray | None = None
        self._lp_lse = 0.0
        self._lp_top: list[tuple[int, float]] = []
        # logit_bias as arrays (added before the penalties, as llama.cpp's chain orders them)
        self._bias_ids = np.array([k for k, _ in params.logit_bias], dtype=np.intp)
        self._bias = np.array([b for _, b in params.logit_bias], dtype=np.float32)
        self._freq = np.float32(params.frequency_penalty)
        self._presence = np.float32(params.presence_penalty)
        sparams = llama_cpp.llama_sampler_chain_default_params()
        self.chain = llama_cpp.llama_sampler_chain_init(sparams)
        self._n = 0  # samplers in the chain
        self._has_dist = False
        # the repeat penalty's window: the last repeat_last_n tokens sampled (a session's
        # history, then this reply's), as llama.cpp's penalties sampler keeps it
        self._window: deque[int] | None = None
        self._native_penalty = False
        # per-token buffers of a grammar's replies, made at their first use
        self._masked: np.ndarray | None = None
        self._cells: np.ndarray | None = None
        self._penalty = np.float32(params.repeat_penalty)
        openai = params.frequency_penalty != 0.0 or params.presence_penalty != 0.0
        penalized = (params.repeat_penalty != 1.0 or openai) and params.repeat_last_n > 0
        # (OpenAI's penalties, and any with a logit bias: numpy, which applies both in order)
        if penalized and (self.n_vocab >= NUMPY_PENALTY_MIN_VOCAB or openai
                          or len(self._bias_ids)):
            # (ids past the vocabulary match no candidate in llama.cpp either)
            self._window = deque((t for t in history[-params.repeat_last_n:]
                                  if 0 <= t < self.n_vocab), maxlen=params.repeat_last_n)
        elif penalized:  # a small vocabulary: llama.cpp's own penalties sampler, first
            pen = llama_cpp.llama_sampler_init_penalties(
                self.n_vocab, params.repeat_last_n, params.repeat_penalty, 0.0, 0.0)
            for tok in history[-params.repeat_last_n:]:
                llama_cpp.llama_sampler_accept(pen, tok)
            self._add(pen)
            self._native_penalty = True
        # the grammar is a mask on the logits, before this chain (runtime/grammar.py): its work
        # per token is bounded, which llama.cpp's grammar sampler's is not
        self.grammar: GrammarMatcher | None = None
        if grammar is not None:
            if not grammar.startswith(COMPILED_PREFIX):
                check_grammar(grammar)
            try:
                self.grammar = GrammarMatcher(grammar, vocab)
                self.grammar.replay(reply_tokens)  # the state after this reply so far
            except BaseException:
                llama_cpp.llama_sampler_free(self.chain)
                self.chain = None
                raise
        if params.greedy:
            self._add(llama_cpp.llama_sampler_init_greedy())
            return
        if params.top_k > 0:
            self._add(llama_cpp.llama_sampler_init_top_k(params.top_k))
        if params.top_p < 1.0:
            self._add(llama_cpp.llama_sampler_init_top_p(params.top_p, 1))
        if params.min_p > 0.0:
            self._add(llama_cpp.llama_sampler_init_min_p(params.min_p, 1))
        self._add(llama_cpp.llama_sampler_init_temp(params.temperature))
        self._has_dist = True
        self._add(llama_cpp.llama_sampler_init_dist(0))

    def _add(self, sampler: llama_cpp.llama_sampler_p) -> None:
        llama_cpp.llama_sampler_chain_add(self.chain, sampler)
        self._n += 1

    def sample(self, ctx: llama_cpp.llama_context_p, batch_index: int, step: int) -> int:
        """Sample (and accept) the next token from the logits at ``batch_index``."""
        if self.params.greedy and not self._native_penalty:
            tok = self._argmax(ctx, batch_index)
            if tok >= 0:
                self.accept(tok)
                return tok
        if self._has_dist:
            llama_cpp.llama_sampler_free(llama_cpp.llama_sampler_chain_remove(self.chain,
                                                                              self._n - 1))
            llama_cpp.llama_sampler_chain_add(
                self.chain, llama_cpp.llama_sampler_init_dist(step_seed(self.params.seed, step))
            )
        if self.grammar is None:
            row = logits_row(ctx, batch_index, self.n_vocab)
            undo = self._penalize(row)
            try:
                if self.logprobs is not None:
                    self._lp_prepare(row)
                tok = llama_cpp.llama_sampler_sample(self.chain, ctx, batch_index)
                if self.logprobs is not None:
                    self._lp_finish(row, tok)
            finally:
                if undo is not None:
                    row[undo[0]] = undo[1]
            if self._window is not None:
                self._window.append(tok)
            return tok
        # what llama_sampler_sample does, on logits the grammar has masked
        cells, arr = self._candidates(ctx, batch_index, self.grammar.n_vocab)  # arr is in it
        masked = None
        if self.logprobs is not None:  # the samplers rewrite the cells: a copy of the logits
            masked = cells["logit"].copy()
            self._lp_prepare(masked)
        llama_cpp.llama_sampler_apply(self.chain, ctypes.byref(arr))
        if not 0 <= arr.selected < arr.size:
            raise InferenceError("the sampler chain selected no token")
        tok = int(arr.data[arr.selected].id)
        if masked is not None:
            self._lp_finish(masked, tok)
        self.accept(tok)
        return tok

    def _lp_prepare(self, logits: np.ndarray) -> None:
        """The log-softmax normaliser of ``logits`` (the row the token is drawn from, after
        the penalties, the biases and a grammar's mask; before truncation and temperature,
        as OpenAI reports them) and its ``logprobs`` likeliest tokens. One exp pass over the
        row into a buffer of this chain's; the likeliest are looked for among the tokens
        nearest the best (a whole-row partition only where fewer than ``logprobs`` are within 9
        nats of it)."""
        top = min(self.logprobs or 0, len(logits))
        buf = self._lp_row
        if buf is None or len(buf) != len(logits):
            buf = self._lp_row = np.empty(len(logits), dtype=np.float32)
        best = float(logits.max())
        np.subtract(logits, np.float32(best), out=buf)
        np.exp(buf, out=buf)
        # (numpy's pairwise float32 sum: exact enough, and a float64 one converts the row)
        self._lp_lse = lse = best + math.log(float(buf.sum()))
        if not top:
            self._lp_top = []
            return
        for near in _LP_NEAR:  # within 3 nats of the best, then 9: few tokens to sort
            ids = np.flatnonzero(buf >= near)
            if len(ids) >= top:
                break
        else:
            ids = np.argpartition(buf, -top)[-top:]
        if len(ids) > top:
            ids = ids[np.argpartition(logits[ids], -top)[-top:]]
        order = ids[np.argsort(-logits[ids], kind="stable")]
        self._lp_top = [(int(i), float(logits[i]) - lse) for i in order]

    def _lp_finish(self, logits: np.ndarray, tok: int) -> None:
        self.last = (float(logits[tok]) - self._lp_lse, self._lp_top)

    def _argmax(self, ctx: llama_cpp.llama_context_p, batch_index: int) -> int:
        """The greedy pick (-1: leave it to llama.cpp): the first largest logit after the
        penalty and the grammar's mask, as llama.cpp's greedy sampler scans its candidates."""
        row = logits_row(ctx, batch_index, self.n_vocab)
        undo = self._penalize(row)
        try:
            pick = row
            if self.grammar is not None:  # refused tokens at -inf, in a buffer of this chain's
                if self._masked is None:
                    self._masked = np.empty(self.n_vocab, dtype=np.float32)
                pick = self._masked
                np.copyto(pick, _NEG_INF)
                np.copyto(pick, row, where=self.grammar.allowed())
            tok = int(pick.argmax())
            best = pick.item(tok)
            if self.logprobs is not None:
                self._lp_prepare(pick)
                self._lp_finish(pick, tok)
        finally:
            if undo is not None:
                row[undo[0]] = undo[1]
        return tok if best == best else -1  # a NaN logit: llama.cpp's comparisons decide

    def _penalize(self, row: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
        """The repeat penalty applied to ``row`` in place, as llama.cpp's penalties sampler
        does to its candidates (logit * p where <= 0, logit / p above); returns what to put
        back (ids, their logits), None if nothing changed."""
        if not self._window and not len(self._bias_ids):
            return None
        counts: dict[int, int] = {}
        for t in self._window or ():
            counts[t] = counts.get(t, 0) + 1
        seen = np.fromiter(counts, dtype=np.intp, count=len(counts))
        ids = np.union1d(seen, self._bias_ids) if len(self._bias_ids) else seen
        kept = row[ids]  # (a copy: fancy indexing)
        if len(self._bias_ids):
            row[self._bias_ids] += self._bias
        if len(seen):
            p = self._penalty
            now = row[seen]
            now = np.where(now <= 0, now * p, now / p)
            if self._freq or self._presence:
                n = np.fromiter(counts.values(), dtype=np.float32, count=len(counts))
                now = now - (n * self._freq + self._presence)
            row[seen] = now
        return ids, kept

    def _candidates(self, ctx: llama_cpp.llama_context_p, batch_index: int,
                    n_vocab: int) -> tuple[np.ndarray, llama_cpp.llama_token_data_array]:
        """The logits at ``batch_index`` as llama.cpp's candidate array (over this chain's
        buffer, rewritten by the next call), repeat penalty applied, tokens the grammar
        refuses at -inf."""
        cells = self._cells
        if cells is None or len(cells) != n_vocab:  # one per chain: no allocation per token
            cells = self._cells = np.empty(n_vocab, dtype=_TOKEN_DATA)
        cells["id"] = _ids(n_vocab)
        row = logits_row(ctx, batch_index, self.n_vocab)
        undo = self._penalize(row)
        logit = cells["logit"]
        if self.grammar is None:
            logit[:] = row[:n_vocab]
        else:
            logit[:] = _NEG_INF
            np.copyto(logit, row[:n_vocab], where=self.grammar.allowed())
        if undo is not None:
            row[undo[0]] = undo[1]
        cells["p"] = 0.0
        arr = llama_cpp.llama_token_data_array(
            data=ctypes.cast(cells.ctypes.data, ctypes.POINTER(llama_cpp.llama_token_data)),
            size=n_vocab, selected=-1, sorted=False)
        return cells, arr

    def distribution(self, ctx: llama_cpp.llama_context_p, batch_index: int,
                     n_vocab: int) -> np.ndarray:
        """The probabilities :meth:`sample` draws from at ``batch_index``: the chain's own
        transforms (grammar, penalties, top-k/top-p/min-p, temperature) applied to the logits,
        then a softmax (float64, over the vocabulary). Accepts nothing (see :meth:`accept`)."""
        cells, arr = self._candidates(ctx, batch_index, n_vocab)
        llama_cpp.llama_sampler_apply(self.chain, ctypes.byref(arr))
        # the samplers may shrink the array or point it at a buffer of their own
        kept = np.frombuffer((ctypes.c_char * (arr.size * _TOKEN_DATA.itemsize)).from_address(
            ctypes.addressof(arr.data.contents)), dtype=_TOKEN_DATA).copy()
        del cells
        finite = kept[np.isfinite(kept["logit"])]
        z = finite["logit"].astype(np.float64)
        w = np.exp(z - z.max())
        probs = np.zeros(n_vocab, dtype=np.float64)
        probs[finite["id"]] = w / w.sum()
        return probs

    def accept(self, token: int) -> None:
        """Record ``token`` as sampled (penalty window, grammar state), as :meth:`sample`
        does. Of the native samplers only llama.cpp's penalties keep state between tokens."""
        if self._window is not None:
            self._window.append(token)
        elif self._native_penalty:
            llama_cpp.llama_sampler_accept(self.chain, token)
        if self.grammar is not None:
            self.grammar.accept(token)

    def close(self) -> None:
        if self.chain:
            llama_cpp.llama_sampler_free(self.chain)
            self.chain = None
        self.grammar = None


def prepare_grammar(grammar: str | None, json_schema: str | dict | None) -> str | None:
    """The checked grammar for a reply (what SamplerChain takes): ``json_schema`` compiled by
    llguidance, else the GBNF ``grammar`` (compiled and cached), else None."""
    if json_schema is not None:
        return compile_json_schema(json.dumps(parse_schema(json_schema), sort_keys=False))
    if grammar is not None:
        check_grammar(grammar)
        compile_gbnf(grammar)  # refused here, off the engine thread, if llguidance refuses it
    return grammar


# GBNF lexemes that may hold "(": literals, char classes, comments, <tokens>; then the parens.
# Possessive and with an optional end: one pass, no backtracking (an unterminated literal runs to
# the end of the text, where llama.cpp's parser stops with an error too).
_GBNF_LEXEME = re.compile(
    r'"(?:\\.|[^"\\])*+"?|\[(?:\\.|[^\]\\])*+\]?|#[^\r\n]*+|<[^>]*+>?|[()]', re.S)


def check_grammar(grammar: str, what: str = "the grammar") -> None:
    """Raise :class:`InvalidGrammarError` unless ``grammar`` is within the GBNF limits."""
    if len(grammar) > MAX_GRAMMAR_CHARS:
        raise InvalidGrammarError(
            f"{what} is {len(grammar)} characters; the limit is {MAX_GRAMMAR_CHARS}")
    if "\0" in grammar or (not grammar.isascii() and not _utf8(grammar)):
        raise InvalidGrammarError(f"{what} holds a NUL or a lone surrogate")
    depth = _nesting(grammar)
    if depth > MAX_GRAMMAR_DEPTH:
        raise InvalidGrammarError(
            f"{what} nests ( ) groups {depth} deep; the limit is {MAX_GRAMMAR_DEPTH}")


@functools.lru_cache(maxsize=64)  # a chain is rebuilt on every reshard: scan a grammar once
def _nesting(grammar: str) -> int:
    """The deepest ( ) nesting, as llama.cpp's parser recurses on it."""
    depth = deepest = 0
    for m in _GBNF_LEXEME.finditer(grammar):
        c = m.group()
        if c == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif c == ")":
            depth = max(0, depth - 1)
    return deepest


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


_REPEAT_KEYS = frozenset(("minLength", "maxLength", "minItems", "maxItems"))
_QUANTIFIER = re.compile(r"\{([^{}]*)\}")


def check_schema(schema: object) -> None:
    """Raise :class:`InvalidGrammarError` unless ``schema`` is within the JSON-schema limits.

    Iterative and bounded by MAX_SCHEMA_CHARS, so a schema of any size or depth is refused
    quickly (the converter would recurse, and json.dumps too)."""
    size = 0
    todo: list[tuple[object, int]] = [(schema, 1)]
    while todo:
        node, depth = todo.pop()
        size += 2  # a lower bound of the JSON text's length: refused as soon as it is too big
        if size > MAX_SCHEMA_CHARS:
            raise InvalidGrammarError(
                f"the JSON schema is more than {MAX_SCHEMA_CHARS} characters as JSON")
        if isinstance(node, (dict, list)) and depth > MAX_SCHEMA_DEPTH:
            raise InvalidGrammarError(
                f"the JSON schema nests more than {MAX_SCHEMA_DEPTH} objects/arrays deep")
        if isinstance(node, list):
            todo.extend((v, depth + 1) for v in node)
        elif isinstance(node, str):
            size += len(node)
        elif isinstance(node, dict):
            for k, v in node.items():
                if not isinstance(k, str) or len(k) > MAX_SCHEMA_NAME_CHARS:
                    raise InvalidGrammarError(
                        f"JSON schema names must be text of at most {MAX_SCHEMA_NAME_CHARS} "
                        "characters")
                size += len(k)
                if k == "properties" and isinstance(v, dict) and len(v) > MAX_SCHEMA_PROPERTIES:
                    raise InvalidGrammarError(
                        f"a JSON schema object has {len(v)} properties; the limit is "
                        f"{MAX_SCHEMA_PROPERTIES}")
                if k in _REPEAT_KEYS and not isinstance(v, (dict, list)):
                    _repeat_bound(k, v)
                elif k == "pattern" and isinstance(v, str):
                    for q in _QUANTIFIER.finditer(v):
                        for part in q.group(1).split(","):
                            n = _int_or_none(part.strip())
                            if n is not None:
                                _repeat_bound(f"the pattern's {{{q.group(1)}}}", n)
                    _check_pattern(v)
                todo.append((v, depth + 1))
    try:
        n = len(json.dumps(schema, ensure_ascii=False))  # depth is bounded by now
    except (TypeError, ValueError) as e:  # not JSON data (a set, an int of 5000 digits, ...)
        raise InvalidGrammarError(f"the JSON schema is not JSON data: {e}") from None
    if n > MAX_SCHEMA_CHARS:
        raise InvalidGrammarError(
            f"the JSON schema is {n} characters as JSON; the limit is {MAX_SCHEMA_CHARS}")


def _repeat_bound(key: str, value: object) -> None:
    if type(value) is not int or not 0 <= value <= MAX_SCHEMA_REPEAT:
        raise InvalidGrammarError(
            f"{key} in a JSON schema must be a whole number from 0 to {MAX_SCHEMA_REPEAT} "
            f"(got {str(value)[:32]})")


def _check_pattern(pattern: str) -> None:
    """Refuse a pattern that repeats a group able to match nothing, or whose nested repetitions
    multiply past MAX_PATTERN_REPEAT_PRODUCT (see there). Read with Python's regex parser, its
    bounds first written as the converter reads them ({ 0 , 5 } is a quantifier there)."""
    if _re_parser is None:
        return
    text = _QUANTIFIER.sub(_canonical_quantifier, pattern)
    try:
        _pattern_nullable(_re_parser.parse(text), 1)
    except (re.error, RecursionError, OverflowError) as e:
        raise InvalidGrammarError(
            f"the JSON schema pattern is not a regular expression the sidecar can check: {e}"
        ) from None


def _canonical_quantifier(m: re.Match[str]) -> str:
    parts = [_int_or_none(p.strip()) for p in m.group(1).split(",")]
    if len(parts) == 1 and parts[0] is not None:
        return f"{{{parts[0]}}}"
    if len(parts) == 2 and m.group(1).strip() != ",":
        lo, hi = parts
        return f"{{{lo or 0},{'' if hi is None else hi}}}"
    if len(parts) == 2:
        return "{0,}"
    return m.group(0)


def _pattern_nullable(items: Any, product: int) -> bool:
    """Whether the parsed ``items`` can match the empty string; refuses as it goes."""
    P = _re_parser
    repeats = {getattr(P, n, None) for n in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT")}
    nullable = True
    for op, av in items:
        if op in repeats:
            lo, hi, body = av
            bound = MAX_SCHEMA_REPEAT if hi == P.MAXREPEAT else hi
            inner = product * max(bound, 1)
            if inner > MAX_PATTERN_REPEAT_PRODUCT:
                raise InvalidGrammarError(
                    f"nested repetitions in a JSON schema pattern allow {inner} repeats; the "
                    f"limit is {MAX_PATTERN_REPEAT_PRODUCT} (upper bounds multiplied, * and + "
                    f"counted as {MAX_SCHEMA_REPEAT})")
            body_nullable = _pattern_nullable(body, inner)
            if body_nullable and (hi > 1 or hi == P.MAXREPEAT):
                raise InvalidGrammarError(
                    "a JSON schema pattern repeats a group that can match nothing (such as "
                    "(a?){0,n} or (a*)*); the limit for such a group is ? (at most once)")
            item = lo == 0 or body_nullable
        elif op is P.SUBPATTERN:
            item = _pattern_nullable(av[-1], product)
        elif op is getattr(P, "ATOMIC_GROUP", None):
            item = _pattern_nullable(av, product)
        elif op is P.BRANCH:
            item = any([_pattern_nullable(b, product) for b in av[1]])  # each branch checked
        elif op in (P.LITERAL, P.NOT_LITERAL, P.ANY, P.IN):
            item = False
        else:  # ^ $ \b, lookarounds, backreferences, conditionals: may match nothing
            item = True
        nullable = nullable and item
    return nullable


def _int_or_none(text: str) -> int | None:
    try:
        return int(text) if text else None
    except ValueError:  # the converter refuses it too
        return None


def parse_schema(schema: str | dict) -> object:
    """A JSON schema (text or data) as data, within the limits above."""
    if isinstance(schema, str):
        if len(schema) > MAX_SCHEMA_CHARS:
            raise InvalidGrammarError(
                f"the JSON schema is {len(schema)} characters; the limit is {MAX_SCHEMA_CHARS}")
        try:
            schema = json.loads(schema)
        except (ValueError, RecursionError) as e:
            raise InvalidGrammarError(f"the JSON schema is not JSON: {e}") from None
    check_schema(schema)
    return schema


def json_schema_grammar(schema: str | dict) -> str:
    """GBNF for a JSON schema (llama-cpp-python's converter, which tracks llama.cpp's), within
    the limits above: bounded time and output whatever the schema. Replies are constrained by
    llguidance's own compiler instead (prepare_grammar): this is the schema as GBNF text."""
    schema = parse_schema(schema)  # type: ignore[assignment]
    try:
        conv = _converter()
        conv.visit(conv.resolve_refs(json.loads(json.dumps(schema)), "stdin"), "")
        gbnf = conv.format_grammar()
    except InvalidGrammarError:
        raise
    except Exception as e:  # noqa: BLE001 - the converter raises bare Exceptions/KeyErrors on bad schemas
        raise InvalidGrammarError(f"cannot turn this JSON schema into a grammar: {e}") from None
    check_grammar(gbnf, "the grammar made from this JSON schema")
    return gbnf


def _converter() -> Any:
    """llama-cpp-python's SchemaConverter (what json_schema_to_gbnf runs; the version is pinned)
    with two changes in ``_add_rule``, which every rule goes through: a name is found in O(1)
    (the original counts up from 0 on every clash: cubic for names that escape alike, such as
    non-ASCII property names), and the rule text written is metered (MAX_SCHEMA_WORK_CHARS)."""
    from llama_cpp.llama_grammar import INVALID_RULE_CHARS_RE, SchemaConverter

    class Converter(SchemaConverter):
        def __init__(self) -> None:
            super().__init__(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
            self._keys: dict[tuple[str, str], str] = {}
            self._next: dict[str, int] = {}
            self._work = 0

        def _add_rule(self, name: str, rule: str) -> str:
            self._work += len(name) + len(rule)
            if self._work > MAX_SCHEMA_WORK_CHARS:
                raise InvalidGrammarError(
                    f"converting this JSON schema writes more than {MAX_SCHEMA_WORK_CHARS} "
                    "characters of grammar rules (many optional properties, or allOf/$ref "
                    "repeating them); simplify it")
            esc = INVALID_RULE_CHARS_RE.sub("-", name)
            key = esc if self._rules.get(esc, rule) == rule else self._keys.get((esc, rule))
            if key is None:
                i = self._next.get(esc, 0)
                while f"{esc}{i}" in self._rules:
                    i += 1
                key, self._next[esc] = f"{esc}{i}", i + 1
            self._rules[key] = rule
            self._keys[(esc, rule)] = key
            return key

    return Converter()
