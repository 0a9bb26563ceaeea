"""Clients of protocol 1.1 against a 1.2 sidecar (the real one, on a synthetic model): they keep
1.1's behaviour — open by name, on ``session_exists`` adopt, ``session_owned`` while another
connection holds the session, saves shared, shutdown — or, on a sidecar started with a launch
token (which a 1.1 client cannot present), they are refused at ``hello`` with
``unsupported_version``. A 1.2 client's sessions stay its owner's either way."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from igi_sdk.client import Client
from tests.sidecars import stop
from tests.test_protocol11 import Raw

TOKEN = "compat-test-launch-token-0001"
OWNER = "compat-test-owner-key-000001"


def _serve(model_dir: Path, endpoint: str, *, token: str | None) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "IGI_SDK_TOKEN"}
    if token is not None:
        env["IGI_SDK_TOKEN"] = token
    cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint,
           "--model-dir", str(model_dir), "--model", "tiny.gguf", "--ctx", "1024",
           "--threads", "1", "--no-arbiter", "--max-sessions", "4",
           "--save-dir", str(model_dir / "saves")]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_llama) -> Path:
    d = tmp_path_factory.mktemp("compat")
    shutil.copy(tiny_llama, d / "tiny.gguf")
    return d


def _started(tiny_dir: Path, tmp: Path, token: str | None) -> Iterator[str]:
    endpoint = f"ipc://{tmp / 's.sock'}"
    proc = _serve(tiny_dir, endpoint, token=token)
    probe = Client(endpoint, timeout=60, token=token)
    probe.wait_ready(60)
    probe.close()
    yield endpoint
    stop(proc)


@pytest.fixture(scope="module")
def open_sidecar(tiny_dir, tmp_path_factory) -> Iterator[str]:
    """A developer's sidecar: no launch token, every client is the game."""
    yield from _started(tiny_dir, tmp_path_factory.mktemp("open"), None)


@pytest.fixture(scope="module")
def token_sidecar(tiny_dir, tmp_path_factory) -> Iterator[str]:
    """A shipped game's sidecar: started with a launch token."""
    yield from _started(tiny_dir, tmp_path_factory.mktemp("tok"), TOKEN)


def _hello11(r: Raw, **extra) -> dict:
    """A 1.1 client's hello: minor 1, and none of 1.2's fields."""
    return r.ok("hello", {"protocol": 1, "minor": 1, "engine": "unity", **extra})


def _code(r: Raw, msg_type: str, body: dict) -> str:
    rtype, answer = r.request(msg_type, body)
    assert rtype == "error", (msg_type, answer)
    return str(answer["code"])


def _talk(r: Raw, session: str, text: str) -> dict:
    events = r.events(r.send("chat", {"session": session, "text": text, "max_tokens": 4,
                                      "sampling": {"temperature": 0.0}}))
    assert events[-1][0] == "done", events[-1]
    return events[-1][1]


def _tokens(r: Raw, session: str) -> int:
    listed = {s["session"]: s for s in r.ok("list_sessions")["sessions"]}
    return int(listed[session]["tokens"])


def test_two_1_1_clients_follow_1_1s_open_then_adopt_pattern(open_sidecar) -> None:
    """1.1's pattern: open the NPC by name; on session_exists, adopt. Run 1 of the game talks
    and leaves keeping its sessions; run 2 (a new connection) opens the same name, is told
    session_exists and adopts the same conversation (was: a fresh, empty session, the
    conversation left orphaned)."""
    run1 = Raw(open_sidecar)
    assert _hello11(run1)["game"] is True
    assert run1.ok("open_session", {"persona": "brom", "name": "npc.brom"}) == {
        "session": "npc.brom"}
    _talk(run1, "npc.brom", "I need a sword.")
    held = _tokens(run1, "npc.brom")
    assert held > 0

    run2 = Raw(open_sidecar)
    try:
        _hello11(run2)
        # while run 1 is connected, 1.1's codes: the name is taken, and held by another client
        assert _code(run2, "open_session", {"name": "npc.brom"}) == "session_exists"
        assert _code(run2, "adopt_session", {"session": "npc.brom"}) == "session_owned"
        run1.ok("goodbye", {"keep_sessions": True})
        run1.close()
        assert _code(run2, "open_session", {"name": "npc.brom"}) == "session_exists"
        assert run2.ok("adopt_session", {"session": "npc.brom"}) == {"session": "npc.brom"}
        assert _tokens(run2, "npc.brom") == held  # the same conversation, not a fresh one
        _talk(run2, "npc.brom", "How much is it?")
        assert _tokens(run2, "npc.brom") > held
        # 1.1's saves are shared by its clients, as before
        assert run2.ok("save_session", {"session": "npc.brom", "name": "brom"})["bytes"] > 0
    finally:
        run2.ok("goodbye", {"keep_sessions": False})
        run2.close()
    run3 = Raw(open_sidecar)
    try:
        _hello11(run3)
        assert run3.ok("restore_session", {"name": "brom", "session": "npc.brom"}) == {
            "session": "npc.brom"}
        assert _tokens(run3, "npc.brom") > held
    finally:
        run3.ok("goodbye", {"keep_sessions": False})
        run3.close()


