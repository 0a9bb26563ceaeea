"""NVML access (NVIDIA's management library), absent on machines without an NVIDIA driver.

NVML numbers GPUs its own way (PCI order), CUDA by default fastest-first and after
``CUDA_VISIBLE_DEVICES``; so NVML index 0 need not be the GPU llama.cpp runs on. The one
identity both agree on is the PCI bus id, which llama.cpp reports per device
(``Device.pci_bus_id``); :func:`handle_for_bus_id` picks NVML's handle by it.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from igi_sdk.nvml_lib import nvml  # noqa: F401  (re-exported: the runtime's NVML readers use it)

log = logging.getLogger("igi_sdk.nvml")


# --- which NVML device is llama.cpp's GPU ---------------------------------------------------------

_BUS_ID = re.compile(r"^(?:([0-9a-f]+):)?([0-9a-f]+):([0-9a-f]+)\.([0-9a-f]+)$")


def normalise_bus_id(bus_id: str | bytes | None) -> str | None:
    """``domain:bus:device.function`` as lower-case hex with a 4-digit domain, or None.

    NVML writes "00000000:C1:00.0" (8-digit domain, upper case), CUDA/llama.cpp "0000:c1:00.0";
    llama.cpp appends "-vN" for virtual devices that share one physical GPU (dropped here: NVML
    knows only the physical one)."""
    if bus_id is None:
        return None
    text = bus_id.decode(errors="replace") if isinstance(bus_id, bytes) else bus_id
    text = text.strip().lower().split("-v", 1)[0]
    m = _BUS_ID.match(text)
    if m is None:
        return None
    domain, bus, dev, fn = (int(g, 16) if g else 0 for g in m.groups())
    return f"{domain:04x}:{bus:02x}:{dev:02x}.{fn:x}"


def select_index(nvml_bus_ids: list[str | None], want: str | None) -> int | None:
    """Index of the NVML device whose bus id is ``want``.

    Without a match: index 0 where that cannot be wrong (exactly one NVML device) or as a last
    resort (warned about, since its figures may then be another GPU's); None without devices."""
    if not nvml_bus_ids:
        return None
    target = normalise_bus_id(want)
    if target is not None:
        for i, b in enumerate(nvml_bus_ids):
            if normalise_bus_id(b) == target:
                return i
    if len(nvml_bus_ids) == 1:
        if target is not None:
            log.warning("NVML's only GPU (%s) does not have llama.cpp's PCI bus id %s; using it",
                        nvml_bus_ids[0], want)
        return 0
    log.warning("no NVML device has llama.cpp's PCI bus id (%s) among %s; using NVML device 0, "
                "whose VRAM figures may be another GPU's", want or "unknown", nvml_bus_ids)
    return 0


def bus_ids(nv: Any) -> list[str | None]:
    """Every NVML device's PCI bus id, in NVML's order (None where NVML cannot say)."""
    out: list[str | None] = []
    for i in range(nv.nvmlDeviceGetCount()):
        try:
            bid = nv.nvmlDeviceGetPciInfo(nv.nvmlDeviceGetHandleByIndex(i)).busId
            out.append(bid.decode() if isinstance(bid, bytes) else str(bid))
        except Exception:  # noqa: BLE001 - an NVML error for one device: it cannot match
            out.append(None)
    return out


def handle_for_bus_id(nv: Any, bus_id: str | None) -> Any | None:
    """NVML's handle for the GPU with PCI bus id ``bus_id`` (see :func:`select_index`)."""
    i = select_index(bus_ids(nv), bus_id)
    return None if i is None else nv.nvmlDeviceGetHandleByIndex(i)


# --- what starting the GPU backend costs (the CUDA context) ---------------------------------------


@dataclass(frozen=True)
class MemoryReading:
    free: int
    used: int
    total: int


def read_memory(nv: Any, handle: Any) -> MemoryReading:
    m = nv.nvmlDeviceGetMemoryInfo(handle)
    return MemoryReading(int(m.free), int(m.used), int(m.total))


def context_bytes(before: MemoryReading | None, after: MemoryReading | None) -> int:
    """VRAM that went from free to used across the backend start: the CUDA context (and
    cuBLAS's handles). Another process allocating meanwhile would be counted too, and one
    freeing could make it negative (then 0): the start takes well under a second."""
    if before is None or after is None or before.total != after.total:
        return 0
    return max(0, before.free - after.free)


def measure_start(
    nv: Any | None, start: Callable[[], tuple[bool, str | None]]
) -> tuple[str | None, int]:
    """Run ``start`` — which starts the GPU backend and returns (whether llama.cpp has a GPU,
    its first GPU's PCI bus id) — and measure the VRAM the start took on that GPU:
    ``(bus id, bytes)``; bytes are 0 without NVML or without a GPU.

    Every NVML device is read before, since which one is llama.cpp's is only known after."""
    if nv is None:
        return start()[1], 0
    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        before = [read_memory(nv, h) for h in handles]
    except Exception:  # noqa: BLE001 - NVML present but not answering: nothing to measure
        return start()[1], 0
    has_gpu, bus_id = start()
    if not has_gpu:  # e.g. a CPU-only llama.cpp build on a machine with an NVIDIA driver
        return bus_id, 0
    try:
        i = select_index(bus_ids(nv), bus_id)
        if i is None:
            return bus_id, 0
        return bus_id, context_bytes(before[i], read_memory(nv, handles[i]))
    except Exception:  # noqa: BLE001 - see above
        return bus_id, 0
