"""The OpenAI-compatible HTTP face against the real sidecar (the default model), with the
official ``openai`` package as the client."""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from igi_sdk.client import Client
from tests.sidecars import free_port, http_sidecar, openai_api, start_sidecar, stop, wait_http

# what HTTP test modules imported from here before tests/sidecars.py held it: use tests/sidecars.py
_free_port, _wait_http = free_port, wait_http

NPC = "You are Brom, the village blacksmith. Answer in one short sentence."


@pytest.fixture(scope="module")
def face(tmp_path_factory, default_model) -> Iterator[tuple[str, str]]:
    with http_sidecar(tmp_path_factory, default_model, "--max-sessions", "4") as f:
        yield f


@pytest.fixture
def api(face) -> openai.OpenAI:
    return openai_api(face[0])


def test_models_and_health(face, api) -> None:
    assert [m.id for m in api.models.list().data] == ["smol.gguf"]
    assert httpx.get(f"{face[0]}/health").json()["status"] == "ok"


def test_a_reply_with_usage(api) -> None:
    r = api.chat.completions.create(model="smol", max_tokens=12, temperature=0, messages=[
        {"role": "system", "content": NPC}, {"role": "user", "content": "What do you sell?"}])
    assert r.object == "chat.completion" and r.choices[0].message.role == "assistant"
    assert r.choices[0].message.content and r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.completion_tokens >= 1 and r.usage.prompt_tokens > 10
    assert r.usage.prompt_tokens_details.cached_tokens == 0  # a new conversation


def test_a_streamed_reply_ends_with_usage_and_done(api) -> None:
    chunks = list(api.chat.completions.create(
        model="smol", max_tokens=12, temperature=0, stream=True,
        stream_options={"include_usage": True},
        messages=[{"role": "system", "content": NPC}, {"role": "user", "content": "Hello!"}]))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens >= 1
    assert any(c.choices and c.choices[0].finish_reason for c in chunks)


def test_a_conversation_keeps_its_cache_and_prefills_only_the_new_line(api) -> None:
    msgs = [{"role": "system", "content": NPC}, {"role": "user", "content": "I need a sword."}]
    first = api.chat.completions.create(model="smol", max_tokens=10, temperature=0,
                                        messages=msgs, extra_body={"prompt_cache_key": "brom-1"})
    msgs += [{"role": "assistant", "content": first.choices[0].message.content},
             {"role": "user", "content": "How much is it?"}]
    second = api.chat.completions.create(model="smol", max_tokens=10, temperature=0,
                                         messages=msgs, extra_body={"prompt_cache_key": "brom-1"})
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens  # the first turn's prompt (and reply) are reused
    assert second.usage.prompt_tokens - cached < first.usage.prompt_tokens  # only the suffix
    # without a key: the conversation whose transcript is the request's prefix is found
    msgs += [{"role": "assistant", "content": second.choices[0].message.content},
             {"role": "user", "content": "Too dear."}]
    third = api.chat.completions.create(model="smol", max_tokens=6, temperature=0,
                                        messages=msgs, extra_body={"prompt_cache_key": "brom-1"})
    assert third.usage.prompt_tokens_details.cached_tokens > cached


def test_a_transcript_the_sidecar_never_saw_is_read_as_history(api) -> None:
    r = api.chat.completions.create(model="smol", max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": NPC}, {"role": "user", "content": "Hi."},
        {"role": "assistant", "content": "Welcome to my forge."},
        {"role": "user", "content": "What did you just say?"}])
    short = api.chat.completions.create(model="smol", max_tokens=8, temperature=0, messages=[
        {"role": "system", "content": NPC}, {"role": "user", "content": "What did you just say?"}])
    assert r.usage.prompt_tokens > short.usage.prompt_tokens + 8  # the history was read
    # nothing of it was cached: at most the system prompt other conversations share
    assert r.usage.prompt_tokens_details.cached_tokens < short.usage.prompt_tokens - 8


def test_a_json_schema_reply_parses_and_validates(api) -> None:
    schema = {"type": "object", "properties": {"price": {"type": "integer"},
                                               "item": {"type": "string", "maxLength": 20}},
              "required": ["price", "item"]}
    r = api.chat.completions.create(
        model="smol", max_tokens=60, temperature=0,
        messages=[{"role": "system", "content": NPC},
                  {"role": "user", "content": "Price of a sword, as JSON."}],
        response_format={"type": "json_schema", "json_schema": {"name": "offer",
                                                                 "schema": schema}})
    data = json.loads(r.choices[0].message.content)
    assert isinstance(data["price"], int) and isinstance(data["item"], str)


