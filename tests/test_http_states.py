"""The HTTP face while the sidecar has no model (503 + Retry-After until one is loaded), and
the ``x-igi-priority`` header reaching the sessions it opens or continues."""

from __future__ import annotations

import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterator

import httpx
import openai
import pytest
import uvicorn

from igi_sdk.client import Client
from igi_sdk.http.app import HttpConfig, build_app
from tests.sidecars import free_port, start_sidecar, stop
from tests.test_http_face import NPC

HELLO = {"messages": [{"role": "user", "content": "Hello there."}], "max_tokens": 2}


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory, default_model) -> Iterator[tuple[str, str]]:
    """A sidecar with a model directory and no model loaded, with its HTTP face."""
    d = tmp_path_factory.mktemp("http-bare")
    shutil.copy(default_model, d / "smol.gguf")
    ep = f"ipc://{tmp_path_factory.mktemp('ipc-http-bare') / 's.sock'}"
    port = free_port()
    proc = start_sidecar(d, ep, "--max-sessions", "6", "--http", f"127.0.0.1:{port}")
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"{base}/health", timeout=2)
                break
            except httpx.HTTPError:
                assert time.monotonic() < deadline, "the HTTP face did not come up"
                time.sleep(0.1)
        yield base, ep
    finally:
        stop(proc)


def _unavailable(r: httpx.Response, code: str) -> None:
    assert r.status_code == 503, r.text
    assert r.headers["retry-after"] == "1"
    assert r.json()["error"] == {"message": r.json()["error"]["message"], "type": "server_error",
                                 "param": None, "code": code}


def test_503_with_retry_after_until_a_model_is_loaded(bare: tuple[str, str]) -> None:
    base, ep = bare
    api = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    # no model: the chat, /health and the model list say so
    _unavailable(httpx.post(f"{base}/v1/chat/completions", json=HELLO, timeout=30), "no_model")
    with pytest.raises(openai.InternalServerError) as e:
        api.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}])
    assert e.value.status_code == 503 and e.value.body["code"] == "no_model"  # type: ignore[index]
    health = httpx.get(f"{base}/health", timeout=30)
    assert health.status_code == 503 and health.headers["retry-after"] == "1"
    assert health.json() == {"status": "no_model", "model": None}
    assert api.models.list().data == []
    # loading: 503 "loading" for as long as it takes
    game = Client(ep, timeout=120)
    try:
        loader = threading.Thread(target=game.load_model, args=("smol.gguf",))
        seen: set[str] = set()
        with httpx.Client(timeout=30) as h:
            loader.start()
            while loader.is_alive():
                r = h.post(f"{base}/v1/chat/completions", json=HELLO)
                if r.status_code == 503:
                    _unavailable(r, r.json()["error"]["code"])
                    seen.add(r.json()["error"]["code"])
                    health = h.get(f"{base}/health")
                    if health.status_code == 503:
                        assert health.headers["retry-after"] == "1"
                        seen.add("health:" + health.json()["status"])
                time.sleep(0.01)
        loader.join()
        assert {"loading", "health:loading"} <= seen, seen
        # loaded: served
        assert httpx.get(f"{base}/health", timeout=30).json() == {"status": "ok",
                                                                   "model": "smol.gguf"}
        r = api.chat.completions.create(model="smol", max_tokens=2,
                                        messages=[{"role": "user", "content": "Hi"}])
        assert r.choices[0].message.content is not None
    finally:
        game.close()


@pytest.fixture
def keyed_face(bare: tuple[str, str]) -> Iterator[tuple[str, str, str, Callable[[], None]]]:
    """The face in this process, over the same sidecar, with an owner key the test knows:
    once stopped, its sessions wait as orphans that a client of that key can list."""
    _base, ep = bare
    game = Client(ep, timeout=120)
    try:  # loaded by the test above, or here when it runs alone
        if game.stats()["model"] is None and not game.stats()["loading"]:
            game.load_model("smol.gguf")
        game.wait_ready(120)
    finally:
        game.close()
    owner = secrets.token_urlsafe(24)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(build_app(HttpConfig(endpoint=ep, owner=owner)),
                                           host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="on"))
    t = threading.Thread(target=server.run, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline
        time.sleep(0.02)

    def stop_face() -> None:  # the shutdown closes the face's connection, keeping sessions
        server.should_exit = True
        t.join(30)

    try:
        yield f"http://127.0.0.1:{port}", ep, owner, stop_face
    finally:
        stop_face()


def test_the_priority_header_reaches_the_session(
        keyed_face: tuple[str, str, str, Callable[[], None]]) -> None:
    base, ep, owner, stop_face = keyed_face
    msgs = [{"role": "system", "content": NPC}, {"role": "user", "content": "A sword?"}]

    def say(key: str, priority: str, messages: list[dict[str, str]]) -> str:
        r = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0
                          ).chat.completions.create(
            model="smol", max_tokens=3, temperature=0, messages=messages,  # type: ignore[arg-type]
            extra_body={"prompt_cache_key": key}, extra_headers={"x-igi-priority": priority})
        return r.choices[0].message.content or ""

    say("guard", "7", msgs)  # a new conversation opens at its priority
    reply = say("merchant", "0", msgs)
    say("merchant", "-3", [*msgs, {"role": "assistant", "content": reply},
                           {"role": "user", "content": "How much?"}])  # a later line sets it
    for bad in ("high", "101", "1.5"):
        r = httpx.post(f"{base}/v1/chat/completions", headers={"x-igi-priority": bad},
                       json={**HELLO, "prompt_cache_key": "bad"}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_argument", bad
        assert "x-igi-priority" in r.json()["error"]["message"]
    # without the header: priority 0
    assert httpx.post(f"{base}/v1/chat/completions", json=HELLO, timeout=30).status_code == 200
    # the face stops: its sessions wait as orphans of its owner key, with their priorities
    stop_face()
    keyed = Client(ep, timeout=30, owner=owner)
    try:
        deadline = time.monotonic() + 30
        while True:
            listing = keyed.list_sessions()["sessions"]
            if len(listing) == 3 and all(s["owner"] == "orphaned" for s in listing):
                break
            assert time.monotonic() < deadline, listing
            time.sleep(0.05)
        assert sorted(s["priority"] for s in listing) == [-3, 0, 7]
    finally:
        keyed.close()
