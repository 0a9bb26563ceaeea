"""Where a line is answered: the local model or the upstream (pure)."""

from __future__ import annotations

from dataclasses import dataclass

from igi_sdk.upstream.config import Policy
from igi_sdk.upstream.transcript import Where


@dataclass(frozen=True)
class LocalHealth:
    """What the local model can do now (read without waiting on its engine)."""

    available: bool  # a placement is loaded (not unavailable, not between models)
    on_gpu: bool  # the placement uses the GPU (False: the CPU rung or a CPU machine)


def route(policy: Policy, health: LocalHealth, *, cpu_tps: float | None,
          min_local_tps: float, restored: bool) -> Where:
    """``remote`` under ``remote``; under ``overflow``, while the local model is unavailable
    or measured slower than ``min_local_tps`` on its CPU placement. A session restored from a
    save stays local: its text lives in the local KV cache only. (Out of session slots is
    found when the local open is refused, and goes remote then.)"""
    if restored or policy == "local":
        return "local"
    if policy == "remote":
        return "remote"
    if not health.available:
        return "remote"
    slow = (not health.on_gpu and min_local_tps > 0 and cpu_tps is not None
            and cpu_tps < min_local_tps)
    return "remote" if slow else "local"
