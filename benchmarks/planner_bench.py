"""Planner benchmark: our plan vs llama.cpp peers at the same total VRAM budget, one run.

For every (model, case, budget, strategy) a fresh process plans, checks the plan with a dry-run
load, loads it, and measures TTFT for the case's prompt, decode speed over 128 tokens, and the
process's peak VRAM as NVML reports it (sampled every 20 ms). It also prints the cost model's
prediction for the same plan, so predicted-vs-measured errors come from the same run.

    python benchmarks/planner_bench.py --models llama3-8b --budgets 2,4,8 \
        --cases 1k:4096,4k:16384 --strategies ours,P0,P1,full,cpu --json out.json

Strategies: ours (the planner), P0/P1/P2 (see igi_sdk.planner.planner.peer_plan), full
(everything in VRAM), cpu (no GPU). ``--sessions N`` measures N sessions decoding together.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import thread_counts  # benchmarks/, this script's folder

import igi_sdk  # noqa: F401  (native import order: llama_cpp before numpy)
from igi_sdk.cli import STREAM_EVERY_MS

GB = 10**9
GIB = 1024**3


class PeakVram:
    """Samples this process's VRAM (NVML) in a thread; ``peak`` is the maximum seen."""

    def __init__(self, period_s: float = 0.02) -> None:
        from igi_sdk.runtime.nvml import nvml

        self.nv = nvml()
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        if self.nv is not None:
            self._handle = self.nv.nvmlDeviceGetHandleByIndex(0)
            self._thread.start()

    def sample(self) -> int:
        if self.nv is None:
            return 0
        for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self._handle):
            if p.pid == os.getpid():
                return int(p.usedGpuMemory or 0)
        return 0

    def _run(self, period: float) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.sample())
            time.sleep(period)

    def stop(self) -> int:
        self._stop.set()
        if self.nv is not None:
            self._thread.join()
            self.peak = max(self.peak, self.sample())
        return self.peak


def _plan(args: argparse.Namespace, inv, prof, wl):
    from igi_sdk.planner import Plan, plan_for
    from igi_sdk.planner.planner import peer_plan
    from igi_sdk.runtime.loader import ContextSettings
    from igi_sdk.tuning.autoplan import measured_vram, plan_checked

    settings = ContextSettings(wl.n_ctx, max(1, args.sessions), 2048, args.threads)
    path = Path(args.model)
    if args.strategy == "cpu":
        return Plan.all_cpu(), {}
    if args.strategy == "full":
        plan = Plan.all_gpu(inv).model_copy(update={"flash_attn": "on", "n_ubatch": 2048})
        return plan, measured_vram(path, inv, plan, prof, wl, settings)[0]
    budget = int(args.budget * GB)
    if args.strategy == "ours":
        res = plan_checked(path, inv, prof, budget, wl, settings)
        return res.best, res.best.vram_bytes
    # peers: the largest placement that fits, checked the same way (a dry run); ``peer_slack``
    # is what a first run of this peer measured over the budget (NVML peak), taken off again
    target = budget - args.peer_slack
    for _ in range(6):
        plan = peer_plan(inv, prof, wl, target, args.strategy)
        vram, _ = measured_vram(path, inv, plan, prof, wl, settings)
        if vram["total"] <= budget - args.peer_slack:
            return plan, vram
        target -= vram["total"] - budget + 32 * 1024 * 1024
    _ = plan_for  # the planner's own check raises for budgets under the minimum
    return plan, vram


