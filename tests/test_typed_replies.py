"""Every reply and event the real sidecar sends in a short session validates against its model
in ``bridge/contract.py`` with no field the model lacks: the contract (and the JSON Schema
exported from it) describes what is on the wire, not a subset of it."""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator

import pytest
import zmq
from pydantic import BaseModel

from bridge import generate as G  # the repository's generator
from igi_sdk.wire import contract as C
from igi_sdk.wire import protocol as P
from tests.sidecars import start_sidecar, stop

GREEDY = {"temperature": 0.0, "seed": 1}


class Recorder:
    """A bare DEALER that keeps every message it receives, heartbeats included."""

    def __init__(self, endpoint: str) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)
        self.ids = iter(range(1, 10**6))
        self.seen: list[tuple[int, str, dict]] = []  # every message, in order
        self.sent: dict[int, str] = {}  # request id -> type

    def send(self, msg_type: str, body: dict | None = None) -> int:
        msg_id = next(self.ids)
        self.sent[msg_id] = msg_type
        self.sock.send(P.encode(msg_id, msg_type, body or {}))
        return msg_id

    def until(self, msg_id: int, end: tuple[str, ...] = ("ok", "error", "done"),
              timeout: float = 120.0) -> tuple[str, dict]:
        """Receive until ``msg_id`` gets a message of a type in ``end``; returns it."""
        deadline = time.monotonic() + timeout
        for rid, rtype, body in self.seen:
            if rid == msg_id and rtype in end:
                return rtype, body
        while True:
            left = deadline - time.monotonic()
            assert left > 0, f"no answer to request {msg_id}"
            if self.sock.poll(int(left * 1000)):
                rid, rtype, body = P.decode_reply(self.sock.recv())
                self.seen.append((rid, rtype, body))
                if rid == msg_id and rtype in end:
                    return rtype, body

    def ok(self, msg_type: str, body: dict | None = None) -> dict:
        rtype, rbody = self.until(self.send(msg_type, body))
        assert rtype == "ok", (msg_type, rbody)
        return rbody

    def close(self) -> None:
        self.sock.close(0)


def _no_extras(value: object, where: str) -> None:
    """Fail on any field a contract model (at any depth) does not declare."""
    if isinstance(value, BaseModel):
        assert not value.model_extra, (
            f"{where} carries fields its model {type(value).__name__} lacks: "
            f"{sorted(value.model_extra or {})}")
        for name in type(value).model_fields:
            _no_extras(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _no_extras(item, f"{where}[{i}]")
    elif isinstance(value, dict):
        for k, item in value.items():
            _no_extras(item, f"{where}.{k}")


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory, default_model) -> Iterator[str]:
    d = tmp_path_factory.mktemp("typed")
    shutil.copy(default_model, d / "smol.gguf")
    ep = f"ipc://{tmp_path_factory.mktemp('ipc-typed') / 's.sock'}"
    proc = start_sidecar(d, ep)  # no model: load_model's ok is part of the session
    yield ep
    stop(proc)


