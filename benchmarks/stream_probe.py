"""The copy-compute probe (``step_bench.copy_compute_seconds``) at several model sizes.

A prefill ubatch of a Llama-3-8B-shaped model whose weights all stay in host memory, streamed
to the GPU layer by layer. The profile divides one 2-layer run's time (less the matmuls it
prices) by its bytes; runs at 2, 4 and 8 layers show how much of that time is fixed per
ubatch rather than per streamed byte.

    python benchmarks/stream_probe.py --layers 2,4,8 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import igi_sdk  # noqa: F401  (native import order)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="2,4,8")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--mapped", action="store_true", help="host weights mapped, not pinned")
    ap.add_argument("--json")
    args = ap.parse_args()
    from igi_sdk.runtime.step_bench import copy_compute_seconds

    out = []
    for n in (int(x) for x in args.layers.split(",")):
        run = copy_compute_seconds(pinned=not args.mapped, threads=args.threads, n_layers=n)
        r = {"n_layers": n, "pinned": not args.mapped, "tokens": run.tokens,
             "seconds": run.seconds, "weight_bytes": run.weight_bytes}
        print(json.dumps(r), flush=True)
        out.append(r)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
