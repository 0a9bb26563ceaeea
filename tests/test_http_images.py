"""Images through the HTTP face: ``image_url`` data URLs read by the tiny synthetic Qwen2.5-VL
on the CPU (a real sidecar with ``--mmproj``), URLs it must never fetch, and bounds checked
before anything is decoded."""

from __future__ import annotations

import base64
import http.server
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from igi_sdk.client import Client
from igi_sdk.model.synthetic_vlm import write_synthetic_vlm
from igi_sdk.wire import protocol as P
from tests.images import card, png
from tests.sidecars import free_port, start_sidecar, stop, wait_http

NPC = "You are Brom, the blacksmith. Describe what the player shows you."


def _data_url(data: bytes, kind: str = "png") -> str:
    return f"data:image/{kind};base64,{base64.b64encode(data).decode()}"


def _line(*urls: str, text: str = "What is this?") -> list[dict[str, object]]:
    parts: list[dict[str, object]] = [{"type": "text", "text": text}]
    parts += [{"type": "image_url", "image_url": {"url": u}} for u in urls]
    return [{"role": "system", "content": NPC}, {"role": "user", "content": parts}]


@pytest.fixture(scope="module")
def face(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    vlm = write_synthetic_vlm(tmp_path_factory.mktemp("vlm"), "tiny")
    d = tmp_path_factory.mktemp("vlm-http")
    shutil.copy(vlm.model, d / "tiny-vl.gguf")
    shutil.copy(vlm.mmproj, d / "mmproj-tiny-vl.gguf")
    ep = f"ipc://{tmp_path_factory.mktemp('ipc-http-img') / 's.sock'}"
    port = free_port()
    proc = start_sidecar(d, ep, "--model", "tiny-vl.gguf", "--mmproj", "mmproj-tiny-vl.gguf",
                         "--max-sessions", "4", "--prefill-chunk", "48", "--no-arbiter",
                         "--http", f"127.0.0.1:{port}")
    try:
        probe = Client(ep, timeout=60)
        try:
            probe.wait_ready(60)
        finally:
            probe.close()
        base = f"http://127.0.0.1:{port}"
        wait_http(base)
        yield base
    finally:
        stop(proc)


@pytest.fixture
def api(face: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{face}/v1", api_key="unused", max_retries=0)


def _reply(api: openai.OpenAI, url: str) -> openai.types.chat.ChatCompletion:
    return api.chat.completions.create(
        model="tiny-vl", max_tokens=6, temperature=0, messages=_line(url))  # type: ignore[arg-type]


def test_a_png_data_url_on_the_newest_line_is_seen(api: openai.OpenAI) -> None:
    shown = _reply(api, _data_url(png(card(0))))
    assert shown.choices[0].message.content is not None
    assert shown.usage is not None
    text_only = api.chat.completions.create(
        model="tiny-vl", max_tokens=2, temperature=0,
        messages=[{"role": "system", "content": NPC},
                  {"role": "user", "content": "What is this?"}])
    # the 64x64 card is 9 patches and two delimiters: the prompt holds the image
    assert text_only.usage is not None
    assert shown.usage.prompt_tokens >= text_only.usage.prompt_tokens + 9


def test_a_url_is_refused_and_nothing_is_fetched(face: str) -> None:
    hits: list[str] = []

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hits.append(self.path)
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/sword.png"
        r = httpx.post(f"{face}/v1/chat/completions", json={"messages": _line(url)}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image"
        time.sleep(0.2)  # a fetch started anyway would have arrived by now
        assert hits == []
    finally:
        server.shutdown()


@pytest.mark.parametrize("url", [
    "data:image/png;base64,iVBORw0KGgo!!!",  # not base64
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAA",  # cut mid-quad
    "data:image/png;base64,QQ==QUJD",  # padding in the middle
    "data:image/gif;base64,R0lGODlhAQABAAAAACw=",  # a format the sidecar does not read
])
def test_broken_data_urls_are_invalid_image(face: str, url: str) -> None:
    r = httpx.post(f"{face}/v1/chat/completions", json={"messages": _line(url)}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["code"] == "invalid_image"


def test_bytes_that_are_not_an_image_are_the_sidecars_typed_error(api: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        _reply(api, _data_url(png(card(0))[:60]))  # a PNG cut short
    assert e.value.body["code"] == "invalid_image"  # type: ignore[index]
    assert _reply(api, _data_url(png(card(1)))).choices[0].message.content is not None


def test_more_images_than_a_line_holds_are_refused_before_decoding(face: str) -> None:
    url = _data_url(png(card(0)))
    r = httpx.post(f"{face}/v1/chat/completions", timeout=30,
                   json={"messages": _line(*[url] * (P.MAX_IMAGES + 1))})
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image"
    assert str(P.MAX_IMAGES) in r.json()["error"]["message"]


def test_images_over_one_message_together_are_413_and_the_face_keeps_serving(
        face: str, api: openai.OpenAI) -> None:
    # two images of 9 MiB: each under the per-image cap, together over what one protocol
    # message carries (the sidecar's socket would drop it unanswered)
    big = _data_url(bytes(9 << 20))
    t0 = time.monotonic()
    r = httpx.post(f"{face}/v1/chat/completions", json={"messages": _line(big, big)},
                   timeout=30)
    assert r.status_code == 413, r.text[:200]
    assert r.json()["error"]["code"] == "request_too_large"
    # answered with the refusal, not left to the client's timeout (30 s: the 18 MiB body is
    # read and parsed first, seconds on a loaded 2-core host)
    assert time.monotonic() - t0 < 30 / 2
    assert _reply(api, _data_url(png(card(0)))).choices[0].message.content is not None


# asks /health in a loop until its stdin closes, then prints each (sent, answered) pair: a
# process of its own, so no GIL in the test's process delays its asking
_PROBE = """
import json, sys, threading, time, httpx
stop = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
waits = []
with httpx.Client(timeout=30) as h:
    h.get(sys.argv[1])
    print("ready", flush=True)
    while not stop.is_set():
        t0 = time.monotonic()
        h.get(sys.argv[1])
        waits.append((t0, time.monotonic()))
print(json.dumps(waits))
"""


def _health_waits_while(face: str, body: bytes) -> tuple[httpx.Response, float, list[float]]:
    """Post ``body`` while another process asks /health: the answer, the post's time and the
    waits for /health that overlapped it."""
    headers = {"content-type": "application/json"}
    for _ in range(2):  # warm: the first big body pays for allocator growth
        httpx.post(f"{face}/v1/chat/completions", content=body, headers=headers, timeout=60)
    probe = subprocess.Popen([sys.executable, "-c", _PROBE, f"{face}/health"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert probe.stdout is not None and probe.stdout.readline().strip() == "ready"
    time.sleep(0.1)
    t0 = time.monotonic()
    r = httpx.post(f"{face}/v1/chat/completions", content=body, headers=headers, timeout=60)
    t1 = time.monotonic()
    out, _ = probe.communicate(timeout=30)
    waits = [b - a for a, b in json.loads(out) if b > t0 and a < t1]
    print(f"measured: longest /health wait {max(waits) * 1e3:.1f} ms over {len(waits)} "
          f"answers while a {(t1 - t0) * 1e3:.0f} ms request was read")
    return r, t1 - t0, waits


def test_the_event_loop_answers_while_a_large_body_is_read(face: str) -> None:
    # a 12 MiB image of bytes no decoder reads: the face parses and decodes ~16 MiB of JSON
    # and base64, and the sidecar refuses the picture. The body is serialized once, here
    body = json.dumps({"messages": _line(_data_url(bytes(12 << 20)))}).encode()
    r, took, waits = _health_waits_while(face, body)
    assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_image"
    # the loop was never held for most of the request: a walk of the body on the loop held
    # it for the whole request (seconds). What remains are the GIL's hand-overs and single
    # C calls over the 16 MiB (a quarter to a half of a request this fast)
    assert max(waits) < 0.75 * took, (max(waits), took)


def test_a_body_of_tiny_values_is_refused_before_it_holds_the_sidecar(face: str) -> None:
    # 24 MiB of tiny parts: parsed, they held the GIL for over a second in one call and every
    # thread of the sidecar waited (its answer was a 400 after the parse)
    parts = [{"type": "text", "text": "a"}] * (24 << 20 >> 5)
    body = json.dumps({"messages": [{"role": "user", "content": parts}]}).encode()
    r, took, waits = _health_waits_while(face, body)
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large", r.text
    assert max(waits) < 0.75 * took, (max(waits), took)
