"""One local flooder against the sidecar's ZeroMQ face: how much the sidecar grows, how soon the
flooder is cut, and what another client's ping sees meanwhile.

``igi-sdk serve`` on a model; a DEALER sends one kind of message as fast as it can for
``--seconds`` (``ping``: answered ``hello_required``, cheap; ``persona``: an ``open_session``
with a 32 000-character persona, refused but parsed whole, dear), reconnecting when cut; a
second client pings every 10 ms. Reported: the sidecar's RSS growth at its peak (psutil, read
every 20 ms), ``flood_cuts`` and when the first came, and the ping's p50/p99/max.

    python benchmarks/flood_rss.py --model-dir DIR --model M.gguf [--kind ping|persona]
        [--seconds 10] [--json out.json]
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
from pathlib import Path
from typing import Any

os.environ["IGI_SDK_CLIENT_ONLY"] = "1"

import psutil
import zmq
from ping_watch import PingWatch

from igi_sdk.client import Client
from igi_sdk.wire import protocol as P


def _message(kind: str) -> bytes:
    if kind == "ping":
        return P.encode(1, "ping", {})
    return P.encode(1, "open_session", {"persona": "é" * 32_000, "name": "x"})


def flood(endpoint: str, kind: str, seconds: float) -> None:
    """(The flooding process.) Send ``kind`` as fast as possible for ``seconds``; print how many
    were sent."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.connect(endpoint)
    message, sent, t0 = _message(kind), 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(100):
            sock.send(message, copy=False)
        sent += 100
    sock.close(0)
    ctx.term()
    print(sent)


def main() -> None:
    if len(sys.argv) == 5 and sys.argv[1] == "--flood":
        flood(sys.argv[2], sys.argv[3], float(sys.argv[4]))
        return
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--kind", choices=("ping", "persona"), default="ping")
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--json")
    args = ap.parse_args()
    endpoint = f"ipc://{Path(tempfile.mkdtemp()) / 's.sock'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint, "--model-dir",
         args.model_dir, "--model", args.model, "--threads", "1", "--no-arbiter"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    watcher = Client(endpoint, timeout=60)
    try:
        watcher.wait_ready(120)
        side = psutil.Process(proc.pid)
        rss0 = side.memory_info().rss
        stop = threading.Event()
        peak = [rss0]

        def watch() -> None:
            while not stop.is_set():
                peak[0] = max(peak[0], side.memory_info().rss)
                time.sleep(0.02)

        watcher_thread = threading.Thread(target=watch, daemon=True)
        watcher_thread.start()
        pinger = PingWatch(endpoint)
        pinger.start()
        time.sleep(0.5)
        # the flooder in a process of its own: in this one, its sending loop held the GIL and
        # the pinger got a few dozen pings out in ten seconds
        flooder = subprocess.Popen([sys.executable, __file__, "--flood", endpoint, args.kind,
                                    str(args.seconds)], stdout=subprocess.PIPE, text=True)
        t0 = time.monotonic()
        first_cut: float | None = None
        while flooder.poll() is None:
            if first_cut is None and watcher.stats()["flood_cuts"] > 0:
                first_cut = time.monotonic() - t0
            time.sleep(0.1)
        sent = int((flooder.stdout.read() if flooder.stdout else "0").strip() or 0)
        time.sleep(1.0)
        stop.set()
        pinger.stop()
        watcher_thread.join(5)
        cuts = watcher.stats()["flood_cuts"]
        out: dict[str, Any] = {
            "kind": args.kind, "seconds": args.seconds, "sent": sent,
            "rss_growth_mib": round((peak[0] - rss0) / 2**20, 1), "flood_cuts": cuts,
            "first_cut_s": None if first_cut is None else round(first_cut, 2),
            "ping_ms": pinger.summary()}
        print(json.dumps(out))
        if args.json:
            Path(args.json).write_text(json.dumps(out, indent=1))
    finally:
        watcher.close()
        proc.terminate()
        proc.wait(30)


if __name__ == "__main__":
    main()
