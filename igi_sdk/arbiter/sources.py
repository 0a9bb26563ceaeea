"""Where the arbiter learns how much VRAM the game (and everyone else) is using.

All sources answer the same question — device total, device used, and how much of that is this
sidecar's own — so the policy can compute ``others = used − own``. Per-process figures are not
always available (Windows/WDDM often reports none), so ``own`` may come from the engine's own
accounting instead of the driver, or on Windows from DXGI (:class:`DxgiSource`).
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import sys
import threading
import time
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from igi_sdk.guest.adapters import DxgiMemoryInfo

if TYPE_CHECKING:
    from igi_sdk.runtime.devices import Device

log = logging.getLogger("igi_sdk.arbiter")


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

    def device_free(self) -> int | None:
        """Free bytes on the device now: one cheap driver call (no per-process figures), for
        watching memory come free while a placement closes."""
        if self.nv is None:
            return None
        mem = self.nv.nvmlDeviceGetMemoryInfo(self.handle)
        return int(mem.total) - int(mem.used)

    def device_memory(self) -> tuple[int, int] | None:
        """The whole device's (total, used) bytes, every process together."""
        if self.nv is None:
            return None
        mem = self.nv.nvmlDeviceGetMemoryInfo(self.handle)
        return int(mem.total), int(mem.used)

    def identity(self) -> tuple[str | None, tuple[int, int, int] | None]:
        """The GPU's PCI bus id and (vendor, device, subsystem) ids, to find it among DXGI's
        adapters; (None, None) without NVML."""
        if self.nv is None:
            return None, None
        from igi_sdk.guest.adapters import pci_ids_from_nvml

        pci = self.nv.nvmlDeviceGetPciInfo(self.handle)
        bus = pci.busId.decode() if isinstance(pci.busId, bytes) else str(pci.busId)
        return bus, pci_ids_from_nvml(int(pci.pciDeviceId), int(pci.pciSubSystemId))


def dxgi_reading(info: DxgiMemoryInfo, device: tuple[int, int] | None, own_floor: int,
                 at: float) -> VramReading:
    """A reading from DXGI's figures for this process, with the whole device's (total, used)
    from NVML where there is one.

    Under WDDM NVML has no per-process figure, so this process's use comes from DXGI
    (``CurrentUsage``), never below ``own_floor`` (the engine's own accounting: should the
    driver leave some allocation out of DXGI's figure, the model is not mistaken for the
    game). The model may take neither more than the device leaves (NVML's total − others)
    nor more than the OS's ``Budget`` for this process, which Windows lowers for background
    processes when the foreground one needs video memory: the reading's total is set so that
    ``total − others`` is the smaller of the two. Without NVML (another vendor's GPU) the
    budget is all there is."""
    own = max(info.current_usage, own_floor)
    if device is None:
        return VramReading(info.budget, own, own, "dxgi", at)
    total, used = device
    used = max(used, own)  # NVML's figure can lag an allocation DXGI already counts
    others = used - own
    room = max(0, min(total - others, info.budget))
    return VramReading(others + room, used, own, "dxgi", at)


class DxgiMemory(Protocol):
    def query(self) -> DxgiMemoryInfo | None: ...

    def close(self) -> None: ...


class DxgiSource:
    """Windows' own video memory figures for this process (``IDXGIAdapter3``'s
    ``QueryVideoMemoryInfo``, see ``guest.dxgi``), combined with NVML's whole-device figures
    by :func:`dxgi_reading`. Only on Windows (:meth:`for_gpu` answers None elsewhere); the
    arbiter takes the most conservative of all sources, so it sits beside ``NvmlSource``."""

    def __init__(self, memory: DxgiMemory,
                 device: Callable[[], tuple[int, int] | None] | None = None,
                 own_floor: Callable[[], int] | None = None) -> None:
        self.memory, self.device = memory, device
        self.own_floor = own_floor or (lambda: 0)

    def read(self) -> VramReading | None:
        info = self.memory.query()
        if info is None:
            return None
        device = self.device() if self.device is not None else None
        return dxgi_reading(info, device, self.own_floor(), time.monotonic())

    def close(self) -> None:
        self.memory.close()

    @classmethod
    def for_gpu(cls, nvml: NvmlSource | None, own_floor: Callable[[], int] | None = None, *,
                bus_id: str | None = None, platform: str | None = None,
                opener: Callable[..., DxgiMemory | None] | None = None) -> DxgiSource | None:
        """The source for llama.cpp's GPU: the DXGI adapter that is NVML's device (by PCI bus
        where D3DKMT gives the adapter's, else by PCI ids), or that is at ``bus_id``, or the
        only hardware adapter. None off Windows, or where no adapter matches."""
        if (platform or sys.platform) != "win32":
            return None
        from igi_sdk.guest.adapters import match_adapter

        nv_bus, pci_ids = nvml.identity() if nvml is not None else (None, None)
        want = nv_bus or bus_id
        if opener is None:
            from igi_sdk.guest.dxgi import open_adapter as opener
        try:
            memory = opener(lambda adapters: match_adapter(adapters, want, pci_ids))
        except OSError as e:  # no dxgi.dll (Wine without it, Server Core), a failed call
            log.info("no DXGI video memory figures: %s", e)
            return None
        if memory is None:
            log.info("no DXGI adapter is the GPU at %s: no DXGI video memory figures", want)
            return None
        device = nvml.device_memory if nvml is not None and nvml.nv is not None else None
        return cls(memory, device, own_floor)


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
