"""Whether copying weights to the GPU takes memory bandwidth from the CPU reading its own.

A pipelined decode overlaps the two: the CPU multiplies the weights it holds while the GPU's
copy engine reads the next streamed ones from pinned host memory. That pays only if the host's
memory serves both at once. Three phases of ``--seconds`` each, in one call: a pinned
host-to-device copy alone (GB/s), the CPU summing a large array with ``--threads`` threads
alone (GB/s read), then both at once (the copy in a process of its own):

    python benchmarks/dma_contention.py [--gb 2] [--seconds 4] [--threads 15] [--json out.json]

Needs torch with CUDA (benchmarks only; the SDK does not import it).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import time


def copy_rate(gb: float, seconds: float, q: mp.Queue | None = None) -> float:
    import torch

    src = torch.empty(int(gb * 2**30), dtype=torch.uint8).pin_memory()
    dst = torch.empty_like(src, device="cuda")
    dst.copy_(src, non_blocking=True)
    torch.cuda.synchronize()
    if q is not None:
        q.put("ready")
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        n += 1
    rate = n * src.numel() / (time.perf_counter() - t0) / 1e9
    if q is not None:
        q.put(rate)
    return rate


def read_rate(gb: float, seconds: float, threads: int) -> float:
    import torch

    torch.set_num_threads(threads)
    a = torch.ones(int(gb * 2**30 / 4), dtype=torch.float32)
    a.sum()
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a.sum()
        n += 1
    return n * a.numel() * 4 / (time.perf_counter() - t0) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gb", type=float, default=2.0)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--threads", type=int, default=15)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    out: dict[str, float] = {"copy_alone_gbs": copy_rate(a.gb, a.seconds),
                             "read_alone_gbs": read_rate(a.gb, a.seconds, a.threads)}
    ctx = mp.get_context("spawn")
    q: mp.Queue = ctx.Queue()
    p = ctx.Process(target=copy_rate, args=(a.gb, a.seconds, q))
    p.start()
    q.get()  # its buffers made and warm
    out["read_during_copy_gbs"] = read_rate(a.gb, a.seconds, a.threads)
    out["copy_during_read_gbs"] = q.get()
    p.join()
    out = {k: round(v, 2) for k, v in out.items()}
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
