"""Large HTTP bodies are parsed in the face's body parsing process, not in the sidecar's: the
same request (or the same refusal) as the in-process parse, every cap held, a parse that runs
past its CPU-time cap killed and the next one served by a fresh process."""

from __future__ import annotations

import base64
import io
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterator

import pytest
from PIL import Image

from igi_sdk.bundle import frozen
from igi_sdk.http import _body_worker as wire
from igi_sdk.http.body_parser import BodyParser
from igi_sdk.http.errors import HttpError
from igi_sdk.http.parse import Parsed, read
from igi_sdk.http.schema import ChatCompletionRequest
from igi_sdk.wire import protocol as P


@pytest.fixture(scope="module")
def parser() -> Iterator[BodyParser]:
    p = BodyParser()
    yield p
    p.close()


def _png(side: int) -> bytes:
    out = io.BytesIO()  # noise: it does not compress, so the body is as large as the image
    Image.frombytes("RGB", (side, side), random.Random(side).randbytes(side * side * 3)).save(
        out, "PNG")
    return out.getvalue()


def _large_request(png: bytes) -> bytes:
    """A legal request: a transcript, a schema and an image."""
    url = "data:image/png;base64," + base64.b64encode(png).decode()
    body = {"model": "m", "max_tokens": 12, "temperature": 0.3, "stop": ["\n\n"],
            "prompt_cache_key": "npc-7",
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "r", "schema": {"type": "object"}}},
            "messages": [{"role": "system", "content": "You are Brom, a smith."},
                         *[{"role": ("user", "assistant")[i % 2], "content": f"turn {i} é" * 900}
                           for i in range(40)],
                         {"role": "user", "content": [
                             {"type": "text", "text": "What is on this shield?"},
                             {"type": "image_url", "image_url": {"url": url}}]}]}
    return json.dumps(body, ensure_ascii=False).encode()


def _chunks(body: bytes, size: int = 65536) -> list[bytes]:
    return [body[i:i + size] for i in range(0, len(body), size)]


def _same(a: Parsed, b: Parsed) -> None:
    assert a.options.model_dump() == b.options.model_dump()
    assert (a.system, a.history, a.line, a.images) == (b.system, b.history, b.line, b.images)


def test_the_child_reads_what_the_sidecar_would(parser: BodyParser,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    body = _large_request(_png(900))
    assert len(body) > 2 << 20
    here = read(body)
    assert here.options.prompt_cache_key == "npc-7" and len(here.history) == 40

    def no_parse_here(*_a: object, **_k: object) -> None:
        raise AssertionError("a large body was parsed in the sidecar's process")

    # the sidecar's own parse is gone: the child (a process of its own) still reads the body
    monkeypatch.setattr(ChatCompletionRequest, "model_validate_json", no_parse_here)
    _same(parser.parse(_chunks(body), len(body)), here)


def test_refusals_come_back_as_the_same_http_errors(parser: BodyParser) -> None:
    bodies = [
        b'{"messages":' + b"[" * 100_000 + b" " * (1 << 20),  # more values than a request has
        ('{"messages":[{"role":"user","content":"' + "\\u00e9" * (1 << 20) + '"}]}').encode(),
        b'{"messages": [{"role": "user", "content": "hi"}], "mirostat": 2}' + b" " * (1 << 20),
        b'{"messages": [{"role": "user", "content": "hi"' + b" " * (1 << 20),  # cut short
    ]
    for body in bodies:
        with pytest.raises(HttpError) as here:
            read(body)
        with pytest.raises(HttpError) as there:
            parser.parse(_chunks(body), len(body))
        assert (there.value.status, there.value.code, there.value.message) == (
            here.value.status, here.value.code, here.value.message)
    # the child lives on: the next body needs no new process
    started = parser.started
    body = _large_request(_png(64))
    _same(parser.parse(_chunks(body), len(body)), read(body))
    assert parser.started == started


def test_a_child_past_its_time_cap_is_killed_and_the_next_gets_a_fresh_one() -> None:
    p = BodyParser(cpu_s=0.05)
    try:
        body = _large_request(_png(64))
        # a child that never answers (here: it waits for bytes that never come) is killed
        # once the cap's wall time (12 times its CPU time) has passed
        with pytest.raises(HttpError) as e:
            p.parse(_chunks(body), len(body) + 1)
        assert (e.value.status, e.value.code) == (413, "request_too_large")
        assert "CPU time" in e.value.message
        p.cpu_s = 30.0
        _same(p.parse(_chunks(body), len(body)), read(body))
        assert p.started == 2
    finally:
        p.close()


def test_a_closed_parser_refuses_at_once() -> None:
    p = BodyParser()
    p.close()
    body = _large_request(_png(64))
    with pytest.raises(HttpError) as e:
        p.parse(_chunks(body), len(body))
    assert e.value.status == 503


def test_the_bundle_runs_the_child_as_an_installed_package_does() -> None:
    assert frozen.BODY_WORKER_MODULE == wire.MODULE
    body = _large_request(_png(64))
    # the bundle's entry sees ``EXE -m MODULE BYTES``; here the same call, through its dispatch
    code = ("import sys; from igi_sdk.bundle import frozen; "
            "sys.exit(0 if frozen.run_body_worker(sys.argv) else 3)")
    out = subprocess.run([sys.executable, "-c", code, "-m", wire.MODULE, "0"],
                         input=wire.REQUEST.pack(len(body)) + body, capture_output=True,
                         timeout=120, env={**os.environ,
                                           "IGI_SDK_CLIENT_ONLY": "1"}, check=True).stdout
    assert out[:1] == wire.READY
    status, _, images_size = wire.REPLY.unpack(out[1:1 + wire.REPLY.size])
    assert status == wire.OK and images_size == len(read(body).images[0])


def test_a_refused_part_is_named_not_the_string_its_content_is_not() -> None:
    url = "data:image/png;base64," + "A" * ((P.MAX_IMAGE_BYTES * 4) // 3 + 100)
    body = json.dumps({"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}]}]}).encode()
    with pytest.raises(HttpError) as e:
        read(body)
    assert e.value.status == 400
    assert "image_url.url" in e.value.message and "at most" in e.value.message