def test_errors_are_openai_shaped(face, api) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}],
                                    extra_body={"mirostat": 2})
    assert e.value.status_code == 400 and e.value.body["code"] == "unsupported_parameter"
    r = httpx.post(f"{face[0]}/v1/chat/completions", content=b"{not json",
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(openai.BadRequestError) as e:  # ~8 000 tokens in a 2 048-cell context
        api.chat.completions.create(model="smol", max_tokens=4, messages=[
            {"role": "user", "content": "word " * 6000}])
    # OpenAI's answer, which its clients and LiteLLM map to a context-window error
    assert e.value.status_code == 400 and e.value.body["code"] == "context_length_exceeded"
    assert e.value.body["param"] == "messages"
    assert "maximum context length is" in e.value.body["message"]
    r = httpx.post(f"{face[0]}/v1/chat/completions", json={"messages": [
        {"role": "user", "content": [{"type": "image_url",
                                      "image_url": {"url": "https://example.com/a.png"}}]}]})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image"


def test_a_client_that_disconnects_cancels_its_reply(face, api) -> None:
    seen: list[float] = []
    with httpx.stream("POST", f"{face[0]}/v1/chat/completions", timeout=60, json={
            "max_tokens": 400, "stream": True, "prompt_cache_key": "gone-1",
            "messages": [{"role": "user", "content": "Count from one to a thousand."}]}) as r:
        for line in r.iter_lines():
            if line.startswith("data: "):
                seen.append(time.monotonic())
            if len(seen) > 8:
                break  # the client goes away mid-reply
    gone = time.monotonic()
    per_token = (seen[-1] - seen[2]) / (len(seen) - 3)
    c = Client(face[1], timeout=30)
    while c.stats()["engine"]["active_replies"] and time.monotonic() - gone < 60:
        time.sleep(0.02)
    stopped = time.monotonic() - gone
    c.close()
    # the rest of a 400-token reply would take ~390 token times: it stopped within a few
    assert stopped < 40 * per_token + 0.5, (stopped, per_token)
    # and the next request is served at once
    assert api.chat.completions.create(model="smol", max_tokens=3, messages=[
        {"role": "user", "content": "Hi"}]).choices[0].message.content is not None


def test_an_api_key_is_required_when_one_is_set_and_off_loopback(tmp_path, default_model) -> None:
    d = tmp_path / "models"
    d.mkdir()
    shutil.copy(default_model, d / "smol.gguf")
    key = tmp_path / "key"
    key.write_text("k" * 24)
    # off loopback without a key: refused at start
    out = subprocess.run([sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint",
                          f"ipc://{tmp_path / 'a.sock'}", "--model-dir", str(d), "--model",
                          "smol.gguf", "--http", "0.0.0.0:1"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0 and "api-key" in out.stderr
    port = free_port()
    ep = f"ipc://{tmp_path / 'b.sock'}"
    proc = start_sidecar(d, ep, "--model", "smol.gguf", "--http", f"127.0.0.1:{port}",
                         "--api-key-file", str(key))
    try:
        Client(ep, timeout=60).wait_ready(60)
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{base}/v1/models", timeout=2).status_code == 401:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        wrong = openai_api(base, api_key="x" * 24)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()
        right = openai_api(base, api_key="k" * 24)
        assert [m.id for m in right.models.list().data] == ["smol.gguf"]
    finally:
        stop(proc)




def test_images_without_a_projector_are_the_typed_error(api) -> None:
    from tests.images import card, png

    url = "data:image/png;base64," + base64.b64encode(png(card(0))).decode()
    with pytest.raises(openai.BadRequestError) as e:
        api.chat.completions.create(model="smol", max_tokens=4, messages=[
            {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                         {"type": "image_url", "image_url": {"url": url}}]}])
    assert e.value.body["code"] == "vision_unavailable"


def test_no_cors_headers_unless_asked(face) -> None:
    origin = {"Origin": "https://mod.example"}
    preflight = httpx.options(f"{face[0]}/v1/chat/completions", headers={
        **origin, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization,content-type"})
    assert preflight.status_code == 403  # refused (http/guard.py); no CORS layer answers it
    for r in (preflight, httpx.get(f"{face[0]}/v1/models", headers=origin),
              httpx.post(f"{face[0]}/v1/chat/completions", headers=origin, json={"n": 2})):
        assert not any(k.startswith("access-control-") for k in r.headers), r.headers


def test_n_choices_share_the_first_choices_prompt(face, api) -> None:
    with Client(face[1], timeout=60) as game:
        before = game.stats()["engine"]["step"]["shared_prefix_tokens"]
        r = api.chat.completions.create(model="smol", max_tokens=8, n=2, temperature=1.0,
                                        seed=3, messages=[
                                            {"role": "system", "content": NPC},
                                            {"role": "user", "content": "Tell me a story."}])
        shared = game.stats()["engine"]["step"]["shared_prefix_tokens"] - before
    assert [c.index for c in r.choices] == [0, 1]
    # the second choice's session took the first's prompt cells: it read one token of it
    assert shared >= r.usage.prompt_tokens - 1
