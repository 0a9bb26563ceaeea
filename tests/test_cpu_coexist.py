"""Decode beside a game's CPU work: the default thread count leaves the game a core, and
llama.cpp's OpenMP threads do not spin for a thread that has no core.

The slow test is the defect itself: with one CPU busy (a stand-in for the game's main thread)
on a machine of two, the old defaults (a thread per CPU, libgomp spinning at every barrier)
decoded at 1-40 tok/s against 120-135 idle; the new ones keep >= 70% of idle.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from igi_sdk.runtime import loader
from igi_sdk.runtime.loader import default_threads, threads_for, usable_cpus

REPO = Path(__file__).resolve().parents[1]


# --- the default thread count ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("cpus", "threads"),
    [(1, 1), (2, 1), (3, 2), (4, 2), (6, 3), (8, 4), (12, 6), (16, 8), (32, 16)],
)
def test_threads_for_leaves_the_game_cores(cpus: int, threads: int) -> None:
    assert threads_for(cpus) == threads


def test_threads_for_never_takes_every_core() -> None:
    for cpus in range(2, 257):
        assert 1 <= threads_for(cpus) < cpus


def test_default_threads_follows_usable_cpus(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(loader.THREADS_ENV, raising=False)
    assert default_threads() == threads_for(usable_cpus())
    monkeypatch.setattr(loader, "usable_cpus", lambda: 8)
    assert default_threads() == 4


def test_threads_env_overrides_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(loader.THREADS_ENV, "3")
    assert default_threads() == 3
    monkeypatch.setattr(loader, "usable_cpus", lambda: 8)
    for bad in ("0", "-2", "many"):
        monkeypatch.setenv(loader.THREADS_ENV, bad)
        assert default_threads() == 4  # ignored (with a warning)


def test_usable_cpus_reads_a_cgroup_quota(tmp_path: Path) -> None:
    mask = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    f = tmp_path / "cpu.max"
    f.write_text("max 100000\n")
    assert usable_cpus(str(f)) == mask
    f.write_text("150000 100000\n")  # docker --cpus=1.5
    assert usable_cpus(str(f)) == min(mask, 2)
    f.write_text("10000 100000\n")
    assert usable_cpus(str(f)) == 1
    assert usable_cpus(str(tmp_path / "absent")) == mask


def test_context_params_keep_an_explicit_thread_count(monkeypatch: pytest.MonkeyPatch) -> None:
    from igi_sdk.planner import Plan

    monkeypatch.delenv(loader.THREADS_ENV, raising=False)
    plan = Plan.all_cpu()
    explicit = loader.context_params(plan, loader.ContextSettings(512, 1, 512, 3), None)
    assert (explicit.n_threads, explicit.n_threads_batch) == (3, 3)
    default = loader.context_params(plan, loader.ContextSettings(512, 1, 512, 0), None)
    assert (default.n_threads, default.n_threads_batch) == (default_threads(),) * 2


# --- the OpenMP wait policy -----------------------------------------------------------------


def _env_after_import(**env: str) -> str:
    clean = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    code = ("import os, igi_sdk; "
            "print(os.environ.get('OMP_WAIT_POLICY'), os.environ.get('GOMP_SPINCOUNT'))")
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, cwd=REPO,
                         capture_output=True, text=True, timeout=60, check=True)
    return out.stdout.strip()


def test_import_sets_libgomps_spin_unless_the_user_chose() -> None:
    from igi_sdk.omp_wait import SPIN_ROUNDS

    assert _env_after_import() == f"None {SPIN_ROUNDS}"
    assert _env_after_import(OMP_WAIT_POLICY="ACTIVE") == "ACTIVE None"
    assert _env_after_import(GOMP_SPINCOUNT="10000") == "None 10000"


# --- decode beside a busy core ----------------------------------------------------------------

# Run in a fresh process (libgomp reads its environment when it loads) restricted to two CPUs, so
# that the scenario is the same on any machine: the default model with default thread settings,
# decode rate measured idle and with one spinning process on one of the two CPUs, alternately,
# so that load from elsewhere hits both alike. A reply that is far too slow is cancelled (its
# rate so far still counts), which keeps the old defaults' failure short.
_PROBE = textwrap.dedent("""
    import json, os, statistics, subprocess, sys, time
    cpus = sorted(os.sched_getaffinity(0))[:2]
    os.sched_setaffinity(0, cpus)
    import igi_sdk
    from igi_sdk.runtime import Engine, EngineConfig
    from igi_sdk.runtime.loader import default_threads

    eng = Engine(config=EngineConfig(n_ctx=512, max_sessions=1))

    def rate():
        s = eng.open_session("You are Brom, the village blacksmith.")
        g = eng.chat(s, "Tell me about your forge.", max_tokens=48, ignore_eos=True)
        try:
            r = g.result(timeout=4)
        except TimeoutError:
            g.cancel()
            r = g.result(timeout=120)
        eng.close_session(s)
        return r.decode_tps

    def others():  # CPU seconds used by every process on the machine but this one and the hog
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        own = os.times()
        return (sum(v) - v[3] - v[4]) / os.sysconf("SC_CLK_TCK") - own.user - own.system \
            - own.children_user - own.children_system

    def hog():
        return subprocess.Popen(
            [sys.executable, "-c", "while True: pass"],
            preexec_fn=lambda: os.sched_setaffinity(0, cpus[:1]))

    try:
        rate()  # warm-up
        idle, busy = [], []
        t0, o0 = time.monotonic(), others()
        for _ in range(int(sys.argv[1])):
            idle.append(rate())
            h = hog()
            try:
                time.sleep(0.2)
                busy.append(rate())
            finally:
                h.kill()
                h.wait()  # its CPU time is counted as ours from here
        elsewhere = (others() - o0) / (time.monotonic() - t0)
        print(json.dumps(dict(threads=default_threads(), idle=idle, busy=busy,
                              policy=os.environ.get("OMP_WAIT_POLICY"),
                              cpus_used_elsewhere=round(elsewhere, 2),
                              load=os.getloadavg()[0])))
    finally:
        eng.close()
