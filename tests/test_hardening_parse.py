"""Nothing a message holds can stop the sidecar: every request type with pathological nesting,
a json_schema string nested far past any parser's recursion, an oversized or extended image —
each answered with a typed error against its own id, and the sidecar keeps serving."""

from __future__ import annotations

import shutil

import msgpack
import pytest
import zmq

from igi_sdk.wire import protocol as P
from tests.sidecars import start_sidecar, stop
from tests.test_hardening_server import _next, _raw_session


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory, tiny_llama):
    d = tmp_path_factory.mktemp("parse")
    shutil.copy(tiny_llama, d / "tiny.gguf")
    endpoint = f"ipc://{tmp_path_factory.mktemp('parse-ipc') / 's.sock'}"
    proc = start_sidecar(d, endpoint, "--model", "tiny.gguf", "--no-arbiter")
    yield endpoint, proc
    stop(proc)


def _leave(s: zmq.Socket) -> None:
    s.send(P.encode(99, "goodbye", {}))  # its session closes: the next test has the slot
    _next(s)
    s.close(0)


def _deep(n: int, leaf: object = "x") -> object:
    value = leaf
    for i in range(n):
        value = [value] if i % 2 else {"k": value}
    return value


def _json_string(n: int) -> str:
    return '{"a":' * n + "1" + "}" * n


def test_the_depth_scans_are_bounded_and_exact() -> None:
    assert P.nesting(_deep(10), 64) == 10
    assert P.nesting(_deep(100_000), 64) == 65  # gives up past the limit, without recursion
    assert P.json_nesting(_json_string(5)) == 5
    assert P.json_nesting('{"a": "[[[[{{{{", "b": [1, {"c": "\\"]]"}]}') == 3
    assert P.json_nesting("[" * 100_000) == 100_000


@pytest.mark.parametrize("msg_type", sorted(P.REQUESTS))
def test_every_request_type_with_pathological_nesting_gets_a_typed_error(sidecar,
                                                                         msg_type) -> None:
    endpoint, proc = sidecar
    s, _ = _raw_session(endpoint)
    fields = list(P.REQUESTS[msg_type].model_fields) or ["x"]
    for depth in (P.MAX_NESTING + 1, 500):
        for n, field in enumerate(fields):
            msg_id = 1000 + depth + n
            s.send(P.encode(msg_id, msg_type, {field: _deep(depth)}))
            rid, rtype, body = _next(s)
            assert (rid, rtype) == (msg_id, "error"), (msg_type, field, body)
            assert body["code"] in ("invalid_body", "malformed"), body
    # deeper than msgpack's own unpacker allows: unreadable, answered against id 0
    head = msgpack.packb({"v": 1, "id": 7, "type": msg_type, "body": {"x": None}})
    s.send(head[:-1] + b"\x91" * 5000 + b"\xc0")  # msgpack's packer would refuse to write it
    rid, rtype, body = _next(s)
    assert rtype == "error" and body["code"] in ("malformed", "invalid_body"), body
    s.send(P.encode(9, "ping", {}))
    assert _next(s)[:2] == (9, "ok")
    assert proc.poll() is None
    _leave(s)


def test_a_json_schema_string_nested_a_thousand_deep_is_refused(sidecar) -> None:
    """Was: json.loads raised RecursionError inside the validator, outside the handler's try,
    and the sidecar exited (a 2 KB chat, before hello even)."""
    endpoint, proc = sidecar
    s, sid = _raw_session(endpoint)
    for n, depth in enumerate((P.MAX_NESTING + 1, 1_000, 30_000)):
        s.send(P.encode(50 + n, "chat", {"session": sid, "text": "hi",
                                         "json_schema": _json_string(depth)[:P.MAX_TEXT_CHARS]}))
        rid, rtype, body = _next(s)
        assert (rid, rtype, body["code"]) == (50 + n, "error", "invalid_body"), body
        assert "deep" in body["message"] or "JSON" in body["message"]
    s.send(P.encode(60, "chat", {"session": sid, "text": "hi", "max_tokens": 2}))
    while (reply := _next(s))[1] not in ("done", "error"):
        pass
    assert reply[:2] == (60, "done"), reply
    assert proc.poll() is None
    _leave(s)


def test_an_oversized_image_is_answered_against_its_own_id(sidecar) -> None:
    endpoint, _ = sidecar
    s, sid = _raw_session(endpoint)
    big = b"\x89PNG" + bytes(P.MAX_IMAGE_BYTES)  # one byte over the image limit, in the message
    s.send(P.encode(70, "chat", {"session": sid, "text": "look", "images": [{"data": big}]}))
    rid, rtype, body = _next(s)
    assert (rid, rtype, body["code"]) == (70, "error", "invalid_body"), body
    _leave(s)


def test_an_unknown_field_inside_an_image_is_ignored_and_named() -> None:
    """A newer client's optional image field must not break an older sidecar."""
    frame = P.encode(3, "chat", {"session": "npc", "text": "look", "images": [
        {"data": b"\x89PNG", "colorspace": "srgb"}, {"pixels": b"\0\0\0", "width": 1,
                                                     "height": 1, "hdr": True}]})
    req = P.parse_request(frame)
    assert req.ignored == ("images.0.colorspace", "images.1.hdr")
    assert len(req.body.images) == 2  # type: ignore[attr-defined]
