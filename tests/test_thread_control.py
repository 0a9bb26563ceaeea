"""The thread/wait controller (runtime/thread_control.py) from simulated step times and loads.

The simulated host follows what was measured on real ones: on free cores spinning threads
decode fastest and sleeping ones pay a wake-up per graph; a thread without a core stalls the
others at every barrier (spinning ones collapse by an order of magnitude, sleeping ones less).
"""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from igi_sdk.errors import UsageError
from igi_sdk.runtime.thread_control import (
    ControlConfig,
    GameCpu,
    HostLoad,
    Setting,
    ThreadController,
    Wait,
)

PENALTY = {Wait.SPIN: 1.0, Wait.POLL: 1.04, Wait.SLEEP: 1.35}
COLLAPSE = {Wait.SPIN: 12.0, Wait.POLL: 10.0, Wait.SLEEP: 2.5}


def step_time(s: Setting, free: int, rng: random.Random, kind: int = 1) -> float:
    t = 0.04 / s.threads ** 0.8 * PENALTY[s.wait] * (1 + 0.15 * (kind - 1))
    if s.threads > free:
        t *= COLLAPSE[s.wait] * (s.threads - free)
    return t * rng.uniform(0.97, 1.03)


def run(ctl: ThreadController, steps: int, free: int, rng: random.Random,
        kinds: tuple[int, ...] = (1,)) -> list[Setting]:
    seen = []
    for i in range(steps):
        s = ctl.setting
        seen.append(s)
        kind = kinds[i % len(kinds)]
        ctl.observe_step(kind, step_time(s, free, rng, kind))
    return seen


def share(seen: list[Setting], want: Setting) -> float:
    return sum(1 for s in seen if s == want) / len(seen)


def test_idle_host_spins_and_keeps_the_threads() -> None:
    rng = random.Random(1)
    ctl = ThreadController(ControlConfig(max_threads=4, cpus=8))
    ctl.observe_load(HostLoad(8, 0.1))
    seen = run(ctl, 3000, free=8, rng=rng, kinds=(1, 2))
    assert ctl.setting == Setting(4, Wait.SPIN)
    assert share(seen[-1000:], Setting(4, Wait.SPIN)) > 0.95  # probes cost little
    assert ctl.probes > 5  # and it kept looking


def test_starting_asleep_on_an_idle_host_discovers_that_spinning_pays() -> None:
    ctl = ThreadController(ControlConfig(max_threads=4, cpus=8), Setting(4, Wait.SLEEP))
    run(ctl, 600, free=8, rng=random.Random(2))
    assert ctl.setting.wait is not Wait.SLEEP and ctl.setting.threads == 4


def test_busy_cores_measured_lower_the_threads_at_once() -> None:
    rng = random.Random(3)
    ctl = ThreadController(ControlConfig(max_threads=4, cpus=4))
    run(ctl, 100, free=4, rng=rng)
    ctl.observe_load(HostLoad(4, 2.6))  # a game on three cores' worth
    assert ctl.setting.threads == 1
    seen = run(ctl, 1500, free=1, rng=rng)
    assert share(seen[-500:], Setting(1, ctl.setting.wait)) > 0.95


def test_collapse_seen_only_in_step_times_moves_to_fewer_threads() -> None:
    # no load samples (psutil missing): the step times alone tell
    rng = random.Random(4)
    ctl = ThreadController(ControlConfig(max_threads=4, cpus=4))
    run(ctl, 200, free=4, rng=rng)
    assert ctl.setting == Setting(4, Wait.SPIN)
    seen = run(ctl, 3000, free=2, rng=rng)  # the game took two cores
    assert ctl.setting.threads <= 2
    slow = sum(step_time(s, 2, random.Random(0)) for s in seen[-1000:])
    best = 1000 * step_time(Setting(2, Wait.SPIN), 2, random.Random(0))
    assert slow < 1.25 * best  # within 25% of the best fixed setting for that load


def test_a_collapsed_spin_with_one_thread_left_sleeps() -> None:
    # the OpenMP build cannot change its wait: here a pool build with one thread allowed
    rng = random.Random(5)
    ctl = ThreadController(ControlConfig(max_threads=1, cpus=2), Setting(1, Wait.SPIN))

    def t(s: Setting) -> float:  # spinning between steps steals the core the game needs
        return {Wait.SPIN: 0.2, Wait.POLL: 0.05, Wait.SLEEP: 0.03}[s.wait] * rng.uniform(.97, 1.03)

    for _ in range(30):
        ctl.observe_step(1, 0.03)  # fast at first: the best seen
    for _ in range(400):
        ctl.observe_step(1, t(ctl.setting))
    assert ctl.setting == Setting(1, Wait.SLEEP)


