"""Drafting only where it pays (runtime/draft_policy.py), from recorded step times; the one α
(per-token acceptance) of `stats` and the planner; n-gram proposals (runtime/ngram.py)."""

from __future__ import annotations

import numpy as np
import pytest

from igi_sdk.planner.speculative import break_even_alpha, expected_tokens_per_pass
from igi_sdk.runtime.draft_policy import (
    Acceptance,
    Policy,
    Source,
    StepCosts,
    StepPrior,
    choose_k,
)
from igi_sdk.runtime.drafting import figures
from igi_sdk.runtime.ngram import NgramIndex
from igi_sdk.runtime.speculative import speculative_pick

# Step seconds of two measured cases. GPU: Llama-3-8B Q4_0 at 4 GB on an H100 with a draft
# wholly in VRAM (docs/benchmarks.md: 29.7 tok/s plain; the 5-token verify reads the
# CPU-resident weights once, as a plain step does). CPU: Qwen2.5-Coder-1.5B Q4_K_M drafted by
# its 0.5B sibling on a few cores, where a verify step is compute-bound (each verified token
# costs about a plain step) and a draft decode ~0.45 of one (its weights' share): drafting every
# step at α = 0.70, k = 4 then runs at (4·0.027 + 0.06 + 4·0.055) / 0.06 = 6.5 plain steps per
# 2.77 tokens, 0.42× — what was measured there with drafting forced.
GPU = {"plain": 0.0337, "slope": 0.0006, "draft": 0.0025}
CPU = {"plain": 0.060, "slope": 0.055, "draft": 0.027}
DEFAULT = Policy(k_max=4)


def _pass(rng: np.random.Generator, alpha: float, k: int) -> int:
    kept = 0
    while kept < k and rng.random() < alpha:
        kept += 1
    return kept


def _run(times: dict[str, float], alpha: float, *, steps: int = 128, seed: int = 0,
         prior: StepPrior | None = None, policy: Policy = DEFAULT,
         source: Source = "model", noise: float = 0.05) -> tuple[list[int], Acceptance]:
    """One reply decoded with the policy against recorded step times (with noise) and forced
    acceptance ``alpha``: the k chosen at each step (0: plain)."""
    rng = np.random.default_rng(seed)
    costs, a, ks = StepCosts(), Acceptance(), []
    decay = 0.97
    for _ in range(steps):
        k = choose_k(a, costs, prior, policy, source, policy.k_max)
        ks.append(k)
        jitter = 1 + noise * rng.standard_normal()
        if k == 0:
            costs.add_plain(times["plain"] * jitter, decay)
            continue
        kept = _pass(rng, alpha, k)
        a.record(k, kept, kept + 1, decay)
        costs.add_verify(k, (times["plain"] + times["slope"] * k) * jitter, decay)
        costs.add_draft(source, times["draft"] * jitter, decay)
    return ks, a


def _prior(times: dict[str, float]) -> StepPrior:
    return StepPrior(times["plain"], times["slope"], times["draft"])


def test_the_recorded_cases_are_what_they_claim() -> None:
    gpu_be = break_even_alpha(4, plain_s=GPU["plain"], verify_s=GPU["plain"] + 4 * GPU["slope"],
                              draft_s=GPU["draft"])
    assert 0.2 < gpu_be < 0.4  # α = 0.5 pays there
    for k in range(1, 5):  # on the CPU pair no k pays at the assumed α (plan: "speculative: no")
        verify = CPU["plain"] + k * CPU["slope"]
        assert expected_tokens_per_pass(0.7, k) * CPU["plain"] / (verify + k * CPU["draft"]) < 1


@pytest.mark.parametrize("seed", range(6))
def test_drafting_at_alpha_half_on_the_gpu_stays_on(seed: int) -> None:
    """The reported misjudgement: forced α = 0.5 paid, yet drafting was off for 85% of the
    reply. Unpriced (no profile) and priced alike it now drafts nearly throughout."""
    for prior in (None, _prior(GPU)):
        ks, a = _run(GPU, 0.5, seed=seed, prior=prior)
        warmup = 0 if prior else Policy().warmup_steps
        assert sum(k > 0 for k in ks) >= 0.95 * (len(ks) - warmup), (prior, ks)
        assert a.drafting


@pytest.mark.parametrize("seed", range(4))
def test_drafting_where_it_pays_at_alpha_0_7_and_0_9(seed: int) -> None:
    for alpha in (0.7, 0.9):
        ks, _ = _run(GPU, alpha, seed=seed, prior=_prior(GPU))
        assert all(k > 0 for k in ks)


