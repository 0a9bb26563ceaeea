"""The engine's side of speculative decoding (speculative.py has the mechanism): the draft
model and the n-gram proposer, what each session's drafts earn, the step costs that decide
whether and how much to draft (draft_policy.py), and a step's drafts walked against the target's
logits.

The engine owns one :class:`Drafting` and calls it on its thread; ``status`` and the
``acceptance`` figures are read from any thread without waiting (one read of each field).
:meth:`Drafting.verify_pick` is the seam where the target's pick at one verify position is
made: ``benchmarks/speculative_bench.py`` patches it on the class to force acceptance rates.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np

from igi_sdk.events import DraftFigures
from igi_sdk.model import ModelInventory, read_inventory
from igi_sdk.planner.cost import ubatch_cost, uses_copy_compute
from igi_sdk.planner.plan import Plan
from igi_sdk.planner.speculative import draft_n_ctx, step_seconds
from igi_sdk.runtime import _native
from igi_sdk.runtime.config import EngineConfig
from igi_sdk.runtime.draft_policy import (
    SOURCES,
    Acceptance,
    Source,
    StepCosts,
    StepPrior,
    choose_k,
)
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.runtime.ngram import NgramIndex
from igi_sdk.runtime.session import Session, Turn
from igi_sdk.runtime.speculative import (
    Drafter,
    DraftRequest,
    Proposal,
    speculative_pick,
)
from igi_sdk.runtime.text import Vocab


def figures(records: Iterable[Acceptance], *, drafting: bool, k: int) -> DraftFigures:
    """Totals of some acceptance records, with α the per-token acceptance (the planner's)."""
    drafted = accepted = failures = passes = tokens = 0
    for a in records:
        drafted, accepted, failures = drafted + a.drafted, accepted + a.accepted, \
            failures + a.failures
        passes, tokens = passes + a.passes, tokens + a.tokens
    return {"drafted": drafted, "accepted": accepted, "passes": passes,
            "alpha": round(accepted / (accepted + failures), 4) if accepted + failures else None,
            "acceptance_rate": round(accepted / drafted, 4) if drafted else None,
            "tokens_per_pass": round(tokens / passes, 4) if passes else None,
            "k": k, "drafting": drafting}


def token_bytes(inventory: ModelInventory) -> int:
    """Weight bytes one decoded token reads: all but the token embedding, of which it reads a
    row (but the whole of it where it is also the output head)."""
    groups = inventory.bytes_by_group()
    tied = groups.get("output", 0) == 0
    return sum(n for g, n in groups.items() if g != "token_embd" or tied)


class SessionDrafts:
    """One session's acceptance per drafter, and its n-gram index."""

    def __init__(self, ngram: NgramIndex | None) -> None:
        self.by_source: dict[Source, Acceptance] = {}
        self.ngram = ngram

    def of(self, source: Source) -> Acceptance:
        return self.by_source.setdefault(source, Acceptance())

    def figures(self) -> DraftFigures:
        records = list(self.by_source.values())
        return figures(records, drafting=any(a.drafting for a in records),
                       k=max((a.k for a in records), default=0))


class Drafting:
    """Draft model, n-gram proposer, per-session acceptance and step costs of one engine
    (engine thread).

    ``take(turn, token)`` is the engine's: it adds a sampled token to the reply and says
    whether the reply goes on (``Engine._take``)."""

    def __init__(self, config: EngineConfig, take: Callable[[Turn, int], bool]) -> None:
        self.config = config
        self._take = take
        self.drafter: Drafter | None = None
        self._draft_inventory: ModelInventory | None = None
        self.acceptance: dict[str, SessionDrafts] = {}  # per session id
        self.costs = StepCosts()
        self.prior: StepPrior | None = None  # predicted for the loaded plan (with a profile)
        self._target: tuple[ModelInventory, Plan] | None = None
        self.totals: dict[Source, Acceptance] = {src: Acceptance() for src in SOURCES}

    @property
    def enabled(self) -> bool:
        return self.drafter is not None or self.config.speculative.ngram

    def placed(self, inventory: ModelInventory, plan: Plan) -> None:
        """The target is loaded with ``plan``: its step costs are measured anew, predicted by
        the planner meanwhile."""
        self._target = (inventory, plan)
        self.costs = StepCosts()
        self._price()

    def _price(self) -> None:
        self.costs.draft_per_plain = self._draft_per_plain()
        prof, target = self.config.speculative.profile, self._target
        if prof is None or target is None:
            self.prior = None
            return
        k = self.config.speculative.k
        ctx = min(self.config.n_ctx, 1024) // 2
        plan = target[1]
        if plan.op_offload and prof.gpu is not None:  # priced as llama.cpp runs it
            plan = plan.model_copy(update={
                "copy_compute_min_batch": _native.copy_compute_threshold_in_effect()})
        sec = step_seconds(target[0], plan, self._draft_inventory, prof, ctx, k)
        verify = tuple(ubatch_cost(target[0], plan, prof, j + 1, ctx).total
                       for j in range(1, k + 1))
        streams_from = next((j for j in range(1, k + 1) if uses_copy_compute(plan, prof, j + 1)),
                            0)
        self.prior = StepPrior.from_verifies(sec.plain_s, verify, sec.draft_s, streams_from)

    def _draft_per_plain(self) -> float | None:
        """A draft decode ÷ a plain target step where both read their weights on the CPU: the
        bytes each reads per token (a same-size draft: 1, which can never pay)."""
        target, drafter, draft = self._target, self.drafter, self._draft_inventory
        if target is None or draft is None or drafter is None or drafter.on_gpu:
            return None
        if target[1].uses_gpu():
            return None
        read = token_bytes(target[0])
        return token_bytes(draft) / read if read > 0 else None

    def load(self, path: str | Path, vocab: Vocab, copy_compute_min_batch: int) -> None:
        c = self.config
        # its sequences mirror the sessions', plus the drafts beyond them
        settings = ContextSettings(draft_n_ctx(c.n_ctx, c.max_sessions, c.speculative.k),
                                   c.max_sessions, c.n_batch, c.n_threads)
        self.drafter = Drafter(path, vocab.vocab, settings, copy_compute_min_batch)
        self._draft_inventory = read_inventory(Path(path))
        self.costs.draft.pop("model", None)
        self._price()

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
        drafter, costs, prior = self.drafter, self.costs, self.prior
        totals = {src: a for src, a in self.totals.items() if a.passes}
        model, ngram = costs.draft.get("model"), costs.draft.get("ngram")
        return {
            "draft": str(drafter.path) if drafter else None,
            "draft_memory": drafter.memory if drafter else None,
            "ngram": self.config.speculative.ngram,
            "k": self.config.speculative.k,
            # α: the per-token acceptance (plan --alpha's); acceptance_rate: accepted ÷ drafted
            **figures(totals.values(), drafting=self.enabled, k=self.config.speculative.k),
            "by_source": {src: figures([a], drafting=True, k=0) for src, a in totals.items()},
            "step_s": {"plain": costs.plain.value,
                       # msgpack map keys are strings on the wire (clients refuse others)
                       "verify": {str(k): m.value for k, m in sorted(costs.verify.items())},
                       "verify_per_token": costs.verify_slope(prior),
                       "draft": model.value if model else None,
                       "ngram": ngram.value if ngram else None},
            "predicted_step_s": None if prior is None else {
                "plain": prior.plain_s, "verify_per_token": prior.verify_slope_s,
                "draft": prior.draft_s},
            "sessions": {sid: a.figures() for sid, a in list(self.acceptance.items())},
        }

    def time_step(self, drafts: dict[int, Proposal], seconds: float) -> None:
        """A decode step (one token per reply, plus ``drafts``) took ``seconds``: a verify
        step is filed under the most drafts one reply verified in it."""
        decay = self.config.speculative.decay
        if drafts:
            self.costs.add_verify(max(len(p.tokens) for p in drafts.values()), seconds, decay)
        else:
            self.costs.add_plain(seconds, decay)

    def _session(self, s: Session) -> SessionDrafts:
        rec = self.acceptance.get(s.id)
        if rec is None:
            c = self.config.speculative
            rec = SessionDrafts(NgramIndex(c.ngram_n_min, c.ngram_n_max) if c.ngram else None)
            self.acceptance[s.id] = rec
        return rec

    def propose(self, turns: list[Turn], budget: int, threads: int = 0) -> dict[int, Proposal]:
        """Draft tokens for the decoding replies where drafting pays (by sequence): an n-gram
        proposal where the session's own tokens have one, else the draft model's. They come on
        top of the step's token budget (at most k per decoding reply), so that prompt chunks
        are split as without drafts; the draft's catch-up is bounded by the budget.
        ``threads``: the target's thread count now, which the draft's decodes never exceed."""
        drafter, cfg = self.drafter, self.config.speculative
        if not self.enabled:
            return {}
        policy, decay = cfg.policy, cfg.decay
        out: dict[int, Proposal] = {}
        requests: list[DraftRequest] = []
        lookup_s, lookups = 0.0, 0
        for t in turns:
            cap = self.draft_cap(t)
            if cap <= 0:
                continue
            s = t.session
            rec = self._session(s)
            context = [*s.tokens, t.feed[0]]
            # sampled sessions: the step's draws, reproducible from the session's seed and step
            params = t.params or s.params  # the reply's sampling (its line's own)
            rng = (np.random.default_rng([params.seed, s.n_sampled, 0x5bec])
                   if not params.greedy else None)
            if rec.ngram is not None:
                t0 = time.perf_counter()
                guess = rec.ngram.propose(context, cap)
                lookup_s, lookups = lookup_s + time.perf_counter() - t0, lookups + 1
                if guess:
                    k = choose_k(rec.of("ngram"), self.costs, self.prior, policy, "ngram",
                                 len(guess))
                    if k > 0:
                        out[s.seq] = Proposal(tokens=guess[:k], rng=rng, source="ngram")
                        continue
            if drafter is not None:
                k = choose_k(rec.of("model"), self.costs, self.prior, policy, "model", cap)
                if k > 0:
                    requests.append(DraftRequest(s.seq, context, k, params, s.history, rng))
        if lookups:
            self.costs.add_draft("ngram", lookup_s / lookups, decay)
        if requests and drafter is not None:
            drafter.run_with(threads)
            proposals, decodes, seconds = drafter.propose(requests, catch_up=budget)
            if decodes:
                self.costs.add_draft("model", seconds / decodes, decay)
            out.update(proposals)
        return out

    def draft_cap(self, t: Turn) -> int:
        """Most tokens ``t`` may have drafted this step (0: none). Off for grammar replies: a
        drafter proposes unconstrained text that the grammar would mostly refuse."""
        s, cfg = t.session, self.config.speculative
        if (len(t.feed) != 1 or t.grammar is not None or t.chain is None or s.n_images
                or t.logprobs is not None):
            # the draft cannot see images; a verified draft has no logprobs of its own
            return 0
        return min(cfg.k,
                   t.max_tokens - len(t.generated) - 1,  # the reply's last token needs no draft
                   self.config.n_ctx - len(s.tokens) - 3)  # as a plain step, the context allows

    def verify(self, t: Turn, proposal: Proposal, ctx: Any, mem: Any, vocab: Vocab) -> None:
        """Walk the verify positions (the fed token, then the drafts; logits at the batch rows
        ``proposal.rows`` of the target's ``ctx``): keep drafts while the target agrees, take
        the target's token at the first disagreement, and cut the cache (``mem``) after the
        last position used."""
        s, cfg = t.session, self.config.speculative
        fed = [t.feed[0], *proposal.tokens]
        used = kept = 0
        failed = False
        for i in range(len(fed)):
            tok, agreed = self.verify_pick(t, proposal.rows[i], proposal, i, ctx, vocab)
            used, kept = i + 1, kept + agreed
            failed = i < len(proposal.tokens) and not agreed
            t.feed = []
            if not self._take(t, tok) or not agreed:
                break
        # the cache keeps the tokens whose logits were used; the last pick is the next feed
        s.decoded(fed[:used])
        llama_cpp.llama_memory_seq_rm(mem, s.seq, len(s.tokens), -1)
        k = len(proposal.tokens)
        for a in (self._session(s).of(proposal.source), self.totals[proposal.source]):
            a.record(k, kept, used, cfg.decay, failed=failed)

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
        q = proposal.dists[i] if proposal.dists else None  # None: an n-gram's, deterministic
        tok, kept = speculative_pick(p, q, proposal.tokens[i], proposal.rng)
        t.chain.accept(tok)  # penalties and grammar see it as if sampled
        return tok, kept
