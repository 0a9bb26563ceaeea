"""An in-process peer of the sidecar (what the HTTP face is): its requests reach the session
service with no socket, and a reply's events can be followed by a callback, in order, with no
thread waiting for them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import msgpack
import pytest
from fastapi.testclient import TestClient

from igi_sdk.client import Client
from igi_sdk.events import ReplyDone, ReplyText
from igi_sdk.http.app import HttpConfig, build_app
from igi_sdk.serving.backend import StreamListener
from igi_sdk.serving.server import Server, ServerConfig
from igi_sdk.wire import protocol as P
from tests.test_server_caps import _Stalled


@dataclass(frozen=True)
class _Result:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    total_s: float
    cached_tokens: int = 0
    tool_calls: tuple[()] = ()  # events.ReplyResult: no calls
    dropped_turns: int = 0
    summarised_turns: int = 0


class _Talking(_Stalled):
    """A model side whose every line answers ``pieces`` from another thread, then ends."""

    pieces = ("Good ", "morning, ", "traveller.")

    def chat(self, request: P.Chat, listener: StreamListener) -> Future[Any]:
        def answer() -> None:
            for k, piece in enumerate(self.pieces):
                listener(ReplyText(k, piece))
            listener(ReplyDone(0, _Result("".join(self.pieces), "stop", 3, 3, 0.0, 0.0)))

        threading.Thread(target=answer, daemon=True).start()
        f: Future[Any] = Future()

        class Handle:
            def cancel(self) -> None:
                pass

        f.set_result(Handle())
        return f


@pytest.fixture()
def server(tmp_path) -> Iterator[Server]:
    srv = Server(ServerConfig(endpoint=f"ipc://{tmp_path / 'local.sock'}", model_dir=tmp_path),
                 _Talking())  # type: ignore[arg-type]
    srv.service.model_name = "talking.gguf"
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.stopping.set()
    t.join(5)


def test_a_local_client_talks_to_the_service_without_a_socket(server) -> None:
    c = Client(server.bound, timeout=10, local=server.connect_local)
    try:
        assert c.hello()["game"] is True  # no launch token configured: everyone is the game
        sid = c.open_session("", name="npc")
        assert "".join(c.chat(sid, "Hello.")) == "Good morning, traveller."
        assert c.stats()["clients"] == 1
    finally:
        c.close()


def test_a_followed_reply_arrives_whole_and_in_order(server) -> None:
    c = Client(server.bound, timeout=10, local=server.connect_local)
    try:
        sid = c.open_session("", name="npc")
        stream = c.chat(sid, "Hello.")
        first = next(iter(stream))  # a reader may take the first piece itself
        seen: list[tuple[str, dict[str, Any]]] = []
        ended = threading.Event()

        def sink(rtype: str, body: dict[str, Any]) -> None:
            seen.append((rtype, body))
            if rtype in ("done", "error"):
                ended.set()

        c.follow(stream.id, sink)
        assert ended.wait(10)
        texts = [b["text"] for t, b in seen if t == "token"]
        assert first + "".join(texts) == "Good morning, traveller."
        assert seen[-1][0] == "done" and seen[-1][1]["text"] == "Good morning, traveller."
    finally:
        c.close()


def test_closing_the_client_ends_a_followed_reply(server) -> None:
    c = Client(server.bound, timeout=10, local=server.connect_local)
    heard: list[str] = []
    c.follow(12345, lambda rtype, body: heard.append(body.get("code", rtype)))
    c.close()
    assert heard == ["engine_closed"]


class _Counting:
    """A local connection that notes the type of every request it sends."""

    def __init__(self, wire: Any, sent: list[str]) -> None:
        self.wire, self.sent = wire, sent

    def send(self, frame: bytes) -> None:
        self.sent.append(msgpack.unpackb(frame)["type"])
        self.wire.send(frame)

    def close(self, goodbye: bytes | None) -> None:
        self.wire.close(goodbye)


def test_a_line_of_a_held_conversation_is_one_request_to_the_service(server) -> None:
    sent: list[str] = []
    cfg = HttpConfig(endpoint=server.bound, owner="o" * 32,
                     connect=lambda on_frame: _Counting(server.connect_local(on_frame), sent))
    http = TestClient(build_app(cfg))
    messages: list[dict[str, str]] = [{"role": "system", "content": "You are Brom."}]
    per_line = []
    for line in ("Hello.", "What do you sell?", "Thanks."):
        messages.append({"role": "user", "content": line})
        before = len(sent)
        r = http.post("/v1/chat/completions", json={"messages": messages, "user": "brom"})
        assert r.status_code == 200, r.text
        messages.append({"role": "assistant",
                         "content": r.json()["choices"][0]["message"]["content"]})
        per_line.append([t for t in sent[before:] if t != "hello"])
    assert per_line[0] == ["open_session", "chat"]
    # the conversation's session is asked for the line, not looked up first
    assert per_line[1:] == [["chat"], ["chat"]]