def test_1_1_sessions_stay_out_of_1_2_owners_reach_and_the_other_way(open_sidecar) -> None:
    old = Raw(open_sidecar)
    _hello11(old)
    old.ok("open_session", {"persona": "mira", "name": "npc.mira"})
    old.ok("goodbye", {"keep_sessions": True})
    old.close()
    new = Raw(open_sidecar)
    try:
        new.ok("hello", {"protocol": 1, "minor": 2, "owner": OWNER})
        # a 1.2 owner's scope is its own: the 1.1 clients' orphan is neither found nor taken
        assert _code(new, "adopt_session", {"session": "npc.mira"}) == "unknown_session"
        assert new.ok("open_session", {"name": "npc.mira"}) == {"session": "npc.mira"}
        new.ok("goodbye", {"keep_sessions": True})
    finally:
        new.close()
    back = Raw(open_sidecar)
    try:
        _hello11(back)
        listed = {s["session"] for s in back.ok("list_sessions")["sessions"]}
        assert listed == {"npc.mira"}  # the 1.1 orphan only, not the owner's namesake
        assert back.ok("adopt_session", {"session": "npc.mira"}) == {"session": "npc.mira"}
    finally:
        back.ok("goodbye", {"keep_sessions": False})
        back.close()


def test_a_1_1_client_may_shut_a_sidecar_without_a_token_down(tiny_dir, tmp_path) -> None:
    endpoint = f"ipc://{tmp_path / 's.sock'}"
    proc = _serve(tiny_dir, endpoint, token=None)
    try:
        Client(endpoint, timeout=60).wait_ready(60)
        r = Raw(endpoint)
        _hello11(r)
        assert r.ok("shutdown") == {}
        r.close()
        assert proc.wait(30) == 0
    finally:
        stop(proc)


def test_a_1_1_client_without_the_launch_token_is_refused_at_hello(token_sidecar) -> None:
    """1.1's rules would let any local process adopt the game's NPCs and shut the sidecar down;
    a 1.1 client cannot present the token, so it is told at once, typed, not silently served
    under other rules."""
    for extra in ({}, {"token": ""}, {"owner": OWNER}):
        r = Raw(token_sidecar)
        try:
            rtype, body = r.request("hello", {"protocol": 1, "minor": 1, **extra})
            assert (rtype, body["code"], body["retryable"]) == (
                "error", "unsupported_version", False), body
            assert "launch token" in body["message"] and "1.2" in body["message"]
            assert _code(r, "ping", {}) == "hello_required"  # not admitted
        finally:
            r.close()
    legacy = Raw(token_sidecar)
    try:
        rtype, body = legacy.request("hello", {"protocol": 1})  # 1.0: no minor at all
        assert (rtype, body["code"]) == ("error", "unsupported_version")
    finally:
        legacy.close()


