"""Where the arbiter learns how much VRAM the game (and everyone else) is using.

All sources answer the same question — device total, device used, and how much of that is this
sidecar's own — so the policy can compute ``others = used − own``. Per-process figures are not
always available (Windows/WDDM often reports none), so ``own`` may come from the engine's own
accounting instead of the driver.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from igi_sdk.runtime.devices import Device


@dataclass(frozen=True)
class VramReading:
    total: int  # device capacity, bytes
    used: int  # used on the device by every process, bytes
    own: int  # this sidecar's share, bytes
    source: str
    at: float  # time.monotonic() of the reading

    @property
    def others(self) -> int:
        return max(0, self.used - self.own)


class VramSource(Protocol):
    def read(self) -> VramReading | None: ...


class NvmlSource:
    """NVML figures of llama.cpp's GPU; this process's share from NVML where the driver reports
    it, else from ``own_fallback`` (the engine's accounting of its buffers) plus the CUDA context
    measured when the backend started (which the engine's buffers do not include).

    The NVML device is the one whose PCI bus id is ``device``'s (a ``Device`` or a bus id),
    by default llama.cpp's first GPU (which starts llama.cpp's backend if nothing has yet);
    NVML's own numbering can differ from CUDA's (see ``runtime.nvml``). ``device_index`` picks
    an NVML index directly, as before. ``nvml_lib`` and ``context_bytes`` stand in for pynvml
    and the measured context in tests."""

    def __init__(self, device_index: int | None = None,
                 own_fallback: Callable[[], int] | None = None, *,
                 device: Device | str | None = None, nvml_lib: Any = None,
                 context_bytes: Callable[[], int] | None = None) -> None:
        from igi_sdk.runtime.nvml import handle_for_bus_id, nvml

        self.nv = nvml_lib if nvml_lib is not None else nvml()
        self.own_fallback = own_fallback
        self.pid = os.getpid()
        self.handle = None
        if self.nv is not None:
            if device_index is not None:
                self.handle = self.nv.nvmlDeviceGetHandleByIndex(device_index)
            else:
                if device is None:
                    from igi_sdk.runtime.devices import first_gpu

                    device = first_gpu()
                bus_id = device if isinstance(device, str) or device is None else device.pci_bus_id
                self.handle = handle_for_bus_id(self.nv, bus_id)
                if self.handle is None:  # a driver without devices: nothing to read
                    self.nv = None
        if context_bytes is None and self.nv is not None:
            from igi_sdk.runtime._native import cuda_context_bytes

            context_bytes = cuda_context_bytes
        self.context_bytes = context_bytes or (lambda: 0)

    def read(self) -> VramReading | None:
        if self.nv is None:
            return None
        mem = self.nv.nvmlDeviceGetMemoryInfo(self.handle)
        own = None
        try:
            for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.handle):
                if p.pid == self.pid and p.usedGpuMemory is not None:
                    own = int(p.usedGpuMemory)
        except Exception:  # noqa: BLE001 - NVML_ERROR_NOT_SUPPORTED under WDDM and others
            own = None
        if own is None:
            # no per-process figure (WDDM): the engine's buffers + the CUDA context, which no
            # buffer accounts for and which would otherwise be counted as the game's
            own = (self.own_fallback() if self.own_fallback else 0) + self.context_bytes()
        return VramReading(int(mem.total), int(mem.used), own, "nvml", time.monotonic())


class EngineReportSource:
    """What the game engine reports in ``frame`` messages (e.g. DXGI's budget/usage on Windows,
    Unity's graphics-memory counters). ``vram_used`` is the *game's* use, so the device use is
    game + own; ``vram_budget`` is what the game and the model may use together (the device
    total if the engine does not say). ``total`` = 0 means no driver figure: reports alone."""

    def __init__(self, total: int, own: Callable[[], int]) -> None:
        self.total, self.own = total, own
        self._lock = threading.Lock()
        self._game_used: int | None = None
        self._game_budget: int | None = None
        self._at = 0.0

    def report(self, vram_used: int | None, vram_budget: int | None) -> None:
        with self._lock:
            if vram_used is not None:
                self._game_used = vram_used
            if vram_budget is not None:
                self._game_budget = vram_budget
            self._at = time.monotonic()

    def read(self) -> VramReading | None:
        with self._lock:
            if self._game_used is None:
                return None
            total = self.total if self._game_budget is None else self._game_budget
            if self.total and self._game_budget is not None:
                total = min(self.total, self._game_budget)
            if not total:  # no device total known and none reported: nothing to go on
                return None
            own = self.own()
            return VramReading(total, self._game_used + own, own, "engine", self._at)


class ScriptedTrace:
    """A VRAM timeline for tests, samples and simulation.

    JSON: ``{"total": bytes, "points": [{"t": seconds, "game": bytes}, ...]}``; the game's use
    steps to each point's value at its time. ``clock`` defaults to seconds since creation."""

    def __init__(self, total: int, points: list[tuple[float, int]],
                 own: Callable[[], int] | None = None,
                 clock: Callable[[], float] | None = None) -> None:
        if not points or any(b[0] < a[0] for a, b in itertools.pairwise(points)):
            raise ValueError("a trace needs points in time order")
        self.total = total
        self.times = [p[0] for p in points]
        self.values = [p[1] for p in points]
        self.own = own or (lambda: 0)
        start = time.monotonic()
        self.clock = clock or (lambda: time.monotonic() - start)

    @classmethod
    def load(cls, path: str | Path, **kw: object) -> ScriptedTrace:
        data = json.loads(Path(path).read_text())
        return cls(int(data["total"]), [(float(p["t"]), int(p["game"])) for p in
                                        data["points"]], **kw)  # type: ignore[arg-type]

    def game_at(self, t: float) -> int:
        i = bisect_right(self.times, t) - 1
        return self.values[max(0, i)]

    def read(self) -> VramReading | None:
        t = self.clock()
        own = self.own()
        return VramReading(self.total, self.game_at(t) + own, own, "trace", time.monotonic())
