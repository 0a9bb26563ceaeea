"""Which thread owns what, by name, and an assertion mode that checks it.

The shell's contract (docs/architecture.md): only the engine thread calls llama.cpp, and no other
layer's code runs on it; listeners and callbacks run on the outbox thread, VRAM readings and
reservations on the arbiter's, protocol work on the socket thread. With ``IGI_SDK_THREAD_CHECKS=1``
(the test suite sets it) each owner's entry points check the thread they run on; a breach is
recorded in :data:`breaches` and raised as :class:`ThreadOwnershipError`, so a test fails even
when the breach happened on a thread whose errors are only logged.
"""

from __future__ import annotations

import os
import threading

ENGINE = "igi-engine"
OUTBOX = "igi-outbox"
ARBITER = "igi-arbiter"
SOCKET = "igi-socket"
# opens a placement while the engine thread decodes on another (runtime/background_load.py)
LOADER = "igi-loader"
# times the machine's kernels for its profile, then exits (tuning/measure.py)
PROFILER = "igi-profiler"

breaches: list[str] = []


class ThreadOwnershipError(AssertionError):
    """Code ran on a thread that does not own it (assertion mode only)."""


def checking() -> bool:
    return os.environ.get("IGI_SDK_THREAD_CHECKS") == "1"


def _breach(message: str) -> None:
    breaches.append(message)
    raise ThreadOwnershipError(message)


def expect(owner: str, what: str) -> None:
    """``what`` belongs to thread ``owner``: it must run there."""
    if checking() and (name := threading.current_thread().name) != owner:
        _breach(f"{what} ran on thread {name!r}, not on {owner!r}")


def expect_one_of(owners: tuple[str, ...], what: str) -> None:
    """``what`` belongs to one of ``owners`` (a placement is opened on the engine thread, or
    on a loader thread that hands it over whole)."""
    if checking() and (name := threading.current_thread().name) not in owners:
        _breach(f"{what} ran on thread {name!r}, not on one of {owners!r}")


def refuse(owner: str, what: str) -> None:
    """``what`` must never run on thread ``owner`` (another layer's code on the engine
    thread, say)."""
    if checking() and threading.current_thread().name == owner:
        _breach(f"{what} ran on thread {owner!r}, which must not run it")
