"""The face's routes and its API key as llama-server's clients and load balancers expect them
(in-process, on a stand-in for the sidecar's connection: no model)."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.testclient import TestClient

from igi_sdk.http.app import HttpConfig, build_app

KEY = "sk-" + "k" * 24


class _Sidecar:
    """What the routes here ask of the face's connection."""

    def __init__(self, stats: dict[str, Any]) -> None:
        self._stats = stats

    def stats(self) -> dict[str, Any]:
        return self._stats


class _Inward:
    def __init__(self, stats: dict[str, Any]) -> None:
        self.sidecar = _Sidecar(stats)

    def get(self) -> _Sidecar:
        return self.sidecar

    def close(self) -> None:
        pass


def _face(api_key: str | None, model: str | None = "smol.gguf") -> TestClient:
    cfg = HttpConfig(endpoint="inproc://unused", owner="o", api_key=api_key)
    app = build_app(cfg, _Inward({"model": model, "loading": False}))  # type: ignore[arg-type]
    return TestClient(app, raise_server_exceptions=True)


def _bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_health_is_public_and_says_only_whether_the_model_is_ready() -> None:
    face = _face(KEY)
    r = face.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}  # no model name
    assert face.get("/health", headers=_bearer(KEY)).json() == {"status": "ok",
                                                                "model": "smol.gguf"}
    bare = _face(KEY, model=None).get("/health")
    assert bare.status_code == 503 and bare.json() == {"status": "no_model"}
    # nothing else is public
    for method, path in (("GET", "/v1/models"), ("GET", "/models"),
                         ("POST", "/v1/chat/completions"), ("POST", "/completion"),
                         ("POST", "/health")):
        assert face.request(method, path).status_code == 401, (method, path)


@pytest.mark.parametrize("headers", [{}, _bearer("wrong"), {"Authorization": KEY}])
def test_the_key_is_checked_before_routing(headers: dict[str, str]) -> None:
    face = _face(KEY)
    for path in ("/no/such/route", "/v2/chat/completions", "/slots"):
        r = face.post(path, headers=headers, json={})
        assert r.status_code == 401, path
        assert r.json()["error"]["type"] == "authentication_error"
    # with the key, an unknown route is what it is
    assert face.post("/no/such/route", headers=_bearer(KEY), json={}).status_code == 404


def test_the_openai_routes_are_served_without_v1_too() -> None:
    face = _face(KEY)
    auth = _bearer(KEY)
    for prefix in ("/v1", ""):
        models = face.get(f"{prefix}/models", headers=auth)
        assert models.status_code == 200 and models.json()["data"][0]["id"] == "smol.gguf"
        # the chat route reads the body (an invalid one is the typed 400, not a 404)
        chat = face.post(f"{prefix}/chat/completions", headers=auth, json={"messages": []})
        assert chat.status_code == 400 and chat.json()["error"]["code"] == "invalid_body"
    # /completions is llama-server's native /completion under its plural name
    for path in ("/completion", "/completions"):
        r = face.post(path, headers=auth, json={"no_prompt": 1})
        assert r.status_code == 400 and "prompt" in r.json()["error"]["message"], path
    # /v1/completions stays OpenAI's (its own body), /embeddings llama-server's native one
    assert face.post("/v1/completions", headers=auth, json={}).status_code == 400
    native = face.post("/embeddings", headers=auth, json={"input": "x"})
    assert native.status_code == 400 and "content" in native.json()["error"]["message"]
