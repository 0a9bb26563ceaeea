"""Measuring the load the game puts on each CPU (psutil), before the model's threads exist.

The sidecar measures the whole machine's per-CPU load over a short window while it is itself
idle (before the model loads), so what it sees is the game and whatever else runs. Only the
CPUs in this process's affinity mask count: those are the ones its threads can land on."""

from __future__ import annotations

import logging
import os

from igi_sdk.cpus import affinity
from igi_sdk.guest.cores import ThreadChoice, choose_threads

log = logging.getLogger("igi_sdk.guest")

WINDOW_S = 0.5  # long enough to average a 60 Hz game's frames, short enough at start-up


def measure_loads(window_s: float = WINDOW_S) -> list[float] | None:
    """Per-CPU load (percent) over ``window_s`` of the CPUs this process may run on; None
    without psutil (the default thread count is used then)."""
    try:
        import psutil
    except ImportError:
        return None
    loads = psutil.cpu_percent(interval=window_s, percpu=True)
    ids = affinity()
    if ids is not None and all(i < len(loads) for i in ids):
        loads = [loads[i] for i in ids]
    return [float(x) for x in loads]


def game_aware_threads(game_threads: int | None = None,
                       window_s: float = WINDOW_S) -> ThreadChoice:
    """The thread count for the model now: :func:`~igi_sdk.guest.cores.choose_threads` of the
    usable CPUs, the runtime's default for them, the loads measured over ``window_s`` (this
    call blocks that long) and the game's report. ``IGI_SDK_THREADS`` set to a count wins, as
    it does over the runtime's default."""
    from igi_sdk.runtime.loader import THREADS_ENV, default_threads, threads_for, usable_cpus

    cpus = usable_cpus()
    if os.environ.get(THREADS_ENV, "").strip():
        n = default_threads()
        return ThreadChoice(n, n, None, f"{THREADS_ENV}")
    choice = choose_threads(cpus, threads_for(cpus), measure_loads(window_s), game_threads)
    log.info("model threads: %d of %d usable CPUs (%s)", choice.threads, cpus, choice.reason)
    return choice
