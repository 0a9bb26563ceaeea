"""A reservation is granted the moment the driver shows its memory free, not when the
placement's close returns (llama.cpp frees VRAM early in a close, host memory after)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from igi_sdk.arbiter import Arbiter, PlanLadder, PolicyConfig
from igi_sdk.arbiter.sources import NvmlSource
from igi_sdk.model import read_inventory
from igi_sdk.planner import Workload
from igi_sdk.runtime.engine_ops import LoadOutcome
from tests.test_planner import GPU_PROFILE

GIB = 1024**3
MIB = 1024**2


@pytest.fixture(scope="module")
def ladder(tmp_path_factory):
    from igi_sdk.model import spec_with, write_synthetic_gguf

    spec = spec_with("tiny-llama", n_layers=8, n_embd=1024, n_ff=4096, n_vocab=4096)
    inv = read_inventory(write_synthetic_gguf(tmp_path_factory.mktemp("m") / "m.gguf", spec))
    return PlanLadder.build(inv, GPU_PROFILE, Workload(n_ctx=2048, prompt_tokens=512),
                            step=16 * MIB)


class Device:
    """pynvml's calls for one device that this process and a game share."""

    class NVMLError(Exception):
        pass

    def __init__(self, total: int, own: int) -> None:
        self.total, self.own, self.game = total, own, 0
        self.lock = threading.Lock()

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return "h0"

    def nvmlDeviceGetMemoryInfo(self, h: str) -> SimpleNamespace:
        with self.lock:
            return SimpleNamespace(total=self.total, used=self.own + self.game)

    def nvmlDeviceGetComputeRunningProcesses(self, h: str) -> list[SimpleNamespace]:
        with self.lock:
            return [SimpleNamespace(pid=os.getpid(), usedGpuMemory=self.own)]


class ClosingEngine:
    """An engine on the ladder's top rung whose release frees the VRAM at once and then takes
    as long as the test lets it (the host-side part of llama.cpp's close)."""

    def __init__(self, top, cpu, device: Device) -> None:
        self.top, self.cpu, self.device = top, cpu, device
        self.plan = top.plan
        self.state, self.loaded, self.last_load_s, self.standby_ready = "ready", True, None, True
        self.close_may_end = threading.Event()
        self.release_done = threading.Event()

    def cancel_load(self) -> bool:
        return False

    def release_async(self) -> Future[None]:
        fut: Future[None] = Future()

        def close() -> None:
            with self.device.lock:
                self.device.own = self.cpu.vram  # the device buffers are gone
            self.close_may_end.wait(5.0)  # unpinning, the vocabulary, the file mapping
            self.plan = self.cpu.plan
            self.release_done.set()
            fut.set_result(None)

        threading.Thread(target=close, daemon=True).start()
        return fut

    def load_first_fitting_async(self, candidates) -> Future[LoadOutcome]:
        fut: Future[LoadOutcome] = Future()
        fut.set_result(LoadOutcome(candidates[0].name, ()))
        return fut

    def drop_draft_async(self) -> Future[bool]:
        fut: Future[bool] = Future()
        fut.set_result(False)
        return fut

    def restore_draft_async(self) -> Future[bool]:
        return self.drop_draft_async()


def test_a_reservation_is_granted_before_the_close_returns(ladder) -> None:
    top, cpu = ladder.rungs[-1], ladder.cpu
    device = Device(total=top.vram + 256 * MIB, own=top.vram)
    engine = ClosingEngine(top, cpu, device)
    source = NvmlSource(0, nvml_lib=device, context_bytes=lambda: 0)
    arb = Arbiter(engine, ladder, [source],  # type: ignore[arg-type]
                  config=PolicyConfig(headroom=64 * MIB))
    assert arb.policy.current is top
    heard: list[tuple[str, bool]] = []

    def granted(res, err) -> None:
        heard.append(("granted" if err is None else err.code, engine.release_done.is_set()))
        engine.close_may_end.set()

    need = top.vram - cpu.vram + 256 * MIB - 1  # free only once the top rung is closed
    arb.reserve(need, 0, granted)
    ticking = threading.Thread(target=arb.tick)
    ticking.start()
    ticking.join(10.0)
    engine.close_may_end.set()
    assert not ticking.is_alive()
    # told while the close was still running (it ends only once the game has heard)
    assert heard == [("granted", False)]
    assert arb.stats()["grant_seconds"] and arb.policy.current is cpu


def test_without_a_driver_figure_the_grant_waits_for_the_close(ladder) -> None:
    """Engine reports alone cannot see memory come free mid-close: the release's answer
    (the arbiter's own accounting) grants, as before."""
    from igi_sdk.arbiter import ScriptedTrace

    top, cpu = ladder.rungs[-1], ladder.cpu
    device = Device(total=top.vram + 256 * MIB, own=top.vram)
    engine = ClosingEngine(top, cpu, device)
    arb: Arbiter
    trace = ScriptedTrace(top.vram + 256 * MIB, [(0.0, 0)], own=lambda: arb.own_vram())
    arb = Arbiter(engine, ladder, [trace],  # type: ignore[arg-type]
                  config=PolicyConfig(headroom=64 * MIB))
    heard: list[bool] = []

    def granted(res, err) -> None:
        heard.append(err is None and engine.release_done.is_set())

    arb.reserve(top.vram - cpu.vram + 256 * MIB - 1, 0, granted)
    threading.Timer(0.2, engine.close_may_end.set).start()
    arb.tick()
    assert heard == [True]


def test_memory_taken_between_readings_ends_the_wait_for_the_next(ladder) -> None:
    """A game that grabs its memory at once is read at once, not at the next period."""
    top, cpu = ladder.rungs[-1], ladder.cpu
    device = Device(total=top.vram + 4 * GIB, own=top.vram)
    engine = ClosingEngine(top, cpu, device)
    arb = Arbiter(engine, ladder, [NvmlSource(0, nvml_lib=device, context_bytes=lambda: 0)],
                  period_s=30.0)  # type: ignore[arg-type]
    waited = threading.Event()
    waiter = threading.Thread(target=lambda: (arb._wait_for_change(), waited.set()))
    waiter.start()
    assert not waited.wait(0.2)  # nothing moves: it waits for the period
    with device.lock:
        device.game += 2 * GIB  # the game's level load, in one allocation
    assert waited.wait(5.0)  # seen within a few watch intervals, long before the 30 s period
    waiter.join()
