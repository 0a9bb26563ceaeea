"""The sidecar's priority and power-throttling decisions, and exactly what they call.

Windows cannot run here: its path is checked as the values it passes to a recording
kernel32 (the manual check on Windows is in docs/shipping.md). The POSIX path runs for real in
a child process (niceness cannot be lowered again without privileges)."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap

import pytest

from igi_sdk.errors import UsageError
from igi_sdk.guest import priority
from igi_sdk.guest.posix import renice
from igi_sdk.guest.priority import (
    BELOW_NORMAL_PRIORITY_CLASS,
    GUEST_NICE,
    GuestPlan,
    ProcessPowerThrottlingState,
    nice_increment,
    plan_priority,
    priority_setting,
)
from igi_sdk.guest.win32 import apply_windows


def test_windows_plan_opts_out_of_throttling_and_goes_below_normal() -> None:
    assert plan_priority("win32") == GuestPlan(True, 0x4000, None)
    # "normal" keeps the priority class, never the throttling
    assert plan_priority("win32", "normal") == GuestPlan(True, None, None)


def test_posix_plan_is_a_positive_nice_by_default() -> None:
    for platform in ("linux", "darwin"):
        assert plan_priority(platform) == GuestPlan(False, None, 10)
        assert plan_priority(platform, "normal") == GuestPlan(False, None, None)
    assert GUEST_NICE > 0  # a game runs at nice 0: the sidecar must be behind it


def test_setting_from_the_environment() -> None:
    assert priority_setting(None) == "below"
    assert priority_setting("") == "below"
    assert priority_setting(" Normal ") == "normal"
    assert priority_setting("realtime") == "below"  # unknown: warned, default kept
    with pytest.raises(UsageError):
        plan_priority("linux", "high")


def test_nice_is_only_ever_raised() -> None:
    assert nice_increment(0, 10) == 10
    assert nice_increment(4, 10) == 6
    assert nice_increment(15, 10) == 0  # a launcher's lower priority is kept
    assert nice_increment(0, None) == 0


def test_power_throttling_state_layout() -> None:
    # PROCESS_POWER_THROTTLING_STATE: ULONG Version, ControlMask, StateMask
    assert ctypes.sizeof(ProcessPowerThrottlingState) == 12
    assert [ProcessPowerThrottlingState.Version.offset,
            ProcessPowerThrottlingState.ControlMask.offset,
            ProcessPowerThrottlingState.StateMask.offset] == [0, 4, 8]
    state = priority.no_throttling_state()
    assert bytes(state) == bytes([1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])


class RecordingKernel32:
    """Records each call with the values it received (the structure's fields read back from
    the pointer passed, as the kernel would)."""

    def __init__(self, ok: bool = True) -> None:
        self.calls: list[tuple[object, ...]] = []
        self.ok = ok

    def GetCurrentProcess(self) -> int:
        self.calls.append(("GetCurrentProcess",))
        return -1

    def SetProcessInformation(self, process: int, info_class: int, info: object,
                              size: int) -> int:
        addr = ctypes.cast(info, ctypes.c_void_p).value
        state = ProcessPowerThrottlingState.from_address(addr)
        self.calls.append(("SetProcessInformation", process, info_class,
                           (state.Version, state.ControlMask, state.StateMask), size))
        return int(self.ok)

    def SetPriorityClass(self, process: int, priority_class: int) -> int:
        self.calls.append(("SetPriorityClass", process, priority_class))
        return int(self.ok)


def test_windows_call_sequence() -> None:
    k = RecordingKernel32()
    done = apply_windows(plan_priority("win32"), k)
    assert k.calls == [
        ("GetCurrentProcess",),
        # ProcessPowerThrottling = 4; Version 1, ControlMask EXECUTION_SPEED, StateMask 0
        ("SetProcessInformation", -1, 4, (1, 1, 0), 12),
        ("SetPriorityClass", -1, BELOW_NORMAL_PRIORITY_CLASS),
    ]
    assert done == ["power throttling off", "priority class 0x4000"]


def test_windows_refusal_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    k = RecordingKernel32(ok=False)
    assert apply_windows(plan_priority("win32"), k) == []
    assert "ProcessPowerThrottling" in caplog.text and "SetPriorityClass" in caplog.text
    k = RecordingKernel32()
    apply_windows(plan_priority("win32", "normal"), k)
    assert [c[0] for c in k.calls] == ["GetCurrentProcess", "SetProcessInformation"]


def test_renice_raises_each_task_to_the_target() -> None:
    nice = {1: 0, 2: 12, 3: 5}
    changed = renice(10, [1, 2, 3], lambda _w, t: nice[t],
                     lambda _w, t, v: nice.__setitem__(t, v), 0)
    assert changed == [1, 3] and nice == {1: 10, 2: 12, 3: 10}


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX niceness")
def test_posix_apply_renices_every_thread_of_a_real_process() -> None:
    # in a child: the threads that exist before the call (Linux keeps a nice value per thread)
    # and one started after it must all end at the guest niceness
    code = textwrap.dedent("""
        import os, sys, threading
        from igi_sdk.guest.posix import apply_posix
        from igi_sdk.guest.priority import plan_priority
        stop = threading.Event()
        seen = {}
        def worker(key):
            seen[key] = os.getpriority(os.PRIO_PROCESS, 0)
            stop.wait()
            seen[key + "_after"] = os.getpriority(os.PRIO_PROCESS, 0)
        early = threading.Thread(target=worker, args=("early",)); early.start()
        while "early" not in seen: pass
        done = apply_posix(plan_priority(sys.platform))
        late = threading.Thread(target=worker, args=("late",)); late.start()
        while "late" not in seen: pass
        stop.set(); early.join(); late.join()
        print(seen["early"], seen["early_after"], seen["late"],
              os.getpriority(os.PRIO_PROCESS, 0), done)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout.split(maxsplit=4)
    start = os.getpriority(os.PRIO_PROCESS, 0)
    target = max(start, GUEST_NICE)
    assert int(out[0]) == start
    if sys.platform.startswith("linux"):
        assert int(out[1]) == target  # the thread that existed before was reniced too
    assert int(out[2]) == target and int(out[3]) == target
    assert "nice 10" in out[4]
