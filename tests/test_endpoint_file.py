"""``serve --endpoint-file``: written without following what another local program planted at
the path, removed only when it still names this sidecar, and never read past a line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from igi_sdk.serving import endpoint_file

ENDPOINT = "tcp://127.0.0.1:40123"


def test_a_link_at_the_path_is_replaced_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("the player's file\n")
    path = tmp_path / "endpoint.txt"
    path.symlink_to(victim)
    endpoint_file.write(path, ENDPOINT)
    assert victim.read_text() == "the player's file\n"
    assert not path.is_symlink() and path.read_text() == ENDPOINT + "\n"
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_links_planted_at_predictable_temporary_names_are_left_alone(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("keep\n")
    path = tmp_path / "endpoint.txt"
    # the names an earlier build wrote through first
    for name in (f".{path.name}.{os.getpid()}.tmp", f".{path.name}.tmp"):
        (tmp_path / name).symlink_to(victim)
    endpoint_file.write(path, ENDPOINT)
    assert victim.read_text() == "keep\n" and path.read_text() == ENDPOINT + "\n"


def test_only_its_own_line_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "endpoint.txt"
    path.write_text("tcp://127.0.0.1:1\n")  # a newer sidecar's
    endpoint_file.remove(path, ENDPOINT)
    assert path.exists()
    endpoint_file.write(path, ENDPOINT)
    endpoint_file.remove(path, ENDPOINT)
    assert not path.exists()


@pytest.mark.skipif(sys.platform == "win32", reason="FIFOs and /dev/zero are POSIX")
@pytest.mark.parametrize("planted", ["fifo", "zero", "link"])
def test_a_planted_file_neither_blocks_nor_bloats_the_exit(tmp_path: Path, planted: str) -> None:
    path = tmp_path / "endpoint.txt"
    if planted == "fifo":
        os.mkfifo(path)
    elif planted == "zero":
        path.symlink_to("/dev/zero")
    else:
        own = tmp_path / "own.txt"
        own.write_text(ENDPOINT + "\n")
        path.symlink_to(own)
    done = threading.Event()
    worker = threading.Thread(target=lambda: (endpoint_file.remove(path, ENDPOINT), done.set()),
                              daemon=True)
    worker.start()
    assert done.wait(10), "removing the endpoint file blocked"
    assert path.is_symlink() or path.exists()  # not ours: left where it was


def _serving(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen, Path]:
    """A real ``serve`` with an endpoint file, once it answers (its loop runs)."""
    from igi_sdk.client import Client, SidecarUnavailable

    out = tmp_path / "endpoint.txt"
    endpoint = f"ipc://{tmp_path / 's.sock'}"
    proc = subprocess.Popen([sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint",
                             endpoint, "--model-dir", str(tmp_path), "--threads", "1",
                             "--endpoint-file", str(out), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c = Client(endpoint, timeout=60)  # no model: its answer to hello says the loop runs
    deadline = time.monotonic() + 60
    try:
        while True:
            try:
                c.hello()
                break
            except SidecarUnavailable:
                assert time.monotonic() < deadline and proc.poll() is None
    finally:
        c.close()
    assert out.read_text() == endpoint + "\n"
    return proc, out


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_sidecar_as_shutdown_does_and_removes_the_file(
        tmp_path: Path, sig: signal.Signals) -> None:
    """A launcher's kill (SIGTERM) or a Ctrl+C (SIGINT) is a clean exit: the endpoint file no
    longer names a sidecar that is gone (SIGTERM used to end the process before it could)."""
    proc, out = _serving(tmp_path)
    try:
        proc.send_signal(sig)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".endpoint")] == []
