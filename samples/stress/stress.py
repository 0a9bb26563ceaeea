"""Headless stress client for the igi-sdk sidecar: N concurrent clients x M chats, loopback only.

    python samples/stress/stress.py --clients 64 --chats 10 --model-dir DIR --model tiny.gguf

Starts its own sidecar (or uses --endpoint, which must be loopback), then every client opens a
session and runs its chats one after another. It checks every stream: token events numbered
1..n with no gap or repeat, exactly one terminal event, and the final text equal to the streamed
pieces. Prints p50/p99 time to first token, tokens/s, errors, lost and duplicated replies.
Bounded in count (clients x chats) and in time (--time-limit).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import igi_sdk  # noqa: F401
from igi_sdk.client import BridgeError, Client
from igi_sdk.serving.server import is_loopback

LINES = ["Hello there!", "What do you sell?", "Any news from the north?", "How much is that?",
         "Goodbye, friend.", "Where is the inn?", "Seen any dragons?", "Tell me a joke.",
         "Who rules this town?", "Is the road safe?"]


@dataclass
class Tally:
    ttft: list[float] = field(default_factory=list)
    tokens: int = 0
    ok: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    lost: int = 0
    duplicated: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


def run_client(endpoint: str, n_chats: int, max_tokens: int, deadline: float, t: Tally,
               seed: int) -> None:
    c = Client(endpoint, timeout=60, engine="stress")
    try:
        sid = c.open_session("You are a terse villager.", sampling={"seed": seed})
        finished = []
        for k in range(n_chats):
            if time.monotonic() > deadline:
                break
            t0 = time.monotonic()
            msg_id = c.send("chat", {"session": sid, "text": LINES[(seed + k) % len(LINES)],
                                     "max_tokens": max_tokens})
            _read_stream(c, msg_id, t0, t)
            finished.append(msg_id)
        c.close_session(sid)
        c.drain(0.2)  # anything still arriving for a finished reply is a duplicate
        with t.lock:
            t.duplicated += sum(c.pending(m) for m in finished)
    except BridgeError as e:
        with t.lock:
            t.errors[e.code] = t.errors.get(e.code, 0) + 1
    finally:
        c.close()


def _read_stream(c: Client, msg_id: int, t0: float, t: Tally) -> None:
    expect, pieces, first = 1, [], None
    while True:
        try:
            rtype, body = c.next_event(msg_id, stream=True)
        except BridgeError:
            with t.lock:
                t.lost += 1
            raise
        if rtype == "token":
            if body["i"] != expect:
                with t.lock:
                    t.duplicated += body["i"] < expect
                    t.lost += body["i"] > expect
            expect = body["i"] + 1
            pieces.append(body["text"])
            first = first or time.monotonic()
            continue
        with t.lock:
            if rtype == "done":
                t.ok += 1
                t.tokens += body["usage"]["completion_tokens"]
                t.ttft.append((first or time.monotonic()) - t0)
                if body["text"] and "".join(pieces) != body["text"]:
                    t.lost += 1
            else:
                t.errors[body.get("code", "?")] = t.errors.get(body.get("code", "?"), 0) + 1
        return


def run(endpoint: str, clients: int, chats: int, max_tokens: int, time_limit: float) -> dict:
    if not is_loopback(endpoint):
        raise SystemExit("the stress client only targets loopback endpoints")
    t = Tally()
    deadline = time.monotonic() + time_limit
    t0 = time.monotonic()
    threads = [threading.Thread(target=run_client, args=(endpoint, chats, max_tokens, deadline,
                                                         t, i)) for i in range(clients)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(time_limit + 60)
    wall = time.monotonic() - t0
    ttft = sorted(t.ttft)
    return {
        "clients": clients, "chats_per_client": chats, "completed": t.ok,
        "expected": clients * chats, "lost": t.lost, "duplicated": t.duplicated,
        "errors": t.errors, "wall_s": round(wall, 2), "tokens": t.tokens,
        "tokens_per_s": round(t.tokens / wall, 1),
        "ttft_p50_ms": round(1000 * statistics.median(ttft), 1) if ttft else None,
        "ttft_p99_ms": round(1000 * ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))], 1)
        if ttft else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--chats", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--time-limit", type=float, default=300)
    ap.add_argument("--endpoint", help="an already running sidecar (loopback only)")
    ap.add_argument("--model-dir", help="start a sidecar serving this directory")
    ap.add_argument("--model", help="model file inside --model-dir")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", help="write the summary here")
    args = ap.parse_args()
    proc = None
    with tempfile.TemporaryDirectory() as tmp:
        endpoint = args.endpoint
        if endpoint is None:
            endpoint = f"ipc://{Path(tmp) / 'stress.sock'}"
            cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint,
                   "--max-sessions", str(args.clients), "--ctx", str(max(4096, args.clients
                                                                          * args.chats * 64)),
                   "--threads", str(args.threads), "--game-pid", str(os.getpid())]
            if args.model_dir:
                cmd += ["--model-dir", args.model_dir, "--model", args.model]
            proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            Client(endpoint, timeout=60).wait_ready(120)
        try:
            summary = run(endpoint, args.clients, args.chats, args.max_tokens, args.time_limit)
        finally:
            if proc is not None:
                proc.terminate()
                proc.wait(10)
    print(json.dumps(summary, indent=1))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=1))
    bad = summary["lost"] or summary["duplicated"] or summary["completed"] != summary["expected"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
