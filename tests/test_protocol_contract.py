"""The committed protocol contract (bridge/schema, bridge/vectors) matches the code. Pure and fast:
no sidecar, no model."""

from __future__ import annotations

import inspect
import json
import re
from pathlib import Path

import msgpack
import pytest

from bridge import generate as G  # the repository's generator (not in the installed package)
from igi_sdk import errors
from igi_sdk.serving import server, service
from igi_sdk.wire import contract as C
from igi_sdk.wire import protocol as P

ROOT = Path(__file__).resolve().parents[1]
SCHEMA_DIR = ROOT / "bridge" / "schema"
VECTORS_DIR = ROOT / "bridge" / "vectors"
REGENERATE = "run `python bridge/generate.py` and commit bridge/"


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir()) if p.is_file()}


def _drift(committed: dict[str, bytes], fresh: dict[str, bytes]) -> list[str]:
    return sorted(n for n in committed.keys() | fresh.keys() if committed.get(n) != fresh.get(n))


def _vectors() -> list[tuple[dict, bytes]]:
    """(twin, bytes) of every committed vector; broken or unpaired files are left to
    test_vectors_match_the_code, which names them."""
    out = []
    for twin in sorted(VECTORS_DIR.glob("*.json")):
        frame = twin.with_suffix(".msgpack")
        try:
            out.append((json.loads(twin.read_text()), frame.read_bytes()))
        except (OSError, ValueError):
            continue
    return out


VECTORS = _vectors()
REQUEST_VECTORS = [(t, b) for t, b in VECTORS if t["direction"] == "request"]
REPLY_VECTORS = [(t, b) for t, b in VECTORS if t["direction"] == "reply"]


def test_schemas_match_the_code(tmp_path) -> None:
    G.export_schemas(tmp_path)
    stale = _drift(_files(SCHEMA_DIR), _files(tmp_path))
    assert not stale, f"bridge/schema is out of date ({', '.join(stale)}): {REGENERATE}"


def test_vectors_match_the_code(tmp_path) -> None:
    G.write_vectors(tmp_path)
    stale = _drift(_files(VECTORS_DIR), _files(tmp_path))
    assert not stale, f"bridge/vectors is out of date ({', '.join(stale)}): {REGENERATE}"


def test_export_is_deterministic_and_removes_stale_files(tmp_path) -> None:
    (tmp_path / "gone.json").write_text("{}")
    G.write_vectors(tmp_path)
    first = _files(tmp_path)
    assert "gone.json" not in first
    G.write_vectors(tmp_path)
    assert _files(tmp_path) == first


@pytest.mark.parametrize("twin,frame", REQUEST_VECTORS, ids=[t["name"] for t, _ in REQUEST_VECTORS])
def test_request_vectors_get_the_expected_answer(twin: dict, frame: bytes) -> None:
    expect = twin["expect"]
    if expect["type"] == "ok":
        req = P.parse_request(frame)
        msg_type = req.type
        assert (req.id, msg_type) == (twin["message"]["id"], twin["message"]["type"])
        assert isinstance(req.body, P.REQUESTS[msg_type])
        assert list(req.ignored) == [k for k in twin["message"]["body"]
                                     if k not in P.REQUESTS[msg_type].model_fields]
        assert expect["reply"] == ("stream" if msg_type in ("chat", "complete") else "ok")
    else:
        assert expect["type"] == "error"
        with pytest.raises(P.EnvelopeError) as e:
            P.parse_request(frame)
        assert (e.value.code, e.value.msg_id) == (expect["code"], expect["id"]), e.value.message
        assert e.value.retryable is C.ERROR_CODES[expect["code"]].retryable


@pytest.mark.parametrize("twin,frame", VECTORS, ids=[t["name"] for t, _ in VECTORS])
def test_msgpack_round_trips_to_its_json_twin(twin: dict, frame: bytes) -> None:
    if twin["message"] is None:  # not a msgpack document a JSON twin could show
        assert frame.hex() == twin["msgpack_hex"]
        return
    m = msgpack.unpackb(frame, raw=False)
    assert G.json_twin(m) == twin["message"]  # bin shows as {"$bin": hex}
    canonical = (isinstance(m, dict) and set(m) == {"v", "id", "type", "body"}
                 and frame == msgpack.packb(m))
    if canonical and (twin["direction"] == "reply" or twin["expect"]["type"] == "ok"):
        assert frame == P.encode(m["id"], m["type"], m["body"])  # what protocol.encode sends


