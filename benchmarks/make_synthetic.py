"""Write a synthetic GGUF model and report its size and how long writing took.

    python benchmarks/make_synthetic.py llama3-8b /tmp/llama3-8b.gguf [--seed 0] [--quiet]

Presets: see igi_sdk.model.synthetic.PRESETS. Not a unit test: a llama3-8b (4.5 GB) is meant to
be written in well under a minute on a 16-core machine with a fast disk.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path

from igi_sdk.model import PRESETS, read_inventory, write_synthetic_gguf


def _progress_printer() -> Callable[[float], None]:
    last = [-1]

    def show(fraction: float) -> None:
        percent = int(fraction * 100)
        if percent // 10 != last[0] // 10:  # every 10 %
            print(f"  {percent:3d} %", file=sys.stderr, flush=True)
            last[0] = percent

    return show


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("preset", choices=sorted(PRESETS))
    parser.add_argument("output", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)

    start = time.perf_counter()
    progress = None if args.quiet else _progress_printer()
    path = write_synthetic_gguf(args.output, args.preset, seed=args.seed, progress=progress)
    seconds = time.perf_counter() - start
    size = path.stat().st_size
    inventory = read_inventory(path)  # also proves the file parses
    print(
        f"{args.preset}: {path} {size / 1e9:.3f} GB ({size} bytes), {len(inventory.tensors)} "
        f"tensors, written in {seconds:.2f} s ({size / 1e9 / max(seconds, 1e-9):.2f} GB/s)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
