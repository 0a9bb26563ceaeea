"""The real sidecar as the tests start it: a child process on loopback, over ZeroMQ and, where
asked, the HTTP face; and what waits for it to answer."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import openai
import pytest

from igi_sdk.client import Client


def start_sidecar(model_dir: Path, endpoint: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint,
           "--model-dir", str(model_dir), "--ctx", "2048", "--threads", "2", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(10)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(base: str, timeout: float = 60.0, *, path: str = "/health",
              proc: subprocess.Popen | None = None, what: str = "the HTTP face",
              log: Callable[[], str] | None = None) -> None:
    """Until ``base + path`` answers 200. Fails after ``timeout``, or at once when ``proc``
    (the server's process) has exited; the failure quotes the end of ``log()``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if httpx.get(f"{base}{path}", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if (proc is not None and proc.poll() is not None) or time.monotonic() > deadline:
            tail = log()[-3000:] if log is not None else ""
            raise AssertionError(f"{what} did not come up at {base}{path}"
                                 + (f": {tail}" if tail else ""))
        time.sleep(0.1)


@contextmanager
def http_sidecar(tmp_path_factory: pytest.TempPathFactory, model: Path, *extra: str,
                 ready_s: float = 60.0) -> Iterator[tuple[str, str]]:
    """``model`` served as ``smol.gguf`` over ZeroMQ and the HTTP face, both answering:
    (the HTTP base address, the ZeroMQ endpoint). ``extra``: more ``serve`` options."""
    d = tmp_path_factory.mktemp("models")
    shutil.copy(model, d / "smol.gguf")  # a symlink out of the directory is refused
    ep = f"ipc://{tmp_path_factory.mktemp('ipc') / 's.sock'}"
    port = free_port()
    proc = start_sidecar(d, ep, "--model", "smol.gguf", *extra, "--http", f"127.0.0.1:{port}")
    try:
        probe = Client(ep, timeout=60)
        try:
            probe.wait_ready(ready_s)
        finally:
            probe.close()
        base = f"http://127.0.0.1:{port}"
        wait_http(base, ready_s)
        yield base, ep
    finally:
        stop(proc)


def openai_api(base: str, **options: object) -> openai.OpenAI:
    """The official client on the HTTP face at ``base``, retrying nothing unless told to."""
    options = {"api_key": "unused", "max_retries": 0, **options}
    return openai.OpenAI(base_url=f"{base}/v1", **options)
