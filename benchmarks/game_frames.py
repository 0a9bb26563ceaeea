"""A game's CPU load beside the sidecar, and what the sidecar costs the game's frames.

    python benchmarks/game_frames.py [--workers 12] [--duty 0.5] [--hz 60] [--seconds 120]
        [--json frames.json]

Each worker is a process of its own running a frame loop: it computes for ``duty`` of a frame
(a fixed amount of work, calibrated on the idle host before the loop starts), then sleeps until
the next frame. A game whose worker threads wake every frame is what a decode's threads share
the cores with; a spinning process (``while :; do :; done``) is not: it never leaves its core.
The loop runs until ``--seconds`` pass or the process gets SIGTERM/SIGINT, then reports each
frame's work time against its idle time (``stretch``) and the share of frames whose work ended
after the frame's deadline (``late``). Pure Python on purpose: nothing to build on a GPU host.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import multiprocessing.synchronize
import signal
import statistics
import sys
import time


def _spin(n: int) -> float:
    x = 1.0
    for _ in range(n):
        x = x * 1.0000001
    return x


def _calibrate(ms: float) -> int:
    """Iterations of :func:`_spin` that take ``ms`` on an idle core (the fastest of a few)."""
    n = 20000
    best = float("inf")
    for _ in range(15):
        t0 = time.perf_counter()
        _spin(n)
        best = min(best, time.perf_counter() - t0)
    return max(1, int(n * (ms / 1000.0) / best))


def _worker(hz: float, duty: float, stop: multiprocessing.synchronize.Event,
            out: mp.Queue) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops the loop
    frame = 1.0 / hz
    work_ms = duty * frame * 1000.0
    n = _calibrate(work_ms)
    works, late = [], 0
    deadline = time.perf_counter() + frame
    while not stop.is_set():
        t0 = time.perf_counter()
        _spin(n)
        t1 = time.perf_counter()
        works.append((t1 - t0) * 1000.0)
        if t1 > deadline:
            late += 1
            deadline = t1 + frame  # a missed frame: the next one starts now
        else:
            time.sleep(deadline - t1)
            deadline += frame
    out.put({"work_ms": work_ms, "works": works, "late": late})


def summarize(parts: list[dict], workers: int, duty: float, hz: float) -> dict:
    works = [w for p in parts for w in p["works"]]
    nominal = statistics.median(p["work_ms"] for p in parts) if parts else 0.0
    frames = len(works)
    q = statistics.quantiles(works, n=100) if frames >= 100 else []
    return {
        "workers": workers, "duty": duty, "hz": hz, "frames": frames,
        "nominal_work_ms": round(nominal, 3),
        "work_ms_p50": round(statistics.median(works), 3) if works else None,
        "work_ms_p99": round(q[98], 3) if q else None,
        "stretch_p50": round(statistics.median(works) / nominal, 3) if works else None,
        "stretch_p99": round(q[98] / nominal, 3) if q else None,
        "late_share": round(sum(p["late"] for p in parts) / frames, 4) if frames else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=12)
    ap.add_argument("--duty", type=float, default=0.5, help="share of a frame each worker computes")
    ap.add_argument("--hz", type=float, default=60.0)
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    if not (args.workers >= 1 and 0.0 < args.duty < 1.0 and args.hz > 0):
        ap.error("workers >= 1, 0 < duty < 1, hz > 0")
    stop, out = mp.Event(), mp.Queue()
    procs = [mp.Process(target=_worker, args=(args.hz, args.duty, stop, out), daemon=True)
             for _ in range(args.workers)]
    for p in procs:
        p.start()
    told: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: told.append(signum))
    end = time.monotonic() + args.seconds
    while not told and time.monotonic() < end:
        time.sleep(0.05)
    stop.set()
    parts = [out.get(timeout=30) for _ in procs]
    for p in procs:
        p.join(timeout=5)
    result = summarize(parts, args.workers, args.duty, args.hz)
    text = json.dumps(result)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
