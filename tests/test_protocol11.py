"""Protocol 1.1 against the real sidecar: leases and orphaned sessions, goodbye, listing and
adoption, version negotiation, ignored fields, set_priority, stream resumption, and a typed end
for every request type."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import msgpack
import pytest
import zmq

from igi_sdk.client import BridgeError, Client
from igi_sdk.wire import protocol as P
from tests.sidecars import start_sidecar, stop

GREEDY = {"temperature": 0.0, "seed": 1}
# the game's owner key: its runs (connections) share their sessions, nobody else sees them
OWNER = "protocol11-test-game-owner"


class Raw:
    """A bare DEALER that sends only what the test says: a game that crashes or hangs is a
    client that simply stops sending."""

    def __init__(self, endpoint: str, routing_id: bytes | None = None) -> None:
        self.sock = zmq.Context.instance().socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        if routing_id:
            self.sock.setsockopt(zmq.ROUTING_ID, routing_id)
        self.sock.connect(endpoint)
        self.ids = iter(range(1, 10**6))
        self.inbox: list[tuple[int, str, dict]] = []

    def send(self, msg_type: str, body: dict | None = None) -> int:
        msg_id = next(self.ids)
        self.sock.send(P.encode(msg_id, msg_type, body or {}))
        return msg_id

    def events(self, msg_id: int, until: tuple[str, ...] = ("ok", "error", "done"),
               timeout: float = 60.0) -> list[tuple[str, dict]]:
        """Every event for ``msg_id`` up to and including the first of type ``until``."""
        got: list[tuple[str, dict]] = []
        deadline = time.monotonic() + timeout
        while True:
            for m in list(self.inbox):
                if m[0] == msg_id:
                    self.inbox.remove(m)
                    got.append((m[1], m[2]))
                    if m[1] in until:
                        return got
            left = deadline - time.monotonic()
            assert left > 0, f"no answer to request {msg_id}: {got}"
            if self.sock.poll(int(left * 1000)):
                rid, rtype, body = P.decode_reply(self.sock.recv())
                if rtype != "heartbeat":
                    self.inbox.append((rid, rtype, body))

    def request(self, msg_type: str, body: dict | None = None) -> tuple[str, dict]:
        return self.events(self.send(msg_type, body))[-1]

    def ok(self, msg_type: str, body: dict | None = None) -> dict:
        rtype, rbody = self.request(msg_type, body)
        assert rtype == "ok", rbody
        return rbody

    def hello(self, **extra) -> dict:
        return self.ok("hello", {"protocol": 1, "minor": 1, "owner": OWNER, **extra})

    def close(self) -> None:
        self.sock.close(0)


@pytest.fixture(scope="module")
def endpoint(tmp_path_factory, default_model):
    d = tmp_path_factory.mktemp("models11")
    shutil.copy(default_model, d / "smol.gguf")
    ep = f"ipc://{tmp_path_factory.mktemp('ipc11') / 's.sock'}"
    proc = start_sidecar(d, ep, "--model", "smol.gguf", "--max-sessions", "4",
                         "--max-sessions-per-client", "3")
    probe = Client(ep, timeout=60)
    probe.wait_ready(60)
    probe.close()
    yield ep
    stop(proc)


def _leave_nothing(ep: str) -> None:
    """Close every session the sidecar lists as adoptable (tests start from a clean slate)."""
    r = Raw(ep)
    r.hello()
    for s in r.ok("list_sessions")["sessions"]:
        r.ok("adopt_session", {"session": s["session"]})
    r.ok("goodbye", {"keep_sessions": False})
    r.close()


def test_hello_negotiates_minor_versions_and_lists_features(endpoint) -> None:
    r = Raw(endpoint)
    ok = r.ok("hello", {"protocol": 1, "minor": 7, "lease_s": 5, "future_field": True})
    assert ok["protocol"] == 1 and ok["minor"] == P.PROTOCOL_MINOR and ok["lease_s"] == 5
    assert {"goodbye", "leases", "resume_stream", "set_priority"} <= set(ok["features"])
    assert ok["ignored"] == ["future_field"]
    for bad in (2, 0, 2**31 + 1):
        rtype, body = r.request("hello", {"protocol": bad})
        assert (rtype, body["code"]) == ("error", "unsupported_version")
    r.close()


def test_unknown_fields_are_ignored_and_reported_in_ok_and_done(endpoint) -> None:
    r = Raw(endpoint)
    r.hello()
    sid = r.ok("open_session", {"system_prompt": "You are a guard.", "mood": "grumpy",
                                "sampling": {**GREEDY, "mirostat": 2}})
    assert sorted(sid["ignored"]) == ["mood", "sampling.mirostat"]
    events = r.events(r.send("chat", {"session": sid["session"], "text": "Halt!",
                                      "max_tokens": 4, "emotion": "fear"}))
    assert events[-1][0] == "done" and events[-1][1]["ignored"] == ["emotion"]
    _, body = r.request("chat", {"session": sid["session"], "text": 5})
    assert body["code"] == "invalid_body"  # known fields stay strictly typed
    r.ok("goodbye")
    r.close()


def test_json_schema_may_come_as_a_json_string(endpoint) -> None:
    c = Client(endpoint, timeout=60)
    sid = c.open_session("You are a merchant.", sampling=GREEDY)
    schema = json.dumps({"type": "object", "properties": {"price": {"type": "integer"}},
                         "required": ["price"]})
    done = c.chat(sid, "How much for the sword?", max_tokens=24, json_schema=schema).result()
    assert isinstance(json.loads(done["text"])["price"], int)
    with pytest.raises(BridgeError) as e:
        c.chat(sid, "Again?", json_schema="[1, 2]").result()
    assert e.value.code == "invalid_body"
    c.close()


def test_three_play_mode_runs_that_never_close_leave_room_for_the_fourth(endpoint) -> None:
    """The Editor keeps the sidecar alive between play-mode runs; each run opens sessions and
    quits without closing them (a crash, or a stop button). The model has 4 slots."""
    _leave_nothing(endpoint)
    for run in range(3):
        r = Raw(endpoint)
        r.hello(lease_s=2)
        for k in range(3):
            r.ok("open_session", {"persona": f"npc{k}", "name": f"run{run}.npc{k}"})
        if run == 1:
            r.ok("goodbye", {"keep_sessions": True})  # a clean quit that keeps them
        else:
            time.sleep(3)  # runs 0 and 2: gone without a word; their 2 s leases lapse
        r.close()
    fourth = Raw(endpoint)
    fourth.hello()
    opened = [fourth.ok("open_session", {"persona": f"npc{k}"})["session"] for k in range(3)]
    assert len(set(opened)) == 3
    listing = fourth.ok("list_sessions")
    assert listing["others"] == 0 and {s["owner"] for s in listing["sessions"]} <= {
        "you", "orphaned"}
    assert sum(s["owner"] == "you" for s in listing["sessions"]) == 3
    fourth.ok("goodbye")
    fourth.close()


def test_a_lapsed_lease_orphans_sessions_that_a_new_client_adopts(endpoint) -> None:
    _leave_nothing(endpoint)
    old = Raw(endpoint, routing_id=b"editor-run-1")
    old.hello(lease_s=2)
    sid = old.ok("open_session", {"system_prompt": "You are Brom, a smith.", "persona": "brom",
                                  "name": "npc.brom", "sampling": GREEDY})["session"]
    assert sid == "npc.brom"
    first = old.events(old.send("chat", {"session": sid, "text": "I need a sword.",
                                         "max_tokens": 8}))[-1]
    assert first[0] == "done"
    rtype, body = old.request("open_session", {"name": "npc.brom"})
    assert body["code"] == "session_exists"
    old.close()  # the game stops; no goodbye

    new = Raw(endpoint)
    new.hello()
    rtype, body = new.request("adopt_session", {"session": sid})
    assert body["code"] == "session_owned"  # the lease has not lapsed yet
    time.sleep(3.5)
    listing = new.ok("list_sessions")["sessions"]
    mine = next(s for s in listing if s["session"] == sid)
    assert mine["owner"] == "orphaned" and mine["persona"] == "brom" and mine["tokens"] > 10
    rtype, body = new.request("open_session", {"name": sid})
    assert body["code"] == "session_exists" and "adopt" in body["message"]
    assert new.ok("adopt_session", {"session": sid}) == {"session": sid}
    done = new.events(new.send("chat", {"session": sid, "text": "How much is it?",
                                        "max_tokens": 8}))[-1]
    assert done[0] == "done" and done[1]["usage"]["prompt_tokens"] > 0
    after = next(s for s in new.ok("list_sessions")["sessions"] if s["session"] == sid)
    assert after["owner"] == "you" and after["tokens"] > mine["tokens"]  # the same talk

    again = Raw(endpoint, routing_id=b"editor-run-1")  # the forgotten client comes back
    rtype, body = again.request("ping")
    assert (rtype, body["code"], body["retryable"]) == ("error", "hello_required", True)
    again.close()
    new.ok("goodbye")
    new.close()


def test_goodbye_closes_sessions_and_the_next_request_needs_hello(endpoint) -> None:
    _leave_nothing(endpoint)
    r = Raw(endpoint)
    r.hello()
    for k in range(2):
        r.ok("open_session", {"persona": f"p{k}"})
    assert r.ok("goodbye") == {"closed": 2, "orphaned": 0}
    _, body = r.request("list_sessions")
    assert body["code"] == "hello_required"
    r.hello()
    assert r.ok("list_sessions")["sessions"] == []
    r.close()


def test_a_1_0_client_keeps_its_sessions_through_a_silence_that_lapses_a_lease(
        endpoint) -> None:
    """In the same silence a 1.1 client's 2 s lease lapses (its session is orphaned) and a 1.0
    client, which knows no leases, keeps its own (the rule at the default lease, 15 s, is
    tests/test_protocol11.py::test_the_lease_rule_at_the_default_lease)."""
    _leave_nothing(endpoint)
    legacy = Raw(endpoint)
    legacy.ok("hello", {"protocol": 1})  # no minor: 1.0 rules, no lease
    sid = legacy.ok("open_session", {"persona": "old"})["session"]
    leased = Raw(endpoint)
    leased.hello(lease_s=2)
    lapsing = leased.ok("open_session", {"persona": "new"})["session"]
    time.sleep(3.5)
    other = Raw(endpoint)
    other.hello()
    listed = {s["session"]: s["owner"] for s in other.ok("list_sessions")["sessions"]}
    assert listed.get(lapsing) == "orphaned" and sid not in listed
    assert legacy.ok("close_session", {"session": sid}) == {}
    assert other.ok("adopt_session", {"session": lapsing}) == {"session": lapsing}
    assert other.ok("close_session", {"session": lapsing}) == {}
    for c in (other, leased, legacy):
        c.close()


def test_the_lease_rule_at_the_default_lease(tmp_path) -> None:
    """A 1.1 client silent past the default 15 s lease is forgotten (its sessions orphaned);
    a 1.0 client silent as long is kept: it knows no leases (the longest one applies)."""
    from igi_sdk.serving.clients import Client as Connected
    from igi_sdk.serving.server import Server, ServerConfig

    class NoModel:
        model_name = None

        def close(self) -> None:
            pass

    server = Server(ServerConfig(endpoint=f"ipc://{tmp_path / 'lease.sock'}",
                                 model_dir=tmp_path), NoModel())  # type: ignore[arg-type]
    try:
        silent_since = time.monotonic() - 17  # past the default lease
        for ident, minor in ((b"legacy", 0), (b"leased", 1)):
            server.service.clients[ident] = Connected(ident, minor=minor, last_seen=silent_since)
        assert P.Hello(protocol=1).lease_s == 15.0
        server.service.heartbeat()
        assert set(server.service.clients) == {b"legacy"}
    finally:
        server.close()


def test_a_leased_client_that_pings_keeps_its_sessions_and_heartbeats(endpoint) -> None:
    c = Client(endpoint, timeout=60, lease_s=2.0)  # its keep-alive thread pings every 0.67 s
    sid = c.open_session("You are a guard.")
    time.sleep(4)  # twice the lease, with nothing sent by the program itself
    assert any(s["session"] == sid and s["owner"] == "you"
               for s in c.list_sessions()["sessions"])
    c.set_priority(sid, 90)
    assert next(s for s in c.list_sessions()["sessions"] if s["session"] == sid)[
        "priority"] == 90
    with pytest.raises(BridgeError) as e:
        c.set_priority("not-mine", 1)
    assert e.value.code == "unknown_session"
    c.close()


def test_a_stream_resumes_after_lost_events(endpoint) -> None:
    r = Raw(endpoint)
    r.hello()
    sid = r.ok("open_session", {"system_prompt": "You are a bard.", "sampling": GREEDY})[
        "session"]
    chat = r.send("chat", {"session": sid, "text": "Sing me a song.", "max_tokens": 24,
                           "stop": []})
    events = r.events(chat, until=("done", "error"))
    tokens = [b for t, b in events if t == "token"]
    assert events[-1][0] == "done" and len(tokens) >= 3
    # the connection dropped after the second token: ask for the rest again
    resume = r.send("resume_stream", {"request": chat, "after": 2})
    ok = r.events(resume)[-1]
    assert ok == ("ok", {"running": False, "replayed": len(tokens) - 1})
    again = r.events(chat, until=("done", "error"))
    assert [b["i"] for t, b in again if t == "token"] == [t["i"] for t in tokens[2:]]
    assert again[-1] == events[-1]
    _, body = r.request("resume_stream", {"request": 424242})
    assert body["code"] == "unknown_stream"
    r.ok("goodbye")
    r.close()


def test_a_running_stream_resumes_and_continues(endpoint) -> None:
    r = Raw(endpoint)
    # a bare client sends no keep-alive pings: this 200-token reply beside two busy CPUs
    # outlasted the default 15 s lease, and the goodbye after it met a forgotten client
    r.hello(lease_s=120)
    sid = r.ok("open_session", {"system_prompt": "You are a bard.", "sampling": GREEDY})[
        "session"]
    chat = r.send("chat", {"session": sid, "text": "Tell a long tale.", "max_tokens": 200})
    first = r.events(chat, until=("token",))
    ok = r.events(r.send("resume_stream", {"request": chat, "after": 0}))[-1]
    assert ok[0] == "ok" and ok[1]["replayed"] >= 1
    rest = r.events(chat, until=("done", "error"))
    seen = [b["i"] for t, b in first + rest if t == "token"]
    # replayed events may repeat ones already received; by i the stream is whole and in order
    assert sorted(set(seen)) == list(range(1, max(seen) + 1)) and rest[-1][0] == "done"
    r.ok("goodbye")
    r.close()


# one body per request type: each must end with exactly one ok or error, within its bound
ENDS = {
    "ping": {}, "stats": {}, "list_sessions": {}, "frame": {"frame": 1, "frame_time_ms": 16.6},
    "reserve_vram": {"bytes": 1, "deadline_frames": 1}, "cancel": {"request": 99},
    "set_priority": {"session": "nope", "priority": 1}, "adopt_session": {"session": "nope"},
    "resume_stream": {"request": 99}, "open_session": {}, "close_session": {"session": "nope"},
    "save_session": {"session": "nope", "name": "x"}, "restore_session": {"name": "none"},
    "load_model": {"path": "missing.gguf"}, "chat": {"session": "nope", "text": "hi"},
    "goodbye": {}, "tokenize": {"text": "hi"}, "detokenize": {"tokens": [1]},
    "embed": {"input": ["hi"]}, "complete": {"prompt": "hi", "max_tokens": 1},
}


def test_every_request_type_ends_with_a_typed_answer(endpoint) -> None:
    assert set(ENDS) | {"hello", "shutdown"} == set(P.REQUESTS)
    r = Raw(endpoint)
    r.hello()
    for msg_type, body in ENDS.items():
        t0 = time.monotonic()
        events = r.events(r.send(msg_type, body), timeout=10)
        ends = ("done", "error") if msg_type == "complete" else ("ok", "error")
        assert events[-1][0] in ends, (msg_type, events)
        assert time.monotonic() - t0 < 6, msg_type  # reserve_vram's bound is 5 s
        if events[-1][0] == "error":
            assert isinstance(events[-1][1]["retryable"], bool)
    r.close()


def test_a_float32_number_is_read_as_its_value(endpoint) -> None:
    r = Raw(endpoint)
    r.hello()
    frame = msgpack.packb({"v": 1, "id": 77, "type": "frame",
                           "body": {"frame": 5, "frame_time_ms": 16.6,
                                    "target_frame_time_ms": 16.6}}, use_single_float=True)
    r.sock.send(frame)
    assert r.events(77)[-1] == ("ok", {"paced": True})  # no launch token: every client paces
    assert abs(r.ok("stats")["last_frame"]["frame_time_ms"] - 16.6) < 1e-5
    r.close()


def test_orphans_wait_at_most_their_ttl(tmp_path, default_model) -> None:
    shutil.copy(default_model, tmp_path / "smol.gguf")
    ep = f"ipc://{tmp_path / 's.sock'}"
    proc = start_sidecar(tmp_path, ep, "--model", "smol.gguf", "--orphan-ttl", "1")
    try:
        Client(ep, timeout=60).wait_ready(60)
        r = Raw(ep)
        r.hello()
        r.ok("open_session", {"name": "npc.short"})
        r.ok("goodbye", {"keep_sessions": True})
        r.hello()
        assert [s["session"] for s in r.ok("list_sessions")["sessions"]] == ["npc.short"]
        time.sleep(2.5)
        assert r.ok("list_sessions")["sessions"] == []
        r.close()
    finally:
        stop(proc)


def test_named_restore(endpoint, tmp_path: Path) -> None:
    _leave_nothing(endpoint)
    c = Client(endpoint, timeout=60)
    sid = c.open_session("You are Mira.", name="npc.mira")
    c.chat(sid, "Hello!", max_tokens=4).result()
    c.save_session(sid, "mira-slot1")
    with pytest.raises(BridgeError) as e:
        c.restore_session("mira-slot1", session="npc.mira")
    assert e.value.code == "session_exists"
    c.close_session(sid)
    assert c.restore_session("mira-slot1", session="npc.mira") == "npc.mira"
    c.close()


def test_load_model_with_a_draft(tmp_path, default_model, tiny_llama) -> None:
    """``load_model.draft``: the default model loads as its own draft (one that cannot pay, so
    it drafts nothing); a draft of another vocabulary fails the load with a typed error; a
    draft path obeys the model directory."""
    shutil.copy(default_model, tmp_path / "smol.gguf")
    shutil.copy(tiny_llama, tmp_path / "tiny.gguf")
    ep = f"ipc://{tmp_path / 's.sock'}"
    proc = start_sidecar(tmp_path, ep)
    try:
        c = Client(ep, timeout=120)
        assert "draft_model" in c.hello()["features"]
        with pytest.raises(BridgeError) as e:
            c.load_model("smol.gguf", draft="../smol.gguf")
        assert e.value.code == "forbidden_path"
        c.load_model("smol.gguf", n_ctx=1024, max_sessions=2, draft="smol.gguf")
        assert c.stats()["engine"]["speculative"]["draft"].endswith("smol.gguf")
        sid = c.open_session("You are a bard.", sampling=GREEDY)
        assert c.chat(sid, "Tell me a long tale of the old king.",
                      max_tokens=48).result()["usage"]["completion_tokens"] > 8
        # a same-size draft on the CPU could not pay even with every draft kept: it is
        # priced from the weights both read per token and never decodes (no draft work)
        assert c.stats()["engine"]["speculative"]["drafted"] == 0
        with pytest.raises(BridgeError) as e:
            c.load_model("smol.gguf", n_ctx=1024, max_sessions=2, draft="tiny.gguf")
        assert e.value.code == "model_load_failed" and not e.value.retryable
        c.load_model("smol.gguf", n_ctx=1024, max_sessions=2)  # and the sidecar goes on
        assert c.stats()["engine"]["speculative"]["draft"] is None
        c.close()
    finally:
        stop(proc)