def test_the_game_reporting_workers_lowers_the_threads() -> None:
    ctl = ThreadController(ControlConfig(max_threads=8, cpus=16))
    assert ctl.setting.threads == 8
    ctl.observe_game(GameCpu(busy_threads=12))
    assert ctl.setting.threads == 4
    ctl.observe_game(GameCpu(cpu_share=0.9))  # 14.4 cores' worth
    assert ctl.setting.threads == 1
    assert ctl.status().game_cores == 15


def test_recovery_when_the_load_goes_away() -> None:
    rng = random.Random(6)
    ctl = ThreadController(ControlConfig(max_threads=4, cpus=4))
    ctl.observe_load(HostLoad(4, 3.0))
    run(ctl, 300, free=1, rng=rng)
    assert ctl.setting.threads == 1
    ctl.observe_load(HostLoad(4, 0.05))
    assert ctl.setting.threads == 1  # one quiet sample is not enough
    ctl.observe_load(HostLoad(4, 0.05))
    seen = run(ctl, 2000, free=4, rng=rng)
    assert ctl.setting == Setting(4, Wait.SPIN)
    assert share(seen[-500:], Setting(4, Wait.SPIN)) > 0.9


def test_recovery_seen_only_in_step_times() -> None:
    # after a collapse moved it down, probes find that more threads pay again
    rng = random.Random(7)
    ctl = ThreadController(ControlConfig(max_threads=4, cpus=4))
    run(ctl, 2000, free=1, rng=rng)
    assert ctl.setting.threads == 1
    run(ctl, 6000, free=4, rng=rng)
    assert ctl.setting.threads >= 3


def test_openmp_build_changes_only_the_thread_count() -> None:
    rng = random.Random(8)
    ctl = ThreadController(ControlConfig(max_threads=4, cpus=4, waits=(Wait.SLEEP,)))
    seen = run(ctl, 3000, free=2, rng=rng)
    assert {s.wait for s in seen} == {Wait.SLEEP}
    assert ctl.setting.threads <= 2


def test_fixed_threads_adapt_only_the_wait() -> None:
    rng = random.Random(9)
    ctl = ThreadController(ControlConfig(max_threads=2, cpus=4, fixed_threads=True),
                           Setting(2, Wait.SLEEP))
    ctl.observe_load(HostLoad(4, 3.5))
    seen = run(ctl, 1500, free=4, rng=rng)
    assert {s.threads for s in seen} == {2}
    assert ctl.setting.wait is Wait.SPIN


def test_an_exact_count_holds_where_the_wait_spins() -> None:
    """Where libgomp spins, a fixed count is a ceiling that follows the free cores; an exact
    one (bit-exact replies) holds through the host's load and the game's reports."""
    for exact, counts in ((False, {2, 1}), (True, {2})):
        ctl = ThreadController(ControlConfig(max_threads=2, cpus=2, waits=(Wait.SPIN,),
                                             fixed_threads=True, exact_threads=exact),
                               Setting(2, Wait.SPIN))
        seen = [ctl.setting, ctl.observe_load(HostLoad(2, 1.5)),
                ctl.observe_game(GameCpu(None, 1.0))]
        seen += run(ctl, 200, free=1, rng=random.Random(3))
        assert {s.threads for s in seen} == counts
    with pytest.raises(UsageError):
        ControlConfig(max_threads=2, cpus=2, exact_threads=True)


def test_steps_that_teach_nothing_are_ignored() -> None:
    ctl = ThreadController(ControlConfig(max_threads=2, cpus=2))
    before = ctl.setting
    for bad in (0.0, -1.0, float("inf"), float("nan")):
        assert ctl.observe_step(1, bad) == before
    assert ctl.observe_step(0, 0.01) == before


@pytest.mark.parametrize("bad", [
    lambda: HostLoad(0, 1.0), lambda: HostLoad(4, -0.5), lambda: HostLoad(4, float("nan")),
    lambda: GameCpu(busy_threads=-1), lambda: GameCpu(cpu_share=1.5),
    lambda: ControlConfig(max_threads=0, cpus=4), lambda: ControlConfig(1, 1, waits=()),
])
def test_bad_input_is_a_typed_error(bad: Callable[[], object]) -> None:
    with pytest.raises(UsageError):
        bad()


