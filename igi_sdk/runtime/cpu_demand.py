"""How many threads of other processes want a CPU: the run queue, not the CPU time they got.

Why not only per-CPU load: CPU time is what other processes *got*. When our threads spin, the
others get less, so their load reads lower than their demand (14 busy processes on 16 CPUs read
as 9.8 cores while six of ours spun), the thread ceiling rises, and the spinning threads starve
each other at their barriers. The number of runnable threads does not shrink that way: a thread
waiting for a core is runnable. Linux counts them in ``/proc/stat`` (``procs_running``, the
whole kernel's, this process's own included); ours are counted from ``/proc/self/task``.

Readers return None where ``/proc`` is missing (Windows, macOS): per-CPU load alone steers.
Sampling and averaging are pure (:class:`DemandWindow`), the readers are the only I/O.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

PROC_STAT = Path("/proc/stat")
OWN_TASKS = Path("/proc/self/task")
# the lines before procs_running: a line per CPU, and "intr" with a count per interrupt source,
# which on a large host runs to tens of KB; bounded all the same (a generated file, read whole)
_STAT_MAX = 1 << 20


def procs_running(stat: Path = PROC_STAT) -> int | None:
    """Runnable threads on the whole kernel now (``procs_running``), None without /proc."""
    try:
        with stat.open("rb") as f:
            head = f.read(_STAT_MAX)
    except OSError:
        return None
    for line in head.splitlines():
        if line.startswith(b"procs_running "):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return None
    return None


def own_running(tasks: Path = OWN_TASKS) -> int | None:
    """This process's threads that are runnable now (state R), None without /proc."""
    try:
        tids = os.listdir(tasks)
    except OSError:
        return None
    n = 0
    for tid in tids:
        try:
            with open(tasks / tid / "stat", "rb") as f:
                raw = f.read(512)
        except OSError:
            continue  # the thread ended meanwhile
        # "tid (comm) S ...": comm may hold spaces and parentheses, the state follows the last ')'
        end = raw.rfind(b")")
        if end >= 0 and raw[end + 2:end + 3] == b"R":
            n += 1
    return n


@dataclass
class DemandWindow:
    """Samples of (kernel-wide runnable, our runnable) over one load window."""

    samples: list[int] = field(default_factory=list)

    def add(self, total: int | None, own: int | None) -> None:
        if total is not None and own is not None:
            self.samples.append(max(0, total - own))

    def other_runnable(self, usable_cpus: int, kernel_cpus: int) -> float | None:
        """Mean runnable threads of other processes on the CPUs we may use: ``procs_running``
        counts the whole kernel's, so where this process may use only some CPUs, the others'
        threads are taken as spread evenly (a container pinned to 4 of 64 CPUs must not count
        the host's other 60 CPUs' work as its own crowd)."""
        if not self.samples:
            return None
        mean = sum(self.samples) / len(self.samples)
        self.samples.clear()
        if kernel_cpus > usable_cpus > 0:
            mean *= usable_cpus / kernel_cpus
        return mean