def _session(r: Recorder) -> None:
    """One of every request type that has an ok, a stream, a cancelled stream, an error."""
    deadline = time.monotonic() + 60
    while True:  # the sidecar is starting
        rid = r.send("hello", {"protocol": 1, "minor": P.PROTOCOL_MINOR,
                               "owner": "typed-replies-test-owner", "lease_s": 30.0,
                               "future_field": 1})
        try:
            rtype, body = r.until(rid, timeout=2)
            assert rtype == "ok", body
            break
        except AssertionError as e:
            assert "no answer" in str(e) and time.monotonic() < deadline, e
    r.ok("load_model", {"path": "smol.gguf", "n_ctx": 2048, "max_sessions": 4})
    r.ok("ping")
    tokens = r.ok("tokenize", {"text": "Halt!", "with_pieces": True})["tokens"]
    r.ok("detokenize", {"tokens": tokens})
    r.ok("embed", {"input": ["a guard at the gate", "a gate guard"]})
    raw = r.send("complete", {"prompt": "Once upon a time", "max_tokens": 4})
    assert r.until(raw, ("done", "error"))[0] == "done"
    r.ok("frame", {"frame": 1, "frame_time_ms": 16.6, "target_frame_time_ms": 16.6,
                   "vram_used": 2**30, "vram_budget": 2**32})
    r.ok("reserve_vram", {"bytes": 2**20, "deadline_frames": 10})
    sid = r.ok("open_session", {"system_prompt": "You are a guard.", "sampling": GREEDY,
                                "mood": "grumpy"})["session"]
    named = r.ok("open_session", {"name": "npc.guard"})["session"]
    chat = r.send("chat", {"session": sid, "text": "Halt! Who goes there?", "max_tokens": 8,
                           "emotion": "fear"})
    assert r.until(chat, ("done", "error"))[0] == "done"
    r.ok("resume_stream", {"request": chat, "after": 1})
    long = r.send("chat", {"session": named, "text": "Tell me a long story.", "max_tokens": 200})
    r.until(long, ("token",))
    r.ok("cancel", {"request": long})
    assert r.until(long, ("done", "error"))[0] == "done"
    r.ok("set_priority", {"session": sid, "priority": 5})
    r.ok("save_session", {"session": sid, "name": "typed-guard"})
    r.ok("restore_session", {"name": "typed-guard"})
    r.ok("list_sessions")
    r.ok("close_session", {"session": sid})
    assert r.until(r.send("adopt_session", {"session": "nobody"}))[0] == "error"
    r.ok("adopt_session", {"session": named})
    r.ok("stats", {"unknown_field": True})
    beat = time.monotonic() + 5
    while not any(t == "heartbeat" for _, t, _ in r.seen):  # one a second
        assert time.monotonic() < beat, "no heartbeat"
        if r.sock.poll(500):
            r.seen.append(P.decode_reply(r.sock.recv()))
    r.ok("goodbye", {"keep_sessions": False})
    r.ok("hello", {"protocol": 1})  # goodbye forgot the connection
    r.ok("shutdown")


def test_every_reply_and_event_of_a_session_validates_against_its_model(endpoint) -> None:
    r = Recorder(endpoint)
    try:
        _session(r)
    finally:
        r.close()
    counts: dict[str, int] = {}
    for rid, rtype, body in r.seen:
        if rtype == "ok":
            request = r.sent[rid]
            model = C.OK_REPLIES[request]
            assert model is not None, f"{request} is answered by a stream, not an ok"
            where = f"ok({request})"
        else:
            model, where = C.EVENTS[rtype], rtype
        _no_extras(model.model_validate(body), where)
        counts[where] = counts.get(where, 0) + 1
    answered = {w[3:-1] for w in counts if w.startswith("ok(")}
    assert answered == {t for t, m in C.OK_REPLIES.items() if m is not None}, answered
    assert {"token", "done", "error", "heartbeat"} <= set(counts), counts
    stats = next(b for rid, t, b in r.seen if t == "ok" and r.sent[rid] == "stats")
    assert stats["ignored"] == ["unknown_field"] and "engine" in stats


def test_a_reply_sends_the_fields_it_was_built_with_and_no_others() -> None:
    """``wire``: null where the sidecar says null, absent where it said nothing."""
    stats = C.StatsOk(model=None, loading=False, clients=1, uptime_s=1.0, requests=1,
                      errors=0, last_frame=P.Frame(frame=3, frame_time_ms=16.6),
                      reservations=[], watching_pid=None)
    body = stats.wire()
    assert body["model"] is None and body["watching_pid"] is None
    assert "sessions" not in body and "engine" not in body and "ignored" not in body
    assert body["last_frame"] == P.Frame(frame=3, frame_time_ms=16.6).model_dump()  # whole
    assert C.Token(text="Hi", i=1).wire() == {"text": "Hi", "i": 1}


def _model_of(name: str, msg_type: str) -> type[C.Reply]:
    if msg_type != "ok":
        return C.ErrorBody if msg_type == "error" else C.EVENTS[msg_type]
    request = name.removeprefix("reply_ok_")
    model = C.OK_REPLIES["stats" if request == "ignored_fields" else request]
    assert model is not None
    return model


def test_every_golden_reply_is_the_same_bytes_when_built_from_its_model() -> None:
    """The server builds bodies from the models: field order, nulls and absent fields
    must come out as the golden vectors (and so older sidecars) put them on the wire.
    ``ignored`` goes last, as the server appends it."""
    for v in G.vectors():
        if v.direction != "reply":
            continue
        msg = v.message
        body = dict(msg["body"])
        ignored = body.pop("ignored", None)
        wire = _model_of(v.name, msg["type"]).model_validate(body).wire()
        if ignored is not None:
            wire["ignored"] = ignored
        assert P.encode(msg["id"], msg["type"], wire) == v.frame, v.name
