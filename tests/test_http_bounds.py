"""What the HTTP face refuses on its own, before it asks the sidecar anything: the app in this
process with no sidecar behind it (a request that got through would wait on the missing
sidecar and answer 503, not the error asserted)."""

from __future__ import annotations

import base64
import binascii
import json
import os
import random

import httpx
import pytest
from fastapi.testclient import TestClient

from igi_sdk.http import parse as face
from igi_sdk.http.app import HttpConfig, build_app
from igi_sdk.http.errors import HttpError
from igi_sdk.http.json_bound import MAX_ESCAPES, MAX_VALUES, over_escapes, over_values
from igi_sdk.wire import protocol as P

URL = "/v1/chat/completions"


@pytest.fixture(scope="module")
def http(tmp_path_factory: pytest.TempPathFactory) -> TestClient:
    nowhere = f"ipc://{tmp_path_factory.mktemp('ipc-none') / 'none.sock'}"
    # server exceptions are raised in the test: an error answered must not fail afterwards
    return TestClient(build_app(HttpConfig(endpoint=nowhere, owner="o" * 32, timeout_s=2.0)),
                      raise_server_exceptions=True)


def _line(*urls: str) -> list[dict[str, object]]:
    return [{"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         *[{"type": "image_url", "image_url": {"url": u}}
                                           for u in urls]]}]