def test_the_cpu_plan_where_drafting_cannot_pay_never_drafts() -> None:
    """With this plan's predicted step times, a draft that cannot pay at the assumed α is
    never tried, even when plain steps measure slower than predicted (all costs scale)."""
    for alpha in (0.5, 0.7, 0.9):
        ks, a = _run(CPU, alpha, prior=_prior(CPU), steps=300)
        assert ks == [0] * 300 and a.drafted == 0
    slow = {k: v * 1.5 for k, v in CPU.items()}
    ks, _ = _run(slow, 0.7, prior=_prior(CPU), steps=300)
    assert ks == [0] * 300


def test_unpriced_drafting_that_loses_is_switched_off_and_reprobed_rarely() -> None:
    """Without a profile the first steps measure; a draft that loses stops soon, and its
    re-probes (as its record ages) cost a small share of the steps."""
    ks, a = _run(CPU, 0.3, steps=600, policy=Policy(k_max=4, reprobe_after=64))
    assert sum(k > 0 for k in ks[:40]) <= 25  # measured, then off
    assert sum(k > 0 for k in ks) <= 0.15 * len(ks)
    assert not a.drafting or ks[-1] > 0


@pytest.mark.parametrize("seed", range(3))
def test_a_draft_that_never_matches_stops_where_a_verify_costs_about_a_plain_step(
        seed: int) -> None:
    """A streamed verify (an 8B at 4 GB on an H200) cost about a plain step, so a draft pays
    from α ≈ 0.035. The assumed α's four pseudo-trials kept their weight while the record
    decayed to ~33 trials: an unrelated draft (α 0) was still estimated at 0.08, optimistic
    0.12, and drafted all 400 steps. The assumption now ages with the record."""
    times = {"plain": 0.0376, "slope": 0.03 * 0.0376, "draft": 0.0002}
    ks, a = _run(times, 0.0, steps=400, seed=seed, prior=_prior(times))
    assert a.accepted == 0
    assert 0 in ks[:128] and ks.index(0) < 100  # off within the first reply's 128 steps
    assert sum(k > 0 for k in ks) <= 0.5 * len(ks)  # re-probes: a share of the steps


def test_one_stalled_plain_step_does_not_keep_a_losing_draft_on() -> None:
    """No plain step is timed while drafting, so the plain mean is what it was when drafting
    began. One plain step stalled 50× (another process took the core) priced every verify
    pass as cheap and kept a draft that never matched on for the whole reply. A verify step
    decodes more tokens than a plain step, so it bounds the plain step's cost."""
    fast = {"plain": 1e-4, "slope": 3e-5, "draft": 2e-4}
    costs, a = StepCosts(), Acceptance()
    costs.add_plain(50 * fast["plain"], 0.97)  # the only plain sample (warmup_steps=1)
    policy = Policy(k_max=4, warmup_steps=1)
    ks = []
    for _ in range(64):
        k = choose_k(a, costs, None, policy, "model", 4)
        ks.append(k)
        if k:
            a.record(k, 0, 1, 0.97)  # an unrelated draft: nothing kept
            costs.add_verify(k, fast["plain"] + fast["slope"] * k, 0.97)
            costs.add_draft("model", fast["draft"], 0.97)
        else:
            costs.add_plain(fast["plain"], 0.97)
    assert not a.drafting
    assert sum(k > 0 for k in ks) <= 4, ks
    assert costs.plain_s(None) <= costs.verify_s(1, None)


def test_k_adapts_to_alpha() -> None:
    """High α: the largest k; lower α: smaller k; where no k pays: none."""
    costs = StepCosts()
    for _ in range(10):
        costs.add_plain(GPU["plain"], 0.9)
        for k in (1, 2, 4):
            costs.add_verify(k, GPU["plain"] + GPU["slope"] * k, 0.9)
        costs.add_draft("model", GPU["draft"], 0.9)
    pol = Policy(k_max=8)
    chosen = {}
    for alpha in (0.95, 0.8, 0.6, 0.4, 0.05):
        best = costs.best_k(alpha, 8, "model", None)
        assert best is not None
        chosen[alpha] = best
    ks = [chosen[a][0] for a in (0.95, 0.8, 0.6, 0.4)]
    assert ks == sorted(ks, reverse=True) and ks[0] == 8 and ks[-1] < ks[0]
    assert chosen[0.05][1] < 1.0  # nothing pays: the session goes plain
    # and a session's own α drives it
    for alpha, expect_k in ((0.95, 8), (0.05, 0)):
        a = Acceptance(drafting=True, successes=alpha * 200, trials=200)
        k = choose_k(a, costs, None, pol, "model", 8)
        assert (k == expect_k) if expect_k == 0 else k >= 6