def test_1_1_clients_holding_the_token_keep_1_1s_pattern_among_themselves(token_sidecar) -> None:
    run1 = Raw(token_sidecar)
    assert _hello11(run1, token=TOKEN)["game"] is True
    run1.ok("open_session", {"persona": "brom", "name": "npc.smith"})
    _talk(run1, "npc.smith", "Hello there.")
    run1.ok("goodbye", {"keep_sessions": True})
    run1.close()
    stranger = Raw(token_sidecar)
    try:
        assert stranger.ok("hello", {"protocol": 1, "minor": 2})["game"] is False
        assert _code(stranger, "adopt_session", {"session": "npc.smith"}) == "unknown_session"
    finally:
        stranger.close()
    run2 = Raw(token_sidecar)
    try:
        _hello11(run2, token=TOKEN)
        assert _code(run2, "open_session", {"name": "npc.smith"}) == "session_exists"
        assert run2.ok("adopt_session", {"session": "npc.smith"}) == {"session": "npc.smith"}
        assert _tokens(run2, "npc.smith") > 0
    finally:
        run2.ok("goodbye", {"keep_sessions": False})
        run2.close()


def test_an_empty_token_is_no_token(token_sidecar, open_sidecar) -> None:
    """Engines without nil (a C# string field, a Blueprint string) send "": it means what
    leaving the token out means — a stranger where the sidecar has a token (was: forbidden),
    the game where it has none."""
    r = Raw(token_sidecar)
    try:
        assert r.ok("hello", {"protocol": 1, "minor": 2, "token": ""})["game"] is False
        assert _code(r, "shutdown", {}) == "forbidden"
        assert _code(r, "hello", {"protocol": 1, "minor": 2, "token": "not-the-token-00"}) \
            == "forbidden"
    finally:
        r.close()
    r = Raw(open_sidecar)
    try:
        assert r.ok("hello", {"protocol": 1, "minor": 2, "token": ""})["game"] is True
    finally:
        r.close()


def test_paced_is_true_only_for_the_games_frames_with_a_target(token_sidecar) -> None:
    game = Raw(token_sidecar)
    stranger = Raw(token_sidecar)
    try:
        game.ok("hello", {"protocol": 1, "minor": 2, "token": TOKEN})
        stranger.ok("hello", {"protocol": 1, "minor": 2})
        untargeted = {"frame": 1, "frame_time_ms": 16.6, "vram_used": 1 << 30}
        targeted = {**untargeted, "frame": 2, "target_frame_time_ms": 16.6}
        # without a target the game's report feeds the arbiter and stats, but paces nothing
        assert game.ok("frame", untargeted) == {"paced": False}
        assert game.ok("stats")["last_frame"]["frame"] == 1
        assert game.ok("frame", targeted) == {"paced": True}
        assert stranger.ok("frame", targeted) == {"paced": False}
        assert game.ok("stats")["last_frame"]["frame"] == 2
    finally:
        game.close()
        stranger.close()


def test_a_1_1_run_that_crashed_is_adopted_once_its_lease_lapses(open_sidecar) -> None:
    """A 1.1 run that crashes (no goodbye) is forgotten when its lease lapses; the next run's
    adopt then finds the conversation (1.1's lapse-then-adopt)."""
    crashed = Raw(open_sidecar)
    _hello11(crashed, lease_s=2)
    crashed.ok("open_session", {"persona": "gate", "name": "npc.gate"})
    crashed.close()  # gone without a word
    nxt = Raw(open_sidecar)
    try:
        _hello11(nxt)
        codes = []
        deadline = time.monotonic() + 30
        while True:
            rtype, body = nxt.request("adopt_session", {"session": "npc.gate"})
            if rtype == "ok":
                break
            codes.append(body["code"])
            assert time.monotonic() < deadline, codes
            time.sleep(0.5)
        assert body == {"session": "npc.gate"} and set(codes) <= {"session_owned"}, codes
    finally:
        nxt.ok("goodbye", {"keep_sessions": False})
        nxt.close()


def test_a_1_1_client_is_granted_1_1s_leases(open_sidecar) -> None:
    """1.1 granted lease_s up to 3600 s; a 1.1 client that pings every lease_s / 3 of the lease
    it asked for must not be forgotten at 1.2's 300 s. A 1.2 client is still capped."""
    old, new = Raw(open_sidecar), Raw(open_sidecar)
    try:
        assert _hello11(old, lease_s=1200)["lease_s"] == 1200.0
        assert new.ok("hello", {"protocol": 1, "minor": 2, "lease_s": 1200})["lease_s"] == 300.0
        assert old.ok("hello", {"protocol": 1})["lease_s"] == 300.0  # 1.0: the longest, told
    finally:
        old.close()
        new.close()
