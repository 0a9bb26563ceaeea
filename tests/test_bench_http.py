"""The HTTP-face benchmark reads both servers' streamed replies the same way: the sidecar's
cached tokens from ``usage.prompt_tokens_details``, llama-server's from its ``timings``."""

from __future__ import annotations

import json
import time

import httpx
import pytest

from benchmarks.http_peer import Turn, stream_chat


def _sse(chunks: list[dict]) -> bytes:
    return b"".join(f"data: {json.dumps(c)}\n\n".encode() for c in chunks) + b"data: [DONE]\n\n"


def _client(body: bytes, status: int = 200) -> httpx.Client:
    def handler(request: httpx.Request) -> httpx.Response:
        sent = json.loads(request.content)
        assert sent["stream"] is True and sent["stream_options"] == {"include_usage": True}
        return httpx.Response(status, content=body,
                              headers={"content-type": "text/event-stream"})
    return httpx.Client(transport=httpx.MockTransport(handler))


def _delta(text: str) -> dict:
    return {"choices": [{"index": 0, "delta": {"content": text}}]}


def test_the_sidecar_reports_cached_tokens_in_usage() -> None:
    body = _sse([{"choices": [{"index": 0, "delta": {"role": "assistant"}}]}, _delta("Aye"),
                 _delta(", swords."),
                 {"choices": [], "usage": {"prompt_tokens": 252, "completion_tokens": 3,
                                           "prompt_tokens_details": {"cached_tokens": 232}}}])
    t = stream_chat(_client(body), "http://x/v1/chat/completions", {"messages": []},
                    time.monotonic() + 30)
    assert (t.text, t.prompt_tokens, t.cached_tokens, t.prefilled_tokens) == \
        ("Aye, swords.", 252, 232, 20)
    assert t.timings == {} and not t.cut
    assert 0 < t.ttft_s <= t.turn_s


def test_llama_server_timings_say_what_it_reused_and_computed() -> None:
    # its usage may count the whole prompt; its timings are what the slot actually did
    body = _sse([_delta("Hm."),
                 {"choices": [], "usage": {"prompt_tokens": 250, "completion_tokens": 1},
                  "timings": {"cache_n": 198, "prompt_n": 52, "prompt_ms": 40.0,
                              "predicted_per_second": 30.0}}])
    t = stream_chat(_client(body), "http://x/v1/chat/completions", {"messages": []},
                    time.monotonic() + 30)
    assert (t.cached_tokens, t.prefilled_tokens) == (198, 52)
    assert t.decode_tps == 0.0  # one token: nothing after the first to time


def test_decode_rate_leaves_the_first_token_to_ttft() -> None:
    t = Turn(turn_s=2.0, ttft_s=1.0, completion_tokens=11, prompt_tokens=5, cached_tokens=0,
             prefilled_tokens=5, text="")
    assert t.decode_tps == pytest.approx(10.0)


def test_an_error_status_is_raised_not_timed() -> None:
    with pytest.raises(RuntimeError, match="HTTP 429"):
        stream_chat(_client(b'{"error": {"message": "busy"}}', 429), "http://x/v1/c",
                    {"messages": []}, time.monotonic() + 30)


def test_a_kept_alive_connection_closed_by_the_server_is_retried() -> None:
    # llama-server's HTTP library may close a kept-alive connection as the next request goes
    # out: the client retries it on a new one (as OpenAI clients do) instead of failing the turn
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        if len(calls) == 1:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return httpx.Response(200, content=_sse([_delta("Aye.")]),
                              headers={"content-type": "text/event-stream"})

    http = httpx.Client(transport=httpx.MockTransport(handler))
    t = stream_chat(http, "http://x/v1/chat/completions", {"messages": []}, time.monotonic() + 30)
    assert t.text == "Aye." and len(calls) == 2
