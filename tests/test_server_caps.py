"""The protocol server's caps on what waiting work may hold: image bytes of lines not yet ended
(per client and in all) and VRAM reservations in flight. The server runs in-process over a
model side whose work never ends (what a slow line or a long model load looks like to it), so
the counts are exact and nothing is timed."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
import zmq

from igi_sdk.serving.backend import ReservationDone, StreamListener
from igi_sdk.serving.server import Server, ServerConfig
from igi_sdk.wire import protocol as P


class _Stalled:
    """The model side of a sidecar whose engine is busy with a very long line: sessions open,
    chats and reservations are accepted and never end."""

    model_name = "stalled.gguf"

    def __init__(self) -> None:
        self.chats = 0
        self.reservations = 0

    def session_slots(self, local_slots: int) -> int:
        return local_slots

    def load_model(self, path: Path, request: P.LoadModel, draft: Path | None = None,
                   mmproj: Path | None = None) -> dict[str, Any]:
        return {"model": path.name}

    def open_session(self, request: P.OpenSession) -> Future[str]:
        f: Future[str] = Future()
        f.set_result(request.name or f"s{id(request)}")
        return f

    def close_session(self, session: str) -> Future[None]:
        f: Future[None] = Future()
        f.set_result(None)
        return f

    def chat(self, request: P.Chat, listener: StreamListener) -> Future[Any]:
        self.chats += 1
        return Future()  # queued behind the long line

    def save_session(self, session: str, path: Path) -> Future[int]:
        return Future()

    def restore_session(self, path: Path, session: str | None = None) -> Future[str]:
        return Future()

    def set_priority(self, session: str, priority: int) -> None:
        pass

    def session_info(self) -> dict[str, dict[str, Any]]:
        return {}

    def frame(self, client: str, request: P.Frame) -> None:
        pass

    def reserve_vram(self, request: P.ReserveVram, done: ReservationDone) -> None:
        self.reservations += 1  # a model load in progress: answered when it ends

    def status(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


@pytest.fixture()
def server(tmp_path) -> Iterator[tuple[str, _Stalled]]:
    backend = _Stalled()
    srv = Server(ServerConfig(endpoint=f"ipc://{tmp_path / 'caps.sock'}", model_dir=tmp_path),
                 backend)
    srv.service.model_name = backend.model_name
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.bound, backend
    srv.stopping.set()
    t.join(5)


def _client(endpoint: str, minor: int = 2) -> zmq.Socket:
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.connect(endpoint)
    s.send(P.encode(1, "hello", {"protocol": P.PROTOCOL_VERSION, "minor": minor}))
    assert _reply(s)[1] == "ok"
    return s


def _reply(s: zmq.Socket, expect: int | None = None) -> tuple[int, str, dict]:
    while True:
        assert s.poll(10_000), "no answer"
        rid, rtype, body = P.decode_reply(s.recv())
        if rtype != "heartbeat" and (expect is None or rid == expect):
            return rid, rtype, body


def _answers(s: zmq.Socket, seconds: float) -> list[tuple[int, str, dict]]:
    """What the server said within ``seconds``, heartbeats left out."""
    out, deadline = [], time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0 and s.poll(int(left * 1000) + 1):
        reply = P.decode_reply(s.recv())
        if reply[1] != "heartbeat":
            out.append(reply)
    return out


def _chat_with_image(s: zmq.Socket, msg_id: int, sid: str) -> None:
    image = {"data": b"\x89PNG" + bytes(P.MAX_IMAGE_BYTES - 8)}  # 16 MiB
    s.send(P.encode(msg_id, "chat", {"session": sid, "text": "look", "images": [image]}))


def test_queued_image_bytes_are_capped_per_client_and_in_all(server) -> None:
    endpoint, backend = server
    cfg = ServerConfig()
    per_client = cfg.max_image_bytes_per_client // P.MAX_IMAGE_BYTES  # 16 MiB images
    in_all = cfg.max_image_bytes // P.MAX_IMAGE_BYTES
    clients, accepted, refused = [], 0, 0
    for _ in range(4):
        s = _client(endpoint)
        s.send(P.encode(2, "open_session", {}))
        sid = _reply(s, 2)[2]["session"]
        clients.append(s)
        for k in range(3):
            _chat_with_image(s, 10 + k, sid)
            answers = _answers(s, 0.3)  # a refusal comes at once; an accepted line says nothing
            for _, rtype, body in answers:
                assert (rtype, body["code"], body["retryable"]) == ("error", "busy", True), body
            refused += len(answers)
            accepted += not answers
    assert backend.chats == accepted == min(4 * per_client, in_all), (accepted, refused)
    for s in clients:
        s.close(0)


def test_reservations_in_flight_are_capped(server) -> None:
    endpoint, backend = server
    s = _client(endpoint)
    cap = ServerConfig().max_reservations
    for i in range(cap + 5):
        s.send(P.encode(100 + i, "reserve_vram", {"bytes": 1 << 20, "deadline_frames": 10}))
    answers = _answers(s, 1.0)
    assert all((rtype, body["code"]) == ("error", "busy") for _, rtype, body in answers)
    busy = len(answers)
    assert (backend.reservations, busy) == (cap, 5)
    s.close(0)
