"""How many threads the model may run, from the cores the game leaves (pure).

llama.cpp's threads meet at a barrier after every op, a few hundred times per token: one
thread without a core stalls all the others (docs/architecture.md, "Coexisting with the game's
CPU work"). So the sidecar plans threads only for cores the game is not using:

- without anything measured or reported, the runtime's default (every usable CPU but one on
  2–3 CPUs, half of them from 4 up) — it already leaves the game a main thread, a render
  thread and workers;
- with the per-core load measured before the model starts (``guest.cpuload``) and/or the
  number of threads the game says it keeps busy, the cores the game holds are taken away, and
  the default is never exceeded: what the game reports or shows can only lower the count.

At least one thread is always planned (llama.cpp cannot run with none); on a machine the game
fills, that one thread runs at the sidecar's lower priority (``guest.priority``) and only gets
a core when the game leaves one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from igi_sdk.errors import UsageError

# a core at least this busy holds one of the game's threads: a model thread placed there would
# wait for it at every barrier. (On a 16-CPU Linux machine a synthetic game of a main thread,
# a render thread at 70% and 4 workers at 40% kept each on its own CPU: 100, 69, 39-41 x 4 %;
# the sum, 3.3 cores, would have hidden two of the six CPUs it holds.)
BUSY_PERCENT = 25.0
# core-equivalents of background noise (an idle desktop shows 1-5% on each core) not counted
# as held: 8 cores at 3% add up to 0.24 cores, which must not cost a thread
NOISE_CORES = 0.25


@dataclass(frozen=True)
class ThreadChoice:
    threads: int
    default: int  # the runtime's default for the usable CPUs
    held: int | None  # cores the game holds (None: nothing measured or reported)
    reason: str


def cores_held(loads: Sequence[float]) -> int:
    """CPUs the game holds, from ``loads`` (percent per logical CPU, as
    ``psutil.cpu_percent(percpu=True)`` gives them): every CPU at least ``BUSY_PERCENT`` busy,
    and never fewer than the cores' worth of work in all of them, rounded up past the noise
    (work the scheduler spreads thinly over many CPUs still adds up to cores)."""
    for x in loads:
        if not (0.0 <= x <= 100.5) or math.isnan(x):  # psutil rounds to one decimal
            raise UsageError(f"a CPU load of {x}% is not a percentage")
    total = sum(min(x, 100.0) for x in loads) / 100.0
    busy = sum(1 for x in loads if x >= BUSY_PERCENT)
    return max(busy, math.ceil(total - NOISE_CORES))


def choose_threads(cpus: int, default: int, loads: Sequence[float] | None = None,
                   game_threads: int | None = None) -> ThreadChoice:
    """Threads for the model on ``cpus`` usable CPUs, given the runtime's ``default`` for them,
    the per-core ``loads`` of the CPUs this process may run on (percent; their number may
    exceed ``cpus`` under a CPU quota), and the number of threads the game reports it keeps
    busy (``game_threads``; 0 or None: not reported)."""
    if cpus < 1 or default < 1:
        raise UsageError(f"{cpus} CPUs and a default of {default} threads: both must be >= 1")
    if game_threads is not None and game_threads < 0:
        raise UsageError(f"the game reports {game_threads} busy threads: it must be >= 0")
    if not loads and not game_threads:
        return ThreadChoice(default, default, None, "the default (nothing measured)")
    logical = len(loads) if loads else cpus
    held = max(cores_held(loads) if loads else 0, game_threads or 0)
    source = "reported" if game_threads and game_threads >= held else "measured"
    threads = max(1, min(default, logical - held))
    return ThreadChoice(threads, default, held,
                        f"{held} of {logical} CPUs busy ({source})")
