"""The Windows calls of :mod:`igi_sdk.guest.priority`'s plan, through ctypes.

``kernel32`` is injectable so a test can record exactly what is called with which values; the
real one is loaded only on Windows."""

from __future__ import annotations

import ctypes
import logging
from typing import Protocol

from igi_sdk.guest.priority import (
    PROCESS_POWER_THROTTLING,
    GuestPlan,
    no_throttling_state,
)

log = logging.getLogger("igi_sdk.guest")


class Kernel32(Protocol):
    # the three kernel32 entry points used here, under their Windows names
    def GetCurrentProcess(self) -> int: ...
    def SetProcessInformation(self, process: int, info_class: int,
                              info: object, size: int) -> int: ...
    def SetPriorityClass(self, process: int, priority_class: int) -> int: ...


def load_kernel32() -> Kernel32:
    from ctypes import wintypes

    k = ctypes.WinDLL("kernel32", use_last_error=True)  # type: ignore[attr-defined]
    k.GetCurrentProcess.restype = wintypes.HANDLE
    k.GetCurrentProcess.argtypes = ()
    k.SetProcessInformation.restype = wintypes.BOOL
    k.SetProcessInformation.argtypes = (wintypes.HANDLE, ctypes.c_int, ctypes.c_void_p,
                                        wintypes.DWORD)
    k.SetPriorityClass.restype = wintypes.BOOL
    k.SetPriorityClass.argtypes = (wintypes.HANDLE, wintypes.DWORD)
    return k  # type: ignore[no-any-return]


def _last_error() -> int:
    get = getattr(ctypes, "get_last_error", None)
    return int(get()) if get is not None else 0


def apply_windows(plan: GuestPlan, kernel32: Kernel32 | None = None) -> list[str]:
    """Apply ``plan``; returns what was done, for the log. A refusal is logged, not raised:
    Windows before 10 1709 has no ``ProcessPowerThrottling`` (ERROR_INVALID_PARAMETER), and the
    sidecar works without either setting, only less politely."""
    k = kernel32 if kernel32 is not None else load_kernel32()
    process = k.GetCurrentProcess()  # a pseudo-handle (-1): nothing to close
    done: list[str] = []
    if plan.no_power_throttling:
        state = no_throttling_state()
        if k.SetProcessInformation(process, PROCESS_POWER_THROTTLING, ctypes.byref(state),
                                   ctypes.sizeof(state)):
            done.append("power throttling off")
        else:
            log.warning("SetProcessInformation(ProcessPowerThrottling) failed (error %d): the "
                        "sidecar may be slowed while the game has the focus", _last_error())
    if plan.priority_class is not None:
        if k.SetPriorityClass(process, plan.priority_class):
            done.append(f"priority class 0x{plan.priority_class:x}")
        else:
            log.warning("SetPriorityClass(0x%x) failed (error %d)", plan.priority_class,
                        _last_error())
    return done