def child(args: argparse.Namespace) -> dict:
    from igi_sdk.model import read_inventory
    from igi_sdk.planner import Workload, decode_tps, ttft_seconds
    from igi_sdk.profile import Profile
    from igi_sdk.runtime import Engine, EngineConfig, SamplingParams

    inv = read_inventory(args.model)
    prof = Profile.load(Path(args.profile))
    n = max(1, args.sessions)
    prompt = args.prompt if n == 1 else 64
    plan_ctx = args.plan_ctx or args.ctx
    from igi_sdk.runtime._native import streams_weights

    wl = Workload(n_ctx=plan_ctx, n_seqs=n, prompt_tokens=prompt, gen_tokens=args.gen,
                  pin_host=not args.no_pin, kv_quant=args.kv == "q8-allowed",
                  output_first=args.output_first,
                  pipelined=streams_weights() and not args.no_pipeline)
    t0 = time.perf_counter()
    if args.plan_file:  # a saved plan, run as it is (e.g. one made for another n_ctx)
        from igi_sdk.planner import Plan

        plan, vram = Plan.load(args.plan_file), {}
    else:
        plan, vram = _plan(args, inv, prof, wl)
    plan_s = time.perf_counter() - t0
    if args.save_plan:
        plan.save(args.save_plan)
    if args.sessions > 1:
        wl = dataclasses.replace(wl, n_seqs=n)
    peak = PeakVram()
    cfg = EngineConfig(n_ctx=args.ctx, max_sessions=n, n_batch=args.n_batch,
                       n_threads=args.threads,
                       launch_ahead=args.launch_ahead,
                       stream_every_s=args.stream_every_ms / 1000)
    eng = Engine(args.model, plan, cfg)
    greedy = SamplingParams(temperature=0.0, repeat_penalty=1.0)
    sid = eng.open_session(sampling=greedy)
    eng.chat(sid, "hello " * 32, max_tokens=4, ignore_eos=True).result()  # warm-up
    eng.close_session(sid)

    def turn(seed: int) -> tuple[list, float, list[str]]:
        """One turn of every session, a prompt of its own (``seed``): the results, the wall
        time and the chat sessions (left open)."""
        text = diverse_prompt(eng, prompt - 24, seed)
        sids: list[str] = []
        t_start = time.perf_counter()
        if args.completion:  # a raw prompt in a session of its own (no chat template)
            futs = [eng.complete_async(text, sampling=greedy, max_tokens=args.gen,
                                       ignore_eos=True) for _ in range(n)]
            gens = [f.result() for f in futs]
        else:
            sids = [eng.open_session(sampling=greedy) for _ in range(n)]
            gens = [eng.chat(s, text, max_tokens=args.gen, ignore_eos=True) for s in sids]
        results = [g.result() for g in gens]
        return results, time.perf_counter() - t_start, sids

    counts0 = thread_counts.snapshot()
    results, wall, sids = turn(0)
    # the turn's prompt and decode: what this process's threads did, per token made
    counts = thread_counts.per_token(counts0, thread_counts.snapshot(),
                                     sum(r.completion_tokens for r in results))
    # --turns: later turns of the same process, each in fresh sessions with a prompt of its
    # own: whether the first reply of a fresh engine is slower than the ones after it
    later = []
    for k in range(1, args.turns):
        for s in sids:
            eng.close_session(s)
        rs, _, sids = turn(k)
        later.append({"ttft_s": round(rs[0].ttft_s, 3), "decode_tps": round(rs[0].decode_tps, 2),
                      "setting": (eng.status().get("threads") or {}).get("setting")})
    peak_vram = peak.stop()
    memory = eng.memory()
    threads_status = eng.status().get("threads")  # the CPU threads' setting as it ended
    launched = eng.step_stats.get("launched_ahead", 0)  # steps queued before a token's take
    eng.close()
    r0 = results[0]
    out = {
        "model": Path(args.model).stem, "strategy": args.strategy, "plan": plan.name,
        "plan_ctx": plan_ctx, "plan_file": Path(args.plan_file).name if args.plan_file else None,
        "cpu_weight_gb": round(sum(t.n_bytes for t in inv.tensors if t.name not in plan.gpu_set
                                   and t.group != "token_embd") / GB, 3),
        "memory_mib": {d: {k: round(v / 2**20) for k, v in m.items()} for d, m in memory.items()},
        "budget_gb": args.budget, "prompt": r0.prompt_tokens, "ctx": args.ctx, "sessions": n,
        "n_ubatch": plan.n_ubatch, "flash_attn": plan.flash_attn, "pinned": plan.pinned_host,
        "type_k": plan.type_k, "type_v": plan.type_v,
        "copy_min_batch": plan.copy_compute_min_batch if plan.op_offload else None,
        "gpu_tensors": len(plan.gpu_tensors), "gpu_layers": plan.gpu_layers,
        "ttft_s": round(r0.ttft_s, 3), "decode_tps": round(r0.decode_tps, 2),
        "total_tps": round(sum(r.completion_tokens for r in results) / wall, 2),
        "peak_vram_gb": round(peak_vram / GB, 3),
        "planned_vram_gb": round(vram.get("total", 0) / GB, 3) if vram else 0.0,
        "plan_s": round(plan_s, 2), "peer_slack_gb": round(args.peer_slack / GB, 3),
        "fits_budget": args.budget == 0 or (vram.get("total", 0) <= args.budget * GB
                                             and peak_vram <= args.budget * GB),
        "threads": threads_status, "launched_ahead": launched, "thread_counts": counts,
        "n_batch": args.n_batch, "completion": args.completion, "later_turns": later,
    }
    if n == 1:
        out["pred_ttft_s"] = round(ttft_seconds(inv, plan, prof, r0.prompt_tokens), 3)
        out["pred_decode_tps"] = round(decode_tps(inv, plan, prof, r0.prompt_tokens
                                                  + args.gen // 2), 2)
        out["turn_s"] = round(r0.ttft_s + args.gen / max(r0.decode_tps, 1e-9), 3)
    else:
        out["pred_total_tps"] = round(decode_tps(inv, plan, prof, prompt + args.gen // 2, n), 2)
    return out


def diverse_prompt(eng, n_tokens: int, seed: int = 0) -> str:
    """Random words of about ``n_tokens`` tokens. A repeated word would send every token of a
    MoE prompt to the same few experts and make expert streaming look free."""
    import random

    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words: list[str] = []
    while True:
        words += ["".join(rng.choice(letters) for _ in range(rng.randint(2, 7)))
                  for _ in range(max(8, n_tokens // 4))]
        toks = len(eng.tokenize(" ".join(words)))
        if toks >= n_tokens:
            break
    # trim to the target by the observed tokens-per-word ratio
    keep = max(1, int(len(words) * n_tokens / toks))
    return " ".join(words[:keep])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", default="llama3-8b")
    ap.add_argument("--workdir", default="/tmp/igi-bench")
    ap.add_argument("--budgets", default="2,4,8", help="total VRAM budgets in GB (10^9 bytes)")
    ap.add_argument("--cases", default="1024:4096", help="prompt:ctx pairs")
    ap.add_argument("--strategies", default="ours,P0,P1,full,cpu")
    ap.add_argument("--sessions", type=int, default=1)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--profile", help="profile JSON (default: measure with --fast, cached)")
    ap.add_argument("--json", help="append results to this JSON list")
    ap.add_argument("--timeout", type=int, default=300)
    # child mode
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--strategy", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, default=0.0, help=argparse.SUPPRESS)
    ap.add_argument("--prompt", type=int, default=1024, help=argparse.SUPPRESS)
    ap.add_argument("--ctx", type=int, default=4096, help=argparse.SUPPRESS)
    ap.add_argument("--peer-slack", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--plan-ctx", type=int, default=0,
                    help="plan for this n_ctx but run at the case's (same placement, other ctx)")
    ap.add_argument("--plan-file", help="run this saved plan instead of planning")
    ap.add_argument("--save-plan", help="write the plan each child runs to this path")
    ap.add_argument("--tag", default="", help="a label stored with every result")
    ap.add_argument("--no-pin", action="store_true",
                    help="plan with host weights memory-mapped instead of pinned")
    ap.add_argument("--no-pipeline", action="store_true",
                    help="no pipelined plans even where llama.cpp's scheduler streams weights "
                         "(the plan as a stock llama.cpp would get it)")
    ap.add_argument("--kv", choices=("f16", "q8-allowed"), default="f16",
                    help="f16: f16 KV only (as shipped); q8-allowed: the planner may choose "
                    "q8_0 KV")
    ap.add_argument("--output-first", action=argparse.BooleanOptionalAction, default=False,
                    help="the planner may put the output head before attention (run4: it did, "
                         "as the default then)")
    ap.add_argument("--launch-ahead", choices=("auto", "on", "off"), default="auto",
                    help="EngineConfig.launch_ahead (auto: as shipped)")
    ap.add_argument("--stream-every-ms", type=float, default=STREAM_EVERY_MS,
                    help="EngineConfig.stream_every_s in ms (default: serve's, as shipped)")
    ap.add_argument("--turns", type=int, default=1,
                    help="turns in one process; the first is the row, the later ones are "
                         "reported beside it (later_turns)")
    ap.add_argument("--n-batch", type=int, default=2048, help="EngineConfig.n_batch")
    ap.add_argument("--completion", action="store_true",
                    help="each turn a raw completion instead of a chat line")
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args)), flush=True)
        return 0
    profile_path = args.profile or _profile(args)
    results = json.loads(Path(args.json).read_text()) if args.json and Path(
        args.json).exists() else []
    for preset in args.models.split(","):
        model = _model(args.workdir, preset)
        for case in args.cases.split(","):
            prompt, ctx = (int(x) for x in case.split(":"))
            for strategy in args.strategies.split(","):
                budgets = [0.0] if strategy in ("full", "cpu") else [
                    float(b) for b in args.budgets.split(",")]
                for budget in budgets:
                    r = _run_child(args, model, profile_path, strategy, budget, prompt, ctx)
                    if (r is not None and strategy in ("P0", "P1", "P2") and not r["fits_budget"]
                            and r["gpu_tensors"] > 0):
                        # a peer the dry run let through but NVML saw over budget: record it,
                        # then give it a placement smaller by what it overshot, as a user would
                        results.append(r)
                        over = int(r["peak_vram_gb"] * GB - budget * GB) + 64 * 1024 * 1024
                        r = _run_child(args, model, profile_path, strategy, budget, prompt, ctx,
                                       slack=max(over, 64 * 1024 * 1024))
                    if r is not None:
                        results.append(r)
                        if args.json:
                            Path(args.json).write_text(json.dumps(results, indent=1))
    print_table(results)
    return 0


def _profile(args: argparse.Namespace) -> str:
    from igi_sdk.tuning.measure import load_or_measure

    t0 = time.perf_counter()
    prof = load_or_measure(threads=args.threads, fast=True)
    path = Path(args.workdir) / "profile.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(prof.model_dump_json(indent=1))
    print(f"profile {prof.key} ready in {time.perf_counter() - t0:.1f} s -> {path}", flush=True)
    return str(path)


def _model(workdir: str, preset: str) -> str:
    from igi_sdk.model import write_synthetic_gguf

    path = Path(workdir) / f"{preset}.gguf"
    if not path.exists():
        t0 = time.perf_counter()
        write_synthetic_gguf(path, preset)
        print(f"wrote {path.name} ({path.stat().st_size / GIB:.2f} GiB) in "
              f"{time.perf_counter() - t0:.1f} s", flush=True)
    return str(path)


def _run_child(args: argparse.Namespace, model: str, profile: str, strategy: str, budget: float,
               prompt: int, ctx: int, slack: int = 0) -> dict | None:
    cmd = [sys.executable, __file__, "--child", "--model", model, "--profile", profile,
           "--strategy", strategy, "--budget", str(budget), "--prompt", str(prompt),
           "--ctx", str(ctx), "--gen", str(args.gen), "--threads", str(args.threads),
           "--sessions", str(args.sessions), "--peer-slack", str(slack),
           "--plan-ctx", str(args.plan_ctx), "--kv", args.kv,
           "--launch-ahead", args.launch_ahead,
           "--stream-every-ms", str(args.stream_every_ms), "--turns", str(args.turns),
           "--n-batch", str(args.n_batch)] + (["--completion"] if args.completion else []) + (
               ["--no-pin"] if args.no_pin else []) + (
               ["--no-pipeline"] if args.no_pipeline else []) + (
               ["--output-first"] if args.output_first else ["--no-output-first"])
    if args.plan_file:
        cmd += ["--plan-file", args.plan_file]
    if args.save_plan:
        cmd += ["--save-plan", args.save_plan.format(strategy=strategy, budget=budget,
                                                    prompt=prompt, ctx=ctx)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    except subprocess.TimeoutExpired:
        print(f"{strategy} {budget} GB {prompt}/{ctx}: timed out", flush=True)
        return None
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    if line is None:
        tail = " | ".join(proc.stderr.strip().splitlines()[-4:])
        print(f"{strategy} {budget} GB {prompt}/{ctx}: failed rc={proc.returncode}: {tail}",
              flush=True)
        return None
    r = json.loads(line[7:])
    if args.tag:
        r["tag"] = args.tag
    r["env"] = {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                if k in os.environ}
    print(json.dumps(r), flush=True)
    return r


def print_table(results: list[dict]) -> None:
    print("\nmodel        case        budget strategy plan                 peakVRAM  TTFT s "
          "(pred)     decode t/s (pred)   total t/s")
    for r in results:
        case = f"{r['prompt']}/{r['ctx']}" + (f" x{r['sessions']}" if r["sessions"] > 1 else "")
        print(f"{r['model']:<12} {case:<11} {r['budget_gb']:>5}  {r['strategy']:<8} "
              f"{r['plan']:<20} {r['peak_vram_gb']:>7.2f}  {r['ttft_s']:6.2f} "
              f"({r.get('pred_ttft_s', 0):5.2f})  {r['decode_tps']:8.1f} "
              f"({r.get('pred_decode_tps', 0):6.1f})  {r['total_tps']:8.1f}"
              + "".join(f"  then {t['decode_tps']:.1f}" for t in r.get("later_turns", [])))


if __name__ == "__main__":
    sys.exit(main())
