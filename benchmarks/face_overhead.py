"""What the HTTP face adds to a request, with the model taken out of the measure.

The sidecar's protocol server runs in a process of its own (as ``serve`` runs it: the same GIL
switch interval) over an *instant* model side (a session opens at once; a line answers one token
and ``done`` at once, from another thread as the engine would), with the HTTP face beside it;
the clients run in this process, as a game's and a mod's run in theirs. An NPC's conversation
goes on, line after line, alternately through the ZeroMQ face (``igi_sdk.client.Client``: one
session, a ``chat`` per line) and the HTTP face (a kept-alive ``httpx`` client, and the official
``openai`` client where it is installed: the whole transcript each time, as an OpenAI client
sends it), and the medians compared: what is left is each face's own cost. Every ``--block``
lines each face starts a new conversation (ZeroMQ: ``open_session``, then the line); those
first lines are reported apart (``*_open_ms``).

    python benchmarks/face_overhead.py [--rounds 300] [--block 25] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# only the sidecar's faces and clients here: llama.cpp's native libraries stay unmapped (as in
# the other client-side benchmarks; the model side, where there is one, is its own process)
os.environ["IGI_SDK_CLIENT_ONLY"] = "1"

import httpx

from igi_sdk.client import Client
from igi_sdk.events import ReplyDone, ReplyText
from igi_sdk.serving.backend import ReservationDone, StreamHandle, StreamListener
from igi_sdk.serving.server import Server, ServerConfig
from igi_sdk.wire import protocol as P


class _Handle:
    def cancel(self) -> None:
        pass


@dataclass(frozen=True)
class _Result:
    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    total_s: float
    cached_tokens: int = 0
    tool_calls: tuple[()] = ()  # events.ReplyResult: no calls
    dropped_turns: int = 0
    summarised_turns: int = 0


class Instant:
    """A model side that answers at once: what a face costs is all that is measured."""

    model_name = "instant.gguf"

    def session_slots(self, local_slots: int) -> int:
        return local_slots

    def load_model(self, path: Path, request: P.LoadModel, draft: Path | None = None,
                   mmproj: Path | None = None) -> dict[str, Any]:
        return {"model": path.name}

    def open_session(self, request: P.OpenSession) -> Future[str]:
        f: Future[str] = Future()
        f.set_result(request.name or "s")
        return f

    def close_session(self, session: str) -> Future[None]:
        f: Future[None] = Future()
        f.set_result(None)
        return f

    def chat(self, request: P.Chat, listener: StreamListener) -> Future[StreamHandle]:
        def answer() -> None:  # the engine's outbox thread, in a sidecar
            listener(ReplyText(0, "Hi"))
            listener(ReplyDone(0, _Result("Hi", "stop", 4, 1, 0.001, 0.001)))

        threading.Thread(target=answer, daemon=True).start()
        f: Future[StreamHandle] = Future()
        f.set_result(_Handle())
        return f

    def save_session(self, session: str, path: Path) -> Future[int]:
        return Future()

    def restore_session(self, path: Path, session: str | None = None) -> Future[str]:
        return Future()

    def set_priority(self, session: str, priority: int) -> None:
        pass

    def session_info(self) -> dict[str, dict[str, Any]]:
        return {}

    def frame(self, client: str, request: P.Frame) -> None:
        pass

    def reserve_vram(self, request: P.ReserveVram, done: ReservationDone) -> None:
        pass

    def status(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(endpoint: str, port: int) -> None:
    """The sidecar's side (a child process): until its stdin closes."""
    from igi_sdk.http.serve import start

    sys.setswitchinterval(0.0005)  # as `igi-sdk serve` sets it
    tmp = Path(tempfile.mkdtemp())
    server = Server(ServerConfig(endpoint=endpoint, model_dir=tmp),
                    Instant())  # type: ignore[arg-type]
    server.service.model_name = "instant.gguf"
    threading.Thread(target=server.serve_forever, daemon=True).start()
    start(f"127.0.0.1:{port}", server, api_key=None)
    sys.stdin.read()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=300)
    ap.add_argument("--block", type=int, default=25,
                    help="lines of a conversation before each face starts a new one")
    ap.add_argument("--stream", action="store_true",
                    help="the HTTP line streamed (server-sent events), as most mods ask")
    ap.add_argument("--json")
    ap.add_argument("--serve", nargs=2, metavar=("ENDPOINT", "PORT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.serve[0], int(args.serve[1]))
        return
    tmp = Path(tempfile.mkdtemp())
    endpoint, port = f"ipc://{tmp / 's.sock'}", _free_port()
    side = subprocess.Popen([sys.executable, __file__, "--serve", endpoint, str(port)],
                            stdin=subprocess.PIPE)
    try:
        measure(args, endpoint, f"http://127.0.0.1:{port}")
    finally:
        assert side.stdin is not None
        side.stdin.close()
        side.wait(10)


def measure(args: argparse.Namespace, endpoint: str, base: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    zmq_client = Client(endpoint, timeout=30)
    http = httpx.Client(timeout=30)
    try:
        import openai

        api: Any = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    except ImportError:
        api = None
    rows: dict[str, list[float]] = {name: [] for name in (
        "zmq", "http", "openai", "zmq_open", "http_open", "openai_open")}
    line = {"role": "user", "content": "Hello."}
    sid, msgs, key = "", [line], ""
    for k in range(args.rounds + 20):  # 20 to warm up
        new = k % args.block == 0
        t0 = time.perf_counter()
        if new:
            if sid:
                zmq_client.close_session(sid)
            t0 = time.perf_counter()
            sid = zmq_client.open_session("", name=f"npc-{k}")
        zmq_client.chat(sid, "Hello.", max_tokens=1).result()
        t1 = time.perf_counter()
        if new:
            msgs, key = [line], f"npc-{k}"
        body = {"model": "x", "max_tokens": 1, "prompt_cache_key": f"http-{key}",
                "messages": msgs, "stream": args.stream}
        with http.stream("POST", f"{base}/v1/chat/completions", json=body) as r:
            r.raise_for_status()
            for _ in r.iter_bytes():  # a streamed reply: to its last event
                pass
        t2 = time.perf_counter()
        if api is not None:
            answer = api.chat.completions.create(
                model="x", max_tokens=1, messages=msgs, stream=args.stream,
                extra_body={"prompt_cache_key": f"openai-{key}"})
            if args.stream:
                for _ in answer:
                    pass
        t3 = time.perf_counter()
        msgs = [*msgs, {"role": "assistant", "content": "Hi"}, line]
        if k >= 20:
            suffix = "_open" if new else ""
            rows["zmq" + suffix].append(t1 - t0)
            rows["http" + suffix].append(t2 - t1)
            if api is not None:
                rows["openai" + suffix].append(t3 - t2)
    zmq_client.close()
    out: dict[str, Any] = {"rounds": args.rounds, "stream": args.stream}
    for name, xs in rows.items():
        out[f"{name}_ms"] = round(statistics.median(xs) * 1e3, 3) if xs else None
    out["overhead_ms"] = round(out["http_ms"] - out["zmq_ms"], 3)
    if out["http_open_ms"] is not None and out["zmq_open_ms"] is not None:
        out["open_overhead_ms"] = round(out["http_open_ms"] - out["zmq_open_ms"], 3)
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