def test_spinning_threads_the_os_deschedules_are_capped_at_the_cores_they_got() -> None:
    """ggml's own pools spin at every barrier: 6 threads that got 2.5 cores' worth of CPU time
    while steps ran the whole window were waiting for each other. The others' load cannot show
    it (they got less while ours spun): 14 of 16 CPUs busy looked like 9.8."""
    cfg = ControlConfig(max_threads=15, cpus=16, spinning_barriers=True)
    c = ThreadController(cfg, Setting(6, Wait.SPIN))
    s = c.observe_load(HostLoad(16, 9.8, own_cores=2.5, window_s=1.0), busy_s=1.0)
    assert s.threads <= 2
    for _ in range(3):  # it holds while the others stay
        s = c.observe_load(HostLoad(16, 13.5, own_cores=1.9, window_s=1.0), busy_s=1.0)
        assert s.threads <= 2


def test_threads_that_got_their_cores_are_not_starved_and_openmp_is_never_judged_so() -> None:
    idle = HostLoad(16, 0.1, own_cores=14.6, window_s=1.0)
    c = ThreadController(ControlConfig(max_threads=15, cpus=16, spinning_barriers=True),
                         Setting(15, Wait.SPIN))
    assert c.observe_load(idle, busy_s=1.0).threads == 15
    # between replies (steps ran a tenth of the window) little CPU time says nothing
    assert c.observe_load(HostLoad(16, 0.1, own_cores=0.3), busy_s=0.1).threads == 15
    # OpenMP threads wait passively: little CPU time is no sign of starving
    omp = ThreadController(ControlConfig(max_threads=15, cpus=16, waits=(Wait.SLEEP,)),
                           Setting(15, Wait.SLEEP))
    assert omp.observe_load(HostLoad(16, 0.1, own_cores=3.0), busy_s=1.0).threads == 15


def test_a_starved_cap_expires_and_the_threads_come_back_when_the_others_left() -> None:
    cfg = ControlConfig(max_threads=15, cpus=16, spinning_barriers=True, starved_hold=2)
    c = ThreadController(cfg, Setting(8, Wait.SPIN))
    assert c.observe_load(HostLoad(16, 8.0, own_cores=3.0), busy_s=1.0).threads <= 3
    for _ in range(6):  # the others left: the cap runs out, the count rises again
        s = c.observe_load(HostLoad(16, 0.0, own_cores=float(c.setting.threads)), busy_s=1.0)
    assert s.threads > 3


def test_a_fixed_count_that_must_spin_follows_the_free_cores() -> None:
    """libgomp told to spin (GOMP_SPINCOUNT) cannot be told to sleep while running: with the
    user's 2 threads beside a busy core of 2, measured 2.6 tok/s (98 sleeping, 120 on one
    thread). The user's count is then a ceiling: lowered while another process wants a core,
    back as soon as the core is free again."""
    cfg = ControlConfig(max_threads=2, cpus=2, waits=(Wait.SPIN,), fixed_threads=True,
                        spinning_barriers=True, starved_hold=2)
    ctl = ThreadController(cfg, Setting(2, Wait.SPIN))
    busy = HostLoad(2, 1.0, own_cores=1.0, other_runnable=1.4)
    assert ctl.observe_load(busy, busy_s=1.0) == Setting(1, Wait.SPIN)
    # the busy process left: spinning threads use their cores whole
    seen = [ctl.observe_load(HostLoad(2, 0.0, own_cores=float(ctl.setting.threads),
                                      other_runnable=0.0), busy_s=1.0).threads
            for _ in range(5)]
    # back once the lower load has held two samples and the starved hold has run out
    assert seen[0] == 1 and seen[-2:] == [2, 2], seen
    # where the wait can change (or sleeps), the user's count stays whatever the load
    for waits in ((Wait.SLEEP,), (Wait.SPIN, Wait.POLL, Wait.SLEEP)):
        c = ThreadController(ControlConfig(max_threads=2, cpus=2, waits=waits,
                                           fixed_threads=True), Setting(2, waits[0]))
        assert c.observe_load(busy, busy_s=1.0).threads == 2


@pytest.mark.parametrize(("env", "want"), [
    ({"OMP_WAIT_POLICY": "PASSIVE"}, Wait.SLEEP),
    ({"OMP_WAIT_POLICY": "passive", "GOMP_SPINCOUNT": "20000"}, Wait.SPIN),
    ({"GOMP_SPINCOUNT": "0"}, Wait.SLEEP),
    ({"GOMP_SPINCOUNT": "infinity"}, Wait.SPIN),
    ({"OMP_WAIT_POLICY": "ACTIVE"}, Wait.SPIN),
    ({}, Wait.SPIN),  # libgomp's own default spins ~300,000 rounds
])
def test_libgomps_wait_is_read_from_its_environment(monkeypatch, env, want) -> None:
    from igi_sdk.runtime.threadpool import libgomp_wait

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert libgomp_wait() is want


