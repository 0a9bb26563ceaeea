"""What this process's threads did over a stretch of decoding, per token, from /proc (Linux):
their CPU time, how often they slept (voluntary switches) and how often another thread took
their core (involuntary). An OpenMP worker preempted stalls every barrier of the graph until
it runs again, so a decode loop that wakes other threads of its own on a machine whose cores
its workers all hold pays for each wake-up; these counts show which threads woke, and how
often a token."""

from __future__ import annotations

import os
import threading
from pathlib import Path

Counts = dict[str, tuple[int, int, int]]  # thread id: (CPU ticks, voluntary, involuntary)


def snapshot(pid: str = "self") -> Counts:
    out: Counts = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out  # no /proc: nothing counted
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_bytes()
            status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
        except OSError:
            continue  # the thread ended meanwhile
        # "tid (comm) S ...": utime and stime are fields 14 and 15, counted after the ')'
        f = stat[stat.rfind(b")") + 2:].split()
        sw = dict(ln.split(":", 1) for ln in status.splitlines() if "ctxt_switches" in ln)
        out[tid] = (int(f[11]) + int(f[12]), int(sw.get("voluntary_ctxt_switches", 0)),
                    int(sw.get("nonvoluntary_ctxt_switches", 0)))
    return out


def per_token(before: Counts, after: Counts, tokens: int) -> dict[str, object]:
    """The stretch between two snapshots of this process, per token; ``switching``: each thread
    that switched at least once in four tokens (Python threads by name, others ``native``):
    CPU ticks, voluntary and involuntary switches, per token."""
    n = max(tokens, 1)
    names = {str(t.native_id): t.name for t in threading.enumerate()}
    d = {k: tuple(b - a for a, b in zip(before.get(k, (0, 0, 0)), v, strict=True))
         for k, v in after.items()}
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    return {
        "threads": len(after), "busy_threads": sum(1 for x in d.values() if x[0] > 0),
        "cpu_ms_per_token": round(sum(x[0] for x in d.values()) * tick_ms / n, 3),
        "voluntary_per_token": round(sum(x[1] for x in d.values()) / n, 2),
        "involuntary_per_token": round(sum(x[2] for x in d.values()) / n, 2),
        "switching": {f"{names.get(k, 'native')}/{k}": [round(x / n, 2) for x in v]
                      for k, v in d.items() if v[1] + v[2] >= n / 4}}
