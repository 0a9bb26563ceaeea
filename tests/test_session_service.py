"""The session service's rules in-process: no socket, a fake model side, a transport that keeps
what it was given. Who the game is, whose sessions make way for the game's, and the orphan rule
for a peer that never leaves (the HTTP face); which calls a line's tool results may answer."""

from __future__ import annotations

import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from igi_sdk.events import ReplyDone, ReplyToolCall, ToolCall
from igi_sdk.serving.backend import StreamListener
from igi_sdk.serving.service import ServerConfig, SessionService
from igi_sdk.wire import protocol as P
from tests.test_server_caps import _Stalled

TOKEN = "launch-token-of-the-test-game-02"


class Kept:
    """A transport that keeps every frame, by peer."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []
        self.stopped = False

    def send(self, identity: bytes, frame: bytes) -> None:
        self.sent.append((identity, frame))

    def wake(self) -> None:
        pass  # the test runs the service's completions itself

    def stop(self) -> None:
        self.stopped = True

    def figures(self) -> dict[str, int]:
        return {"flood_cuts": 0}


class Peer:
    """One client of the service, speaking the wire format."""

    def __init__(self, service: SessionService, kept: Kept, identity: bytes, *,
                 token: str | None = None, local: bool = False) -> None:
        self.service, self.kept, self.identity, self.local = service, kept, identity, local
        self.ids = iter(range(1, 10_000))
        body: dict[str, Any] = {"protocol": P.PROTOCOL_VERSION, "minor": P.PROTOCOL_MINOR}
        if token is not None:
            body["token"] = token
        self.hello = self.call("hello", body)

    def tell(self, msg_type: str, body: dict[str, Any]) -> int:
        """Send without waiting for an answer (a chat whose reply never ends, say)."""
        msg_id = next(self.ids)
        self.service.handle(self.identity, P.encode(msg_id, msg_type, body), local=self.local)
        self.service.run_completions()
        return msg_id

    def call(self, msg_type: str, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        msg_id = self.tell(msg_type, body)
        for ident, frame in self.kept.sent:
            rid, rtype, rbody = P.decode_reply(frame)
            if ident == self.identity and rid == msg_id:
                return rtype, rbody
        raise AssertionError(f"{msg_type} was not answered")


@pytest.fixture()
def service(tmp_path: Path) -> tuple[SessionService, Kept]:
    kept = Kept()
    svc = SessionService(ServerConfig(endpoint="inproc://unused", model_dir=tmp_path,
                                      max_sessions=4, launch_token=TOKEN, orphan_ttl_s=60.0),
                         _Stalled(), kept)  # type: ignore[arg-type]
    svc.model_name = "stalled.gguf"
    return svc, kept


def test_only_the_launch_token_makes_a_client_the_game(service) -> None:
    svc, kept = service
    assert Peer(svc, kept, b"game", token=TOKEN).hello[1]["game"] is True
    assert Peer(svc, kept, b"mod").hello[1]["game"] is False
    assert Peer(svc, kept, b"http", local=True).hello[1]["game"] is False


def test_the_games_open_session_succeeds_whatever_the_mods_hold(service) -> None:
    svc, kept = service
    mods = [Peer(svc, kept, b"mod-a"), Peer(svc, kept, b"http", local=True)]
    for k, mod in enumerate(mods):  # each holds its share (half the slots): all four taken
        for j in range(2):
            assert mod.call("open_session", {"name": f"m{k}{j}", "persona": ""})[0] == "ok"
    assert mods[0].call("open_session", {"name": "more", "persona": ""})[1]["code"] == \
        "too_many_sessions"
    game = Peer(svc, kept, b"game", token=TOKEN)
    for j in range(4):  # every slot, one after another: the mods' idle sessions make way
        assert game.call("open_session", {"name": f"npc{j}", "persona": ""})[0] == "ok", j
    assert len(svc.sessions) == 4 and all(
        svc.sessions.owner_of(sid) == b"game" for sid in svc.sessions.by_id)
    # a mod's line to a session that made way is told so, typed (it opens it anew; the model
    # side refuses that while the game holds every slot: tests/test_http_principal.py)
    assert mods[0].call("chat", {"session": "m00", "text": "hi"})[1]["code"] == \
        "unknown_session"


def test_a_session_replying_does_not_make_way(service) -> None:
    svc, kept = service
    mod = Peer(svc, kept, b"mod")
    for j in range(2):
        mod.call("open_session", {"name": f"m{j}", "persona": ""})
    mod.tell("chat", {"session": "m0", "text": "a long line"})  # never ends (_Stalled)
    game = Peer(svc, kept, b"game", token=TOKEN)
    for j in range(3):
        assert game.call("open_session", {"name": f"npc{j}", "persona": ""})[0] == "ok"
    left = {svc.sessions.by_id[sid].name for sid in svc.sessions.owned(b"mod")}
    assert left == {"m0"}  # the idle one went; the one replying stays


def test_an_in_process_peer_never_lapses_and_its_idle_sessions_end(service) -> None:
    svc, kept = service
    svc.cfg.orphan_ttl_s = 0.05
    face = Peer(svc, kept, b"http", local=True)
    for j in range(2):
        face.call("open_session", {"name": f"c{j}", "persona": ""})
    face.tell("chat", {"session": "c1", "text": "still answering"})  # never ends
    svc.clients[b"http"].last_seen -= 3600  # far past any lease
    time.sleep(0.1)
    svc.heartbeat()
    assert b"http" in svc.clients  # still connected
    names = {svc.sessions.by_id[sid].name for sid in svc.sessions.owned(b"http")}
    assert names == {"c1"}  # the idle conversation ended; the one replying did not
    # heartbeats still go to it: a client counts a long silence as the sidecar gone
    assert any(ident == b"http" and P.decode_reply(f)[1] == "heartbeat" for ident, f in kept.sent)


def test_a_remote_peer_still_lapses(service) -> None:
    svc, kept = service
    mod = Peer(svc, kept, b"mod")
    mod.call("open_session", {"name": "m", "persona": ""})
    svc.clients[b"mod"].last_seen -= 3600
    svc.heartbeat()
    assert b"mod" not in svc.clients and svc.sessions.orphans()


def test_a_frozen_sidecar_does_not_count_its_freeze_as_the_clients_silence(
        service, monkeypatch: pytest.MonkeyPatch) -> None:
    svc, kept = service
    game = Peer(svc, kept, b"game", token=TOKEN)
    game.call("open_session", {"name": "npc", "persona": ""})
    now = [time.monotonic()]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    svc.heartbeat()
    now[0] += 20.0  # stopped for 20 s (SIGSTOP, a debugger): no beat ran meanwhile
    svc.heartbeat()
    assert b"game" in svc.clients  # a fresh lease on waking, not hello_required
    rtype, listing = game.call("list_sessions", {})
    assert rtype == "ok" and [s["session"] for s in listing["sessions"]] == ["npc"]
    # beating again, a client that stays silent past its lease still lapses
    for _ in range(int(svc.clients[b"game"].lease_s) + 2):
        now[0] += 1.0
        svc.heartbeat()
    assert b"game" not in svc.clients


def test_a_client_silent_while_its_reply_runs_keeps_its_lease(
        service, monkeypatch: pytest.MonkeyPatch) -> None:
    svc, kept = service
    mod = Peer(svc, kept, b"mod")
    mod.call("open_session", {"name": "m", "persona": ""})
    mod.tell("chat", {"session": "m", "text": "a very long story"})  # never ends (_Stalled)
    lease = svc.clients[b"mod"].lease_s
    now = [time.monotonic()]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])
    for _ in range(int(3 * lease) + 1):  # three leases of silence, beating every second
        now[0] += 1.0
        svc.heartbeat()
    assert b"mod" in svc.clients and svc.clients[b"mod"].streams


def test_the_face_may_reply_on_every_slot_and_still_makes_way_for_the_game(service) -> None:
    svc, kept = service
    face = Peer(svc, kept, b"http", local=True)
    assert face.hello[1]["limits"]["max_sessions_per_client"] == 4  # every slot
    assert face.hello[1]["limits"]["max_streams_per_client"] >= 4
    for j in range(4):  # four conversations replying at once (a mod had half the slots)
        assert face.call("open_session", {"name": f"c{j}", "persona": ""})[0] == "ok"
        face.tell("chat", {"session": f"c{j}", "text": "a long line"})  # never ends
    assert len(svc.clients[b"http"].streams) == 4
    game = Peer(svc, kept, b"game", token=TOKEN)
    # every slot replying: the face's least recently used conversation is closed for the game
    assert game.call("open_session", {"name": "npc", "persona": ""})[0] == "ok"
    left = {svc.sessions.by_id[sid].name for sid in svc.sessions.owned(b"http")}
    assert len(left) == 3 and len(svc.sessions) == 4
    # another mod still has half the slots
    mod = Peer(svc, kept, b"mod")
    assert mod.hello[1]["limits"]["max_sessions_per_client"] == 2


@dataclass(frozen=True)
class _Done:
    text: str = ""
    finish_reason: str = "stop"
    prompt_tokens: int = 4
    completion_tokens: int = 3
    ttft_s: float = 0.0
    total_s: float = 0.0
    cached_tokens: int = 0
    tool_calls: tuple[ToolCall, ...] = ()
    dropped_turns: int = 0
    summarised_turns: int = 0


class _Calling(_Stalled):
    """A model side whose reply to the line "act" is two calls, and to any other line text."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[P.Chat] = []

    def chat(self, request: P.Chat, listener: StreamListener) -> Future[Any]:
        self.lines.append(request)
        calls = (ToolCall(0, "call_follow", "follow", "{}"),
                 ToolCall(1, "call_trade", "trade", "{}")) if request.text == "act" else ()
        for call in calls:
            listener(ReplyToolCall(0, call))
        listener(ReplyDone(0, _Done("" if calls else "Well met.",
                                    "tool_calls" if calls else "stop", tool_calls=calls)))
        f: Future[Any] = Future()
        f.set_result(None)
        return f


