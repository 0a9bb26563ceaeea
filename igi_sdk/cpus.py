"""Which CPUs this process may run on (no llama.cpp, no other layer: the guest layer and the
runtime's load sampler both ask)."""

from __future__ import annotations

import os


def affinity() -> list[int] | None:
    """The CPU ids this process may run on, or None where the OS does not say (macOS)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    try:
        import psutil

        ids = psutil.Process().cpu_affinity()  # Windows and Linux; absent on macOS
        return sorted(ids) if ids else None
    except (ImportError, AttributeError, OSError):
        return None
