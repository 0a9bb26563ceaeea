"""A hostile OpenAI-compatible upstream on loopback, and what the sidecar's control plane sees
while a line goes to it.

The server (:class:`Hostile`, also the tests' in tests/test_upstream_hostile.py) answers by
``MODE``: a drip, keep-alives without end, a server that ignores ``max_tokens``, a gzip stream
of nothing, a model list that drips or is too large. The bench starts ``igi-sdk serve
--upstream`` on it (every session remote, a short line deadline), sends one line per mode over
ZeroMQ while another client pings every 10 ms, and reports per mode how the line ended and when,
the ping's p50/p99/max, and the sidecar's RSS growth.

    python benchmarks/hostile_upstream.py --model-dir DIR --model M.gguf [--deadline 3]
        [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

MODE: dict[str, str] = {"models": "ok", "chat": "ok"}
STOP = threading.Event()
HUNG_UP = threading.Event()  # a streamed answer's reader went away


def _chunk(text: str) -> bytes:
    body = {"choices": [{"delta": {"content": text}, "finish_reason": None}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


class Hostile(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _stream(self, parts: Iterator[bytes], encoding: str | None = None) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        if encoding:
            self.send_header("content-encoding", encoding)
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()
        try:
            for part in parts:
                if STOP.is_set():
                    return
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
                self.wfile.flush()
        except OSError:
            HUNG_UP.set()  # the sidecar hung up: what the test wants

    def do_GET(self) -> None:
        mode = MODE["models"]
        if mode == "drip":
            self._stream(iter(lambda: (time.sleep(0.05), b" ")[1], None))
        elif mode == "huge":
            self._stream(b"x" * (1 << 20) for _ in range(64))  # 64 MiB of a "model list"
        else:
            body = json.dumps({"data": [{"id": "m"}]}).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        mode = MODE["chat"]
        if mode == "drip":  # a byte a second would do; a byte every 50 ms is the same attack
            first = _chunk("Hi")
            self._stream(iter([first, *[b":" for _ in range(10_000)]]))
        elif mode == "keepalive":
            self._stream(iter(lambda: (time.sleep(0.02), b": ping\n\n")[1], None))
        elif mode == "ignores_max_tokens":
            self._stream(_chunk("tok ") for _ in range(4096))
        elif mode == "gzip_nothing":
            z = zlib.compressobj(9, zlib.DEFLATED, 31)
            head = z.compress(b"") + z.flush(zlib.Z_SYNC_FLUSH)
            self._stream(iter([head, *(z.flush(zlib.Z_SYNC_FLUSH) for _ in range(200_000))]),
                         encoding="gzip")
        else:
            self._stream(iter([_chunk("Hello."), b"data: [DONE]\n\n"]))


CHAT_MODES = ("drip", "keepalive", "ignores_max_tokens", "gzip_nothing")


def serve_hostile() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Hostile)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}"


def main() -> None:
    os.environ["IGI_SDK_CLIENT_ONLY"] = "1"
    import psutil
    from ping_watch import PingWatch  # a sibling script: run as benchmarks/hostile_upstream.py

    from igi_sdk.client import BridgeError, Client

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--deadline", type=float, default=3.0, help="--upstream-line-timeout")
    ap.add_argument("--json")
    args = ap.parse_args()
    server, base = serve_hostile()
    endpoint = f"ipc://{Path(tempfile.mkdtemp()) / 's.sock'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint, "--model-dir",
         args.model_dir, "--model", args.model, "--threads", "1", "--no-arbiter",
         "--upstream", base, "--upstream-policy", "remote", "--upstream-model", "m",
         "--upstream-retries", "0", "--upstream-line-timeout", str(args.deadline)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out: dict[str, Any] = {"deadline_s": args.deadline, "modes": {}}
    c = Client(endpoint, timeout=120)
    try:
        c.wait_ready(120)
        side = psutil.Process(proc.pid)
        rss0 = peak = side.memory_info().rss
        for mode in CHAT_MODES:
            MODE["chat"] = mode
            pinger = PingWatch(endpoint)
            pinger.start()
            sid = c.open_session("You are a scribe.")
            t0 = time.perf_counter()
            try:
                done = c.chat(sid, "Tell me a story.", max_tokens=64).result()
                answer = f"{done['finish_reason']} ({done['usage']['completion_tokens']} tokens)"
            except BridgeError as e:
                answer = e.code
            took = time.perf_counter() - t0
            peak = max(peak, side.memory_info().rss)
            pinger.stop()
            c.close_session(sid)
            out["modes"][mode] = {
                "answer": answer, "ended_s": round(took, 2),
                "ping_ms": pinger.summary()}
            print(mode, json.dumps(out["modes"][mode]), flush=True)
        out["rss_growth_mib"] = round((peak - rss0) / 2**20, 1)
    finally:
        c.close()
        STOP.set()
        server.shutdown()
        proc.terminate()
        proc.wait(30)
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
