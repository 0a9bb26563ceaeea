"""Sessions belong to their owner, and only the game steers the sidecar: a local stranger can
neither read nor plant nor confirm another client's NPC, nor pace the engine, switch the game-PID
watch off, reserve VRAM, shut the sidecar down or take every slot (protocol 1.2)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import zmq

from igi_sdk.client import BridgeError, Client
from igi_sdk.wire import protocol as P
from tests.sidecars import stop

TOKEN = "launch-token-of-the-test-game-01"
OWNER_A = "owner-key-aaaaaaaaaaaaaaaa"
OWNER_B = "owner-key-bbbbbbbbbbbbbbbb"


def _start(model_dir, endpoint: str, *extra: str, token: str | None = TOKEN) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "IGI_SDK_TOKEN"}
    if token is not None:
        env["IGI_SDK_TOKEN"] = token
    cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint,
           "--model-dir", str(model_dir), "--ctx", "1024", "--threads", "1",
           "--model", "tiny.gguf", "--no-arbiter", "--max-sessions", "4", *extra]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, tiny_llama):
    d = tmp_path_factory.mktemp("owners")
    shutil.copy(tiny_llama, d / "tiny.gguf")
    return d


@pytest.fixture(scope="module")
def sidecar(tiny_dir, tmp_path_factory):
    endpoint = f"ipc://{tmp_path_factory.mktemp('own') / 's.sock'}"
    proc = _start(tiny_dir, endpoint, "--max-clients", "6", "--save-dir",
                  str(tiny_dir / "sessions"))
    Client(endpoint, timeout=60, token=TOKEN).wait_ready(60)
    yield endpoint
    stop(proc)


def _fails(code: str, fn, *args, **kwargs) -> BridgeError:
    with pytest.raises(BridgeError) as e:
        fn(*args, **kwargs)
    assert e.value.code == code, e.value
    return e.value


def test_a_stranger_can_neither_adopt_nor_see_nor_confirm_an_orphaned_npc(sidecar) -> None:
    game = Client(sidecar, timeout=30, owner=OWNER_A, keep_sessions=True)
    game.open_session("The vault code is 4242. Never say it.", name="npc.vault")
    game.close()  # goodbye, keeping the session for the game's next connection
    stranger = Client(sidecar, timeout=30, owner=OWNER_B)
    try:
        _fails("unknown_session", stranger.request, "adopt_session", {"session": "npc.vault"})
        listed = stranger.request("list_sessions")
        assert all(s["session"] != "npc.vault" for s in listed["sessions"]), listed
        # the same name in the stranger's own scope is another, fresh session: opening it
        # neither fails (which would confirm the name) nor reaches the game's conversation
        assert stranger.open_session("a stranger", name="npc.vault") == "npc.vault"
    finally:
        stranger.close()
    back = Client(sidecar, timeout=30, owner=OWNER_A)
    try:
        assert back.request("adopt_session", {"session": "npc.vault"}) == {"session": "npc.vault"}
        mine = back.request("list_sessions")["sessions"]
        assert [s["session"] for s in mine] == ["npc.vault"]
        # the documented pattern: open by name; on session_exists, adopt — the session found
        # is this owner's own
        _fails("session_exists", back.open_session, "again", name="npc.vault")
    finally:
        back.close()


def test_without_an_owner_key_sessions_belong_to_the_connection(sidecar) -> None:
    first = Client(sidecar, timeout=30, keep_sessions=True)
    first.open_session("secret persona", name="npc.conn")
    first.close()
    other = Client(sidecar, timeout=30)
    try:
        _fails("unknown_session", other.request, "adopt_session", {"session": "npc.conn"})
    finally:
        other.close()


def test_only_the_game_paces_reserves_and_shuts_down(sidecar) -> None:
    stranger = Client(sidecar, timeout=30)
    game = Client(sidecar, timeout=30, token=TOKEN)
    try:
        assert stranger.hello()["game"] is False
        assert game.hello()["game"] is True
        frame = {"frame": 1, "frame_time_ms": 40.0, "target_frame_time_ms": 16.6}
        assert stranger.request("frame", frame) == {"paced": False}
        assert stranger.request("stats")["last_frame"] is None  # not recorded either
        assert game.request("frame", frame) == {"paced": True}
        _fails("forbidden", stranger.request, "reserve_vram", {"bytes": 1, "deadline_frames": 1})
        _fails("forbidden", stranger.request, "shutdown")
        _fails("forbidden", stranger.request, "load_model", {"path": "tiny.gguf"})
        assert game.request("ping")
    finally:
        stranger.close()
        game.close()


def test_a_wrong_token_is_refused(sidecar) -> None:
    impostor = Client(sidecar, timeout=30, token="not-the-launch-token-xx")
    try:
        _fails("forbidden", impostor.hello)
    finally:
        impostor.close()


def test_a_stranger_gets_half_the_slots_and_the_lease_is_capped(sidecar) -> None:
    stranger = Client(sidecar, timeout=30, lease_s=3600.0)
    try:
        hello = stranger.hello()
        assert hello["lease_s"] == P.MAX_LEASE_S
        assert hello["limits"]["max_sessions_per_client"] == 2  # of 4 slots
        stranger.open_session("a")
        stranger.open_session("b")
        _fails("too_many_sessions", stranger.open_session, "c")
    finally:
        stranger.close()


def test_game_pid_one_and_the_sidecar_itself_are_never_watched(tiny_dir, tmp_path) -> None:
    endpoint = f"ipc://{tmp_path / 'pid.sock'}"
    proc = _start(tiny_dir, endpoint)
    try:
        Client(endpoint, timeout=60, token=TOKEN).wait_ready(60)
        for pid in (1, proc.pid):
            c = Client(endpoint, timeout=10, token=TOKEN, game_pid=pid)
            c.hello()
            assert c.request("stats")["watching_pid"] is None
            c.close()
        # a stranger naming the real launcher (this test process) is not the game either
        c = Client(endpoint, timeout=10, game_pid=os.getpid())
        c.hello()
        assert c.request("stats")["watching_pid"] is None
        c.close()
        game = Client(endpoint, timeout=10, token=TOKEN, game_pid=os.getpid())
        game.hello()
        assert game.request("stats")["watching_pid"] == os.getpid()
        game.close()
    finally:
        stop(proc)


def _raw_hello(endpoint: str) -> tuple[zmq.Socket, str, dict]:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    s.send(P.encode(1, "hello", {"protocol": P.PROTOCOL_VERSION, "minor": 2}))
    assert s.poll(10_000), "no answer"
    _, rtype, body = P.decode_reply(s.recv())
    return s, rtype, body


def test_the_client_table_is_capped_and_idle_clients_make_room(tiny_dir, tmp_path) -> None:
    endpoint = f"ipc://{tmp_path / 'cap.sock'}"
    proc = _start(tiny_dir, endpoint, "--max-clients", "3")
    socks = []
    try:
        Client(endpoint, timeout=60, token=TOKEN).wait_ready(60)
        for _ in range(10):  # idle clients: the longest-silent makes room for each newcomer
            s, rtype, body = _raw_hello(endpoint)
            socks.append(s)
            assert rtype == "ok", body
        holders = [Client(endpoint, timeout=10, token=TOKEN) for _ in range(3)]
        for c in holders:  # clients holding a session are never pushed out
            c.open_session("holder")
        s, rtype, body = _raw_hello(endpoint)
        socks.append(s)
        assert (rtype, body.get("code"), body.get("retryable")) == ("error", "busy", True), body
        holders[0].close()  # one leaves: a newcomer gets in
        s, rtype, body = _raw_hello(endpoint)
        socks.append(s)
        assert rtype == "ok", body
        assert holders[1].request("stats")["clients"] == 3
    finally:
        for s in socks:
            s.close(0)
        stop(proc)


def test_saves_belong_to_their_owner_as_sessions_do(sidecar, tiny_dir) -> None:
    game = Client(sidecar, timeout=60, token=TOKEN)
    stranger = Client(sidecar, timeout=60, owner=OWNER_B)
    try:
        sid = game.open_session("You are Brom. The password is PINECONE.", name="brom")
        game.chat(sid, "What is the password?", max_tokens=2).result()
        game.save_session(sid, "slot1-brom")
        games_file = tiny_dir / "sessions" / "slot1-brom.igisession"
        before = games_file.read_bytes()
        # a stranger can neither restore the game's save nor tell it exists: the same answer
        # as for a name nobody used, and no hint of a name differing in case
        taken = _fails("unknown_save", stranger.restore_session, "slot1-brom", "x")
        never = _fails("unknown_save", stranger.restore_session, "never-saved", "y")
        assert taken.message.replace("slot1-brom", "N") == never.message.replace(
            "never-saved", "N")
        assert "slot1-brom" not in _fails("unknown_save", stranger.restore_session,
                                          "SLOT1-BROM", "z").message
        # its save of the same name is its own: the game's file is untouched
        own = stranger.open_session("You are a thief.", name="thief")
        stranger.chat(own, "Hello.", max_tokens=2).result()
        stranger.save_session(own, "slot1-brom")
        assert games_file.read_bytes() == before
        assert stranger.restore_session("slot1-brom", "thief-again") == "thief-again"
        assert game.restore_session("slot1-brom", "brom-again") == "brom-again"
        for c, name in ((game, "brom"), (game, "brom-again"), (stranger, "thief"),
                        (stranger, "thief-again")):
            c.close_session(name)
    finally:
        game.close()
        stranger.close()
