"""A flood of large HTTP bodies beside a talking NPC: does the sidecar keep its control plane
and its NPC?

``igi-sdk serve --http`` on a model; first alone, then while senders post large bodies to the
HTTP face in a loop (a 30 MiB body of ``\\u00e9`` escapes, and a 24 MiB body of one long
base64 string), an NPC streams a long reply through the ZeroMQ face and a client pings it
every 10 ms. Reported: the NPC's decode speed with the flood over its speed alone (one run),
and the ping's p50/p99/max in both phases.

    python benchmarks/body_flood.py --model-dir DIR --model M.gguf [--threads N]
        [--tokens 256] [--senders 2] [--json out.json]
"""

from __future__ import annotations

import argparse
import base64
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

# only the sidecar's faces and clients here: llama.cpp's native libraries stay unmapped (as in
# the other client-side benchmarks; the model side, where there is one, is its own process)
os.environ["IGI_SDK_CLIENT_ONLY"] = "1"

import httpx
from ping_watch import PingWatch

from igi_sdk.client import Client


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _bodies() -> list[bytes]:
    escapes = ('{"model":"x","max_tokens":1,"messages":[{"role":"user","content":"'
               + "\\u00e9" * (5 << 20) + '"}]}').encode()
    image = base64.b64encode(os.urandom(18 << 20)).decode()
    plain = ('{"model":"x","max_tokens":1,"messages":[{"role":"user","content":[{"type":'
             '"image_url","image_url":{"url":"data:image/png;base64,' + image + '"}}]}]}').encode()
    return [escapes, plain]


def _phase(endpoint: str, base: str, tokens: int, senders: int) -> dict[str, Any]:
    stop = threading.Event()
    posted: list[int] = []

    def flood(body: bytes) -> None:
        http = httpx.Client(timeout=120)
        while not stop.is_set():
            try:
                r = http.post(f"{base}/v1/chat/completions", content=body,
                              headers={"Content-Type": "application/json"})
            except httpx.HTTPError:
                if stop.is_set():
                    return  # the sidecar stops at the end of the run, mid-post
                raise
            posted.append(r.status_code)

    if senders:
        bodies = _bodies()
        for k in range(senders):
            threading.Thread(target=flood, args=(bodies[k % len(bodies)],), daemon=True).start()
        time.sleep(1.0)  # the flood is on before the NPC speaks
    pinger = PingWatch(endpoint)
    pinger.start()
    npc = Client(endpoint, timeout=120)
    sid = npc.open_session("You are a storyteller.", sampling={"temperature": 0.0, "seed": 1})
    t0 = time.perf_counter()
    stream = npc.chat(sid, "Tell me a long story about a dragon and a smith.",
                      max_tokens=tokens)
    first = None
    n = 0
    for _ in stream:
        n += 1
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    npc.close_session(sid)
    npc.close()
    stop.set()
    pinger.stop()
    decode = (n - 1) / (end - first) if first is not None and n > 1 else 0.0
    return {"tokens": n, "decode_tok_s": round(decode, 2),
            "ttft_s": round((first or end) - t0, 3),
            "ping_ms": pinger.summary(),
            "bodies_posted": len(posted), "statuses": sorted(set(posted))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--senders", type=int, default=2)
    ap.add_argument("--json")
    ap.add_argument("extra", nargs="*", help="more `igi-sdk serve` arguments (after --)")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    endpoint, port = f"ipc://{tmp / 's.sock'}", _free_port()
    cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint,
           "--model-dir", args.model_dir, "--model", args.model, "--http",
           f"127.0.0.1:{port}", *(["--threads", str(args.threads)] if args.threads else []),
           *args.extra]
    log = open(tmp / "sidecar.log", "w")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
    base = f"http://127.0.0.1:{port}"
    try:
        Client(endpoint, timeout=120).wait_ready(300)
        while httpx.get(f"{base}/health", timeout=5).status_code != 200:
            time.sleep(0.2)
        alone = _phase(endpoint, base, args.tokens, 0)
        print("alone:", json.dumps(alone), flush=True)
        flooded = _phase(endpoint, base, args.tokens, args.senders)
        print("flood:", json.dumps(flooded), flush=True)
    finally:
        proc.terminate()
        proc.wait(30)
    out = {"model": args.model, "alone": alone, "flood": flooded,
           "decode_ratio": round(flooded["decode_tok_s"] / max(alone["decode_tok_s"], 1e-9), 3)}
    print(f"decode with the flood / alone: {out['decode_ratio']}x; ping p99 "
          f"{alone['ping_ms']['p99']} -> {flooded['ping_ms']['p99']} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
