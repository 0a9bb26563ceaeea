"""Other processes' demand for CPUs (runtime/cpu_demand.py) and the thread ceiling it sets.

Recorded case: on a 16-CPU host with 14 CPUs busy in other processes, six spinning threads of
ours made the others' CPU time read 9.8 cores, so the ceiling rose to 6 and decode collapsed
(1.2 tok/s against 10.5 for two threads). Their runnable threads still numbered 14.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from igi_sdk.errors import UsageError
from igi_sdk.runtime.cpu_demand import DemandWindow, own_running, procs_running
from igi_sdk.runtime.loader import usable_cpus
from igi_sdk.runtime.thread_control import ControlConfig, HostLoad, Setting, ThreadController, Wait


def test_procs_running_is_read_from_the_counters_and_none_without_them(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  1 2 3 4\ncpu0 1 2 3 4\nctxt 99\nprocs_running 17\nprocs_blocked 0\n")
    assert procs_running(stat) == 17
    # a large host's interrupt counts come first and run to tens of KB
    stat.write_text("cpu  1 2 3 4\nintr " + " 0" * 60_000 + "\nprocs_running 9\n")
    assert procs_running(stat) == 9
    stat.write_text("cpu  1 2 3 4\nprocs_running x\n")
    assert procs_running(stat) is None
    assert procs_running(tmp_path / "missing") is None


def test_own_running_counts_state_r_after_the_last_parenthesis(tmp_path: Path) -> None:
    for tid, line in {"10": "10 (python3) R 1 2", "11": "11 (igi cpu) (x) S 1 2",
                      "12": "12 (a) R) R 1", "13": "13 (sleepy) D 1"}.items():
        (tmp_path / tid).mkdir()
        (tmp_path / tid / "stat").write_text(line)
    (tmp_path / "14").mkdir()  # a thread that ended between listing and reading
    assert own_running(tmp_path) == 2
    assert own_running(tmp_path / "missing") is None


def test_the_window_averages_others_and_scales_to_the_cpus_we_may_use() -> None:
    w = DemandWindow()
    assert w.other_runnable(16, 16) is None  # nothing counted (no /proc)
    for total, own in ((16, 2), (15, 1), (14, 0)):
        w.add(total, own)
    w.add(None, 3)  # a failed read counts for nothing
    assert w.other_runnable(16, 16) == pytest.approx(14.0)
    assert w.samples == []  # a new window starts empty
    for _ in range(4):
        w.add(64, 4)  # the whole kernel's 60 threads, we may use 4 of its 64 CPUs
    assert w.other_runnable(4, 64) == pytest.approx(60 * 4 / 64)


def test_demand_sets_the_ceiling_where_the_cpu_time_others_got_reads_low() -> None:
    """The recorded case: CPU time says 9.8 cores held, the run queue says 14."""
    cfg = ControlConfig(max_threads=15, cpus=16, spinning_barriers=True)
    by_time = ThreadController(cfg, Setting(6, Wait.SPIN))
    by_demand = ThreadController(cfg, Setting(6, Wait.SPIN))
    for _ in range(12):  # samples in which our threads got their cores (no starved cap)
        by_time.observe_load(HostLoad(16, 9.8, own_cores=6.0), busy_s=1.0)
        s = by_demand.observe_load(HostLoad(16, 9.8, own_cores=6.0, other_runnable=14.2),
                                   busy_s=1.0)
        assert s.threads <= 2
    assert by_time.setting.threads == 6  # what it did without the run queue
    st = by_demand.status()
    assert st.ceiling == 2 and st.other_runnable == 14.2
    # a lightly loaded host: a runnable thread now and then costs no thread of ours
    idle = ThreadController(ControlConfig(max_threads=15, cpus=16), Setting(15, Wait.SPIN))
    assert idle.observe_load(HostLoad(16, 0.2, other_runnable=0.4)).threads == 15
    with pytest.raises(UsageError):
        HostLoad(16, 1.0, other_runnable=float("nan"))


@pytest.mark.skipif(procs_running() is None, reason="no /proc run-queue counters here")
def test_busy_processes_are_counted_as_runnable_on_this_machine() -> None:
    def sample(seconds: float) -> float:
        w = DemandWindow()
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            w.add(procs_running(), own_running())
            time.sleep(0.02)
        got = w.other_runnable(1, 1)
        assert got is not None
        return got

    spin = "import time\nend = time.monotonic() + 30\nwhile time.monotonic() < end: pass\n"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    try:
        time.sleep(0.3)  # started and spinning
        with_two = sample(1.0)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    without = sample(1.0)
    # two spinners are runnable the whole second, whoever else runs: at least 1.5 on average
    assert with_two >= 1.5
    assert with_two > without + 1.0


@pytest.mark.skipif(procs_running() is None or usable_cpus() < 2,
                    reason="no /proc run-queue counters, or one CPU (no load sampler)")
def test_the_engine_counts_other_processes_runnable_threads_while_it_decodes(
        tiny_llama: Path) -> None:
    from igi_sdk.planner import Plan
    from igi_sdk.runtime import Engine, EngineConfig

    spin = "import time\nend = time.monotonic() + 60\nwhile time.monotonic() < end: pass\n"
    busy = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
    seen: dict = {}
    try:
        with Engine(tiny_llama, Plan.all_cpu(), EngineConfig(n_ctx=2048, max_sessions=1)) as eng:
            assert eng.status()["threads"]["other_runnable"] is None  # nothing decoded yet
            deadline = time.monotonic() + 60
            # replies one after another until a sample counted the spinners (a reply of the
            # tiny model may end before the first one is taken)
            while time.monotonic() < deadline and (seen.get("other_runnable") or 0) < 1.5:
                sid = eng.open_session("You are a guard.")
                gen = eng.chat(sid, "Halt!", max_tokens=1900, ignore_eos=True)
                while time.monotonic() < deadline and not gen.done:
                    seen = eng.status()["threads"]
                    if (seen["other_runnable"] or 0) >= 1.5:
                        break
                    time.sleep(0.1)
                gen.cancel()
                gen.result(timeout=60)
                eng.close_session(sid)
    finally:
        for p in busy:
            p.kill()
            p.wait()
    # both spinners wanted a CPU the whole time (each sample counts them, whoever ran)
    assert (seen.get("other_runnable") or 0) >= 1.5, seen
    assert seen["ceiling"] <= max(1, usable_cpus() - 2), seen
