"""When drafting pays and how many tokens to draft (pure: no llama.cpp, no clock).

One definition of α everywhere: the **per-token acceptance**, the chance that the target keeps a
drafted token given that it kept the ones before it — what ``planner.speculative``'s
``expected_tokens_per_pass(α, k)`` and ``igi-sdk plan --alpha`` mean. A verify pass that keeps
``m`` of ``k`` drafted tokens is ``m`` successes and, when ``m < k``, one failure; α is
successes ÷ (successes + failures). Accepted ÷ drafted is a different, smaller figure (a pass
that stops at the first disagreement never tries the drafts after it): it is reported as
``acceptance_rate`` only.

A step with ``k`` drafts yields ``E(α, k)`` tokens for ``draft(k) + verify(k)`` seconds, a plain
step one token for ``plain`` seconds; drafting pays where ``E · plain / (draft + verify) > 1``.
The seconds come from this plan's measured steps (:class:`StepCosts`), and until they exist from
the planner's prediction for the plan (:class:`StepPrior`). A ``k`` not measured yet is priced
from the planner's prediction for that very ``k``, scaled by what was measured on the same side
of the copy-compute threshold: a verify batch that reaches it streams the CPU-held weights to
the GPU, one that does not computes them on the CPU, and the two cost differently (an 8B at
4 GB on an H200: 39.5 ms for a streamed 5-token verify, 51.6 ms for a 2-token one on the CPU),
so no line through the small ``k`` measured predicts the large ones. Without the planner's
per-``k`` figures, ``verify(k)`` is ``plain + slope · k``, the slope fit from verify steps of
any ``k``. Each session's α is
estimated from its own passes (:class:`Acceptance`), shrunk toward an assumed α while it has few.

Hysteresis: a session starts drafting where the gain at its estimated α exceeds 1, and stops only
where even an optimistic α (one standard error above the estimate) cannot pay — so a few unlucky
passes of a draft that pays do not switch it off. A switched-off session halves the weight of its
evidence every ``reprobe_after`` plain steps, so it tries again once its record is old.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from igi_sdk.planner.speculative import expected_tokens_per_pass

Source = Literal["model", "ngram"]
SOURCES: tuple[Source, ...] = ("model", "ngram")

# prior weight of the assumed α, in verify trials: a handful of passes outweighs it
PRIOR_TRIALS = 4.0
# n-gram lookup seconds per step when none has been timed yet (a dict probe per n in Python)
NGRAM_STEP_S = 3e-5


@dataclass(frozen=True)
class StepPrior:
    """Predicted seconds on this plan (``planner.speculative.step_seconds``): a plain target
    step, the extra seconds each verified draft token adds to it, one draft-model decode;
    ``verify_by_k``: a verify step with k = 1, 2, ... drafts (empty: the slope alone), and
    ``streams_from`` the least k whose verify batch reaches the copy-compute threshold (0:
    none does)."""

    plain_s: float
    verify_slope_s: float
    draft_s: float
    verify_by_k: tuple[float, ...] = ()
    streams_from: int = 0

    @classmethod
    def from_steps(cls, plain_s: float, verify_s: float, draft_s: float, k: int) -> StepPrior:
        return cls(plain_s, max(0.0, verify_s - plain_s) / max(k, 1), draft_s)

    @classmethod
    def from_verifies(cls, plain_s: float, verify_by_k: tuple[float, ...], draft_s: float,
                      streams_from: int = 0) -> StepPrior:
        k = len(verify_by_k)
        slope = max(0.0, verify_by_k[-1] - plain_s) / k if k else 0.0
        return cls(plain_s, slope, draft_s, verify_by_k, streams_from)

    def streams(self, k: int) -> bool:
        return 0 < self.streams_from <= k


@dataclass
class Mean:
    """A decayed mean of a measured duration, and how many measurements it has seen."""

    value: float | None = None
    count: int = 0

    def add(self, x: float, decay: float) -> None:
        self.value = x if self.value is None else decay * self.value + (1 - decay) * x
        self.count += 1


@dataclass
class StepCosts:
    """This plan's measured step seconds: plain steps, verify steps by ``k``, and drafting
    (a draft-model decode per drafted token; an n-gram lookup per step)."""

    plain: Mean = field(default_factory=Mean)
    verify: dict[int, Mean] = field(default_factory=dict)
    draft: dict[Source, Mean] = field(default_factory=dict)
    # a draft-model decode ÷ a plain target step before either is measured beside the other,
    # from the weights each reads per token where both run on the CPU (None: not known). Both
    # steps stall alike on a loaded host, so the ratio holds where absolute seconds do not
    draft_per_plain: float | None = None

    def add_plain(self, seconds: float, decay: float) -> None:
        self.plain.add(seconds, decay)

    def add_verify(self, k: int, seconds: float, decay: float) -> None:
        self.verify.setdefault(k, Mean()).add(seconds, decay)

    def add_draft(self, source: Source, seconds: float, decay: float) -> None:
        self.draft.setdefault(source, Mean()).add(seconds, decay)

    def plain_s(self, prior: StepPrior | None) -> float | None:
        if self.plain.value is not None:
            # No plain step is timed while drafting, so one stalled sample (a core taken by
            # another process) would price every verify pass as cheap for good. A verify step
            # decodes more tokens than a plain one: the cheapest verify mean bounds it.
            verified = [m.value for m in self.verify.values() if m.value is not None]
            return min([self.plain.value, *verified])
        return prior.plain_s if prior is not None else None

    def _scale(self, prior: StepPrior) -> float:
        """Measured ÷ predicted plain step: a profile that is off is off for every kind of
        step alike, so predictions are scaled by it until they are measured."""
        plain = self.plain_s(None)
        if plain is None or prior.plain_s <= 0:
            return 1.0
        return plain / prior.plain_s

    def verify_slope(self, prior: StepPrior | None) -> float | None:
        """Seconds per verified draft token: a least-squares line through the plain step
        (k = 0) and every measured verify step, else the prediction."""
        plain = self.plain_s(prior)
        if plain is None:
            return None
        num = den = 0.0
        for k, m in self.verify.items():
            if m.value is not None and k > 0:
                num += m.count * k * (m.value - plain)
                den += m.count * k * k
        if den > 0:
            return max(0.0, num / den)
        return prior.verify_slope_s * self._scale(prior) if prior is not None else None

    def verify_s(self, k: int, prior: StepPrior | None) -> float | None:
        m = self.verify.get(k)
        if m is not None and m.value is not None and m.count >= 3:
            return m.value  # measured at this very k: no model needed
        if prior is not None and 0 < k <= len(prior.verify_by_k):
            return prior.verify_by_k[k - 1] * self._regime_scale(k, prior)
        plain, slope = self.plain_s(prior), self.verify_slope(prior)
        return None if plain is None or slope is None else plain + slope * k

    def _regime_scale(self, k: int, prior: StepPrior) -> float:
        """Measured ÷ predicted over the verify steps timed on ``k``'s side of the copy-compute
        threshold (weighted by how often each was timed); the plain step's where none was."""
        num = den = 0.0
        for j, m in self.verify.items():
            if (m.value is not None and 0 < j <= len(prior.verify_by_k)
                    and prior.streams(j) == prior.streams(k) and prior.verify_by_k[j - 1] > 0):
                num += m.count * m.value / prior.verify_by_k[j - 1]
                den += m.count
        return num / den if den else self._scale(prior)

    def draft_cost(self, source: Source, k: int, prior: StepPrior | None) -> float | None:
        """Seconds of drafting ``k`` tokens: ``k`` decodes of the draft model, or one n-gram
        lookup whatever ``k``."""
        m = self.draft.get(source)
        if source == "ngram":
            return m.value if m is not None and m.value is not None else NGRAM_STEP_S
        if m is not None and m.value is not None:
            return k * m.value
        if prior is not None:
            return k * prior.draft_s * self._scale(prior)
        plain = self.plain_s(None)
        if self.draft_per_plain is not None and plain is not None:
            return k * self.draft_per_plain * plain
        return None

    def best_case_gain(self, k_max: int, source: Source, prior: StepPrior | None) -> float | None:
        """The most any ``k`` in 1..k_max could gain: every draft kept (α = 1) and, where no
        verify step is priced, a verify that costs no more than a plain step (None: the plain
        step or the draft is not priced yet)."""
        plain = self.plain_s(prior)
        if plain is None:
            return None
        best = 0.0
        for k in range(1, k_max + 1):
            draft = self.draft_cost(source, k, prior)
            if draft is None:
                return None
            verify = self.verify_s(k, prior)
            verify = plain if verify is None else max(plain, verify)
            best = max(best, expected_tokens_per_pass(1.0, k) * plain / max(draft + verify, 1e-12))
        return best

    def gain(self, alpha: float, k: int, source: Source, prior: StepPrior | None) -> float | None:
        """Tokens per second with ``k`` drafts over tokens per second without (None: a cost is
        unknown)."""
        plain, verify = self.plain_s(prior), self.verify_s(k, prior)
        draft = self.draft_cost(source, k, prior)
        if plain is None or verify is None or draft is None:
            return None
        return expected_tokens_per_pass(alpha, k) * plain / max(draft + verify, 1e-12)

    def best_k(self, alpha: float, k_max: int, source: Source,
               prior: StepPrior | None) -> tuple[int, float] | None:
        """The ``k`` in 1..k_max that maximizes :meth:`gain`, with its gain (None: unknown)."""
        best: tuple[int, float] | None = None
        for k in range(1, k_max + 1):
            g = self.gain(alpha, k, source, prior)
            if g is None:
                return None
            if best is None or g > best[1] + 1e-9:
                best = (k, g)
        return best


