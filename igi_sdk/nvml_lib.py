"""The NVIDIA driver's management library (NVML), initialised: apart from ``igi_sdk.runtime``,
whose package loads llama.cpp, so that a bundle can look at the driver before it chooses which
llama.cpp build to load (igi_sdk/bundle/gpu.py)."""

from __future__ import annotations

import warnings
from types import ModuleType


def nvml() -> ModuleType | None:
    """The initialised ``pynvml`` module, or None where there is no NVIDIA driver."""
    with warnings.catch_warnings():
        # the `pynvml` distribution warns that it is a shim over nvidia-ml-py; the module it
        # provides is nvidia-ml-py's own, which is what we use
        warnings.simplefilter("ignore", FutureWarning)
        try:
            import pynvml
        except ImportError:
            return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_LibraryNotFound/DriverNotLoaded/...: no GPU
        return None
    return pynvml