def test_the_first_load_reading_counts_the_crowd_before_any_reply_decodes(monkeypatch) -> None:
    """A context is made right before its first prompt: the sampler's first reading must come
    within a fraction of a second and count the other processes' runnable threads although no
    reply decodes yet, or the first reply's steps run at the start-up count on a busy host."""
    import os
    import time
    from types import SimpleNamespace

    from igi_sdk.runtime import threadpool

    monkeypatch.setattr(threadpool, "procs_running", lambda *a: 16)  # 15 others + ours
    monkeypatch.setattr(threadpool, "own_running", lambda *a: 1)
    runner = SimpleNamespace(decoding=False, host_load=None)
    sampler = threadpool.LoadSampler(runner, period_s=5.0)  # type: ignore[arg-type]
    t0 = time.monotonic()
    sampler.start()
    try:
        while runner.host_load is None and time.monotonic() - t0 < 3.0:
            time.sleep(0.01)
    finally:
        sampler.stop()
    load = runner.host_load
    assert load is not None and time.monotonic() - t0 < 1.5, "no reading in the first window"
    share = min(1.0, load.cpus / (os.cpu_count() or 1))  # spread over the CPUs we may use
    assert load.other_runnable == pytest.approx(15.0 * share)
    assert load.held() >= min(load.cpus, 15)


def test_a_count_the_load_forced_down_comes_back_when_the_load_eases() -> None:
    """On an H200 host beside 14 busy CPUs of 16, the spinning OpenMP build ran at 2 threads
    until one load sample read 14.6 runnable threads of others: the ceiling fell to 1, rose back
    to 2 two samples later, and the count stayed at 1 (2 threads had been tried, so only a probe
    could bring them back): 6.8 tok/s against 10.3 at 2 threads. A count the load forced down is
    restored as soon as the load allows it."""
    rng = random.Random(12)
    ctl = ThreadController(ControlConfig(max_threads=15, cpus=16, waits=(Wait.SPIN,)))
    busy = HostLoad(16, 14.0, own_cores=2.0, other_runnable=14.0)
    assert ctl.observe_load(busy) == Setting(2, Wait.SPIN)
    run(ctl, 60, free=2, rng=rng)  # a probe of 1 thread loses: 2 threads are known and kept
    assert ctl.setting == Setting(2, Wait.SPIN) and ctl.probes >= 1
    noisy = HostLoad(16, 14.0, own_cores=2.0, other_runnable=14.6)
    assert ctl.observe_load(noisy) == Setting(1, Wait.SPIN)  # the game comes first: at once
    run(ctl, 5, free=2, rng=rng)
    assert ctl.observe_load(busy) == Setting(1, Wait.SPIN)  # one sample is not enough
    assert ctl.observe_load(busy) == Setting(2, Wait.SPIN)


class _LooksEveryStep(ThreadController):
    """The controller without its backoff memo: it asks for a candidate on every step past
    ``probe_every``, as the memo must behave."""

    def observe_step(self, kind: int, seconds: float) -> Setting:
        self._backed_off_until = 0
        return super().observe_step(kind, seconds)


def test_a_controller_that_remembers_its_backoffs_probes_at_the_same_steps() -> None:
    """Every candidate backing off, the controller stops looking for one on each step until the
    first is due; loads that move the ceiling (a new candidate) and the setting mid-way must
    not delay a probe: the settings step by step equal those of one that looks every step."""
    seen = {}
    for cls in (ThreadController, _LooksEveryStep):
        rng = random.Random(11)
        ctl = cls(ControlConfig(max_threads=4, cpus=4))
        trace: list[Setting] = []
        # cores lost and found seen only in step times (a probe wins: the setting moves),
        # then loads that move the ceiling
        for free, load in ((4, None), (2, None), (4, None), (2, 2.0), (2, 2.0), (4, 0.05),
                           (4, 0.05), (3, None)):
            if load is not None:
                ctl.observe_load(HostLoad(4, load))
            trace += run(ctl, 3000, free=free, rng=rng)
        seen[cls] = (trace, ctl.probes)
    assert seen[ThreadController] == seen[_LooksEveryStep]
    assert seen[ThreadController][1] > 10  # probes ran, and lost (backoffs grew)