@dataclass
class Acceptance:
    """One session's record with one kind of drafter: lifetime totals (what ``stats``
    reports) and decayed evidence (what the decisions weigh)."""

    drafted: int = 0
    accepted: int = 0
    failures: int = 0  # passes that stopped at a disagreement
    passes: int = 0
    tokens: int = 0  # tokens the verify passes yielded
    successes: float = 0.0  # decayed
    trials: float = 0.0  # decayed
    # the assumed α's weight, in trials: pseudo-passes older than every real one, so decayed
    # as they are. Held fixed, it outweighed a decayed record for good: a draft that never
    # matched (α 0) was still estimated at 0.08 (optimistic 0.12) after any number of passes,
    # enough to keep drafting where a streamed verify costs about a plain step
    prior_trials: float = PRIOR_TRIALS
    drafting: bool = False
    plain_steps: int = 0  # steps decoded without drafting since it was switched off
    k: int = 0  # the k chosen last

    def record(self, proposed: int, kept: int, yielded: int, decay: float, *,
               failed: bool | None = None) -> None:
        """A verify pass kept ``kept`` of ``proposed`` drafts and yielded ``yielded`` tokens;
        ``failed``: it stopped at a disagreement (default: it kept fewer than proposed; a
        reply that ends on a kept draft tried none after it)."""
        failed = kept < proposed if failed is None else failed
        self.drafted += proposed
        self.accepted += kept
        self.failures += failed
        self.passes += 1
        self.tokens += yielded
        self.successes = decay * self.successes + kept
        self.trials = decay * self.trials + kept + (1 if failed else 0)
        self.prior_trials *= decay

    @property
    def alpha(self) -> float | None:
        """The per-token α of every pass so far."""
        n = self.accepted + self.failures
        return self.accepted / n if n else None

    def estimate(self, assumed: float) -> tuple[float, float]:
        """(estimated α, an optimistic α one standard error above it) from the decayed
        evidence, shrunk toward ``assumed``."""
        n = self.trials + self.prior_trials
        mean = (self.successes + self.prior_trials * assumed) / n
        return mean, min(1.0, mean + math.sqrt(mean * (1 - mean) / n))


