"""What the OpenAI-compatible HTTP face costs over the ZeroMQ face, on one sidecar and model.

Starts ``igi-sdk serve --http``, then alternates the same NPC turn through both faces: a
one-token reply (the per-request cost: time to the reply's end) and a long streamed reply
(decode tokens/s, time to first token). Each face keeps one conversation, so both prefill only
the new line. Prints a table and writes JSON::

    python benchmarks/http_face_bench.py --model-dir DIR --model M.gguf [--rounds 20]
        [--tokens 128] [--threads N] [--json out.json] [-- extra serve arguments]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from igi_sdk.client import Client

NPC = "You are Brom, the village blacksmith."
LINES = ["What do you sell?", "How much for a sword?", "Is it sharp?", "Any armour?",
         "Who made it?", "Thanks."]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json")
    ap.add_argument("extra", nargs="*")
    args = ap.parse_args()
    ep = f"ipc://{tempfile.mkdtemp()}/s.sock"
    port = _free_port()
    cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", ep, "--model-dir",
           args.model_dir, "--model", args.model, "--http", f"127.0.0.1:{port}",
           "--prefill-chunk", "512", *(["--threads", str(args.threads)] if args.threads else []),
           *args.extra]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    try:
        zc = Client(ep, timeout=300)
        zc.wait_ready(600)
        base = f"http://127.0.0.1:{port}/v1"
        http = httpx.Client(timeout=300)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if http.get(f"{base}/models").status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        # under the VRAM arbiter the model climbs its ladder first: measure on a settled plan
        seen, settled_at = None, time.monotonic()
        while time.monotonic() - settled_at < 4 and time.monotonic() < deadline + 60:
            st = zc.stats()
            now = (st.get("plan"), (st.get("arbiter") or {}).get("reshards"))
            if now != seen:
                seen, settled_at = now, time.monotonic()
            time.sleep(0.5)
        sid = zc.open_session(NPC, sampling={"temperature": 0})
        transcript = [{"role": "system", "content": NPC}]
        rows: dict[str, list[float]] = {k: [] for k in (
            "zmq_turn_s", "http_turn_s", "zmq_ttft_s", "http_ttft_s", "zmq_tps", "http_tps")}

        def zmq_turn(text: str, n: int) -> tuple[float, float, float]:
            t0 = time.perf_counter()
            first = None
            stream = zc.chat(sid, text, max_tokens=n)
            count = 0
            for _ in stream:
                count += 1
                first = first or time.perf_counter()
            end = time.perf_counter()
            toks = stream.done["usage"]["completion_tokens"] if stream.done else count
            return end - t0, (first or end) - t0, toks / max(end - (first or end), 1e-9)

        def http_turn(text: str, n: int) -> tuple[float, float, float]:
            transcript.append({"role": "user", "content": text})
            body = {"model": "m", "messages": transcript, "max_tokens": n, "temperature": 0,
                    "stream": True, "stream_options": {"include_usage": True},
                    "prompt_cache_key": "bench"}
            t0 = time.perf_counter()
            first = None
            said, usage = [], {}
            with http.stream("POST", f"{base}/chat/completions", json=body) as r:
                for line in r.iter_lines():
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[6:])
                    if chunk.get("usage"):
                        usage = chunk["usage"]
                    for c in chunk.get("choices", []):
                        if c["delta"].get("content"):
                            first = first or time.perf_counter()
                            said.append(c["delta"]["content"])
            end = time.perf_counter()
            transcript.append({"role": "assistant", "content": "".join(said)})
            toks = usage.get("completion_tokens", len(said))
            return end - t0, (first or end) - t0, toks / max(end - (first or end), 1e-9)

        for k in range(args.rounds):
            line = LINES[k % len(LINES)]
            rows["zmq_turn_s"].append(zmq_turn(line, 1)[0])
            rows["http_turn_s"].append(http_turn(line, 1)[0])
        for k in range(max(2, args.rounds // 5)):
            line = LINES[k % len(LINES)]
            _, ttft, tps = zmq_turn(line, args.tokens)
            rows["zmq_ttft_s"].append(ttft)
            rows["zmq_tps"].append(tps)
            _, ttft, tps = http_turn(line, args.tokens)
            rows["http_ttft_s"].append(ttft)
            rows["http_tps"].append(tps)
        med = {k: statistics.median(v) for k, v in rows.items() if v}
        out = {"model": args.model, "rounds": args.rounds, "tokens": args.tokens,
               "plan": zc.stats().get("plan"),
               "median": med,
               "http_added_ms_per_request": (med["http_turn_s"] - med["zmq_turn_s"]) * 1000,
               "http_decode_ratio": med["http_tps"] / med["zmq_tps"], "raw": rows}
        print(f"one-token turn: zmq {med['zmq_turn_s'] * 1000:.2f} ms, http "
              f"{med['http_turn_s'] * 1000:.2f} ms (+{out['http_added_ms_per_request']:.2f} ms)")
        print(f"decode: zmq {med['zmq_tps']:.1f} tok/s, http {med['http_tps']:.1f} tok/s "
              f"(ratio {out['http_decode_ratio']:.3f}); ttft zmq {med['zmq_ttft_s']:.3f} s, "
              f"http {med['http_ttft_s']:.3f} s")
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
        zc.close()
        http.close()
    finally:
        proc.terminate()
        proc.wait(30)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