def _error(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, r.text[:300]
    assert r.json()["error"]["code"] == code
    return str(r.json()["error"]["message"])


def test_an_answered_error_raises_nothing_afterwards(http: TestClient) -> None:
    # the ASGI stack clears the traceback of an exception it has answered: a frozen error
    # raised there, after the response, and the server dropped the keep-alive connection
    for _ in range(2):
        _error(http.post(URL, json={"top_logprobs": 2,
                                    "messages": [{"role": "user", "content": "Hi"}]}),
               400, "invalid_argument")


def test_nesting_is_refused_without_a_scan_of_the_body(http: TestClient) -> None:
    # deeper than pydantic's recursion limit, within the count of values: a 400 of the parser
    _error(http.post(URL, content=b'{"messages":' + b"[" * 20_000), 400, "invalid_body")
    # more brackets than a request has values: refused before the parser runs
    msg = _error(http.post(URL, content=b'{"messages":' + b"[" * 100_000), 413,
                 "request_too_large")
    assert str(MAX_VALUES) in msg
    schema: dict[str, object] = {"type": "string"}
    for _ in range(P.MAX_NESTING + 2):
        schema = {"type": "array", "items": schema}
    msg = _error(http.post(URL, json={
        "messages": [{"role": "user", "content": "Hi"}],
        "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}}),
        400, "invalid_body")
    assert "nests" in msg


def test_image_count_and_size_are_refused_before_decoding(http: TestClient) -> None:
    small = "data:image/png;base64," + base64.b64encode(b"\x89PNG....").decode()
    msg = _error(http.post(URL, json={"messages": _line(*[small] * (P.MAX_IMAGES + 1))}),
                 400, "invalid_image")
    assert str(P.MAX_IMAGES) in msg
    # together over the images' share of a message, each under its own cap; not base64 at
    # all, so a 413 (not invalid_image) shows the size was judged before any decoding
    half = "data:image/png;base64," + "!" * ((P.MAX_IMAGE_BYTES // 2 + 8) * 4 // 3)
    _error(http.post(URL, json={"messages": _line(half, half)}), 413, "request_too_large")


def test_a_transcript_over_one_message_is_413_not_a_dropped_request(http: TestClient) -> None:
    # 150 turns of 32 000 four-byte characters: 19 MB of history, more than the sidecar's
    # socket takes in one message (it drops such a message unanswered)
    turn = "\N{GRINNING FACE}" * 32_000
    msgs = [{"role": ("user", "assistant")[i % 2], "content": turn} for i in range(150)]
    body = json.dumps({"messages": [*msgs, {"role": "user", "content": "And?"}]},
                      ensure_ascii=False).encode()
    assert len(body) < 32 << 20  # under the face's body cap
    msg = _error(http.post(URL, content=body, headers={"content-type": "application/json"}),
                 413, "request_too_large")
    assert "transcript" in msg


@pytest.mark.parametrize("size", [0, 1, 2, 3, face._SLICE * 3 // 4 - 1, face._SLICE * 3 // 4,
                                  face._SLICE * 3 // 4 + 1, face._SLICE * 3 // 2 + 2])
def test_sliced_decoding_is_base64(size: int) -> None:
    data = os.urandom(size)
    encoded = base64.b64encode(data).decode()
    if size == 0:
        with pytest.raises(HttpError):
            face._decode(encoded)
        return
    assert face._decode(encoded) == data == binascii.a2b_base64(encoded, strict_mode=True)


def test_padding_inside_the_data_is_refused_at_a_slice_edge() -> None:
    # "QQ==" ends the first slice exactly: valid alone, padding in the middle of the whole
    inside = "A" * (face._SLICE - 4) + "QQ==" + "QUJD"
    with pytest.raises(HttpError) as e:
        face._decode(inside)
    assert e.value.code == "invalid_image"
    with pytest.raises(binascii.Error):
        binascii.a2b_base64(inside, strict_mode=True)


def _separators_outside_strings(body: bytes) -> int:
    """The count, a character at a time: what ``over_values`` must agree with."""
    n, inside, escaped = 0, False, False
    for c in body.decode():
        if inside:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                inside = False
        elif c == '"':
            inside = True
        elif c in ",[{":
            n += 1
    return n


def _random_json(rng: random.Random, depth: int = 0) -> object:
    pick = rng.random()
    if depth > 3 or pick < 0.4:  # strings full of what a scanner can trip on
        return "".join(rng.choice(['"', "\\", ",", "[", "{", "a", " ", "\\\\", '\\"'])
                       for _ in range(rng.randrange(12)))
    if pick < 0.5:
        return rng.randrange(100)
    if pick < 0.75:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(5))]
    return {_random_json(rng, 9): _random_json(rng, depth + 1)  # type: ignore[misc]
            for _ in range(rng.randrange(5))}


def test_the_values_a_body_holds_are_counted_outside_its_strings() -> None:
    rng = random.Random(7)
    for _ in range(400):
        body = json.dumps(_random_json(rng)).encode()
        n = _separators_outside_strings(body)
        # the limit at, just under and well under the count: the walk runs where the quick
        # count (strings included) is over the limit
        for limit in {n, max(0, n - 1), n // 2, 0}:
            assert over_values(body, limit) == (n > limit), (body, n, limit)


def test_bodies_within_the_caps_pass_and_floods_of_values_do_not() -> None:
    prose = 'He said, "well, then, go on," and she, as ever, did. ' * 600
    transcript = {"messages": [{"role": "user" if i % 2 else "assistant", "content": prose}
                               for i in range(P.MAX_HISTORY_TURNS + 1)]}
    parts = [{"type": "text", "text": "a, b"}] * (P.MAX_IMAGES + 16)
    widest = {"messages": [{"role": "user", "content": parts}] * (P.MAX_HISTORY_TURNS + 2)}
    image = {"messages": _line("data:image/png;base64," + base64.b64encode(
        bytes(P.MAX_IMAGE_BYTES)).decode())}
    for fits in (transcript, widest, image):
        assert not over_values(json.dumps(fits).encode())
    numbers = b'{"x":[' + b"1," * (8 << 20) + b"1]}"
    escaped = b'{"a":"' + b'\\"' * (8 << 20) + b'"' + b",1" * 40_000 + b"}"
    backslashes = b'{"a":"' + b"\\\\" * (8 << 20) + b'"' + b",1" * 40_000 + b"}"
    for flood in (numbers, escaped, backslashes):
        assert over_values(flood)


def test_floods_of_escapes_are_counted_and_a_long_transcript_is_not_one() -> None:
    prose = 'He said, "well, then, go on," and she, as ever, did. ' * 600
    transcript = json.dumps({"messages": [{"role": "user", "content": prose}
                                          for _ in range(P.MAX_HISTORY_TURNS + 1)]}).encode()
    assert not over_escapes(transcript)  # ~310k escaped quotes: a legal body
    for flood in (b'{"a":"' + b"\\u00e9" * (MAX_ESCAPES + 1) + b'"}',
                  b'{"a":"' + b"\\n" * (MAX_ESCAPES + 1) + b'"}'):
        assert over_escapes(flood)
    assert not over_escapes(b'{"a":"' + b"\\n" * MAX_ESCAPES + b'"}')


def test_a_flood_of_escapes_is_refused_before_the_parse(http: TestClient) -> None:
    body = b'{"messages":[{"role":"user","content":"' + b"\\u00e9" * (4 << 20) + b'"}]}'
    msg = _error(http.post(URL, content=body, headers={"content-type": "application/json"}),
                 413, "request_too_large")
    assert "escaped characters" in msg
