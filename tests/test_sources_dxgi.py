"""DXGI's per-process figures as a VRAM source: how they make a reading, alone and with
NVML's whole-device figures, and when the source exists at all."""

from __future__ import annotations

from types import SimpleNamespace

from igi_sdk.arbiter.sources import DxgiSource, NvmlSource, VramReading, dxgi_reading
from igi_sdk.guest.adapters import AdapterInfo, DxgiMemoryInfo

GIB = 1 << 30
MIB = 1 << 20


def info(budget: int, usage: int) -> DxgiMemoryInfo:
    return DxgiMemoryInfo(budget, usage, budget // 2, 0)


def room(r: VramReading) -> int:
    """What the policy would let the model take (no headroom, no reservations)."""
    return r.total - r.others


def test_own_use_comes_from_dxgi_and_others_from_nvml() -> None:
    # 12 GiB card; NVML: 9 GiB used by everyone (no per-process figure under WDDM);
    # DXGI: this process uses 3 GiB, the OS budgets it 10 GiB
    r = dxgi_reading(info(10 * GIB, 3 * GIB), (12 * GIB, 9 * GIB), 2 * GIB, 5.0)
    assert (r.own, r.others, r.source, r.at) == (3 * GIB, 6 * GIB, "dxgi", 5.0)
    assert room(r) == 6 * GIB  # what the device leaves: 12 - 6


def test_the_os_budget_limits_when_it_is_lower() -> None:
    # the game in the foreground needs video memory: Windows cuts this process's budget to
    # 2 GiB though the device still has room for 6
    r = dxgi_reading(info(2 * GIB, 3 * GIB), (12 * GIB, 9 * GIB), 0, 0.0)
    assert room(r) == 2 * GIB and r.others == 6 * GIB
    # the policy shrinks the model below what it holds (3 GiB)
    assert r.total - r.others - 256 * MIB < r.own


def test_engine_accounting_is_a_floor() -> None:
    # a driver that leaves allocations out of DXGI's figure must not turn the model into
    # "the game's" use: the engine knows it holds at least 4 GiB
    r = dxgi_reading(info(10 * GIB, 1 * GIB), (12 * GIB, 9 * GIB), 4 * GIB, 0.0)
    assert r.own == 4 * GIB and r.others == 5 * GIB


def test_nvml_lagging_behind_dxgi() -> None:
    # NVML's used below our own figure (read a moment earlier): nobody else, never negative
    r = dxgi_reading(info(10 * GIB, 3 * GIB), (12 * GIB, 2 * GIB), 0, 0.0)
    assert r.others == 0 and r.used == 3 * GIB and room(r) == 10 * GIB


def test_dxgi_alone_is_the_os_budget() -> None:
    # another vendor's GPU (no NVML): the budget is all there is
    r = dxgi_reading(info(7 * GIB, 2 * GIB), None, 0, 0.0)
    assert (r.total, r.used, r.own, r.others) == (7 * GIB, 2 * GIB, 2 * GIB, 0)
    assert room(r) == 7 * GIB


class Memory:
    def __init__(self, answers: list[DxgiMemoryInfo | None]) -> None:
        self.answers, self.closed = answers, False

    def query(self) -> DxgiMemoryInfo | None:
        return self.answers.pop(0)

    def close(self) -> None:
        self.closed = True


def test_source_reads_and_closes() -> None:
    mem = Memory([info(10 * GIB, 3 * GIB), None])
    src = DxgiSource(mem, lambda: (12 * GIB, 9 * GIB), lambda: GIB)
    r = src.read()
    assert r is not None and r.own == 3 * GIB and room(r) == 6 * GIB
    assert src.read() is None  # a removed device: no reading, the other sources decide
    src.close()
    assert mem.closed


class FakeNvml:
    """pynvml's calls NvmlSource makes, for one device under WDDM (no per-process figure)."""

    class NVMLError(Exception):
        pass

    def nvmlDeviceGetCount(self) -> int:
        return 1

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return "h0"

    def nvmlDeviceGetPciInfo(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(busId=b"00000000:01:00.0", pciDeviceId=0x278610DE,
                               pciSubSystemId=0x51031458)

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        return SimpleNamespace(total=12 * GIB, used=9 * GIB)

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[object]:
        raise self.NVMLError("Not Supported")


def test_for_gpu_only_on_windows_and_matched_to_nvml_s_device() -> None:
    nv = NvmlSource(0, lambda: GIB, nvml_lib=FakeNvml(), context_bytes=lambda: 0)
    assert nv.identity() == ("00000000:01:00.0", (0x10DE, 0x2786, 0x51031458))
    asked: list[AdapterInfo | None] = []
    mem = Memory([info(10 * GIB, 3 * GIB)])
    adapters = [AdapterInfo(0, "igpu", 0x8086, 0x9BC4, 1, (0, 1), False, 0, "0000:00:02.0"),
                AdapterInfo(1, "rtx", 0x10DE, 0x2786, 0x51031458, (0, 2), False, 0, None)]

    def opener(choose: object) -> Memory:
        asked.append(choose(adapters))  # type: ignore[operator]
        return mem

    assert DxgiSource.for_gpu(nv, platform="linux", opener=opener) is None
    assert asked == []  # nothing is even tried off Windows
    src = DxgiSource.for_gpu(nv, lambda: GIB, platform="win32", opener=opener)
    assert src is not None and asked == [adapters[1]]  # by PCI ids (no bus from D3DKMT)
    r = src.read()
    # NVML's figure under WDDM would have taken the engine's 1 GiB for the process's use;
    # DXGI says 3 GiB: the 2 GiB the engine does not account for are not the game's
    nvr = nv.read()
    assert nvr is not None and r is not None
    assert (nvr.own, r.own) == (GIB, 3 * GIB) and r.others == nvr.others - 2 * GIB


def test_for_gpu_without_a_matching_adapter_or_dxgi() -> None:
    assert DxgiSource.for_gpu(None, platform="win32", opener=lambda choose: None) is None

    def broken(choose: object) -> None:
        raise OSError("dxgi.dll not found")

    assert DxgiSource.for_gpu(None, platform="win32", opener=broken) is None