@pytest.mark.parametrize("twin,frame", REPLY_VECTORS, ids=[t["name"] for t, _ in REPLY_VECTORS])
def test_reply_vectors_follow_the_reply_schemas(twin: dict, frame: bytes) -> None:
    msg_id, msg_type, body = P.decode_reply(frame)
    assert msg_type in P.REPLY_TYPES and 0 <= msg_id <= P.MAX_ID
    if msg_type == "ok":  # by convention the replies reuse the ids of the request vectors
        request = next(t for t, _ in REQUEST_VECTORS
                       if t["expect"]["type"] == "ok" and t["message"]["id"] == msg_id)
        model = C.OK_REPLIES[request["message"]["type"]]
        assert model is not None
        model.model_validate(body)
    else:
        C.EVENTS[msg_type].model_validate(body)
    if msg_type == "heartbeat":
        assert msg_id == 0
    if msg_type == "error":
        assert body["code"] in C.ERROR_CODES
        assert body["retryable"] is C.ERROR_CODES[body["code"]].retryable


def test_every_type_has_a_schema_and_vectors() -> None:
    for t in P.REQUESTS:
        assert (SCHEMA_DIR / f"{t}.json").is_file(), t
        assert any(isinstance(tw["message"], dict) and tw["message"].get("type") == t
                   and tw["expect"]["type"] == "ok" for tw, _ in REQUEST_VECTORS), t
    assert {"envelope.json", "replies.json"} <= set(_files(SCHEMA_DIR))
    reply_types = {tw["message"]["type"] for tw, _ in REPLY_VECTORS}
    assert reply_types == set(P.REPLY_TYPES)
    ok_for = {next(r["message"]["type"] for r, _ in REQUEST_VECTORS
                   if r["expect"]["type"] == "ok" and r["message"]["id"] == tw["message"]["id"])
              for tw, _ in REPLY_VECTORS if tw["message"]["type"] == "ok"}
    assert ok_for == {t for t, m in C.OK_REPLIES.items() if m is not None}
    assert set(C.OK_REPLIES) == set(P.REQUESTS)
    error_codes = {tw["expect"]["code"] for tw, _ in REQUEST_VECTORS
                   if tw["expect"]["type"] == "error"}
    assert error_codes == {"malformed", "unsupported_version", "unknown_type", "invalid_body"}


def _codes_in_source() -> set[str]:
    src = inspect.getsource(server) + inspect.getsource(service) + inspect.getsource(P)
    found = set(re.findall(r'ProtocolError\(\s*"([a-z_]+)"', src))
    found |= set(re.findall(r'"code":\s*"([a-z_]+)"', src))
    found |= set(re.findall(r'getattr\(err, "code", "([a-z_]+)"\)', src))
    for obj in vars(errors).values():
        if inspect.isclass(obj) and issubclass(obj, errors.IgiError):
            found.add(obj.code)
    return found


def test_error_table_lists_every_code_the_sidecar_can_send() -> None:
    in_code = _codes_in_source()
    assert {"hello_required", "busy", "forbidden_path", "model_load_failed"} <= in_code
    assert set(C.ERROR_CODES) == in_code, (
        "error codes differ from igi_sdk/wire/contract.py ERROR_CODES: "
        f"missing {sorted(in_code - set(C.ERROR_CODES))}, "
        f"extra {sorted(set(C.ERROR_CODES) - in_code)}")
    for obj in vars(errors).values():  # the classes' retryable flags agree with the table
        if inspect.isclass(obj) and issubclass(obj, errors.IgiError):
            assert C.ERROR_CODES[obj.code].retryable is obj.retryable, obj.code
    doc = (ROOT / "bridge" / "PROTOCOL.md").read_text()
    undocumented = [c for c in C.ERROR_CODES if f"`{c}`" not in doc]
    assert not undocumented, f"bridge/PROTOCOL.md does not list {undocumented}"
