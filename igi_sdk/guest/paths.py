"""Where the sidecar writes: the OS's per-user app-data folders, never next to the executable.

A game installs its files where the player cannot write (``C:\\Program Files``, a Steam
library on another account's drive, a read-only ``/opt`` or AppImage). So saved sessions and
the log go to the per-user folders (``platformdirs``):

======== ============================================== ====================================
OS       saves (``<data>/sessions``)                    log
======== ============================================== ====================================
Windows  ``%LOCALAPPDATA%\\igi-sdk\\sessions``           ``%LOCALAPPDATA%\\igi-sdk\\Logs``
macOS    ``~/Library/Application Support/igi-sdk/...``  ``~/Library/Logs/igi-sdk``
Linux    ``$XDG_DATA_HOME/igi-sdk/sessions``            ``$XDG_STATE_HOME/igi-sdk/log``
         (``~/.local/share``)                           (``~/.local/state``)
======== ============================================== ====================================

Local, not roaming, app data on Windows: saved KV caches are large, and a roaming profile
copies its folder over the network at every log-on. Where no per-user folder can be found or
written (no home directory, a read-only one), each falls back to a folder of this user in the
system's temporary directory, with a warning: saves there may not survive a restart.
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Protocol

log = logging.getLogger("igi_sdk.guest")

APP_NAME = "igi-sdk"
LOG_FILE = "sidecar.log"


class DirsLike(Protocol):
    """The two folders of a ``platformdirs`` object this module reads."""

    @property
    def user_data_dir(self) -> str: ...

    @property
    def user_log_dir(self) -> str: ...


@dataclass(frozen=True)
class GuestDirs:
    data: Path  # <data>/igi-sdk
    logs: Path  # <log dir>/igi-sdk (with the OS's log sub-folder)
    fallback: tuple[str, ...] = ()  # which of "data", "logs" are in the temporary directory

    @property
    def sessions(self) -> Path:
        return self.data / "sessions"

    @property
    def log_file(self) -> Path:
        return self.logs / LOG_FILE


def platform_dirs(platform: str | None = None) -> DirsLike:
    """``platformdirs``' folders of igi-sdk for ``platform`` (``sys.platform``; the Windows and
    macOS rules can be asked for anywhere, which is how they are tested)."""
    platform = platform or sys.platform
    if platform == "win32":
        from platformdirs.windows import Windows as Dirs
    elif platform == "darwin":
        from platformdirs.macos import MacOS as Dirs
    else:
        from platformdirs.unix import Unix as Dirs
    # appauthor=False: "igi-sdk", not "igi-sdk\igi-sdk" on Windows; roaming=False: see above
    return Dirs(APP_NAME, appauthor=False, roaming=False, ensure_exists=False)


def temp_root(base: str | None = None) -> Path:
    """This user's folder in the system temporary directory (``/tmp/igi-sdk-1000``; Windows'
    temporary directory is the user's own already)."""
    suffix = f"-{os.getuid()}" if hasattr(os, "getuid") else ""
    return Path(base or tempfile.gettempdir()) / f"{APP_NAME}{suffix}"


def writable_dir(path: Path) -> bool:
    """Creates ``path`` (private to this user) if needed; True when this user can write
    there. A temporary folder that another user created first is refused (it could be a
    trap: a link they control)."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        if hasattr(os, "getuid") and path.stat().st_uid != os.getuid():
            return False
        return os.access(path, os.W_OK | os.X_OK)
    except OSError:
        return False


def _candidate(get: Callable[[], str]) -> Path | None:
    """One folder from platformdirs, or None when it cannot name an absolute one (no home
    directory: platformdirs raises, or ``~`` stays unexpanded and would land in the current
    folder — next to the executable)."""
    try:
        text = get()
    except (RuntimeError, KeyError, ValueError, OSError) as e:
        log.debug("no per-user folder: %s", e)
        return None
    path = Path(text)
    absolute = PurePosixPath(text).is_absolute() or PureWindowsPath(text).is_absolute()
    if not text or "~" in path.parts or not absolute:
        return None
    return path


def choose_dirs(dirs: DirsLike, usable: Callable[[Path], bool] = writable_dir,
                temp: Path | None = None) -> GuestDirs:
    """The folders to use: ``dirs``' own where ``usable``, else ``temp`` (default: this
    user's temporary folder), each warned about."""
    temp = temp or temp_root()
    chosen: dict[str, Path] = {}
    fallback: list[str] = []
    for kind, get, sub in (("data", lambda: dirs.user_data_dir, "data"),
                           ("logs", lambda: dirs.user_log_dir, "logs")):
        path = _candidate(get)
        if path is None or not usable(path):
            alt = temp / sub
            log.warning("no writable per-user %s folder (%s): using %s", kind,
                        path or "no home directory", alt)
            path = alt
            fallback.append(kind)
        chosen[kind] = path
    return GuestDirs(chosen["data"], chosen["logs"], tuple(fallback))


_chosen: GuestDirs | None = None


def guest_dirs() -> GuestDirs:
    """This machine's folders (chosen once per process: the warning is given once)."""
    global _chosen
    if _chosen is None:
        _chosen = choose_dirs(platform_dirs())
    return _chosen


def user_data_dir() -> Path:
    """igi-sdk's per-user data folder (``<data>/igi-sdk``); saves go in its ``sessions``."""
    return guest_dirs().data


def user_log_dir() -> Path:
    """igi-sdk's per-user log folder."""
    return guest_dirs().logs


def sessions_dir() -> Path:
    """Where saved sessions go by default."""
    return guest_dirs().sessions


def sidecar_log_file() -> Path:
    """The sidecar's log file by default."""
    return guest_dirs().log_file