def test_verify_cost_is_modelled_from_verify_steps_of_other_k() -> None:
    costs = StepCosts()
    costs.add_plain(0.010, 0.9)
    for _ in range(5):
        costs.add_verify(2, 0.014, 0.9)  # 2 ms per verified token
    assert costs.verify_s(4, None) == pytest.approx(0.018)
    assert costs.verify_s(2, None) == pytest.approx(0.014)
    # before any verify step: the prediction's slope, scaled by measured / predicted plain
    fresh = StepCosts()
    fresh.add_plain(0.020, 0.9)
    assert fresh.verify_s(4, StepPrior(0.010, 0.001, 0.002)) == pytest.approx(0.028)


def test_a_verify_that_streams_is_priced_apart_from_the_ones_on_the_cpu() -> None:
    """An 8B at 4 GB on an H200 (docs/benchmarks.md): a plain step 34 ms, 2- and 3-token
    verifies on the CPU 51.6 and 58.3 ms, a 5-token one streamed to the GPU 39.5 ms. Having
    timed k = 1 and 2, a line through them priced k = 4 at ~80 ms and the session never tried
    it; priced from the planner's figure for k = 4 (the streamed side), k = 4 is chosen."""
    plain, draft = 0.034, 0.0006
    prior = StepPrior.from_verifies(0.0348, (0.0348, 0.0463, 0.0580, 0.0521), 0.0005,
                                    streams_from=4)
    costs = StepCosts()
    for _ in range(6):
        costs.add_plain(plain, 0.9)
        costs.add_verify(1, 0.0516, 0.9)
        costs.add_verify(2, 0.0583, 0.9)
        costs.add_draft("model", draft, 0.9)
    # the CPU side is scaled by what the CPU side measured; the streamed side is not
    assert costs.verify_s(3, prior) > 0.058
    assert costs.verify_s(4, prior) == pytest.approx(0.0521 * plain / 0.0348)
    best = costs.best_k(0.69, 4, "model", prior)
    assert best is not None and best[0] == 4 and best[1] > 1.3
    # without the per-k figures, the line through k = 1 and 2 keeps k small
    linear = StepPrior(prior.plain_s, prior.verify_slope_s, prior.draft_s)
    assert costs.best_k(0.69, 4, "model", linear)[0] < 4  # type: ignore[index]
    # once k = 4 is measured, its own figure decides
    for _ in range(3):
        costs.add_verify(4, 0.0395, 0.9)
    assert costs.verify_s(4, prior) == pytest.approx(0.0395, rel=0.01)


# ------------------------------------------------------------------------------ one α


def test_stats_alpha_fed_to_the_planner_reproduces_tokens_per_pass() -> None:
    """The per-token α that `stats` reports is the planner's: E(α, k) of the reported α gives
    the run's measured tokens per pass (accepted ÷ drafted would not)."""
    rng = np.random.default_rng(7)
    a = Acceptance()
    for _ in range(4000):
        kept = _pass(rng, 0.7, 4)
        a.record(4, kept, kept + 1, 0.97)
    f = figures([a], drafting=True, k=4)
    assert f["alpha"] == pytest.approx(0.7, abs=0.02)
    assert f["tokens_per_pass"] is not None and f["alpha"] is not None
    assert expected_tokens_per_pass(f["alpha"], 4) == pytest.approx(f["tokens_per_pass"],
                                                                    rel=0.01)
    assert f["acceptance_rate"] is not None and f["acceptance_rate"] < 0.5  # the other figure
    assert expected_tokens_per_pass(f["acceptance_rate"], 4) < 0.8 * f["tokens_per_pass"]


def test_a_reply_ending_on_a_kept_draft_is_no_failure() -> None:
    a = Acceptance()
    a.record(4, 2, 2, 0.97, failed=False)  # the reply reached max_tokens on the 2nd draft
    a.record(4, 1, 2, 0.97)
    assert (a.accepted, a.failures, a.alpha) == (3, 1, 0.75)


# ------------------------------------------------------------------------------ n-grams


def test_ngram_proposes_what_followed_the_latest_earlier_match() -> None:
    idx = NgramIndex(n_min=2, n_max=3)
    ctx = [5, 1, 2, 3, 4, 9, 1, 2, 3, 7, 8, 1, 2]
    # longest suffix found earlier: (1, 2) (3-gram (8, 1, 2) is new); latest: at 6 -> 3, 7, 8
    assert idx.propose(ctx, 3) == [3, 7, 8]
    assert idx.propose(ctx, 1) == [3]
    assert idx.propose([*ctx, 3], 2) == [7, 8]  # (1, 2, 3) latest at 6
    assert NgramIndex().propose([1, 2, 3, 4], 4) == []  # nothing repeats
    assert idx.propose(ctx, 0) == []


def test_ngram_repeating_pattern_continues_past_the_present() -> None:
    idx = NgramIndex(n_min=2, n_max=4)
    assert idx.propose([1, 2, 1, 2, 1, 2], 5) == [1, 2, 1, 2, 1]


