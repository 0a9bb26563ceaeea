"""What does not fit a session's share of the context, through the HTTP face on the real
sidecar: a line no fold can make room for, and (``--http-memory off``) a transcript over the
share, are OpenAI's 400 ``context_length_exceeded``, streamed or not."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from tests.sidecars import http_sidecar


@pytest.fixture(scope="module")
def face(tmp_path_factory, default_model) -> Iterator[str]:
    with http_sidecar(tmp_path_factory, default_model, "--max-sessions", "2", "--ctx", "512",
                      "--http-memory", "off") as (base, _):
        yield base


def _share(base: str) -> int:
    return int(httpx.get(f"{base}/v1/models", timeout=30).json()["data"][0]["context_length"])


def _tokens(base: str, text: str) -> int:
    return len(httpx.post(f"{base}/tokenize", json={"content": text}, timeout=30)
               .json()["tokens"])


def _exceeded(r: httpx.Response) -> None:
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["code"] == "context_length_exceeded" and err["type"] == "invalid_request_error"
    assert err["message"].startswith("This model's maximum context length is")


@pytest.mark.parametrize("stream", [False, True])
def test_a_transcript_over_the_share_is_refused_with_memory_off(face, stream) -> None:
    # llama.cpp's server test: a system prompt and a line, a hundred times over
    msgs = [{"role": "system", "content": "Book"},
            {"role": "user", "content": "What is the best book"}] * 100
    _exceeded(httpx.post(f"{face}/v1/chat/completions", timeout=120,
                         json={"messages": msgs, "stream": stream}))
    # a transcript that fits is answered
    ok = httpx.post(f"{face}/v1/chat/completions", timeout=120,
                    json={"messages": msgs[:6], "max_tokens": 4, "stream": stream})
    assert ok.status_code == 200


def test_a_line_no_fold_makes_room_for_is_refused(face) -> None:
    most = _share(face)
    n = most - min(256, most // 4) // 2 - 24  # fits the share, not with its reply's room
    line = " ".join(["forge"] * n)
    while _tokens(face, line) > n:
        line = line[: len(line) * 9 // 10]
    body = {"messages": [{"role": "user", "content": line}]}
    _exceeded(httpx.post(f"{face}/v1/chat/completions", json=body, timeout=120))
    # the same line asking for a short reply fits
    short = httpx.post(f"{face}/v1/chat/completions", json={**body, "max_tokens": 4},
                       timeout=120)
    assert short.status_code == 200, short.text
