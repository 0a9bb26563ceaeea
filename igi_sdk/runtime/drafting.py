"""The engine's side of speculative decoding (speculative.py has the mechanism): the draft
model, what each session's drafts earn, and a step's drafts walked against the target's logits.

The engine owns one :class:`Drafting` and calls it on its thread; ``status`` and the
``acceptance`` figures are read from any thread without waiting (one read of each field).
:meth:`Drafting.verify_pick` is the seam where the target's pick at one verify position is
made: ``benchmarks/speculative_bench.py`` patches it on the class to force acceptance rates.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from igi_sdk.planner.speculative import draft_n_ctx
from igi_sdk.runtime.config import EngineConfig
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.runtime.session import Session, Turn
from igi_sdk.runtime.speculative import (
    Acceptance,
    Drafter,
    DraftRequest,
    Proposal,
    StepTimes,
    speculative_pick,
)
from igi_sdk.runtime.text import Vocab


class Drafting:
    """Draft model, per-session acceptance and step timings of one engine (engine thread).

    ``take(turn, token)`` is the engine's: it adds a sampled token to the reply and says
    whether the reply goes on (``Engine._take``)."""

    def __init__(self, config: EngineConfig, take: Callable[[Turn, int], bool]) -> None:
        self.config = config
        self._take = take
        self.drafter: Drafter | None = None
        self.acceptance: dict[str, Acceptance] = {}  # per session id
        self.times = StepTimes()
        self.totals = {"drafted": 0, "accepted": 0, "steps": 0}

    def load(self, path: str | Path, vocab: Vocab, copy_compute_min_batch: int) -> None:
        c = self.config
        # its sequences mirror the sessions', plus the drafts beyond them
        settings = ContextSettings(draft_n_ctx(c.n_ctx, c.max_sessions, c.speculative.k),
                                   c.max_sessions, c.n_batch, c.n_threads)
        self.drafter = Drafter(path, vocab.vocab, settings, copy_compute_min_batch)

    def drop(self) -> bool:
        """Free the draft model; True if there was one."""
        drafter, self.drafter = self.drafter, None
        if drafter is not None:
            drafter.close()
        return drafter is not None

    def forget(self, s: Session) -> None:
        """The session is closed: its draft sequence and figures go."""
        if self.drafter is not None:
            self.drafter.forget(s.seq)
        self.acceptance.pop(s.id, None)

    def status(self) -> dict[str, Any]:
        drafter, totals = self.drafter, dict(self.totals)
        times = self.times
        return {
            "draft": str(drafter.path) if drafter else None,
            "draft_memory": drafter.memory if drafter else None,
            "k": self.config.speculative.k,
            **totals,
            "alpha": round(totals["accepted"] / totals["drafted"], 4) if totals["drafted"]
            else None,
            "step_s": {"plain": times.plain_s, "verify": times.verify_s, "draft": times.draft_s},
            "sessions": {sid: a.figures() for sid, a in list(self.acceptance.items())},
        }

    def time_step(self, verified: bool, seconds: float) -> None:
        """A decode step (one token per reply, plus drafts where ``verified``) took
        ``seconds``."""
        self.times.add("verify_s" if verified else "plain_s", seconds,
                       self.config.speculative.decay)

    def propose(self, turns: list[Turn], budget: int) -> dict[int, Proposal]:
        """Draft tokens for the decoding replies where drafting is on (by sequence). They come
        on top of the step's token budget (at most k per decoding reply), so that prompt chunks
        are split as without drafts; the draft's catch-up is bounded by the budget."""
        drafter, cfg = self.drafter, self.config.speculative
        if drafter is None or (cfg.adaptive and self.times.plain_count < cfg.warmup_steps):
            return {}  # adaptive: a plain step's time is known before anything is drafted
        requests: list[DraftRequest] = []
        for t in turns:
            k = self.draft_k(t)
            if k <= 0:
                continue
            s = t.session
            sampled = not s.params.greedy
            requests.append(DraftRequest(
                s.seq, [*s.tokens, t.feed[0]], k, s.params, s.history,
                # the step's draws, reproducible from the session's seed and step
                np.random.default_rng([s.params.seed, s.n_sampled, 0x5bec]) if sampled
                else None))
        if not requests:
            return {}
        t0 = time.perf_counter()
        proposals, decodes = drafter.propose(requests, catch_up=budget)
        if decodes:
            self.times.add("draft_s", (time.perf_counter() - t0) / decodes, cfg.decay)
        return proposals

    def draft_k(self, t: Turn) -> int:
        """Tokens to draft for ``t`` this step (0: none). Off for grammar replies: the draft
        proposes unconstrained text that the grammar would mostly refuse."""
        s, cfg = t.session, self.config.speculative
        if len(t.feed) != 1 or t.grammar is not None or t.chain is None or s.n_images:
            return 0  # the draft cannot see images
        k = min(cfg.k,
                t.max_tokens - len(t.generated) - 1,  # the reply's last token needs no draft
                self.config.n_ctx - len(s.tokens) - 3)  # as a plain step, the context allows
        if k <= 0:
            return 0
        acceptance = self.acceptance.setdefault(s.id, Acceptance())
        return k if acceptance.wants_draft(cfg) else 0

    def verify(self, t: Turn, proposal: Proposal, ctx: Any, mem: Any, vocab: Vocab) -> None:
        """Walk the verify positions (the fed token, then the drafts; logits at the batch rows
        ``proposal.rows`` of the target's ``ctx``): keep drafts while the target agrees, take
        the target's token at the first disagreement, and cut the cache (``mem``) after the
        last position used."""
        s, cfg = t.session, self.config.speculative
        fed = [t.feed[0], *proposal.tokens]
        used = kept = 0
        for i in range(len(fed)):
            tok, agreed = self.verify_pick(t, proposal.rows[i], proposal, i, ctx, vocab)
            used, kept = i + 1, kept + agreed
            t.feed = []
            if not self._take(t, tok) or not agreed:
                break
        # the cache keeps the tokens whose logits were used; the last pick is the next feed
        s.decoded(fed[:used])
        llama_cpp.llama_memory_seq_rm(mem, s.seq, len(s.tokens), -1)
        k = len(proposal.tokens)
        acceptance = self.acceptance.setdefault(s.id, Acceptance())
        acceptance.record(k, kept, cfg.decay)
        acceptance.judge(cfg, self.times.break_even(k))
        self.totals["drafted"] += k
        self.totals["accepted"] += kept
        self.totals["steps"] += 1

    def verify_pick(self, t: Turn, idx: int, proposal: Proposal, i: int, ctx: Any,
                    vocab: Vocab) -> tuple[int, bool]:
        """The target's token at verify position ``i`` (logits row ``idx`` of ``ctx``), and
        whether it keeps draft ``i``."""
        assert t.chain is not None
        s, k = t.session, len(proposal.tokens)
        if i == k or proposal.rng is None:
            # greedy (the chain's pick, exactly as without a draft), or the bonus token after k
            # kept drafts (an ordinary sample from the target)
            tok = t.chain.sample(ctx, idx, s.n_sampled)
            return tok, i < k and tok == proposal.tokens[i]
        p = t.chain.distribution(ctx, idx, vocab.n_tokens)
        tok, kept = speculative_pick(p, proposal.dists[i], proposal.tokens[i], proposal.rng)
        t.chain.accept(tok)  # penalties and grammar see it as if sampled
        return tok, kept