def _results(*ids: str) -> list[dict[str, str]]:
    return [{"id": i, "content": "done"} for i in ids]


@pytest.fixture()
def calling(tmp_path: Path) -> tuple[SessionService, _Calling, Peer]:
    """The service over a model side that calls, and the game connected to it."""
    kept, model = Kept(), _Calling()
    svc = SessionService(ServerConfig(endpoint="inproc://unused", model_dir=tmp_path),
                         model, kept)  # type: ignore[arg-type]
    svc.model_name = "calling.gguf"
    return svc, model, Peer(svc, kept, b"game")


def _chat(peer: Peer, body: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A chat's terminal frame (its ``done`` or ``error``), past its ``tool_call`` events."""
    msg_id = peer.tell("chat", body)
    for ident, frame in peer.kept.sent:
        rid, rtype, rbody = P.decode_reply(frame)
        if ident == peer.identity and rid == msg_id and rtype in ("done", "error"):
            return rtype, rbody
    raise AssertionError("the chat did not end")


def test_tool_results_answer_only_the_calls_of_the_sessions_last_reply(calling) -> None:
    svc, model, game = calling
    game.call("open_session", {"name": "lydia", "persona": ""})
    # no reply yet: a result answers nothing, and is refused before the model sees the line
    rtype, body = _chat(game, {"session": "lydia", "text": "",
                                     "tool_results": _results("call_follow")})
    assert (rtype, body["code"]) == ("error", "invalid_body") and "call_follow" in body["message"]
    assert _chat(game, {"session": "lydia", "text": "act"})[0] == "done"
    lines = len(model.lines)
    # a result naming a call the reply did not make: typed, and nothing lost
    rtype, body = _chat(game, {"session": "lydia", "text": "",
                                     "tool_results": _results("call_follow", "call_fly")})
    assert (rtype, body["code"]) == ("error", "invalid_body")
    assert "call_fly" in body["message"] and "call_follow, call_trade" in body["message"]
    assert len(model.lines) == lines and not svc.clients[b"game"].streams
    # the session is as it was: the right results are taken, the reply after them makes no
    # calls, and results of the calls before it are refused then
    assert _chat(game, {"session": "lydia", "text": "",
                              "tool_results": _results("call_trade", "call_follow")}
                     )[0] == "done"
    assert [r.id for r in model.lines[-1].tool_results] == ["call_trade", "call_follow"]
    assert _chat(game, {"session": "lydia", "text": "",
                              "tool_results": _results("call_trade")})[1]["code"] == \
        "invalid_body"


def test_a_history_given_says_which_calls_the_results_answer(calling) -> None:
    game = calling[2]
    called = [{"role": "user", "content": "Follow me."},
              {"role": "assistant", "content": "", "tool_calls": [
                  {"id": "call_1", "name": "follow", "arguments": "{}"},
                  {"id": "call_2", "name": "trade", "arguments": "{}"}]},
              {"role": "tool", "content": "following", "tool_call_id": "call_1"}]
    game.call("open_session", {"name": "lydia", "persona": "", "history": called})
    assert _chat(game, {"session": "lydia", "text": "",
                              "tool_results": _results("call_2")})[0] == "done"
    # a line that rewrites the conversation: its history's calls, not the session's
    assert _chat(game, {"session": "lydia", "text": "", "history": called,
                              "tool_results": _results("call_1")})[0] == "done"
    plain = [*called, {"role": "user", "content": "Thanks."}]
    assert _chat(game, {"session": "lydia", "text": "", "history": plain,
                              "tool_results": _results("call_1")})[1]["code"] == "invalid_body"
