"""Decode speed of one NPC streamed by the real sidecar to a local client, idle or beside busy
CPUs, and the thread setting the sidecar ended on.

    python benchmarks/sidecar_decode.py [--threads 2] [--busy 1] [--replies 3] [--tokens 96]
        [--env GOMP_SPINCOUNT=20000] [--json out.json]

The sidecar (`igi-sdk serve`, the default model) runs in a process of its own, so the wait policy
given with ``--env`` reaches libgomp when it loads; ``--busy N`` starts N processes spinning for
the whole run. Each reply's rate counts the tokens after its first over the time after its first,
as the client saw them; the client's own work is part of the machine's load, as a game's is.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from igi_sdk.client import Client  # noqa: E402  (after the path: run from anywhere)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=0, help="serve --threads (0: adaptive)")
    ap.add_argument("--busy", type=int, default=0, help="processes spinning meanwhile")
    ap.add_argument("--replies", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the sidecar")
    ap.add_argument("--json", default="")
    args = ap.parse_args()

    endpoint = f"ipc://{tempfile.mkdtemp(prefix='igi-decode-')}/s.sock"
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "IGI_SDK_CLIENT_ONLY")}
    env.update(kv.split("=", 1) for kv in args.env)
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(args.busy)]
    sidecar = subprocess.Popen([sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint",
                                endpoint, "--threads", str(args.threads)], env=env, cwd=REPO,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rates: list[float] = []
    try:
        c = Client(endpoint, timeout=60)
        c.wait_ready(120)
        sid = c.open_session("You are a guard.", sampling={"temperature": 0})
        c.chat(sid, "Hello there.", max_tokens=4).result()  # warm-up
        for _ in range(args.replies):
            first = None
            n = 0
            for _piece in c.chat(sid, "Tell me about the castle and its history, in detail.",
                                 max_tokens=args.tokens):
                first = first or time.perf_counter()
                n += 1
            if first is not None and n > 1:
                rates.append(round((n - 1) / (time.perf_counter() - first), 1))
        threads = c.stats().get("engine", {}).get("threads", {})
        c.close()
    finally:
        sidecar.kill()
        sidecar.wait()
        for h in hogs:
            h.kill()
            h.wait()
    out = {"threads_arg": args.threads, "busy": args.busy, "env": args.env, "tok_s": rates,
           "setting": threads.get("setting"), "ceiling": threads.get("ceiling"),
           "other_runnable": threads.get("other_runnable")}
    print(json.dumps(out))
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
