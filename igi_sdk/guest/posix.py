"""The Linux/macOS side of :mod:`igi_sdk.guest.priority`'s plan: a positive niceness.

On Linux the nice value belongs to each thread (a POSIX deviation the setpriority(2) manual
lists under BUGS): a new thread inherits its creator's, and changing it later changes only
the calling thread. So every thread that exists is reniced (``/proc/self/task``), not just
the caller: the sidecar may already run the ZeroMQ I/O thread or others when this is called."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from igi_sdk.guest.priority import GuestPlan, nice_increment

log = logging.getLogger("igi_sdk.guest")


def _tasks(task_dir: Path = Path("/proc/self/task")) -> list[int]:
    try:
        return sorted(int(p.name) for p in task_dir.iterdir() if p.name.isdigit())
    except OSError:
        return []


def renice(target: int, tasks: Iterable[int],
           get: Callable[[int, int], int], set_: Callable[[int, int, int], None],
           which: int) -> list[int]:
    """Raise the niceness of each of ``tasks`` (ids for ``get``/``set_``, i.e.
    ``os.getpriority``/``os.setpriority`` with ``which``) to ``target``; returns the tasks
    changed. A task that has ended meanwhile is skipped."""
    changed = []
    for tid in tasks:
        try:
            current = get(which, tid)
            if nice_increment(current, target):
                set_(which, tid, target)
                changed.append(tid)
        except (ProcessLookupError, PermissionError):
            continue
    return changed


def apply_posix(plan: GuestPlan) -> list[str]:
    """Apply ``plan`` to this process (every thread of it on Linux)."""
    if plan.nice is None:
        return []
    tasks = _tasks()
    if not tasks:  # macOS (the nice value is the process's) or no /proc
        tasks = [0]
    try:
        changed = renice(plan.nice, tasks, os.getpriority, os.setpriority, os.PRIO_PROCESS)
    except OSError as e:
        log.warning("could not lower the sidecar's priority: %s", e)
        return []
    return [f"nice {plan.nice} ({len(changed)} of {len(tasks)} threads changed)"]