def test_ngram_index_follows_rollbacks_and_new_contexts() -> None:
    idx = NgramIndex(n_min=2, n_max=2)
    assert idx.propose([1, 2, 3, 1, 2], 1) == [3]
    assert idx.propose([7, 1, 2, 8, 1, 2], 1) == [8]  # another context: indexed again
    assert idx.propose([7, 1, 2, 9, 1, 2], 1) == [9]  # diverged in the middle
    assert idx.propose([7, 1, 2], 1) == []  # rolled back


def test_ngram_sizes_are_checked() -> None:
    with pytest.raises(ValueError):
        NgramIndex(n_min=3, n_max=2)


def test_sampled_ngram_proposals_keep_the_targets_distribution() -> None:
    """A deterministic proposal (q all on one token) is kept with probability p(x), else the
    token is drawn from p without x: together exactly p."""
    p = np.array([0.5, 0.3, 0.15, 0.05])
    rng = np.random.default_rng(3)
    n = 40000
    counts = np.zeros(4)
    kept = 0
    for _ in range(n):
        tok, ok = speculative_pick(p, None, 1, rng)
        counts[tok] += 1
        kept += ok
    assert kept / n == pytest.approx(0.3, abs=0.01)
    assert np.allclose(counts / n, p, atol=0.01)


def _decide(costs: StepCosts, times: dict[str, float], steps: int, *, alpha: float = 1.0,
            stall: float = 0.0, seed: int = 0) -> list[int]:
    """k chosen at each step of one reply against ``times`` (``stall``: the share of steps
    another process stretches 2-10x, as on a loaded host)."""
    rng = np.random.default_rng(seed)
    a, ks = Acceptance(), []
    for _ in range(steps):
        k = choose_k(a, costs, None, DEFAULT, "model", DEFAULT.k_max)
        ks.append(k)
        slow = rng.uniform(2, 10) if rng.random() < stall else 1.0
        if k == 0:
            costs.add_plain(times["plain"] * slow, 0.97)
            continue
        kept = _pass(rng, alpha, k)
        a.record(k, kept, kept + 1, 0.97)
        costs.add_verify(k, (times["plain"] + times["slope"] * k) * slow, 0.97)
        costs.add_draft("model", times["draft"] * slow, 0.97)
    return ks


SELF = {"plain": 0.02, "slope": 0.004, "draft": 0.02}  # a model drafting for itself on the CPU


@pytest.mark.parametrize("stall", [0.0, 0.3])
def test_a_same_size_draft_on_the_cpu_never_drafts(stall: float) -> None:
    """Priced from the weights each reads per token (draft ÷ plain = 1), a draft as large as
    its target cannot pay even if every draft is kept: decided from the first timed plain
    steps, with no draft work at all, idle or with steps stalled by other processes."""
    for seed in range(4):
        ks = _decide(StepCosts(draft_per_plain=1.0), SELF, 200, stall=stall, seed=seed)
        assert ks == [0] * 200


def test_without_the_weights_ratio_the_same_draft_is_probed_then_off() -> None:
    """What the rule did before it knew the ratio: drafting tried once to price it, then off."""
    ks = _decide(StepCosts(), SELF, 60)
    assert 0 < sum(k > 0 for k in ks) <= 2
    assert ks[-10:] == [0] * 10


def test_a_small_cpu_draft_is_still_tried_and_kept_where_it_pays() -> None:
    """A draft a tenth of its target's weights may pay: it is probed after the warm-up and,
    where verify steps cost little beyond a plain one and α is high, drafting stays on."""
    cheap = {"plain": 0.02, "slope": 0.001, "draft": 0.002}
    ks = _decide(StepCosts(draft_per_plain=0.1), cheap, 100, alpha=0.9)
    assert ks[:DEFAULT.warmup_steps] == [0] * DEFAULT.warmup_steps
    assert sum(k > 0 for k in ks) >= 90


def test_best_case_gain_bounds_every_k() -> None:
    costs = StepCosts(draft_per_plain=1.0)
    assert costs.best_case_gain(4, "model", None) is None  # no plain step timed yet
    costs.add_plain(0.02, 0.97)
    assert costs.best_case_gain(4, "model", None) == pytest.approx(1.0)  # (k+1)/(k+1)
    costs.draft_per_plain = 0.5
    assert costs.best_case_gain(1, "model", None) == pytest.approx(2 / 1.5)
    assert costs.best_case_gain(4, "model", None) == pytest.approx(5 / 3)
    # a measured verify step costlier than a plain one lowers the bound
    costs.add_verify(1, 0.04, 0.97)
    costs.add_verify(1, 0.04, 0.97)
    costs.add_verify(1, 0.04, 0.97)
    assert costs.best_case_gain(1, "model", None) == pytest.approx(2 * 0.02 / (0.01 + 0.04))
