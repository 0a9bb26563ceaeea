"""Scale-out against a real, independent OpenAI-compatible server (llama-cpp-python's own
``llama_cpp.server`` on the default model, tests/upstream_server.py): ZeroMQ and HTTP clients
served through the sidecar by the upstream, session affinity as the cluster sees it, retries,
an upstream that is gone, and overflow from a local engine made unavailable and back."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from igi_sdk.client import BridgeError, Client
from igi_sdk.serving.server import Server, ServerConfig
from igi_sdk.sidecar import HostConfig, ModelHost
from igi_sdk.upstream import UpstreamConfig
from igi_sdk.upstream.routing import RoutingBackend
from tests.sidecars import free_port, start_sidecar, stop, wait_http

NPC = "You are Brom, the village blacksmith. Answer in one short sentence."
KEY = "upstream-test-key-0123456789"


@pytest.fixture(scope="module")
def upstream(default_model) -> Iterator[str]:
    """The upstream's base URL (ending in /v1)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(Path(__file__).with_name("upstream_server.py")),
                             str(default_model), str(port), KEY],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    base = f"http://127.0.0.1:{port}"
    try:
        wait_http(base, 90, path="/test/seen", proc=proc, what="the upstream")
    except AssertionError as e:
        stop(proc)  # then its error output can be read to its end
        assert proc.stderr is not None
        raise AssertionError(f"{e}: {proc.stderr.read()[-2000:]}") from None
    yield f"{base}/v1"
    stop(proc)


def _seen(upstream: str) -> list[dict]:
    return httpx.get(upstream.removesuffix("/v1") + "/test/seen", timeout=5).json()


def _fail_next(upstream: str, status: int, count: int) -> None:
    httpx.post(upstream.removesuffix("/v1") + "/test/fail",
               json={"status": status, "count": count}, timeout=5)


def _sidecar(tmp_path_factory, default_model, *extra: str) -> tuple[subprocess.Popen, str]:
    d = tmp_path_factory.mktemp("up-models")
    shutil.copy(default_model, d / "smol.gguf")
    ep = f"ipc://{tmp_path_factory.mktemp('ipc-up') / 's.sock'}"
    os.environ["IGI_TEST_UPSTREAM_KEY"] = KEY  # the key travels in the environment only
    try:
        proc = start_sidecar(d, ep, "--model", "smol.gguf", "--max-sessions", "2",
                             "--upstream-key-env", "IGI_TEST_UPSTREAM_KEY", *extra)
    finally:
        del os.environ["IGI_TEST_UPSTREAM_KEY"]
    probe = Client(ep, timeout=60)
    probe.wait_ready(60)
    probe.close()
    return proc, ep


@pytest.fixture(scope="module")
def remote(tmp_path_factory, default_model, upstream) -> Iterator[tuple[str, str]]:
    """A sidecar serving every session upstream, with its HTTP face: (endpoint, http base)."""
    port = free_port()
    proc, ep = _sidecar(tmp_path_factory, default_model, "--upstream", upstream,
                        "--upstream-policy", "remote", "--http", f"127.0.0.1:{port}",
                        # llama-cpp-python's server reads a schema from json_object only
                        "--upstream-schema-format", "json_object")
    base = f"http://127.0.0.1:{port}"
    wait_http(base)
    yield ep, base
    stop(proc)


def test_a_zeromq_chat_streams_from_the_upstream_pinned_to_its_session(remote, upstream) -> None:
    ep, _ = remote
    c = Client(ep, timeout=60)
    before = len(_seen(upstream))
    sid = c.open_session(NPC, name="npc.brom", sampling={"temperature": 0.0})
    first = c.chat(sid, "What do you sell?", max_tokens=12)
    pieces = list(first)
    done = first.result()
    assert pieces and "".join(pieces) == done["text"]
    # llama_cpp.server streams no usage: the pieces are counted (prompt tokens unknown: 0)
    assert done["usage"]["completion_tokens"] == len(pieces)
    second = c.chat(sid, "And horseshoes?", max_tokens=8).result()
    assert second["text"]
    seen = _seen(upstream)[before:]
    assert len(seen) == 2
    # one key per session, in the sticky header and prompt_cache_key, with the API key
    keys = {s["headers"]["x-session-id"] for s in seen} | {s["prompt_cache_key"] for s in seen}
    assert len(keys) == 1 and len(keys.pop()) == 32
    assert all(s["authorization"] == f"Bearer {KEY}" for s in seen)
    # the whole transcript each time: system + line, then system + line + reply + line
    assert [s["messages"] for s in seen] == [2, 4]
    other = c.open_session(NPC, name="npc.mara")
    c.chat(other, "Hello.", max_tokens=4).result()
    assert _seen(upstream)[-1]["prompt_cache_key"] not in {s["prompt_cache_key"] for s in seen}
    figures = c.stats()["upstream"]
    assert figures["policy"] == "remote" and figures["remote_replies"] >= 3
    assert figures["local_replies"] == 0
    listed = {s["session"]: s for s in c.list_sessions()["sessions"]}
    assert listed["npc.brom"]["tokens"] == 0  # no local KV cells: it lives upstream
    c.close()


