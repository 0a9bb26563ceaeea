"""Only the player's own programs reach the HTTP face: the rules (pure), the real sidecar's face
attacked with a rebinding Host, a foreign Origin and a text/plain body, a port another program
holds, and a real headless browser whose page fetch()es the face from another local port."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import openai
import pytest

from igi_sdk.client import Client
from igi_sdk.http.guard import Gate, refusal
from tests.sidecars import free_port, http_sidecar

GATE = Gate.for_bind("127.0.0.1", 8080, loopback=True)
JSON_POST = {"host": ["127.0.0.1:8080"], "content-type": ["application/json"]}


def test_a_program_on_this_machine_passes() -> None:
    assert refusal("POST", JSON_POST, GATE) is None
    assert refusal("POST", {**JSON_POST, "content-type": ["application/json; charset=utf-8"]},
                   GATE) is None
    assert refusal("GET", {"host": ["localhost:8080"]}, GATE) is None
    assert refusal("GET", {"host": ["[::1]:8080"], "sec-fetch-site": ["none"]}, GATE) is None


@pytest.mark.parametrize("host", ["evil.example:8080", "127.0.0.1:8081", "127.0.0.1",
                                  "localhost.evil.example:8080", ""])
def test_a_rebinding_host_is_refused(host: str) -> None:
    err = refusal("GET", {"host": [host]} if host else {}, GATE)
    assert err is not None and (err.status, err.code) == (403, "forbidden_host")


@pytest.mark.parametrize("origin", ["http://evil.example", "null", "http://127.0.0.1:3000",
                                    "https://127.0.0.1:8080"])
def test_a_web_page_is_refused(origin: str) -> None:
    err = refusal("POST", {**JSON_POST, "origin": [origin]}, GATE)
    assert err is not None and (err.status, err.code) == (403, "forbidden_origin")
    site = refusal("GET", {"host": ["127.0.0.1:8080"], "sec-fetch-site": ["same-site"]}, GATE)
    assert site is not None and site.code == "forbidden_origin"


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded",
                                   "multipart/form-data; boundary=x", None])
def test_a_body_a_page_can_send_without_preflight_is_refused(ctype: str | None) -> None:
    headers = {"host": ["127.0.0.1:8080"], **({"content-type": [ctype]} if ctype else {})}
    err = refusal("POST", headers, GATE)
    assert err is not None and (err.status, err.code) == (415, "unsupported_media_type")


def test_a_header_given_twice_is_refused() -> None:
    err = refusal("GET", {"host": ["127.0.0.1:8080", "evil.example"]}, GATE)
    assert err is not None and err.status == 400


def test_beyond_loopback_any_host_but_still_no_page() -> None:
    gate = Gate.for_bind("0.0.0.0", 9000, loopback=False)
    assert refusal("GET", {"host": ["gamebox.lan:9000"]}, gate) is None
    assert refusal("POST", {"host": ["gamebox.lan:9000"], "content-type": ["text/plain"]},
                   gate) is not None
    assert refusal("GET", {"host": ["x"], "origin": ["http://evil.example"]}, gate) is not None


# --- the real sidecar -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def face(tmp_path_factory, default_model) -> Iterator[tuple[str, str, int]]:
    with http_sidecar(tmp_path_factory, default_model, "--max-sessions", "4") as (base, ep):
        yield base, ep, int(base.rsplit(":", 1)[1])


def _sessions(ep: str) -> int:
    c = Client(ep, timeout=30)
    try:
        return int(c.stats()["sessions"])
    finally:
        c.close()


BODY = json.dumps({"model": "smol", "max_tokens": 4, "prompt_cache_key": "attack",
                   "messages": [{"role": "user", "content": "Say hi."}]})


def test_the_real_face_refuses_what_a_page_or_a_rebinding_sends(face) -> None:
    base, ep, port = face
    before = _sessions(ep)
    url = f"{base}/v1/chat/completions"
    cases = [
        ({"Host": f"evil.example:{port}", "Content-Type": "application/json"}, 403),
        ({"Origin": "http://evil.example", "Content-Type": "application/json"}, 403),
        ({"Content-Type": "text/plain"}, 415),
        ({"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ]
    for headers, status in cases:
        r = httpx.post(url, content=BODY, headers=headers, timeout=30)
        assert r.status_code == status, (headers, r.text)
        assert r.json()["error"]["code"] in ("forbidden_host", "forbidden_origin",
                                              "unsupported_media_type")
        assert "access-control-allow-origin" not in r.headers
    # a preflight gets nothing a browser would accept
    pre = httpx.options(url, headers={"Origin": "http://evil.example",
                                      "Access-Control-Request-Method": "POST"}, timeout=30)
    assert "access-control-allow-origin" not in pre.headers
    assert _sessions(ep) == before  # nothing reached the sidecar
    # and the player's own mod, through the official client, is answered
    reply = openai.OpenAI(base_url=f"{base}/v1", api_key="none").chat.completions.create(
        model="smol", max_tokens=4, messages=[{"role": "user", "content": "Say hi."}])
    assert reply.choices[0].message.content is not None


def test_a_port_another_program_holds_is_refused_at_start(tmp_path, default_model) -> None:
    shutil.copy(default_model, tmp_path / "smol.gguf")
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(1)
    port = holder.getsockname()[1]
    try:
        cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint",
               f"ipc://{tmp_path / 's.sock'}", "--model-dir", str(tmp_path), "--threads", "1",
               "--http", f"127.0.0.1:{port}"]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    finally:
        holder.close()
    assert done.returncode == 2, done.stderr
    assert "cannot listen on http://127.0.0.1" in done.stderr
    assert "OpenAI-compatible HTTP on" not in done.stderr  # no URL of a face that is not there


# --- a real browser ---------------------------------------------------------------------------

_PAGE = """<!doctype html><html><body><script>
const face = "http://127.0.0.1:%(port)d";
const rebound = "http://evil.example:%(port)d";
const body = %(body)s;
async function attempt(name, url, init) {
  try {
    const r = await fetch(url, init);
    return name + " status=" + r.status + " type=" + r.type;
  } catch (e) { return name + " error=" + e.name; }
}
(async () => {
  const out = [];
  out.push(await attempt("simple-post", face + "/v1/chat/completions",
    {method: "POST", mode: "no-cors", headers: {"Content-Type": "text/plain"}, body}));
  out.push(await attempt("form-post", face + "/v1/chat/completions",
    {method: "POST", mode: "no-cors",
     headers: {"Content-Type": "application/x-www-form-urlencoded"}, body}));
  out.push(await attempt("json-post", face + "/v1/chat/completions",
    {method: "POST", headers: {"Content-Type": "application/json"}, body}));
  out.push(await attempt("read-models", face + "/v1/models", {method: "GET"}));
  out.push(await attempt("rebound-models", rebound + "/v1/models", {method: "GET"}));
  await fetch("/report", {method: "POST", body: JSON.stringify(out)});
})();
</script></body></html>"""


def _browser() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


@pytest.mark.skipif(_browser() is None and not os.environ.get("IGI_REQUIRE_BROWSER"),
                    reason="no Chromium here (tests/run.sh installs it from Debian)")
def test_a_page_in_a_real_browser_cannot_drive_the_face(face, tmp_path) -> None:
    browser = _browser()
    assert browser is not None, "Chromium is required (tests/run.sh installs it)"
    _base, ep, port = face
    before = _sessions(ep)
    page = (_PAGE % {"port": port, "body": json.dumps(BODY)}).encode()
    reports: list[list[str]] = []
    arrived = threading.Event()

    class Page(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(page)))
            self.end_headers()
            self.wfile.write(page)

        def do_POST(self) -> None:
            n = int(self.headers.get("Content-Length", "0"))
            reports.append(json.loads(self.rfile.read(n)))
            self.send_response(204)
            self.end_headers()
            arrived.set()

        def log_message(self, *args: object) -> None:
            pass

    site = ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=site.serve_forever, daemon=True).start()
    page_url = f"http://127.0.0.1:{site.server_address[1]}/"
    proc = subprocess.Popen(
        [browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
         "--disable-extensions", "--disable-background-networking",
         f"--user-data-dir={tmp_path / 'profile'}",
         "--host-resolver-rules=MAP evil.example 127.0.0.1", page_url],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        assert arrived.wait(90), "the page never reported (did Chromium start?)"
    finally:
        proc.kill()
        proc.wait(10)
        site.shutdown()
    outcome = dict(line.split(" ", 1) for line in reports[0])
    # what the page can see: nothing readable (opaque, or a network error)
    assert outcome["simple-post"] == "status=0 type=opaque", outcome
    assert outcome["form-post"] == "status=0 type=opaque", outcome
    assert outcome["json-post"] == "error=TypeError", outcome  # its preflight fails
    assert outcome["read-models"] == "error=TypeError", outcome
    assert outcome["rebound-models"] == "error=TypeError", outcome
    # and what the page could not see either: the sidecar never opened a session for it
    assert _sessions(ep) == before


def test_the_face_listens_on_a_socket_asyncio_turns_nagle_off_on() -> None:
    """asyncio sets TCP_NODELAY only on sockets whose proto says TCP; with Nagle on, every
    reply written in two parts waited for the client's delayed ACK (44 ms a request)."""
    from igi_sdk.http.serve import listen

    sock = listen("127.0.0.1", free_port())
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