""")


def _measure(rounds: int) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", loader.THREADS_ENV)}
    out = subprocess.run([sys.executable, "-c", _PROBE, str(rounds)], env=env, cwd=REPO,
                         capture_output=True, text=True, timeout=150)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or usable_cpus() < 2,
                    reason="needs two CPUs (affinity and CPU quota) and CPU affinity (Linux)")
def test_decode_keeps_its_rate_beside_a_busy_core() -> None:
    import statistics

    # Other work on the machine (a shared developer box) is not the scenario: it takes the decode
    # thread's core while the busy process holds the other. Such a run is measured again, and
    # skipped if the machine never settles. On a quiet 2-CPU VM the OS still puts the decode
    # thread beside the busy process for a whole reply now and then (7 of 45 busy rounds fell to
    # 64-70% of idle, 2 of 15 medians of three; the rest read 0.96-1.0): a shortfall is measured
    # again too, and fails only when every try falls short, as a slower decode would.
    tries = []
    for _attempt in range(3):
        m = _measure(rounds=3)
        idle, busy = statistics.median(m["idle"]), statistics.median(m["busy"])
        tries.append(m)
        if busy >= 0.7 * idle:
            break
    else:
        if all(t["cpus_used_elsewhere"] >= 0.2 for t in tries):
            pytest.skip(f"{m['cpus_used_elsewhere']} CPUs busy elsewhere in every try: {m}")
    assert idle > 0, m
    assert busy >= 0.7 * idle, (
        f"beside one busy CPU of two, decode fell to {busy:.1f} tok/s from {idle:.1f} idle "
        f"({busy / idle:.0%}; want >= 70%) in every try: {tries}")


# --- thread count and wait chosen while running (runtime/threadpool.py) ----------------------


def test_the_engine_reports_its_thread_mechanism_and_follows_the_game(tiny_llama: Path) -> None:
    from igi_sdk.planner import Plan
    from igi_sdk.runtime import Engine, EngineConfig
    from igi_sdk.runtime.threadpool import OPENMP, THREADPOOL, uses_openmp

    config = EngineConfig(n_ctx=256, max_sessions=1, n_threads=2, adapt_threads=True)
    with Engine(tiny_llama, Plan.all_cpu(), config) as eng:
        sid = eng.open_session("You are a guard.")
        assert eng.chat(sid, "Halt!", max_tokens=8, ignore_eos=True).result(timeout=60).tokens
        st = eng.status()["threads"]
        assert st["mechanism"] == (OPENMP if uses_openmp() else THREADPOOL)
        assert st["wait_mode"] == "auto"
        eng.report_game_cpu(busy_threads=usable_cpus(), cpu_share=None)  # the game holds all
        assert eng.chat(sid, "Who goes?", max_tokens=4, ignore_eos=True).result(timeout=60)
        st = eng.status()["threads"]
        assert st["ceiling"] == 1 and st["setting"].startswith("1x"), st


def test_an_unknown_wait_is_a_typed_error() -> None:
    from igi_sdk.errors import UsageError
    from igi_sdk.runtime.threadpool import ThreadRunner

    with pytest.raises(UsageError):
        ThreadRunner(start_threads=1, max_threads=1, cpus=1, wait="yield", openmp=True)


@pytest.mark.skipif("OPENMP = 1" in __import__("llama_cpp").llama_print_system_info().decode(),
                    reason="ggml's own threadpools exist in a build without OpenMP only")
def test_pools_switch_waits_and_threads_between_steps(tiny_llama: Path) -> None:
    from igi_sdk.planner import Plan
    from igi_sdk.runtime import Engine, EngineConfig
    from igi_sdk.runtime.thread_control import ControlConfig, Setting, ThreadController, Wait

    config = EngineConfig(n_ctx=256, max_sessions=1, n_threads=2, adapt_threads=True)
    with Engine(tiny_llama, Plan.all_cpu(), config) as eng:
        runner = eng._core.threads
        # probe after every other step: every wait and count is attached during one reply
        runner.controller = ThreadController(
            ControlConfig(max_threads=2, cpus=4, probe_every=2, probe_steps=2, margin=-10.0),
            Setting(2, Wait.SPIN))
        sid = eng.open_session("You are a guard.")
        r = eng.chat(sid, "Halt!", max_tokens=40, ignore_eos=True).result(timeout=60)
        assert len(r.tokens) == 40
        st = eng.status()["threads"]
        assert st["mechanism"] == "threadpool" and st["probes"] >= 5 and st["switches"] >= 5
        assert len(runner._pools._pools) >= 2  # one pool per wait used


def test_stats_show_the_games_report_before_the_next_step(tiny_llama) -> None:
    """An idle engine takes the game's report in only after its next decode step; stats show
    the report as it came."""
    from igi_sdk.planner import Plan
    from igi_sdk.runtime import Engine, EngineConfig

    with Engine(tiny_llama, Plan.all_cpu(), EngineConfig(n_ctx=256, max_sessions=1)) as eng:
        eng.report_game_cpu(busy_threads=3, cpu_share=None)
        assert eng.status()["threads"]["game_cores"] == 3
        eng.report_game_cpu(busy_threads=None, cpu_share=None)
        assert eng.status()["threads"]["game_cores"] is None
