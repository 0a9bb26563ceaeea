"""CPU decode against the cost model: a MoE and a dense model of the same depth, all on the CPU.

    python benchmarks/cpu_cost_check.py [--threads 2] [--layers 16] [--models moe,dense]
        [--json out.json]

Each model is a synthetic file of a real model's shape cut to ``--layers`` layers (``moe``:
Qwen3-30B-A3B, 128 experts of 768, 8 used; ``dense``: Llama-3-8B), Q4_0 like the GPU rows.
The engine decodes a greedy reply with every weight on the CPU; its decode rate is set
against ``planner.cost.decode_tps`` for the same plan with this machine's profile (measured
and cached as ``igi-sdk profile --fast`` does). Where the GPU rows' decode misses the
prediction, this says whether the CPU's share of the model is what is mispriced.
``--tiny``: the tiny presets and a scaled-down profile (seconds; what the tests run).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

MODELS = {"moe": "qwen3-30b-a3b", "dense": "llama3-8b"}
TINY = {"moe": "tiny-qwen3moe", "dense": "tiny-llama"}


def _profile(threads: int, tiny: bool):
    from igi_sdk.tuning.measure import load_or_measure, measure_profile

    if tiny:
        return measure_profile(threads=threads, fast=True, k=256, n=256, scale_down=True)
    return load_or_measure(threads=threads, fast=True)


def measure(path: Path, threads: int, tokens: int) -> tuple[float, str]:
    """Decode tokens/s of a greedy reply of ``tokens`` tokens (its first excluded: the prompt)
    with every weight on the CPU, and the thread setting the engine ran."""
    from igi_sdk.planner import Plan
    from igi_sdk.runtime.engine import Engine, EngineConfig
    from igi_sdk.runtime.sampling import SamplingParams

    first: list[float] = []
    with Engine(path, Plan.all_cpu(), EngineConfig(n_ctx=512, max_sessions=1,
                                                   n_threads=threads)) as eng:
        sid = eng.open_session("You are a guard.", sampling=SamplingParams(temperature=0.0))
        eng.chat(sid, "Hello.", max_tokens=4, ignore_eos=True).result(600)  # warm
        t0 = time.perf_counter()
        res = eng.chat(sid, "Tell me more.", max_tokens=tokens, ignore_eos=True,
                       listener=lambda _e: first or first.append(time.perf_counter())
                       ).result(600)
        end = time.perf_counter()
        setting = str((eng.status().get("threads") or {}).get("setting"))
    start = first[0] if first else t0
    return (res.completion_tokens - 1) / max(end - start, 1e-9), setting


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--models", default="moe,dense")
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--workdir", default="/tmp/igi-cost-check")
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    names = [m for m in args.models.split(",") if m]
    if not names or any(m not in MODELS for m in names) or args.layers < 1 or args.tokens < 2:
        ap.error(f"--models from {','.join(MODELS)}, --layers >= 1, --tokens >= 2")

    from igi_sdk.model import read_inventory, spec_with, write_synthetic_gguf
    from igi_sdk.planner import Plan
    from igi_sdk.planner.cost import decode_tps

    prof = _profile(args.threads, args.tiny)
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in names:
        preset = (TINY if args.tiny else MODELS)[name]
        layers = min(args.layers, 2) if args.tiny else args.layers
        path = work / f"{preset}-{layers}l.gguf"
        if not path.exists():
            write_synthetic_gguf(path, spec_with(preset, n_layers=layers), seed=1)
        inv = read_inventory(path)
        predicted = decode_tps(inv, Plan.all_cpu(), prof, 256)
        measured, setting = measure(path, args.threads, args.tokens)
        row = {"model": preset, "layers": layers, "threads": args.threads, "setting": setting,
               "file_gb": round(path.stat().st_size / 1e9, 3), "decode_tps": round(measured, 2),
               "pred_decode_tps": round(predicted, 2),
               "measured_over_predicted": round(measured / predicted, 3)}
        rows.append(row)
        print(f"{preset} x{layers} layers, {setting}: {measured:.2f} tok/s measured, "
              f"{predicted:.2f} predicted ({row['measured_over_predicted']:.2f}x)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"profile": prof.key, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
