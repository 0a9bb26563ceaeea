"""Placement benchmark: the same model under hand-made plans, measured in one run.

For each plan it loads the model in a fresh process (so VRAM figures and CUDA start-up are not
shared), then prints what llama.cpp reports per device (weights / KV / compute buffers), the
process's VRAM as NVML measures it, and prefill (TTFT) and decode speed.

    python benchmarks/placement_bench.py --preset llama3-8b --workdir /tmp/bench \
        --plans attn-gpu,all-gpu,all-cpu --prompt-tokens 1024 --gen 128 --threads 16

Writes a JSON list of results (``--json``) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import igi_sdk  # noqa: F401  (native import order: llama_cpp before numpy)

GIB = 1024**3


def _nvml_process_bytes() -> tuple[int | None, int | None]:
    """(this process's VRAM, device used) from NVML, or (None, None) without a GPU."""
    from igi_sdk.runtime.nvml import nvml

    pynvml = nvml()
    if pynvml is None:
        return None, None
    h = pynvml.nvmlDeviceGetHandleByIndex(0)
    mine = None
    for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
        if p.pid == os.getpid():
            mine = int(p.usedGpuMemory or 0)
    used = int(pynvml.nvmlDeviceGetMemoryInfo(h).used)
    return mine, used


def _plan(name: str, inventory):
    from igi_sdk.planner import Plan

    if name == "all-cpu":
        return Plan.all_cpu()
    if name == "all-gpu":
        return Plan.all_gpu(inventory).model_copy(update={"flash_attn": "on", "n_ubatch": 2048})
    if name == "attn-gpu":
        return Plan.attention_on_gpu(inventory)
    if name == "attn-gpu+output":
        return Plan.attention_on_gpu(inventory, with_output=True)
    raise SystemExit(f"unknown plan {name}")


def child(args: argparse.Namespace) -> dict:
    from igi_sdk.model import read_inventory
    from igi_sdk.runtime import Engine, EngineConfig, SamplingParams

    inv = read_inventory(args.model)
    plan = _plan(args.child, inv)
    _, used_before = _nvml_process_bytes()
    cfg = EngineConfig(n_ctx=args.prompt_tokens + args.gen + 256, max_sessions=1,
                       n_batch=2048, n_threads=args.threads)
    t0 = time.perf_counter()
    eng = Engine(args.model, plan, cfg)
    load_s = time.perf_counter() - t0
    greedy = SamplingParams(temperature=0.0, repeat_penalty=1.0)
    # warm-up: first CUDA kernels, graph allocation
    sid = eng.open_session(sampling=greedy)
    eng.chat(sid, "hello " * 64, max_tokens=4, ignore_eos=True).result()
    eng.close_session(sid)
    sid = eng.open_session(sampling=greedy)
    prompt = "the " * (args.prompt_tokens - 16)
    res = eng.chat(sid, prompt, max_tokens=args.gen, ignore_eos=True).result()
    proc_vram, used_after = _nvml_process_bytes()
    mem = eng.memory()
    out = {
        "plan": args.child,
        "load_s": round(load_s, 2),
        "prompt_tokens": res.prompt_tokens,
        "gen_tokens": res.completion_tokens,
        "ttft_s": round(res.ttft_s, 3),
        "prefill_tps": round(res.prompt_tokens / res.ttft_s, 1),
        "decode_tps": round(res.decode_tps, 2),
        "llama_gpu": mem["gpu"],
        "llama_cpu": mem["cpu"],
        "buffers": {"model": eng.report.model_buffers, "kv": eng.report.kv_buffers,
                    "compute": eng.report.compute_buffers},
        "nvml_process_vram": proc_vram,
        "nvml_device_used_delta": (used_after - used_before)
        if used_after is not None and used_before is not None else None,
        "gpu_tensors": sum(1 for v in eng.placement().values() if v == "gpu"),
        "cpu_tensors": sum(1 for v in eng.placement().values() if v == "cpu"),
    }
    eng.close()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", help="GGUF to measure (else --preset is written to --workdir)")
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--workdir", default="/tmp/igi-bench")
    ap.add_argument("--plans", default="attn-gpu,all-gpu,all-cpu")
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--json", help="write results here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    if not args.model:
        from igi_sdk.model import write_synthetic_gguf

        path = Path(args.workdir) / f"{args.preset}.gguf"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            t0 = time.perf_counter()
            write_synthetic_gguf(path, args.preset)
            print(f"wrote {path} ({path.stat().st_size / GIB:.2f} GiB) in "
                  f"{time.perf_counter() - t0:.1f} s", flush=True)
        args.model = str(path)
    results = []
    for name in args.plans.split(","):
        cmd = [sys.executable, __file__, "--child", name, "--model", args.model,
               "--prompt-tokens", str(args.prompt_tokens), "--gen", str(args.gen),
               "--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            print(f"{name}: failed (rc {proc.returncode})\n{proc.stderr[-3000:]}", flush=True)
            continue
        r = json.loads(line[7:])
        results.append(r)
        print(json.dumps(r), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))
    print_table(results)
    return 0


def print_table(results: list[dict]) -> None:
    def g(x: int | None) -> str:
        return "-" if x is None else f"{x / GIB:.2f}"

    print("\nplan            GPU w/kv/compute (GiB)   NVML proc VRAM  TTFT s  prefill t/s"
          "  decode t/s")
    for r in results:
        gpu = r["llama_gpu"]
        print(f"{r['plan']:<15} {g(gpu['weights'])}/{g(gpu['kv'])}/{g(gpu['compute']):<14} "
              f"{g(r['nvml_process_vram']):>14} {r['ttft_s']:7.2f} {r['prefill_tps']:12.0f} "
              f"{r['decode_tps']:11.1f}")


if __name__ == "__main__":
    sys.exit(main())
