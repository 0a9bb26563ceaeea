"""A 7.9 MB history sent by one client while another NPC talks: does the bystander's reply
keep its pace?

``igi-sdk serve --http`` on a model. A bystander NPC streams a long reply through the ZeroMQ
face, first alone, then while a second client opens a session with a history of 256 turns of
32 000 characters (7.9 MB) and sends it a line: over ZeroMQ (``open_session.history``), then
over HTTP (the whole transcript in one body). Reported per phase: the bystander's longest gap
between two tokens and its decode speed, and what the hostile line was answered (and when).

    python benchmarks/long_history.py --model-dir DIR --model M.gguf [--threads N]
        [--tokens 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ["IGI_SDK_CLIENT_ONLY"] = "1"

import httpx

from igi_sdk.client import BridgeError, Client
from igi_sdk.wire import protocol as P

TURN = ("The siege lasted nine winters, and the smith forged every hinge of the gate. " * 420
        )[:32_000]
HISTORY = [{"role": ("user", "assistant")[i % 2], "content": TURN}
           for i in range(P.MAX_HISTORY_TURNS)]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _hostile_zmq(endpoint: str, out: dict[str, Any]) -> None:
    c = Client(endpoint, timeout=120)
    t0 = time.perf_counter()
    try:
        sid = c.open_session("You are a scribe.", history=HISTORY)
        c.chat(sid, "And then?", max_tokens=4).result()
        out["answer"] = "ok"
    except BridgeError as e:
        out["answer"] = e.code
    out["answered_s"] = round(time.perf_counter() - t0, 3)
    c.close()


def _hostile_http(base: str, out: dict[str, Any]) -> None:
    body = {"model": "m", "max_tokens": 4,
            "messages": [*HISTORY, {"role": "user", "content": "And then?"}]}
    t0 = time.perf_counter()
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=120)
    out["answer"] = f"{r.status_code} {r.json().get('error', {}).get('code', '')}".strip()
    out["answered_s"] = round(time.perf_counter() - t0, 3)


def _phase(endpoint: str, tokens: int, hostile: Any) -> dict[str, Any]:
    npc = Client(endpoint, timeout=120)
    sid = npc.open_session("You are a storyteller.", sampling={"temperature": 0.0, "seed": 1})
    told: dict[str, Any] = {}
    stamps: list[float] = []
    stream = npc.chat(sid, "Tell me a long story about a dragon and a smith.", max_tokens=tokens)
    for _ in stream:
        stamps.append(time.perf_counter())
        if hostile is not None and len(stamps) == 10:  # the reply is under way
            threading.Thread(target=hostile, args=(told,), daemon=True).start()
    npc.close_session(sid)
    npc.close()
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    span = stamps[-1] - stamps[0] if len(stamps) > 1 else 0.0
    deadline = time.monotonic() + 120
    while hostile is not None and "answer" not in told and time.monotonic() < deadline:
        time.sleep(0.1)
    return {"tokens": len(stamps), "decode_tok_s": round((len(stamps) - 1) / span, 2)
            if span else 0.0, "max_gap_ms": round(max(gaps) * 1e3, 1) if gaps else None,
            **({"hostile": told} if hostile is not None else {})}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=200)
    ap.add_argument("--json")
    ap.add_argument("extra", nargs="*", help="more `igi-sdk serve` arguments (after --)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    endpoint, port = f"ipc://{tmp / 's.sock'}", _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint, "--model-dir",
         args.model_dir, "--model", args.model, "--http", f"127.0.0.1:{port}",
         *(["--threads", str(args.threads)] if args.threads else []), *args.extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    out: dict[str, Any] = {"model": args.model, "history_bytes": len(json.dumps(HISTORY))}
    try:
        Client(endpoint, timeout=120).wait_ready(300)
        while httpx.get(f"{base}/health", timeout=5).status_code != 200:
            time.sleep(0.2)
        out["alone"] = _phase(endpoint, args.tokens, None)
        out["zmq_history"] = _phase(endpoint, args.tokens,
                                    lambda told: _hostile_zmq(endpoint, told))
        out["http_history"] = _phase(endpoint, args.tokens,
                                     lambda told: _hostile_http(base, told))
        out["alone_again"] = _phase(endpoint, args.tokens, None)
    finally:
        proc.terminate()
        proc.wait(30)
    print(json.dumps(out, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
