"""The shared context's cells: one session's line cannot take the cells the others are
guaranteed (the rule in runtime/context_share.py, the admission and reply growth in the engine,
on a real llama.cpp context of a synthetic model)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys

import pytest

from igi_sdk.client import BridgeError, Client
from igi_sdk.errors import ContextFullError, PromptTooLongError
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams
from igi_sdk.runtime.context_share import Admit, ContextShare

# --- the rule ------------------------------------------------------------------------------------


def test_default_floor_is_half_the_context_split_among_the_slots() -> None:
    share = ContextShare.of(1024, 4)
    assert share.floor == 128
    assert share.most == 1024 - 3 * 128  # every other slot keeps its floor
    assert share.room([]) == share.most  # idle slots keep their floors too


def test_floor_is_clamped_and_zero_means_first_come() -> None:
    assert ContextShare.of(1024, 4, floor=1000).floor == 256  # at most an even split
    free_for_all = ContextShare.of(1024, 4, floor=0)
    assert free_for_all.most == 1024 and free_for_all.room([1000]) == 24
    assert ContextShare.of(512, 1).most == 512  # one slot: the whole context


def test_a_session_grows_only_into_cells_no_other_floor_needs() -> None:
    share = ContextShare.of(1024, 4)  # floor 128
    # others within their floors: the room is the same as with them idle
    assert share.room([0, 50]) == share.room([]) == 640
    # an other beyond its floor takes from the pool, not from anyone's floor
    assert share.room([500]) == 1024 - 500 - 2 * 128
    assert share.admit(640, []) is Admit.OK
    assert share.admit(641, []) is Admit.NEVER  # not even with every other slot idle
    assert share.admit(300, [500]) is Admit.WAIT  # would fit once that session shrinks
    # whatever one session takes, the others keep their floor
    hog = share.most
    assert share.room([hog, 0, 0]) == share.floor


def test_claims_never_add_up_past_the_context() -> None:
    """Sessions growing greedily, each within its room, never claim more than n_ctx."""
    share = ContextShare.of(1000, 5, floor=100)
    claims = {"a": 0, "b": 0, "c": 0, "d": 0, "e": 0}
    for _ in range(50):
        for sid in claims:
            room = share.rooms(claims)[sid]
            claims[sid] = max(claims[sid], min(room, claims[sid] + 37))
            assert sum(share.reserved(c) for c in claims.values()) <= share.n_ctx
    assert all(c >= share.floor for c in claims.values())


def test_a_session_cap_bounds_what_one_session_holds_however_free_the_context() -> None:
    # llama-server's --ctx-size 512 --parallel 2: a slot holds 256 tokens at most
    share = ContextShare.of(512, 2, cap=256)
    assert share.most == 256 and share.floor == 128  # the floors leave 384: the cap is less
    assert share.room([]) == share.room([0]) == 256  # the other slot idle: still the cap
    assert share.rooms({"a": 10, "b": 0}) == {"a": 256, "b": 256}
    assert share.admit(256, []) is Admit.OK
    assert share.admit(257, []) is Admit.NEVER  # refused outright, never waited for
    assert share.admit(200, [400]) is Admit.WAIT  # the cap does not add cells to the pool
    # a cap below the floor cuts the floor: no slot keeps cells it may never use
    small = ContextShare.of(1024, 2, cap=100)
    assert small.floor == 100 and small.most == 100
    assert ContextShare.of(512, 2).most == 384  # no cap: as before
    with pytest.raises(ValueError):
        ContextShare.of(512, 2, cap=-1)


def test_rooms_agree_with_room() -> None:
    share = ContextShare.of(2048, 8)
    claims = {"a": 900, "b": 10, "c": 300}
    rooms = share.rooms(claims)
    for sid in claims:
        others = [v for k, v in claims.items() if k != sid]
        assert rooms[sid] == share.room(others)


# --- the engine ----------------------------------------------------------------------------------

CFG = EngineConfig(n_ctx=1024, max_sessions=4, n_threads=2, prefill_chunk=64)
SAMPLING = SamplingParams(seed=3)


@pytest.fixture(scope="module")
def engine(tiny_llama):
    with Engine(tiny_llama, Plan.all_cpu(), CFG) as eng:
        yield eng


@pytest.fixture(autouse=True)
def no_sessions_left(engine):
    yield
    for sid in engine.sessions():
        engine.close_session(sid)


def _line(engine: Engine, n_tokens: int) -> str:
    """A player line of about ``n_tokens`` tokens."""
    words = ["apple", "river", "stone", "lantern", "harbor", "violet", "copper", "meadow"]
    text = " ".join(words[i % len(words)] + str(i) for i in range(n_tokens))
    toks = engine.tokenize(text)
    while len(toks) > n_tokens:
        text = text[: len(text) * n_tokens // len(toks)]
        toks = engine.tokenize(text)
    return text


def test_a_huge_line_cannot_take_the_cells_others_are_guaranteed(engine) -> None:
    hog = engine.open_session("You are the hog.", sampling=SAMPLING)
    npc = engine.open_session("You are Mira.", sampling=SAMPLING)
    # fits the context (n_ctx 1024) but not one session's share of it (640)
    with pytest.raises(PromptTooLongError, match="at most 640"):
        engine.chat(hog, _line(engine, 900), max_tokens=4)
    # the hog takes all the share it may have
    engine.chat(hog, _line(engine, 600), max_tokens=4).result(timeout=60)
    assert engine.session_info()[hog]["tokens"] <= engine.share.most
    res = engine.chat(npc, "Hello there, innkeeper.", max_tokens=16,
                      ignore_eos=True).result(timeout=60)
    assert res.finish_reason == "length" and res.completion_tokens == 16


def test_the_bystander_of_a_line_as_long_as_the_context_still_speaks(engine) -> None:
    hog = engine.open_session(None, sampling=SAMPLING)
    npc = engine.open_session("You are Mira.", sampling=SAMPLING)
    with contextlib.suppress(PromptTooLongError):  # the line (1 000 of 1 024 cells) is refused
        engine.chat(hog, _line(engine, 1000), max_tokens=4).result(timeout=60)
    res = engine.chat(npc, "Hello there, innkeeper.", max_tokens=16,
                      ignore_eos=True).result(timeout=60)
    assert res.completion_tokens == 16


def test_a_long_reply_ends_at_its_share_and_the_others_still_speak(engine) -> None:
    hog = engine.open_session("You are the hog.", sampling=SAMPLING)
    npcs = [engine.open_session(f"You are NPC {i}.", sampling=SAMPLING) for i in range(3)]
    long = engine.chat(hog, _line(engine, 400), max_tokens=2000, ignore_eos=True)
    next(iter(long))  # it is replying: the others speak meanwhile and after it
    during = [engine.chat(s, "Any news?", max_tokens=24, ignore_eos=True) for s in npcs]
    res = long.result(timeout=120)
    assert res.finish_reason == "length"  # cut at its share, not by max_tokens
    assert res.completion_tokens < 2000
    held = engine.session_info()[hog]["tokens"]
    assert engine.share.most - 2 <= held <= engine.share.most
    # every other session still has its floor: a short chat each, all at once
    after = [engine.chat(s, "And now?", max_tokens=24, ignore_eos=True) for s in npcs]
    for g in during + after:
        assert g.result(timeout=60).completion_tokens == 24
    ctx = engine.status()["context"]
    assert ctx["n_ctx"] == 1024 and ctx["floor"] == 128 and ctx["max_per_session"] == 640
    assert ctx["claimed"] == ctx["used"] <= 1024
    assert ctx["used"] == sum(i["tokens"] for i in engine.session_info().values())


def test_the_rule_reclaims_idle_cells_least_recent_first_and_only_when_it_makes_room() -> None:
    share = ContextShare.of(1024, 4)  # floor 128; others idle: room 640
    claims = {"old": 300, "new": 300, "small": 100}
    # room with these claims: 1024 - 300 - 300 - 128 = 296
    assert share.to_reclaim(296, claims, ["old", "new", "small"]) == []  # it fits already
    assert share.to_reclaim(400, claims, ["old", "new", "small"]) == ["old"]  # +172
    assert share.to_reclaim(400, claims, ["small", "new", "old"]) == ["new"]  # small gives 0
    assert share.to_reclaim(640, claims, ["old", "new"]) == ["old", "new"]
    # more than every idle session could give back: nobody re-reads for nothing
    assert share.to_reclaim(640, claims, ["old"]) == []


def test_a_line_waits_only_for_cells_a_reply_holds_and_fits_once_it_ends(engine) -> None:
    hog = engine.open_session("You are the hog.", sampling=SAMPLING)
    npc = engine.open_session("You are Mira.", sampling=SAMPLING)
    long = engine.chat(hog, _line(engine, 560), max_tokens=60, ignore_eos=True)
    next(iter(long))  # replying: its cells are in use
    line = _line(engine, 300)  # beyond its floor, into the pool the hog holds
    with pytest.raises(ContextFullError) as err:
        engine.chat(npc, line, max_tokens=4)
    assert err.value.retryable and err.value.code == "context_full"
    before = engine.session_info()[npc]["tokens"]
    assert before == 0  # nothing of the refused line stayed
    long.result(timeout=120)  # idle now: its cells may be taken back
    res = engine.chat(npc, line, max_tokens=4).result(timeout=60)
    assert res.prompt_tokens > 290
    assert engine.session_info()[hog]["tokens"] == 0  # it gave its cells back


def test_an_idle_npcs_cells_go_to_a_talking_one_which_is_never_cut_for_them(engine) -> None:
    hog = engine.open_session("You are the hog.", sampling=SAMPLING)
    npc = engine.open_session("You are Mira.", sampling=SAMPLING)
    first = engine.chat(hog, _line(engine, 560), max_tokens=4).result(timeout=60)
    # Mira's reply grows past the room the idle hog leaves (1024 - 2 * 128 - 560 cells)
    res = engine.chat(npc, "Tell me a long story.", max_tokens=300,
                      ignore_eos=True).result(timeout=120)
    assert res.completion_tokens == 300  # max_tokens ended it, not its room
    assert engine.status()["step"]["reclaimed"] >= 1
    # the hog reads its conversation again with its next line, and answers
    again = engine.chat(hog, "And you?", max_tokens=4).result(timeout=60)
    assert again.cached_tokens == 0 and again.prompt_tokens > first.prompt_tokens
    assert again.completion_tokens >= 1


def test_a_line_longer_than_the_context_is_prompt_too_long(engine) -> None:
    sid = engine.open_session(None, sampling=SAMPLING)
    with pytest.raises(PromptTooLongError) as err:
        engine.chat(sid, _line(engine, 1100), max_tokens=4)
    assert not err.value.retryable
    assert engine.chat(sid, "Hi.", max_tokens=2).result(timeout=30).completion_tokens >= 1


def test_a_restore_beyond_the_room_is_retryable(engine) -> None:
    big = engine.open_session(None, sampling=SAMPLING)
    engine.chat(big, _line(engine, 400), max_tokens=2).result(timeout=60)
    saved = engine.snapshot(big)
    engine.close_session(big)
    hog = engine.open_session(None, sampling=SAMPLING)
    long = engine.chat(hog, _line(engine, 560), max_tokens=60, ignore_eos=True)
    next(iter(long))
    # the replying hog and the idle slots' floors leave less than the save holds
    with pytest.raises(ContextFullError):
        engine.restore(saved)
    long.result(timeout=120)  # idle now: its cells go to the restore
    assert engine.restore(saved)


# --- the sidecar ---------------------------------------------------------------------------------


def test_on_the_wire_the_bystander_speaks_and_a_wait_is_retryable(engine, tiny_llama,
                                                                   tmp_path) -> None:
    """Two clients of a real sidecar (n_ctx 1024, 4 slots): one client's lines cannot take the
    cells the other's session is guaranteed; a line waits only while a reply holds the cells
    it needs; stats show the share."""
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(tiny_llama, models / "tiny.gguf")
    endpoint = f"ipc://{tmp_path / 's.sock'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint, "--model-dir",
         str(models), "--model", "tiny.gguf", "--ctx", "1024", "--max-sessions", "4",
         "--threads", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    hog, npc = Client(endpoint, timeout=60), Client(endpoint, timeout=60)
    try:
        hog.wait_ready(60)
        npc.hello()
        h = hog.open_session("You are the hog.", sampling={"seed": 1})
        n = npc.open_session("You are Mira.", sampling={"seed": 1})
        with pytest.raises(BridgeError) as err:
            hog.chat(h, _line(engine, 1000), max_tokens=4).result()
        assert err.value.code == "prompt_too_long" and not err.value.retryable
        long = hog.chat(h, _line(engine, 600), max_tokens=30, ignore_eos=True)
        next(iter(long))  # replying: the cells it holds are in use
        with pytest.raises(BridgeError) as err:
            npc.chat(n, _line(engine, 300), max_tokens=4).result()
        assert err.value.code == "context_full" and err.value.retryable
        done = npc.chat(n, "Hello there.", max_tokens=12, ignore_eos=True).result()
        assert done["usage"]["completion_tokens"] == 12
        long.result()
        ctx = npc.request("stats")["engine"]["context"]
        assert ctx["floor"] == 128 and ctx["max_per_session"] == 640
        assert 600 < ctx["used"] <= 1024
        # idle now: the hog's cells go to the line that waited for them
        assert npc.chat(n, _line(engine, 300), max_tokens=4).result()["usage"][
            "prompt_tokens"] > 290
    finally:
        hog.close()
        npc.close()
        proc.kill()
        proc.wait(10)


def test_serve_context_floor_sets_the_share(tiny_llama, tmp_path) -> None:
    """A game with one long NPC gives up the floors: `serve --context-floor 0`."""
    shutil.copy(tiny_llama, tmp_path / "tiny.gguf")
    endpoint = f"ipc://{tmp_path / 'f.sock'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint, "--model-dir",
         str(tmp_path), "--model", "tiny.gguf", "--ctx", "1024", "--max-sessions", "4",
         "--threads", "1", "--context-floor", "0"], stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    c = Client(endpoint, timeout=60)
    try:
        ctx = c.wait_ready(60)["engine"]["context"]
        assert (ctx["floor"], ctx["max_per_session"]) == (0, 1024)
    finally:
        c.close()
        proc.kill()
        proc.wait(10)


def test_session_info_reads_a_sessions_draft_figures_once(engine) -> None:
    """The engine thread may drop a session's draft figures between a check and a read: the
    listing must not fail (it answered list_sessions with `internal`)."""

    class Racing(dict):  # dropped right after the membership check
        def __contains__(self, key: object) -> bool:
            return True

    sid = engine.open_session("npc", sampling=SamplingParams(temperature=0.0))
    real = engine._drafting.acceptance
    engine._drafting.acceptance = Racing()
    try:
        info = engine.session_info()
    finally:
        engine._drafting.acceptance = real
    assert sid in info and "draft" not in info[sid]
