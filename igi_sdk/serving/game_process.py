"""The game's process as the sidecar sees it: is it running, and did it launch the sidecar.
Only the launching game may bind the sidecar's lifetime (see the server's game-PID watch)."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether the process runs (a zombie counts as gone)."""
    if os.name == "nt":  # os.kill(pid, 0) would send CTRL_C_EVENT on Windows
        return _alive_windows(pid)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie (exited, not yet reaped by its parent) is gone as far as the game goes
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def is_ancestor(pid: int) -> bool:
    """Whether ``pid`` launched this process (its parent, or further up where /proc shows)."""
    if pid == os.getppid():
        return True
    current = os.getppid()
    for _ in range(32):  # a launcher script or two between the game and the sidecar
        try:
            with open(f"/proc/{current}/stat") as f:
                current = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
        if current == pid:
            return True
        if current <= 1:
            return False
    return False


def _alive_windows(pid: int) -> bool:
    import ctypes

    synchronize, wait_timeout = 0x00100000, 0x00000102
    k32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
    handle = k32.OpenProcess(synchronize, False, pid)
    if not handle:
        return False
    try:
        return k32.WaitForSingleObject(handle, 0) == wait_timeout
    finally:
        k32.CloseHandle(handle)
