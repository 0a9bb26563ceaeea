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
from igi_sdk.omp_wait import SDK_CHOSE, SPIN_ROUNDS, default_wait, in_effect, start_env

SDK = {"PATH": "/bin", "GOMP_SPINCOUNT": SPIN_ROUNDS, SDK_CHOSE: "1"}  # igi_sdk's, when unset
PASSIVE = {"PATH": "/bin", "OMP_WAIT_POLICY": "PASSIVE"}


def test_the_sdk_spins_by_default_and_marks_the_choice_as_its_own() -> None:
    env = {"PATH": "/bin"}
    default_wait(env)
    assert env == SDK
    for user in ({"OMP_WAIT_POLICY": "PASSIVE"}, {"GOMP_SPINCOUNT": "0"}):
        mine = dict(user)
        default_wait(mine)
        assert mine == user  # the user's wait is theirs: untouched, and not marked


def test_spin_replaces_the_policy_with_the_spin_count() -> None:
    assert start_env(PASSIVE, "spin") == {"PATH": "/bin", "GOMP_SPINCOUNT": SPIN_ROUNDS}
    # the flag is the more specific request: it wins over the user's variables too
    assert start_env({"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "5000"}, "spin") == \
        {"GOMP_SPINCOUNT": SPIN_ROUNDS}


def test_sleep_is_passive_without_a_spin_count() -> None:
    assert start_env({"GOMP_SPINCOUNT": "20000"}, "sleep") == {"OMP_WAIT_POLICY": "PASSIVE"}


def test_a_count_the_user_fixed_sleeps_unless_a_spin_was_asked_for() -> None:
    """Spinning threads follow the free cores, and a count that moves changes the greedy text
    under load: `--threads N` alone keeps its count by sleeping."""
    assert start_env(SDK, "auto", fixed_threads=True) == {"PATH": "/bin", SDK_CHOSE: "1",
                                                          "OMP_WAIT_POLICY": "PASSIVE"}
    assert start_env(SDK, "auto", fixed_threads=False) is None
    user = {"GOMP_SPINCOUNT": SPIN_ROUNDS}  # the user's own spin: kept, the count follows it
    assert start_env(user, "auto", fixed_threads=True) is None
    assert start_env(SDK, "spin", fixed_threads=True) is None


def test_nothing_restarts_where_the_environment_already_gives_the_wait() -> None:
    assert start_env(PASSIVE, "sleep") is None
    assert start_env(SDK, "spin") is None
    for wait in ("auto", "poll"):  # left to the environment (and, without OpenMP, to the run)
        assert start_env(SDK, wait) is None
        assert start_env({"GOMP_SPINCOUNT": "7"}, wait) is None


def test_the_wait_in_effect_names_each_environment_as_libgomp_reads_it() -> None:
    """What a profile records: libgomp's default without a policy is its 300,000-round spin."""
    assert in_effect({}) == in_effect(SDK) == f"spin{SPIN_ROUNDS}"
    assert in_effect(PASSIVE) == in_effect({"OMP_WAIT_POLICY": "passive"}) == "passive"
    assert in_effect({"OMP_WAIT_POLICY": "ACTIVE"}) == "active"
    # libgomp: a spin count wins over the policy
    assert in_effect({"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "7"}) == "spin7"
    assert in_effect({"GOMP_SPINCOUNT": "20000"}) == "spin20000"
    for env, wait in ((SDK, "sleep"), (PASSIVE, "spin")):  # what `serve --wait` restarts with
        assert in_effect(start_env(env, wait) or env) == ("passive" if wait == "sleep"
                                                          else f"spin{SPIN_ROUNDS}")


def test_a_preload_without_libraries_sets_no_empty_preload() -> None:
    assert "LD_PRELOAD" not in preload_env([], {"A": "1"})
    assert preload_env([], {"LD_PRELOAD": "/p/x.so"})["LD_PRELOAD"] == "/p/x.so"


@pytest.mark.skipif(sys.platform != "linux", reason="the restart is Linux's (libgomp)")
@pytest.mark.parametrize(("flag", "threads", "env", "expected"), [
    ("spin", "2", {"OMP_WAIT_POLICY": "PASSIVE"}, f"spin{SPIN_ROUNDS}"),
    ("sleep", "2", {"GOMP_SPINCOUNT": "5000"}, "passive"),
    ("auto", "2", {}, "passive"),  # a count given: it sleeps, to stay as given
    ("auto", "0", {}, f"spin{SPIN_ROUNDS}"),  # the default: spin, the count chosen
])
def test_the_sidecar_runs_with_the_wait_it_was_asked_for(tmp_path: Path, flag: str, threads: str,
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
                          "IGI_SDK_PRELOADED", SDK_CHOSE)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", ep, "--threads", threads,
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
