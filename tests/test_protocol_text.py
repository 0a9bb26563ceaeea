"""What bridge/PROTOCOL.md says is what the sidecar does, point by point, where a third client
written from the text alone would trip: over-limit values answered under their own id, the lease
a 1.0 client is told, which messages keep a lease, orphans counted as reclaimable, unknown keys
allowed by the schemas, unique vector ids and the game-PID watch's bound. The server runs
in-process over a model side whose work never ends (tests/test_server_caps.py), so nothing here
loads a model."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq

from bridge import generate as G  # the repository's generator
from igi_sdk.serving.server import PID_POLL_S, Server, ServerConfig
from igi_sdk.wire import protocol as P
from tests.test_server_caps import _client, _reply, _Stalled

ROOT = Path(__file__).resolve().parents[1]
DOC = (ROOT / "bridge" / "PROTOCOL.md").read_text()


@pytest.fixture()
def serving(tmp_path) -> Iterator[tuple[str, Server]]:
    backend = _Stalled()
    srv = Server(ServerConfig(endpoint=f"ipc://{tmp_path / 'text.sock'}", model_dir=tmp_path,
                              max_sessions=2, max_sessions_per_client=2), backend)
    srv.service.model_name = backend.model_name
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv.bound, srv
    srv.stopping.set()
    t.join(5)


def _raw(msg: Any) -> bytes:
    return msgpack.packb(msg, use_bin_type=True)


# --- an over-limit value ends its request -------------------------------------------------------


OVER_LIMIT = {
    "array of 4097 items": {"v": 1, "id": 40, "type": "stats", "body": {"x": [0] * 4097}},
    "map of 257 entries": {"v": 1, "id": 41, "type": "stats",
                           "body": {f"k{i}": 0 for i in range(257)}},
    "str over 1 MiB": {"v": 1, "id": 42, "type": "chat",
                       "body": {"session": "npc", "text": "a" * (P.MAX_STR_BYTES + 1)}},
    "id after the body": {"body": {"x": [0] * 5000}, "type": "stats", "v": 1, "id": 43},
}


@pytest.mark.parametrize("what", sorted(OVER_LIMIT))
def test_a_value_past_the_limits_is_answered_under_the_requests_own_id(what: str) -> None:
    """Was: malformed with id 0, so a client waiting on that id never saw its request end."""
    msg = OVER_LIMIT[what]
    with pytest.raises(P.EnvelopeError) as e:
        P.parse_request(_raw(msg))
    assert (e.value.code, e.value.msg_id) == ("malformed", msg["id"]), e.value.message
    assert "limits" in e.value.message


def test_a_non_string_key_is_answered_under_the_id_and_garbage_under_0() -> None:
    with pytest.raises(P.EnvelopeError) as e:
        P.parse_request(msgpack.packb({1: "x", "v": 1, "id": 3, "type": "ping"}))
    assert (e.value.code, e.value.msg_id) == ("malformed", 3)
    whole = msgpack.packb({"v": 1, "id": 5, "type": "ping", "body": {"x": [0] * 5000}})
    for unreadable in (b"\xc1hello", whole[:-1], whole + b"\xc0", _raw([1, 5, "ping", {}]),
                       _raw({"v": 1, "id": True, "body": {"x": [0] * 5000}}),
                       _raw({"v": 1, "id": -1, "body": {"x": [0] * 5000}})):
        with pytest.raises(P.EnvelopeError) as e:
            P.parse_request(unreadable)
        assert (e.value.code, e.value.msg_id) == ("malformed", 0), unreadable[:16]


def test_reading_the_id_of_a_full_size_message_is_cheap() -> None:
    """The id is read with the C unpacker's skip, never by building the values: a 16 MiB
    array of nils costs a small fraction of the full decode the limits refuse."""
    frame = _raw({"v": 1, "body": {"x": [None] * (16 << 20)}, "type": "stats", "id": 9})
    t0 = time.perf_counter()
    assert P.peek_id(frame) == 9
    peek = time.perf_counter() - t0
    t0 = time.perf_counter()
    msgpack.unpackb(frame, max_array_len=len(frame))
    full = time.perf_counter() - t0
    assert peek < full / 3, (peek, full)


def test_the_sidecar_answers_an_over_limit_request_under_its_id_and_serves_on(serving) -> None:
    endpoint, _ = serving
    s = _client(endpoint)
    for msg in OVER_LIMIT.values():
        s.send(_raw(msg))
        rid, rtype, body = _reply(s)
        assert (rid, rtype, body["code"]) == (msg["id"], "error", "malformed"), body
    s.send(P.encode(50, "ping"))
    assert _reply(s)[:2] == (50, "ok")
    s.close(0)


# --- leases ---------------------------------------------------------------------------------------


def test_a_1_0_client_is_told_the_lease_it_is_under(serving) -> None:
    """Was: hello answered a 1.0 client the lease it asked for (15 s by default) while the
    heartbeat held it to the longest one, 300 s."""
    endpoint, _ = serving
    for minor, asked, granted in ((0, None, P.MAX_LEASE_S), (0, 5.0, P.MAX_LEASE_S),
                                  (1, 5.0, 5.0), (2, 3600.0, P.MAX_LEASE_S)):
        s = zmq.Context.instance().socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.connect(endpoint)
        body: dict[str, Any] = {"protocol": 1, "minor": minor}
        if asked is not None:
            body["lease_s"] = asked
        s.send(P.encode(1, "hello", body))
        _, rtype, ok = _reply(s)
        assert rtype == "ok" and ok["lease_s"] == granted, (minor, asked, ok["lease_s"])
        s.close(0)


def test_only_accepted_requests_keep_a_lease(tmp_path) -> None:
    """§1.1: a message answered with a validation error does not keep the lease; any request
    that passes validation does, whatever its answer."""
    from igi_sdk.serving.clients import Client as Connected

    server = Server(ServerConfig(endpoint=f"ipc://{tmp_path / 'lease.sock'}",
                                 model_dir=tmp_path), _Stalled())
    try:
        long_ago = time.monotonic() - 100
        server.service.clients[b"c"] = Connected(b"c", minor=2, last_seen=long_ago)
        for invalid in (b"\xc1", P.encode(2, "summon_dragon"), P.encode(3, "frame", {}),
                        _raw({"v": 2, "id": 4, "type": "ping"}),
                        _raw({"v": 1, "id": 5, "type": "stats", "body": {"x": [0] * 5000}})):
            server.service.handle(b"c", invalid)
            assert server.service.clients[b"c"].last_seen == long_ago
        server.service.handle(b"c", P.encode(6, "close_session", {"session": "nope"}))  # an error,
        assert server.service.clients[b"c"].last_seen > long_ago  # but a valid request: it counts
    finally:
        server.close()


# --- list_sessions: orphans are reclaimable -----------------------------------------------------


def test_list_sessions_counts_the_orphans_a_newcomer_can_reclaim(serving) -> None:
    """Was: free_slots 0 while every slot held an orphan that the next open_session closes."""
    endpoint, _ = serving
    gone = _client(endpoint)
    for n in (2, 3):
        gone.send(P.encode(n, "open_session", {"name": f"npc{n}"}))
        assert _reply(gone, n)[1] == "ok"
    gone.send(P.encode(4, "goodbye", {"keep_sessions": True}))
    assert _reply(gone, 4)[2] == {"closed": 0, "orphaned": 2}
    new = _client(endpoint)
    new.send(P.encode(2, "list_sessions"))
    listing = _reply(new, 2)[2]
    assert (listing["free_slots"], listing["reclaimable"], listing["others"]) == (0, 2, 2)
    new.send(P.encode(3, "open_session", {}))
    assert _reply(new, 3)[1] == "ok"  # an orphan made room
    new.send(P.encode(4, "list_sessions"))
    listing = _reply(new, 4)[2]
    assert (listing["free_slots"], listing["reclaimable"]) == (0, 1)
    for s in (gone, new):
        s.close(0)


# --- unknown keys: ignored by the sidecar, allowed by the schemas -------------------------------


def _closed_objects(schema: Any, where: str = "") -> list[str]:
    if isinstance(schema, dict):
        found = [where or "/"] if schema.get("additionalProperties") is False else []
        for k, v in schema.items():
            found += _closed_objects(v, f"{where}/{k}")
        return found
    if isinstance(schema, list):
        return [x for i, v in enumerate(schema) for x in _closed_objects(v, f"{where}/{i}")]
    return []


def test_request_schemas_allow_the_fields_the_sidecar_ignores() -> None:
    """Was: every body schema (and sampling, images, history turns, the envelope) said
    additionalProperties false while the sidecar ignores and names unknown keys."""
    for msg_type in P.REQUESTS:
        schema = json.loads((ROOT / "bridge" / "schema" / f"{msg_type}.json").read_text())
        assert _closed_objects(schema) == [], msg_type
    envelope = json.loads((ROOT / "bridge" / "schema" / "envelope.json").read_text())
    assert envelope["$defs"]["request"]["additionalProperties"] is True
    req = P.parse_request(_raw({"v": 1, "id": 7, "type": "open_session", "trace": "t1",
                                "body": {"sampling": {"mirostat": 2, "seed": 3},
                                         "mood": "grim"}}))
    assert set(req.ignored) == {"sampling.mirostat", "mood"}
    assert "refused" not in _section("### `open_session`")
    assert "unknown envelope key" not in DOC


def _section(heading: str) -> str:
    """The text under ``heading`` up to the next heading of any level."""
    start = DOC.index(heading)
    nxt = re.compile(r"\n#{2,4} ").search(DOC, start + 1)
    return DOC[start:nxt.start() if nxt else len(DOC)]


# --- vectors --------------------------------------------------------------------------------------


def test_vector_ids_are_unique_but_for_variants_of_one_request() -> None:
    """Ids of request vectors: shared only by variants of one request type (the reply vectors
    answer them by id), and every refused vector's answer id is its own (0 aside)."""
    vecs = G.vectors()
    by_id: dict[int, set[str]] = {}
    for v in vecs:
        if v.direction == "request" and isinstance(v.message, dict):
            i = v.message.get("id")
            if isinstance(i, int) and not isinstance(i, bool):
                by_id.setdefault(i, set()).add(str(v.message.get("type")))
    shared = {i: types for i, types in by_id.items() if len(types) > 1}
    assert not shared, f"request vectors of different types share an id: {shared}"
    answers = [v.expect["id"] for v in vecs
               if v.expect is not None and v.expect["type"] == "error" and v.expect["id"]]
    assert len(answers) == len(set(answers)), sorted(answers)
    ok_ids = {v.message["id"] for v in vecs if v.direction == "request"
              and v.expect == {"type": "ok", "reply": "ok"}}
    assert not ok_ids & set(answers)


# --- the game-PID watch ---------------------------------------------------------------------------


def test_the_pid_watch_stops_the_sidecar_within_its_poll(tmp_path) -> None:
    """§10: the watch polls every PID_POLL_S; the serving loop stops within a poll (plus a
    scheduling slice) of the game's end. The whole process's exit adds the model's close."""
    game = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        srv = Server(ServerConfig(endpoint=f"ipc://{tmp_path / 'pid.sock'}", model_dir=tmp_path,
                                  game_pid=game.pid), _Stalled())
        t = threading.Thread(target=srv.serve_forever, daemon=True)
        t.start()
        deadline = time.monotonic() + 5
        while srv.service._pid_watch is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(PID_POLL_S * 1.5)  # mid-poll
        game.kill()
        game.wait()
        t0 = time.monotonic()
        t.join(5)
        took = time.monotonic() - t0
        assert not t.is_alive()
        assert took < PID_POLL_S * 2, f"{took:.3f} s for a {PID_POLL_S} s poll"
    finally:
        game.kill()
    assert f"every {PID_POLL_S:g} s" in _section("## 10. Game PID watch")
