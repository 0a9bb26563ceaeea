"""The engine tells when its decode steps keep carrying more replies than the plan was made for
(runtime/crowd.py): pure rule, and the real engine's log and ``status``."""

from __future__ import annotations

import logging

import pytest

from igi_sdk.errors import UsageError
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig
from igi_sdk.runtime.crowd import CrowdWatch


def test_a_larger_crowd_is_told_once_after_enough_steps_in_a_row() -> None:
    w = CrowdWatch(planned=1, steps=5)
    assert [w.observe(4) for _ in range(4)] == [None] * 4
    assert w.observe(2) is None  # a step with no larger crowd starts the count again
    assert [w.observe(n) for n in (3, 5, 4, 3)] == [None] * 4
    assert w.observe(3) == 5 and w.told  # the run's largest crowd
    assert all(w.observe(16) is None for _ in range(20))  # once
    assert w.status() == {"planned": 1, "peak": 16}


@pytest.mark.parametrize(("planned", "crowd", "larger"), [
    (1, 2, False), (1, 3, True),  # one talker: a pair is no crowd, three are
    (4, 7, False), (4, 8, True),  # twice the plan
    (16, 16, False), (16, 32, True)])
def test_what_counts_as_a_larger_crowd(planned: int, crowd: int, larger: bool) -> None:
    assert CrowdWatch(planned).larger(crowd) is larger


def test_a_crowd_the_plan_was_made_for_is_never_told() -> None:
    w = CrowdWatch(planned=16, steps=3)
    assert all(w.observe(16) is None for _ in range(100)) and not w.told


@pytest.mark.parametrize(("planned", "steps"), [(0, 50), (1, 0)])
def test_a_crowd_watch_refuses_nonsense(planned: int, steps: int) -> None:
    with pytest.raises(UsageError):
        CrowdWatch(planned, steps)


def test_the_engine_tells_of_four_replies_decoding_together_on_a_plan_for_one(
        tiny_llama, caplog) -> None:
    cfg = EngineConfig(n_ctx=1024, max_sessions=4, n_threads=1, prefill_chunk=64)
    with Engine(tiny_llama, Plan.all_cpu(), cfg) as eng:
        eng._core.crowd.steps = 10  # the rule's count is its unit test's; here: that it is wired
        sids = [eng.open_session(f"NPC {i}.") for i in range(4)]
        with caplog.at_level(logging.WARNING, logger="igi_sdk.runtime.core"):
            # long replies: the chats reach the engine thread while it decodes the first ones,
            # so the replies start some steps apart (on a loaded 2-core machine, 24-token
            # replies overlapped three at a time for fewer than the 10 steps asked for)
            futs = [eng.chat(s, "Hello.", max_tokens=96, ignore_eos=True) for s in sids]
            for f in futs:
                assert f.result(60).completion_tokens == 96
        told = [r.getMessage() for r in caplog.records if "--talking" in r.getMessage()]
        # the replies start as their prompts are read: at least three decode together
        peak = eng.status()["talking"]["peak"]
        assert peak >= 3 and eng.status()["talking"]["planned"] == 1
        assert len(told) == 1 and "made for 1" in told[0], told
        assert 3 <= int(told[0].split()[0]) <= peak, told  # the crowd of the run it told


def test_an_engine_planned_for_the_crowd_stays_quiet(tiny_llama, caplog) -> None:
    cfg = EngineConfig(n_ctx=1024, max_sessions=4, n_threads=1, talking=4, prefill_chunk=64)
    with Engine(tiny_llama, Plan.all_cpu(), cfg) as eng:
        eng._core.crowd.steps = 10
        sids = [eng.open_session(f"NPC {i}.") for i in range(4)]
        with caplog.at_level(logging.WARNING, logger="igi_sdk.runtime.core"):
            for f in [eng.chat(s, "Hello.", max_tokens=96, ignore_eos=True) for s in sids]:
                f.result(60)
        assert not [r for r in caplog.records if "--talking" in r.getMessage()]
        assert eng.status()["talking"]["planned"] == 4
        assert eng.status()["talking"]["peak"] >= 3


def test_the_sidecar_hands_serve_talking_to_its_engine(tmp_path) -> None:
    """`serve --talking N` plans for N; its engine watches against the same N (stats)."""
    import os
    import subprocess
    import sys

    from igi_sdk.client import Client

    ep = f"ipc://{tmp_path / 's.sock'}"
    child = {k: v for k, v in os.environ.items() if k != "IGI_SDK_CLIENT_ONLY"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", ep, "--threads", "1",
         "--max-sessions", "4", "--talking", "3"], env=child, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    client = Client(ep, timeout=30)
    try:
        client.wait_ready(90)
        assert client.stats()["engine"]["talking"] == {"planned": 3, "peak": 0}
    finally:
        client.close()
        proc.kill()
        proc.wait(10)


def test_a_plan_carries_the_talkers_no_more_than_a_step_has_rows() -> None:
    from igi_sdk.arbiter.ladder import arbiter_workload
    from igi_sdk.planner import planned_talkers

    assert planned_talkers(4, 8) == 4 and planned_talkers(16, 8) == 8
    assert planned_talkers(3, None) == 3 and planned_talkers(1, 0) == 1
    assert arbiter_workload(4096, outputs=8, talking=16).n_seqs == 8
