"""Routed experts against dense weights on this machine's devices, measured together, and what
the cost model then predicts for the 30B-A3B MoE.

    python benchmarks/expert_scale.py --profile PROFILE.json [--out NEW.json] [--rounds 3]

Per device (the CPU at the profile's threads, the GPU when there is one), ``rounds`` times:
one token through a Q4_0 dense weight of the profile's shape (the CPU 4096 x 4096, the GPU
8192 x 8192, as ``tuning/measure.py`` times them) and through Qwen3-30B-A3B's routed experts
(8 of 2048 x 768 a token; gate/up sharing one input row, down one row each), the two back to
back so both see the same machine; the share is the median of the rounds' ratios
(``tuning.measure.expert_scale_on``). ``--out`` writes the profile with these shares. Prints
the cost model's decode for the MoE (a header-only synthetic file) with the profile's shares
and with the measured ones, every expert on the GPU (``-ncmoe 0``) and the experts of the
first 42 layers on the CPU (the 4 GB plan's placement), for comparing with upstream's
``llama-bench -ncmoe`` on that machine.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from igi_sdk.model import read_inventory, write_synthetic_gguf
from igi_sdk.planner import Plan
from igi_sdk.planner.cost import ubatch_cost
from igi_sdk.profile import Profile
from igi_sdk.runtime import ggml_bench
from igi_sdk.runtime.devices import list_devices
from igi_sdk.tuning.measure import cpu_weights_repacked, expert_scale_on

MIB = 1024 * 1024


def shares(index: int, threads: int, shape: tuple[int, int], budget: int, rounds: int,
           weights_buft: int | None = None) -> tuple[dict[str, float], list[float]]:
    """Median expert shares over ``rounds`` (dense, experts) pairs, and the dense rates, the
    weights in ``weights_buft``'s layout (the one llama.cpp loads them in, as the profile)."""
    seen: dict[str, list[float]] = {"gate_up": [], "down": []}
    dense: list[float] = []
    for _ in range(rounds):
        with ggml_bench.backend(index, threads) as be:
            s = ggml_bench.matmul_seconds(be, "Q4_0", *shape, 1, reps=3, total_bytes=budget,
                                          weights_buft=weights_buft)
        rate = ggml_bench.ggml_weight_bytes("Q4_0", *shape) / s
        dense.append(rate)
        for kind, v in expert_scale_on(index, threads, rate, budget // 2, reps=3,
                                       weights_buft=weights_buft).items():
            seen[kind].append(v)
    return {k: round(statistics.median(v), 3) for k, v in seen.items()}, dense


def moe_decode(prof: Profile, path: Path) -> dict[str, float]:
    inv = read_inventory(path)
    out = {}
    for n in (0, 42):
        gpu = [t.name for t in inv.tensors
               if not (t.group == "ffn_exps" and t.layer is not None and t.layer < n)]
        plan = Plan.all_gpu(inv).model_copy(update={"gpu_tensors": gpu, "flash_attn": "on"})
        out[f"ncmoe{n}"] = round(1.0 / ubatch_cost(inv, plan, prof, 1, 1024).total, 1)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--profile", required=True)
    ap.add_argument("--out", default="")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    prof = Profile.load(a.profile)
    devices = list_devices()
    cpu = next(d for d in devices if d.kind == "cpu")
    gpu = next((d for d in devices if d.is_gpu), None)
    new = prof.model_copy(deep=True)
    report: dict[str, object] = {"profile": a.profile}
    # without a GPU llama.cpp repacks the CPU's weights, and the profile times them so
    repacked = cpu_weights_repacked(gpu is not None)
    s, dense = shares(cpu.index, prof.cpu.threads or 1, (4096, 4096), 256 * MIB, a.rounds,
                      ggml_bench.repack_buffer_type() if repacked else None)
    new.cpu.expert_scale = s
    report["cpu"] = {"before": prof.cpu.expert_scale, "now": s, "repacked": repacked,
                     "dense_gbps": [round(r / 1e9, 1) for r in dense]}
    if gpu is not None and new.gpu is not None:
        s, dense = shares(gpu.index, 1, (8192, 8192), 1024 * MIB, a.rounds)
        new.gpu.expert_scale = s
        report["gpu"] = {"before": prof.gpu.expert_scale if prof.gpu else {}, "now": s,
                         "dense_gbps": [round(r / 1e9, 1) for r in dense]}
    with tempfile.TemporaryDirectory() as d:
        path = write_synthetic_gguf(Path(d) / "moe.gguf", "qwen3-30b-a3b", data=False)
        report["predicted_decode_tps"] = {"profile": moe_decode(prof, path),
                                          "measured_shares": moe_decode(new, path)}
    print(json.dumps(report))
    if a.out:
        Path(a.out).write_text(new.model_dump_json(indent=1))
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