def test_the_http_face_streams_through_the_upstream(remote, upstream) -> None:
    _, base = remote
    oa = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    before = len(_seen(upstream))
    chunks = list(oa.chat.completions.create(
        model="any", max_tokens=8, stream=True, stream_options={"include_usage": True},
        messages=[{"role": "system", "content": NPC}, {"role": "user", "content": "Hi!"}],
        extra_body={"prompt_cache_key": "npc.http"}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1
    assert len(_seen(upstream)) == before + 1


def test_a_503_from_the_upstream_is_retried_with_back_off(remote, upstream) -> None:
    ep, _ = remote
    c = Client(ep, timeout=60)
    sid = c.open_session(NPC, name="npc.retry")
    retries = c.stats()["upstream"]["retries"]
    before = len(_seen(upstream))
    _fail_next(upstream, 503, 2)
    assert c.chat(sid, "Are you open?", max_tokens=4).result()["text"]
    assert len(_seen(upstream)) == before + 3  # two refused, the third answered
    assert c.stats()["upstream"]["retries"] == retries + 2
    _fail_next(upstream, 400, 1)  # a refusal is not retried, and says what the upstream said
    with pytest.raises(BridgeError) as e:
        c.chat(sid, "Still open?", max_tokens=4).result()
    assert e.value.code == "upstream_refused" and "replica busy" in str(e.value)
    assert c.chat(sid, "Good.", max_tokens=4).result()["text"]  # the session goes on
    c.close()


def test_json_schema_replies_come_back_valid_from_the_upstream(remote, upstream) -> None:
    ep, _ = remote
    c = Client(ep, timeout=60)
    sid = c.open_session(NPC, name="npc.json", sampling={"temperature": 0.0})
    schema = {"type": "object", "properties": {"mood": {"enum": ["calm", "angry"]}},
              "required": ["mood"], "additionalProperties": False}
    done = c.chat(sid, "How do you feel?", max_tokens=24, json_schema=schema).result()
    assert json.loads(done["text"])["mood"] in ("calm", "angry")
    assert _seen(upstream)[-1]["response_format"] == {"type": "json_object", "schema": schema}
    c.close()


def test_an_unreachable_upstream_is_a_typed_retryable_error(tmp_path_factory,
                                                           default_model) -> None:
    gone = f"http://127.0.0.1:{free_port()}/v1"  # nothing listens there
    port = free_port()
    proc, ep = _sidecar(tmp_path_factory, default_model, "--upstream", gone,
                        "--upstream-policy", "remote", "--upstream-retries", "1",
                        "--http", f"127.0.0.1:{port}")
    try:
        wait_http(f"http://127.0.0.1:{port}")
        oa = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="-", max_retries=0)
        with pytest.raises(openai.APIStatusError) as http_error:
            oa.chat.completions.create(model="any", max_tokens=4,
                                       messages=[{"role": "user", "content": "Hello?"}])
        assert http_error.value.status_code == 503
        assert http_error.value.response.headers["retry-after"]
        assert http_error.value.body["code"] == "upstream_unavailable"
        c = Client(ep, timeout=60)
        sid = c.open_session(NPC, name="npc.lost")
        with pytest.raises(BridgeError) as e:
            c.chat(sid, "Anyone there?", max_tokens=4).result()
        assert e.value.code == "upstream_unavailable" and e.value.retryable
        assert c.stats()["upstream"]["failures"] == 2  # the HTTP line, then this one
        assert c.request("ping") is not None  # the sidecar keeps serving
        c.close()
    finally:
        stop(proc)


def test_overflow_goes_upstream_while_the_local_engine_is_unavailable_and_comes_back(
        tmp_path, default_model, upstream) -> None:
    with _overflowing(tmp_path, default_model, upstream, max_sessions=2) as (host, c):
        sid = c.open_session(NPC, name="npc.over", sampling={"temperature": 0.0})
        before = len(_seen(upstream))
        local = c.chat(sid, "What do you sell?", max_tokens=6).result()
        assert local["text"] and len(_seen(upstream)) == before  # the local model answered
        eng = host.engine
        assert eng is not None
        plan = eng.plan
        # a reshard in which no placement loads (the game took every byte): unavailable
        eng.release_async().result(30)
        assert eng.load_first_fitting_async([]).result(30).landed is None
        assert eng.state == "unavailable"
        away = c.chat(sid, "And horseshoes?", max_tokens=6).result()
        assert away["text"]
        seen = _seen(upstream)[before:]
        # the upstream got the conversation so far: system, the local exchange, the new line
        assert [s["messages"] for s in seen] == [4]
        assert c.stats()["upstream"]["overflowed"] >= 1
        eng.load_first_fitting_async([plan]).result(60)
        back = c.chat(sid, "Thanks.", max_tokens=6).result()
        assert back["text"] and len(_seen(upstream)) == before + 1  # local again
        up = c.stats()["upstream"]
        assert up["moved_local"] == 1 and up["local_replies"] == 2
        # the local copy reread the whole transcript with the line: more than the first
        # exchange's system prompt, line and reply together
        first = local["usage"]["prompt_tokens"] + local["usage"]["completion_tokens"]
        assert back["usage"]["prompt_tokens"] > first
        tokens = {s["session"]: s["tokens"] for s in c.list_sessions()["sessions"]}["npc.over"]
        assert tokens >= back["usage"]["prompt_tokens"]
        c.close()


def test_overflow_serves_a_session_beyond_the_local_slots(tmp_path, default_model,
                                                          upstream) -> None:
    with _overflowing(tmp_path, default_model, upstream, max_sessions=1,
                      remote_sessions=1) as (_host, c):
        a = c.open_session(NPC, name="npc.a")
        b = c.open_session(NPC, name="npc.b")  # no local slot left: served upstream
        before = len(_seen(upstream))
        assert c.chat(a, "Hi.", max_tokens=4).result()["text"]
        assert len(_seen(upstream)) == before
        assert c.chat(b, "Hi.", max_tokens=4).result()["text"]
        assert len(_seen(upstream)) == before + 1
        with pytest.raises(BridgeError) as e:  # past both: refused, typed
            c.open_session(NPC, name="npc.c")
        assert e.value.code == "too_many_sessions"
        assert c.list_sessions()["free_slots"] == 0
        c.close()


@contextlib.contextmanager
def _overflowing(tmp_path: Path, default_model: Path, upstream: str, *, max_sessions: int,
                 remote_sessions: int = 64) -> Iterator[tuple[ModelHost, Client]]:
    """An in-process sidecar (its engine reachable, to make it unavailable) routing overflow to
    the upstream, and a client of it."""
    d = tmp_path / "models"
    d.mkdir()
    shutil.copy(default_model, d / "smol.gguf")
    host = ModelHost(HostConfig(n_threads=2, arbiter=False))
    routing = RoutingBackend(host, UpstreamConfig(urls=(upstream,), policy="overflow",
                                                  api_key=KEY, remote_sessions=remote_sessions))
    srv = Server(ServerConfig(endpoint=f"ipc://{tmp_path / 'o.sock'}", model_dir=d,
                              model="smol.gguf", n_ctx=2048, max_sessions=max_sessions), routing)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        c = Client(srv.bound, timeout=60)
        c.wait_ready(60)
        yield host, c
    finally:
        srv.stopping.set()
        t.join(10)


def test_a_session_served_upstream_is_saved_through_its_local_copy(remote, upstream) -> None:
    ep, _ = remote
    c = Client(ep, timeout=60)
    sid = c.open_session(NPC, name="npc.saved", sampling={"temperature": 0.0})
    assert c.chat(sid, "Remember the password: anvil.", max_tokens=6).result()["text"]
    saved = c.save_session(sid, "upstream-npc")  # reopened locally with its transcript first
    assert saved["bytes"] > 0
    restored = c.restore_session("upstream-npc", "npc.back")
    # the same, saved before any line: what the system prompt and a line cost alone
    empty = c.open_session(NPC, name="npc.empty", sampling={"temperature": 0.0})
    c.save_session(empty, "upstream-empty")
    baseline = c.restore_session("upstream-empty", "npc.baseline")
    # a restored session is local; the save held the transcript, read with the next line
    back = c.chat(restored, "What was it?", max_tokens=4).result()
    alone = c.chat(baseline, "What was it?", max_tokens=4).result()
    assert back["usage"]["prompt_tokens"] > alone["usage"]["prompt_tokens"] + 6
    c.close()
