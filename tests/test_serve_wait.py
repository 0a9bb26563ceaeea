"""`serve --wait` holds with llama.cpp's OpenMP build: libgomp reads its wait once, when it
loads (before the command line is parsed), so the command starts again with the environment
that gives the wait asked for. The rule as a pure function, then the real sidecar."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from igi_sdk.client import Client
from igi_sdk.native_preload import preload_env
from igi_sdk.omp_wait import SPIN_ROUNDS, start_env

SDK = {"PATH": "/bin", "GOMP_SPINCOUNT": SPIN_ROUNDS}  # what igi_sdk sets when nothing is set
PASSIVE = {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}


def test_spin_replaces_the_policy_with_the_spin_count() -> None:
    assert start_env(PASSIVE, "spin") == SDK
    # the flag is the more specific request: it wins over the user's variables too
    assert start_env({"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "5000"}, "spin") == \
        {"GOMP_SPINCOUNT": SPIN_ROUNDS}


def test_sleep_is_passive_without_a_spin_count() -> None:
    assert start_env({"GOMP_SPINCOUNT": "20000"}, "sleep") == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_nothing_restarts_where_the_environment_already_gives_the_wait() -> None:
    assert start_env(PASSIVE, "sleep") is None
    assert start_env(SDK, "spin") is None
    for wait in ("auto", "poll"):  # left to the environment (and, without OpenMP, to the run)
        assert start_env(SDK, wait) is None
        assert start_env({"GOMP_SPINCOUNT": "7"}, wait) is None


def test_a_preload_without_libraries_sets_no_empty_preload() -> None:
    assert "LD_PRELOAD" not in preload_env([], {"A": "1"})
    assert preload_env([], {"LD_PRELOAD": "/p/x.so"})["LD_PRELOAD"] == "/p/x.so"


@pytest.mark.skipif(sys.platform != "linux", reason="the restart is Linux's (libgomp)")
@pytest.mark.parametrize(("flag", "env", "expected"), [
    ("spin", {"OMP_WAIT_POLICY": "PASSIVE"}, f"spin{SPIN_ROUNDS}"),
    ("sleep", {"GOMP_SPINCOUNT": "5000"}, "passive"),
    ("auto", {}, f"spin{SPIN_ROUNDS}"),
])
def test_the_sidecar_runs_with_the_wait_it_was_asked_for(tmp_path: Path, flag: str,
                                                          env: dict[str, str],
                                                          expected: str) -> None:
    """Before the restart, `--wait spin` ran PASSIVE on the OpenMP build (the wait igi_sdk had
    set when it was imported), and stats said so."""
    from igi_sdk.runtime.threadpool import uses_openmp

    if not uses_openmp():
        pytest.skip("llama.cpp built without OpenMP: the wait is chosen while running")
    ep = f"ipc://{tmp_path / 's.sock'}"
    child = {k: v for k, v in os.environ.items()
             if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "IGI_SDK_CLIENT_ONLY",
                          "IGI_SDK_PRELOADED")}
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", ep, "--threads", "2",
         "--wait", flag], env={**child, **env}, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, text=True)
    client = Client(ep, timeout=30)
    try:
        client.wait_ready(90)
        setting = client.stats()["engine"]["threads"]["setting"]
        assert setting.split("x", 1)[1] == expected, setting
    finally:
        client.close()
        proc.kill()
        proc.wait(10)
