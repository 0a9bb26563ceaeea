"""Upstream's ``--n-cpu-moe N`` placement as a plan our runtime runs (a mirror of the peer).

    python benchmarks/ncmoe_mirror.py --model qwen3-30b-a3b.gguf --profile profile.json \
        --budget-gb 4 --n-cpu-moe 44 --out ncmoe44.json [--ours ours.json]

Takes the planner's plan for the budget (a 1K prompt, 128 tokens, n_ctx 1152, as the shipped
rows) and moves the routed experts: those of the first ``N`` layers on the CPU, the rest in VRAM,
as ``llama-bench -ngl 99 -ncmoe N`` places them; every other tensor stays where the plan put it.
``planner_bench.py --plan-file`` then runs the peer's placement in our runtime beside our own
plan (``--ours`` writes it), so a gap can be told apart into placement and runtime.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from igi_sdk.model import read_inventory
from igi_sdk.planner import Workload, plan_for
from igi_sdk.profile import Profile

_EXPERT = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--profile", required=True, type=Path)
    ap.add_argument("--budget-gb", type=float, default=4.0)
    ap.add_argument("--n-cpu-moe", type=int, required=True)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--ours", type=Path, help="also write the planner's own plan here")
    a = ap.parse_args(argv)
    inv = read_inventory(a.model)
    wl = Workload(n_ctx=1152, n_seqs=1, prompt_tokens=1024, gen_tokens=128)
    ours = plan_for(inv, Profile.load(a.profile), int(a.budget_gb * 1e9), wl).best
    kept = [n for n in ours.gpu_tensors if not _EXPERT.match(n)]
    moved = [t.name for t in inv.tensors
             if (m := _EXPERT.match(t.name)) and int(m.group(1)) >= a.n_cpu_moe]
    mirror = ours.model_copy(update={"gpu_tensors": tuple(sorted(kept + moved)),
                                     "name": f"ncmoe{a.n_cpu_moe}-mirror"})
    mirror.save(a.out)
    if a.ours:
        ours.save(a.ours)
    gpu_experts = sorted({int(m.group(1)) for n in ours.gpu_tensors if (m := _EXPERT.match(n))})
    print(f"ours: experts of layers {gpu_experts} in VRAM; mirror: layers {a.n_cpu_moe}.. "
          f"({len(moved)} expert tensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
