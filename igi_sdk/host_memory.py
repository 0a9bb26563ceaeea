"""The host memory this machine could give now (no llama.cpp, no other layer: the sidecar's
ladder and the runtime's loader both ask before they page-lock weights)."""

from __future__ import annotations


def available_ram() -> int | None:
    """Bytes the OS could give now without swapping (page cache it would reclaim included),
    or None where psutil cannot say."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except (ImportError, OSError):
        return None
