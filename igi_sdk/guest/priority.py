"""How the sidecar runs behind the game: the decision (pure) and the Windows structure it passes.

Two separate things:

- **Power throttling (Windows).** Windows 11 puts processes without a foreground window into
  EcoQoS ("Efficiency mode" in Task Manager): low clocks, efficiency cores. A sidecar behind a
  full-screen game is such a process, and replies slowed until the player alt-tabbed. The
  sidecar opts out of execution-speed throttling, always: it only ever works while the game
  waits for a line.
- **Priority.** The game must win a contended core. Windows: ``BELOW_NORMAL_PRIORITY_CLASS``
  (base priority 6 against the game's 8), so a ready game thread preempts the sidecar at once,
  while the sidecar still runs ahead of ``IDLE``-class background work (indexers, updaters),
  which ``IDLE_PRIORITY_CLASS`` would queue it behind (and Task Manager's Efficiency mode *is*
  IDLE plus EcoQoS). POSIX: nice 10 (a game runs at nice 0): Linux's scheduler shares a
  contended core by weight, 1024 for nice 0 against 110 for nice 10, so the game keeps about
  90% of a core the sidecar also wants. On the cores the game leaves — the only ones the
  sidecar plans threads for (``guest.cores``) — an idle core runs whatever is ready and nice
  changes nothing, which is why it is the default.

``IGI_SDK_PRIORITY=normal`` keeps the priority the process was started with (throttling stays
off).
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass

log = logging.getLogger("igi_sdk.guest")

PRIORITY_ENV = "IGI_SDK_PRIORITY"
PRIORITY_SETTINGS = ("below", "normal")

# processthreadsapi.h
PROCESS_POWER_THROTTLING_CURRENT_VERSION = 1
PROCESS_POWER_THROTTLING_EXECUTION_SPEED = 0x1
PROCESS_POWER_THROTTLING_IGNORE_TIMER_RESOLUTION = 0x4
# PROCESS_INFORMATION_CLASS: ProcessMemoryPriority 0, ProcessMemoryExhaustionInfo 1,
# ProcessAppMemoryInfo 2, ProcessInPrivateInfo 3, ProcessPowerThrottling 4
PROCESS_POWER_THROTTLING = 4
# WinBase.h priority classes
NORMAL_PRIORITY_CLASS = 0x00000020
IDLE_PRIORITY_CLASS = 0x00000040
BELOW_NORMAL_PRIORITY_CLASS = 0x00004000

GUEST_NICE = 10  # the niceness the sidecar runs at on Linux and macOS (see the module docs)


class ProcessPowerThrottlingState(ctypes.Structure):
    """``PROCESS_POWER_THROTTLING_STATE``: three ULONGs (4 bytes on every Windows ABI), 12 bytes.

    ``ControlMask`` names the policies this call decides; ``StateMask`` turns each of them on
    (bit set) or off (bit clear). EXECUTION_SPEED in the control mask and not in the state mask
    means "never throttle this process", which is not the same as leaving the bit out of both
    (that hands the decision back to the system)."""

    _fields_ = (("Version", ctypes.c_uint32),
                ("ControlMask", ctypes.c_uint32),
                ("StateMask", ctypes.c_uint32))


def no_throttling_state() -> ProcessPowerThrottlingState:
    return ProcessPowerThrottlingState(PROCESS_POWER_THROTTLING_CURRENT_VERSION,
                                       PROCESS_POWER_THROTTLING_EXECUTION_SPEED, 0)


@dataclass(frozen=True)
class GuestPlan:
    """What to change in this process so that it runs behind the game."""

    no_power_throttling: bool  # Windows: opt out of EcoQoS
    priority_class: int | None  # Windows: the priority class to set; None leaves it
    nice: int | None  # Linux/macOS: the niceness to reach (never lowered); None leaves it


def priority_setting(value: str | None) -> str:
    """``IGI_SDK_PRIORITY``'s value, or the default ("below") when unset or unknown (warned)."""
    text = (value or "").strip().lower()
    if not text:
        return "below"
    if text not in PRIORITY_SETTINGS:
        log.warning("%s=%r is not one of %s: using 'below'", PRIORITY_ENV, value,
                    ", ".join(PRIORITY_SETTINGS))
        return "below"
    return text


def plan_priority(platform: str, setting: str = "below") -> GuestPlan:
    """The plan for ``platform`` (``sys.platform``: "win32", "linux", "darwin", ...)."""
    if setting not in PRIORITY_SETTINGS:
        from igi_sdk.errors import UsageError

        raise UsageError(f"priority setting {setting!r}: use one of {PRIORITY_SETTINGS}")
    below = setting == "below"
    if platform == "win32":
        return GuestPlan(True, BELOW_NORMAL_PRIORITY_CLASS if below else None, None)
    return GuestPlan(False, None, GUEST_NICE if below else None)


def nice_increment(current: int, target: int | None) -> int:
    """How much to add to ``current`` niceness to reach ``target``: never negative (a launcher
    that started the sidecar nicer than the target is kept, and lowering needs privileges)."""
    if target is None:
        return 0
    return max(0, target - current)