@dataclass(frozen=True)
class Policy:
    """The settings the decisions use (``SpeculativeConfig`` carries them)."""

    k_max: int = 4
    adaptive: bool = True
    warmup_steps: int = 3  # plain steps timed before an unpriced draft is tried
    reprobe_after: int = 64
    assumed_alpha: float = 0.7  # a draft model's α before it is measured (plan --alpha)
    ngram_alpha: float = 0.5  # an n-gram proposal's α before it is measured
    margin: float = 0.02  # a gain must exceed 1 by this much to start drafting


def choose_k(a: Acceptance, costs: StepCosts, prior: StepPrior | None, policy: Policy,
             source: Source, k_cap: int) -> int:
    """Tokens to draft this step for a session (0: decode plainly), updating its state.
    ``k_cap``: what the reply and context allow (at most ``policy.k_max``)."""
    k_cap = min(k_cap, policy.k_max)
    if k_cap <= 0:
        return 0
    if not policy.adaptive:
        a.drafting, a.k = True, k_cap
        return k_cap
    assumed = policy.ngram_alpha if source == "ngram" else policy.assumed_alpha
    mean, upper = a.estimate(assumed)
    at_mean = costs.best_k(mean, k_cap, source, prior)
    if at_mean is None:
        # unpriced (no profile, nothing verified yet): time plain steps, then try drafting
        # to measure what it costs, unless even every draft kept could not pay
        if costs.plain.count < policy.warmup_steps:
            return 0
        best = costs.best_case_gain(k_cap, source, prior)
        if best is not None and best <= 1.0 + policy.margin:
            a.drafting, a.k = False, 0
            return 0
        a.drafting, a.k = True, k_cap
        return k_cap
    if a.drafting:
        at_upper = costs.best_k(upper, k_cap, source, prior)
        assert at_upper is not None
        if at_upper[1] < 1.0:  # even an optimistic α loses: off
            a.drafting, a.plain_steps, a.k = False, 0, 0
            return 0
        a.k = at_mean[0] if at_mean[1] >= 1.0 else at_upper[0]
        return a.k
    a.plain_steps += 1
    if a.plain_steps >= policy.reprobe_after and a.trials > 0:
        # an old verdict weighs less: the estimate drifts back toward the assumed α
        a.successes, a.trials, a.plain_steps = a.successes / 2, a.trials / 2, 0
        # and the assumed α twice as much as before beside it (up to its first weight)
        a.prior_trials = min(PRIOR_TRIALS, 2 * a.prior_trials)
        mean, _ = a.estimate(assumed)
        at_mean = costs.best_k(mean, k_cap, source, prior)
        assert at_mean is not None
    if at_mean[1] > 1.0 + policy.margin:
        a.drafting, a.k = True, at_mean[0]
        return a.k
    return 0
