"""Speculative decoding: a small draft model proposes tokens, the target model verifies them.

Per decoding session and step, the draft (a second GGUF with the target's vocabulary, wholly on
the GPU when there is one) proposes ``k`` tokens in ``k`` small decodes, batched across sessions,
picking with the session's own settings and penalty history (no grammar: drafting is off there);
the engine then puts the session's last token and the ``k`` drafts into the target's batch with
logits at every position, and walks them in order with the session's own sampler chain:

* greedy: the target's token at position *i* is the chain's pick there; drafts are kept while
  they equal it, and the first disagreement is replaced by the target's token (the output is
  the target's greedy output, penalties included, since the chain accepts the same tokens in the
  same order);
* sampled: standard speculative sampling on the distributions after the chain's transforms
  (:func:`speculative_pick`), so the output keeps the target's distribution (not the same draws
  as without a draft for a given seed).

The draft keeps its own KV cache, one sequence per session slot, as a pure function of the
session's tokens: it is synced lazily (common prefix kept, the rest re-decoded), so the target's
snapshots, saves and reshards never contain draft state and need nothing from it.

Proposals may also come from n-grams of the session's own tokens (``runtime/ngram.py``), with no
draft model; they are verified the same way (sampled: as a proposal ``q`` with all its mass on
the proposed token). Whether a session drafts, and how many tokens, is
``runtime/draft_policy.py``'s.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from igi_sdk.errors import DraftMismatchError
from igi_sdk.model import read_inventory
from igi_sdk.planner.speculative import draft_plan
from igi_sdk.profile import Profile
from igi_sdk.runtime import loader
from igi_sdk.runtime.devices import first_gpu
from igi_sdk.runtime.draft_policy import Policy, Source
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.runtime.sampling import SamplerChain, SamplingParams

log = logging.getLogger("igi_sdk.runtime")

@dataclass(frozen=True)
class SpeculativeConfig:
    k: int = 4  # most tokens drafted per session and step (each session's k follows its α)
    # draft only where the break-even says it pays, with a k per session; False: draft k
    # tokens every eligible step (tests, benchmarks of the mechanism)
    adaptive: bool = True
    reprobe_after: int = 64  # plain steps before a switched-off session's record weighs less
    warmup_steps: int = 3  # plain steps timed before an unpriced draft is tried (adaptive)
    decay: float = 0.97  # weight of the past in the α evidence and the step-time averages
    # draft-free drafting: proposals from n-grams of the session's own prompt and reply, used
    # where one is found (else the draft model's, if there is one)
    ngram: bool = False
    ngram_n_min: int = 2
    ngram_n_max: int = 4
    assumed_alpha: float = 0.7  # a draft model's per-token α before it is measured
    ngram_alpha: float = 0.5  # an n-gram proposal's per-token α before it is measured
    # this machine's profile: the planner's predicted step seconds for the loaded plan decide
    # until steps are measured (None: the first steps measure them)
    profile: Profile | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if (not 1 <= self.k <= 32 or not 0.0 < self.decay < 1.0 or self.reprobe_after < 1
                or not 1 <= self.ngram_n_min <= self.ngram_n_max
                or not 0.0 <= self.assumed_alpha <= 1.0 or not 0.0 <= self.ngram_alpha <= 1.0):
            raise ValueError(f"invalid speculative settings {self}")

    @property
    def policy(self) -> Policy:
        return Policy(k_max=self.k, adaptive=self.adaptive, warmup_steps=self.warmup_steps,
                      reprobe_after=self.reprobe_after, assumed_alpha=self.assumed_alpha,
                      ngram_alpha=self.ngram_alpha)


# --------------------------------------------------------------------------- pure helpers


def speculative_pick(p: np.ndarray, q: np.ndarray | None, drafted: int,
                     rng: np.random.Generator) -> tuple[int, bool]:
    """One position of speculative sampling: keep ``drafted`` (drawn from ``q``) with
    probability min(1, p/q), else draw from the normalized residual max(0, p - q). The token
    returned is distributed as ``p``. Returns (token, whether the draft was kept). ``q`` None:
    a deterministic proposal (an n-gram's), all of q's mass on ``drafted``."""
    px, qx = float(p[drafted]), 1.0 if q is None else float(q[drafted])
    if qx > 0.0 and rng.random() * qx < px:
        return drafted, True
    if q is None:
        residual = p.copy()
        residual[drafted] = 0.0
    else:
        residual = np.maximum(p - q, 0.0)
    total = residual.sum()
    if total <= 0.0:  # p == q up to rounding: the residual is empty, p itself is the answer
        residual, total = p, p.sum()
    return draw(residual / total, rng), False


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    cdf = np.cumsum(probs)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(probs) - 1))


def common_prefix(a: list[int], b: list[int]) -> int:
    """Length of the common prefix of two token lists (C-speed slice compares)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def check_same_vocab(target: Any, draft: Any) -> None:
    """Raise :class:`DraftMismatchError` unless the two llama vocabs have the same tokens (text
    and kind, id by id) and the same special tokens."""
    n_t, n_d = llama_cpp.llama_vocab_n_tokens(target), llama_cpp.llama_vocab_n_tokens(draft)
    if n_t != n_d:
        raise DraftMismatchError(
            f"the draft model has {n_d} tokens and the target {n_t}: a draft must share the "
            "target's tokenizer")
    for name in ("bos", "eos", "eot"):
        fn = getattr(llama_cpp, f"llama_vocab_{name}")
        if fn(target) != fn(draft):
            raise DraftMismatchError(f"the draft model's {name.upper()} token differs from "
                                     "the target's")
    for i in range(n_t):
        if (llama_cpp.llama_vocab_get_text(target, i) != llama_cpp.llama_vocab_get_text(draft, i)
                or llama_cpp.llama_vocab_get_attr(target, i)
                != llama_cpp.llama_vocab_get_attr(draft, i)):
            raise DraftMismatchError(
                f"token {i} differs between the draft and the target model: a draft must share "
                "the target's tokenizer")


# --------------------------------------------------------------------------- the draft model


@dataclass
class DraftRequest:
    seq: int
    context: list[int]  # what the target has decoded plus the token it is about to decode
    k: int
    params: SamplingParams  # the session's: the draft picks as the target would, penalties too
    history: list[int]  # the session's sampled tokens (repeat penalty)
    rng: np.random.Generator | None = None  # sampled sessions: the step's draws


@dataclass
class Proposal:
    tokens: list[int] = field(default_factory=list)
    dists: list[np.ndarray] = field(default_factory=list)  # q per token (sampled only)
    rng: np.random.Generator | None = None  # sampled: the draws of this step, verify included
    rows: list[int] = field(default_factory=list)  # batch rows of the verify logits (engine)
    source: Source = "model"  # who proposed it: the draft model or the n-gram index


class Drafter:
    """The draft model: its own llama.cpp model and context, one sequence per session slot,
    all on the engine thread. :meth:`close` frees it (what ``Engine.drop_draft`` does)."""

    def __init__(self, path: str | Path, target_vocab: Any, settings: ContextSettings,
                 copy_compute_min_batch: int) -> None:
        self.path = Path(path)
        inventory = read_inventory(self.path)
        # wholly on the GPU when there is one: it drafts while the target's CPU share idles
        self.on_gpu = first_gpu() is not None
        plan = draft_plan(inventory, gpu=self.on_gpu).model_copy(
            update={"copy_compute_min_batch": copy_compute_min_batch})
        self._threads = settings.n_threads  # what its context runs with now (0: the default)
        self._loaded: loader.Loaded | None = loader.load(self.path, inventory, plan, settings,
                                                         names_streamed=False)
        try:
            self.vocab = llama_cpp.llama_model_get_vocab(self._loaded.model)
            check_same_vocab(target_vocab, self.vocab)
            self.n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
            self._batch_cap = settings.n_batch
            self._batch = llama_cpp.llama_batch_init(self._batch_cap, 0, 1)
        except BaseException:
            loader.free(self._loaded)
            raise
        self._ctx = self._loaded.ctx
        self._mem = llama_cpp.llama_get_memory(self._ctx)
        self.memory = {d: self._loaded.report.bytes_on(d, self._loaded.gpu)
                       for d in ("gpu", "cpu")}
        self._held: dict[int, list[int]] = {}  # tokens in the draft's KV, per sequence

    def forget(self, seq: int) -> None:
        if self._held.pop(seq, None) is not None:
            llama_cpp.llama_memory_seq_rm(self._mem, seq, -1, -1)

    def run_with(self, threads: int) -> None:
        """Run the next graphs with the target's thread count: the two contexts decode in turn
        on one thread, and a draft with more threads than the target has cores for would have
        them spin or stall beside whatever took the others."""
        if threads > 0 and threads != self._threads:
            llama_cpp.llama_set_n_threads(self._ctx, threads, threads)
            self._threads = threads

    def propose(self, requests: list[DraftRequest],
                catch_up: int) -> tuple[dict[int, Proposal], int, float]:
        """Proposals per sequence, the number of one-token-per-sequence draft decodes run and
        their seconds (a catch-up decode, a prompt's worth of tokens, is not a draft step's
        cost). A session whose draft KV is behind (a new prompt, a restore, a reload) is caught
        up with at most ``catch_up`` tokens per step in all, and proposes nothing until it is:
        the step stays short."""
        ready: list[tuple[DraftRequest, int]] = []  # (request, batch index of its logits)
        fed: list[tuple[list[int], list[int]]] = []  # (held list, tokens it gains if decoded)
        batch, n = self._batch, 0
        for r in requests:
            held = self._held.setdefault(r.seq, [])
            keep = min(common_prefix(held, r.context), len(r.context) - 1)
            if keep < len(held):  # the target rolled back or moved on: so does the draft
                llama_cpp.llama_memory_seq_rm(self._mem, r.seq, keep, -1)
                del held[keep:]
            missing = r.context[keep:]
            take = min(len(missing), max(catch_up, len(requests)) - n, self._batch_cap - n)
            if take <= 0:
                continue
            for i in range(take):
                put_token(batch, n + i, missing[i], keep + i, r.seq, False)
            if take == len(missing):
                batch.logits[n + take - 1] = 1
                ready.append((r, n + take - 1))
            fed.append((held, missing[:take]))
            n += take
        if n == 0:
            return {}, 0, 0.0
        batch.n_tokens = n
        # one token per drafting sequence: a draft step; more: a catch-up, not timed
        steady = n == len(ready) and len(fed) == len(ready)
        t0 = time.perf_counter()
        ok = self._decode(requests)
        decodes, seconds = (1, time.perf_counter() - t0) if steady else (0, 0.0)
        if not ok:
            return {}, decodes, seconds
        for held, tokens in fed:
            held.extend(tokens)
        # the session's own transforms (no grammar: drafting is off there) with its penalty
        # history, so that the draft's picks differ from the target's only where the models do
        chains = {r.seq: SamplerChain(r.params, self.vocab, grammar=None, history=r.history,
                                      reply_tokens=[]) for r, _ in ready}
        try:
            out: dict[int, Proposal] = {}
            for r, idx in ready:
                out[r.seq] = Proposal(rng=r.rng)
                self._pick(r, chains[r.seq], idx, out[r.seq])
            while True:  # one decode per further draft token, every drafting session together
                more = [r for r, _ in ready if len(out[r.seq].tokens) < r.k]
                if not more:
                    return out, decodes, seconds
                for i, r in enumerate(more):
                    tok = out[r.seq].tokens[-1]
                    put_token(batch, i, tok, len(self._held[r.seq]), r.seq, True)
                batch.n_tokens = len(more)
                decodes += 1
                t0 = time.perf_counter()
                ok = self._decode(requests)
                seconds += time.perf_counter() - t0
                if not ok:
                    return {}, decodes, seconds
                for i, r in enumerate(more):
                    self._held[r.seq].append(out[r.seq].tokens[-1])
                    self._pick(r, chains[r.seq], i, out[r.seq])
        finally:
            for chain in chains.values():
                chain.close()

    def _decode(self, requests: list[DraftRequest]) -> bool:
        rc = llama_cpp.llama_decode(self._ctx, self._batch)
        if rc == 0:
            return True
        # the draft's cache is only a helper: start its sequences over, never fail the target
        log.warning("draft decode failed (%d): its sequences are rebuilt", rc)
        for r in requests:
            self.forget(r.seq)
        return False

    def _pick(self, r: DraftRequest, chain: SamplerChain, idx: int, into: Proposal) -> None:
        if r.rng is None:  # greedy: the chain's pick (accepted into its penalty history)
            into.tokens.append(chain.sample(self._ctx, idx, 0))
            return
        q = chain.distribution(self._ctx, idx, self.n_vocab)
        x = draw(q, r.rng)
        chain.accept(x)
        into.tokens.append(x)
        into.dists.append(q)

    def close(self) -> None:
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._loaded is not None:
            loader.free(self._loaded)
            self._loaded = None
        self._held.clear()


def put_token(batch: Any, i: int, token: int, pos: int, seq: int, logits: bool) -> None:
    batch.token[i] = token
    batch.pos[i] = pos
    batch.n_seq_id[i] = 1
    batch.seq_id[i][0] = seq
    batch.logits[i] = 1 if logits else 0

