"""Saves and logs under the OS's per-user folders, with the temporary directory as a warned
fallback; the rotating log file."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path, PureWindowsPath

import pytest

from igi_sdk.guest import paths
from igi_sdk.guest.logs import SidecarLogHandler, configure_logging
from igi_sdk.guest.paths import choose_dirs, platform_dirs, temp_root, writable_dir


@pytest.fixture
def no_xdg(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)


def test_linux_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    d = choose_dirs(platform_dirs("linux"), temp=tmp_path / "tmp")
    assert d.sessions == tmp_path / "data" / "igi-sdk" / "sessions"
    assert d.log_file == tmp_path / "state" / "igi-sdk" / "log" / "sidecar.log"
    assert d.fallback == ()
    assert d.data.is_dir() and d.logs.is_dir()


def test_linux_without_xdg_uses_home(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                     no_xdg: None) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    d = choose_dirs(platform_dirs("linux"), temp=tmp_path / "tmp")
    assert d.data == tmp_path / "home" / ".local" / "share" / "igi-sdk"
    assert d.logs == tmp_path / "home" / ".local" / "state" / "igi-sdk" / "log"


def test_macos_folders(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, no_xdg: None) -> None:
    monkeypatch.setenv("HOME", "/Users/ana")
    d = platform_dirs("darwin")
    assert d.user_data_dir == "/Users/ana/Library/Application Support/igi-sdk"
    assert d.user_log_dir == "/Users/ana/Library/Logs/igi-sdk"


def test_windows_folders_are_local_app_data(monkeypatch: pytest.MonkeyPatch) -> None:
    # the shell's known folders, as SHGetKnownFolderPath answers them on Windows
    import platformdirs.windows

    known = {"CSIDL_LOCAL_APPDATA": r"C:\Users\Ana\AppData\Local",
             "CSIDL_APPDATA": r"C:\Users\Ana\AppData\Roaming"}
    monkeypatch.setattr(platformdirs.windows, "get_win_folder", known.__getitem__)
    d = choose_dirs(platform_dirs("win32"), usable=lambda p: True)
    # local, not roaming; no "author" folder above igi-sdk
    assert PureWindowsPath(str(d.data)) == PureWindowsPath(r"C:\Users\Ana\AppData\Local\igi-sdk")
    assert PureWindowsPath(str(d.sessions)) == PureWindowsPath(
        r"C:\Users\Ana\AppData\Local\igi-sdk\sessions")
    assert PureWindowsPath(str(d.logs)) == PureWindowsPath(
        r"C:\Users\Ana\AppData\Local\igi-sdk\Logs")
    assert d.fallback == ()


def test_windows_without_known_folder_falls_back(monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    import platformdirs.windows

    def missing(name: str) -> str:
        raise ValueError(f"Unset environment variable: {name}")

    monkeypatch.setattr(platformdirs.windows, "get_win_folder", missing)
    d = choose_dirs(platform_dirs("win32"), temp=tmp_path / "tmp")
    assert d.data == tmp_path / "tmp" / "data" and d.fallback == ("data", "logs")
    assert "no writable per-user data folder" in caplog.text


def test_no_home_falls_back_to_temp_with_a_warning(monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path, no_xdg: None,
                                                   caplog: pytest.LogCaptureFixture) -> None:
    # HOME unset and no passwd entry: "~" cannot be expanded, and a relative "~/.local/share"
    # would be the current folder (next to the executable)
    monkeypatch.delenv("HOME", raising=False)
    import pwd

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(uid)

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    monkeypatch.chdir(tmp_path)
    d = choose_dirs(platform_dirs("linux"), temp=tmp_path / "tmp")
    assert d.sessions == tmp_path / "tmp" / "data" / "sessions"
    assert d.logs == tmp_path / "tmp" / "logs"
    assert d.fallback == ("data", "logs")
    assert "using" in caplog.text and str(tmp_path / "tmp") in caplog.text
    assert not (tmp_path / "~").exists()


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() == 0,
                    reason="root writes anywhere")
def test_read_only_home_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                   no_xdg: None) -> None:
    home = tmp_path / "home"
    home.mkdir()
    home.chmod(0o500)
    monkeypatch.setenv("HOME", str(home))
    try:
        d = choose_dirs(platform_dirs("linux"), temp=tmp_path / "tmp")
    finally:
        home.chmod(0o700)
    assert d.fallback == ("data", "logs")


def test_unwritable_folder_falls_back(tmp_path: Path, no_xdg: None,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # what a read-only home does for an unprivileged user, decided by ``usable``
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    d = choose_dirs(platform_dirs("linux"), usable=lambda p: p.is_relative_to(tmp_path / "tmp"),
                    temp=tmp_path / "tmp")
    assert d.fallback == ("data", "logs") and d.data == tmp_path / "tmp" / "data"


def test_temp_root_is_per_user(tmp_path: Path) -> None:
    root = temp_root(str(tmp_path))
    if hasattr(os, "getuid"):
        assert root == tmp_path / f"igi-sdk-{os.getuid()}"
    assert writable_dir(root / "data") and (root / "data").is_dir()


@pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX ownership")
def test_a_folder_of_another_owner_is_refused(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "igi-sdk-x"
    target.mkdir()
    monkeypatch.setattr(os, "getuid", lambda: os.stat(target).st_uid + 1)
    assert not writable_dir(target)


def test_defaults_are_chosen_once(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "d"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "s"))
    monkeypatch.setattr(paths, "_chosen", None)
    if sys.platform.startswith("linux"):
        assert paths.sessions_dir() == tmp_path / "d" / "igi-sdk" / "sessions"
        assert paths.sidecar_log_file() == tmp_path / "s" / "igi-sdk" / "log" / "sidecar.log"
        assert paths.user_data_dir() / "sessions" == paths.sessions_dir()
        assert paths.user_log_dir() == tmp_path / "s" / "igi-sdk" / "log"
    assert paths.guest_dirs() is paths.guest_dirs()


def test_rotating_log_is_bounded(tmp_path: Path) -> None:
    path = tmp_path / "logs" / "sidecar.log"
    root = logging.getLogger()
    level = root.level
    try:
        handler = configure_logging(path, max_bytes=2000, backups=2)
        again = configure_logging(path, max_bytes=2000, backups=2)  # replaces, never doubles
        assert [h for h in root.handlers if isinstance(h, SidecarLogHandler)] == [again]
        assert handler not in root.handlers
        log = logging.getLogger("igi_sdk.test")
        for i in range(200):
            log.info("line %03d %s", i, "x" * 40)
        again.flush()
        files = sorted(p.name for p in path.parent.iterdir())
        assert files == ["sidecar.log", "sidecar.log.1", "sidecar.log.2"]
        assert all((path.parent / f).stat().st_size <= 2000 for f in files)
        assert "line 199" in path.read_text(encoding="utf-8")
        assert " INFO igi_sdk.test line" in path.read_text(encoding="utf-8")
    finally:
        for h in [h for h in root.handlers if isinstance(h, SidecarLogHandler)]:
            root.removeHandler(h)
            h.close()
        root.setLevel(level)
