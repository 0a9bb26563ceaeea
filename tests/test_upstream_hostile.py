"""A hostile upstream (``serve --upstream``) on loopback: a drip, keep-alives without end, a
model list too large to hold, a server that ignores ``max_tokens``, a compressed stream of
nothing. Each line ends typed within its deadline, holding a bounded amount, and a cancel ends
even the model list."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from benchmarks.hostile_upstream import HUNG_UP, MODE, STOP, Hostile
from igi_sdk.errors import UpstreamUnavailableError
from igi_sdk.upstream.client import MAX_BODY_BYTES, UpstreamCall, UpstreamClient
from igi_sdk.upstream.config import UpstreamConfig
from tests.sidecars import free_port, stop, wait_http


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    STOP.set()
    server.shutdown()


@pytest.fixture(autouse=True)
def _modes() -> Iterator[None]:
    yield
    MODE.update(models="ok", chat="ok")


def _client(base: str, **kw: float) -> UpstreamClient:
    return UpstreamClient(UpstreamConfig(urls=(base,), retries=0, read_timeout_s=30.0,
                                         **kw))  # type: ignore[arg-type]


def _line(client: UpstreamClient, call: UpstreamCall | None = None, max_tokens: int = 64):
    return client.stream("k", {"messages": [{"role": "user", "content": "Hi"}],
                               "max_tokens": max_tokens, "stream": True},
                         lambda _t: None, call or UpstreamCall(), max_chars=1 << 20)


@pytest.mark.parametrize("mode", ["drip", "keepalive"])
def test_a_line_that_never_ends_ends_at_its_deadline(hostile: str, mode: str) -> None:
    MODE["chat"] = mode
    client = _client(hostile, line_timeout_s=1.0)
    t0 = time.monotonic()
    with pytest.raises(UpstreamUnavailableError) as e:
        _line(client)
    assert "deadline" in str(e.value) or "within" in str(e.value)
    assert time.monotonic() - t0 < 20  # ended by the deadline, not by the server


def test_a_model_list_is_bounded_and_a_dripping_one_is_cancelled(hostile: str) -> None:
    MODE["models"] = "huge"
    with pytest.raises(UpstreamUnavailableError) as e:
        _line(_client(hostile))
    assert str(MAX_BODY_BYTES) in str(e.value)
    MODE["models"] = "drip"
    call = UpstreamCall()
    threading.Timer(0.5, call.cancel).start()
    t0 = time.monotonic()
    with pytest.raises(UpstreamUnavailableError):
        _line(_client(hostile), call)
    assert time.monotonic() - t0 < 20  # the cancel ended it, not the drip


def test_max_tokens_holds_against_a_server_that_ignores_it(hostile: str) -> None:
    MODE["chat"] = "ignores_max_tokens"
    reply = _line(_client(hostile), max_tokens=64)
    assert reply.completion_tokens <= 64 and reply.finish_reason == "length"
    assert reply.text == "tok " * 64


def test_a_compressed_answer_is_refused_not_inflated(hostile: str) -> None:
    MODE["chat"] = "gzip_nothing"
    with pytest.raises(UpstreamUnavailableError) as e:
        _line(_client(hostile))
    assert "gzip" in str(e.value)


def test_a_plain_upstream_still_answers(hostile: str) -> None:
    assert _line(_client(hostile)).text == "Hello."


@pytest.mark.parametrize("stream", [True, False])
def test_an_http_client_that_leaves_ends_its_silent_upstream_line(
        hostile: str, tiny_llama: Path, tmp_path: Path, stream: bool) -> None:
    """Over the HTTP face, a client that disconnects while the upstream sends nothing (only
    keep-alives) ends the upstream call at once, not at the line's deadline."""
    shutil.copy(tiny_llama, tmp_path / "tiny.gguf")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint",
         f"ipc://{tmp_path / 's.sock'}", "--model-dir", str(tmp_path), "--model", "tiny.gguf",
         "--ctx", "1024", "--threads", "1", "--no-arbiter", "--http", f"127.0.0.1:{port}",
         "--upstream", hostile, "--upstream-policy", "remote", "--upstream-model", "m",
         "--upstream-retries", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base, 60)
        MODE["chat"] = "keepalive"
        HUNG_UP.clear()
        body = {"model": "m", "max_tokens": 8, "stream": stream,
                "messages": [{"role": "user", "content": "Hello?"}]}
        with httpx.Client(timeout=httpx.Timeout(1.0)) as http:
            try:
                with http.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
                    for _ in r.iter_bytes():
                        break  # the role chunk (streamed); then the client is gone
            except httpx.ReadTimeout:
                pass  # not streamed: nothing comes before the reply's end, and it gives up
        assert HUNG_UP.wait(30), "the upstream call outlived its client"
        MODE["chat"] = "ok"
        r = httpx.post(f"{base}/v1/chat/completions", timeout=60, json={
            "model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello."
    finally:
        stop(proc)