def test_one_large_body_at_a_time(face) -> None:
    """A second large body while one is being read is refused 429 at once (not queued): a
    flood of large bodies cannot hold the sidecar's GIL more than one at a time."""
    base, _ep, _port = face
    url = f"{base}/v1/chat/completions"
    junk = (b'{"model":"x","pad":"' + b"a" * (3 << 20)
            + b'","messages":[{"role":"user","content":"hi"}]}')
    started = threading.Event()

    def slow() -> Iterator[bytes]:  # sent without a length, a slice at a time
        yield junk[: 2 << 20]
        started.set()
        time.sleep(1.5)
        yield junk[2 << 20:]

    first: list[int] = []
    sender = threading.Thread(target=lambda: first.append(httpx.post(
        url, content=slow(), headers={"Content-Type": "application/json"}, timeout=60)
        .status_code))
    sender.start()
    assert started.wait(30)
    time.sleep(0.3)  # its first 2 MiB are read: it holds the large-body slot
    second = httpx.post(url, content=junk, headers={"Content-Type": "application/json"},
                        timeout=60)
    assert second.status_code == 429 and second.json()["error"]["code"] == "busy"
    assert "retry-after" in second.headers
    sender.join(60)
    assert first and first[0] != 429  # the first was read and answered
    third = httpx.post(url, content=junk, headers={"Content-Type": "application/json"},
                       timeout=60)
    assert third.status_code != 429  # and the slot is free again
