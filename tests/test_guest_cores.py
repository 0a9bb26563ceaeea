"""The model's thread count from the cores the game leaves, from recorded per-CPU loads.

The loads are ``psutil.cpu_percent(interval=0.5, percpu=True)`` as recorded: on a 16-CPU
Linux VM (the GPU test machine) idle and with a synthetic game (a main thread at 100%, a
render thread at 70%, four workers at 40%, each a process), and on the 2-CPU development VM
idle and with one spinning process."""

from __future__ import annotations

import pytest

from igi_sdk.errors import UsageError
from igi_sdk.guest.cores import choose_threads, cores_held
from igi_sdk.runtime.loader import threads_for

Z = [0.0] * 10
IDLE_16 = [0.0] * 16
MAIN_16 = [100.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
MAIN_RENDER_16 = [100.0, 69.4, 2.0, 0.0, 0.0, 0.0, *Z]
GAME_16 = [100.0, 68.8, 39.2, 40.0, 40.0, 41.2, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
IDLE_2 = [3.9, 0.0]
SPIN_2 = [11.8, 100.0]


def choose(loads: list[float] | None, game_threads: int | None = None) -> int:
    cpus = len(loads) if loads else 16
    return choose_threads(cpus, threads_for(cpus), loads, game_threads).threads


def test_cores_held_from_recorded_loads() -> None:
    assert cores_held(IDLE_16) == 0
    assert cores_held(MAIN_16) == 1
    assert cores_held(MAIN_RENDER_16) == 2
    # six CPUs hold one of the game's threads each, though the work adds up to 3.3 cores
    assert cores_held(GAME_16) == 6
    assert cores_held(IDLE_2) == 0
    assert cores_held(SPIN_2) == 1


def test_thin_spread_work_still_counts() -> None:
    # a busy thread the scheduler moves around: 8 CPUs at 20% are 1.6 cores of work
    assert cores_held([20.0] * 8) == 2
    # desktop noise is not the game: 8 CPUs at 3% (0.24 cores) hold nothing
    assert cores_held([3.0] * 8) == 0


def test_default_without_anything_measured() -> None:
    for cpus in (1, 2, 3, 4, 8, 16):
        c = choose_threads(cpus, threads_for(cpus))
        assert c.threads == threads_for(cpus) and c.held is None
    assert choose_threads(8, 4, [], 0).threads == 4


def test_never_more_than_the_default() -> None:
    # an idle 16-CPU machine leaves all 16, but the default (8) already leaves the game half
    assert choose(IDLE_16) == 8
    assert choose(GAME_16) == 8  # 6 held, 10 free: the default fits beside the game


def test_threads_only_on_cores_the_game_leaves() -> None:
    # the same game on a 8-CPU machine: 6 held, 2 left
    game_8 = [*GAME_16[:6], 0.0, 0.0]
    assert choose_threads(8, threads_for(8), game_8).threads == 2
    # on 2 CPUs with one busy: the one that is left
    assert choose_threads(2, threads_for(2), SPIN_2).threads == 1
    # a machine the game fills: one thread (it only runs when a core frees, at lower priority)
    assert choose_threads(4, threads_for(4), [90.0, 85.0, 70.0, 95.0]).threads == 1


def test_reported_game_threads() -> None:
    # the game says it keeps 12 threads busy on 16 CPUs: 4 left
    c = choose_threads(16, 8, None, 12)
    assert (c.threads, c.held) == (4, 12) and "reported" in c.reason
    # measured and reported: the larger count of held CPUs wins
    assert choose_threads(16, 8, MAIN_16, 10).threads == 6
    assert choose_threads(16, 8, GAME_16, 2).held == 6


def test_loads_of_more_cpus_than_a_quota_allows() -> None:
    # docker --cpus 2 on the 16-CPU host: the loads are the host's CPUs, the default is 2's
    assert choose_threads(2, threads_for(2), GAME_16).threads == 1


@pytest.mark.parametrize("bad", [[-1.0], [101.0], [float("nan")]])
def test_bad_loads_are_refused(bad: list[float]) -> None:
    with pytest.raises(UsageError):
        cores_held(bad)


def test_bad_counts_are_refused() -> None:
    with pytest.raises(UsageError):
        choose_threads(0, 1)
    with pytest.raises(UsageError):
        choose_threads(4, 2, None, -1)


def test_measured_loads_are_those_of_this_process_cpus() -> None:
    import os

    from igi_sdk.guest.cpuload import game_aware_threads, measure_loads

    loads = measure_loads(0.1)
    assert loads is not None and len(loads) == len(os.sched_getaffinity(0))
    assert all(0.0 <= x <= 100.5 for x in loads)
    c = game_aware_threads(window_s=0.1)
    assert 1 <= c.threads <= c.default
