"""Upstream llama.cpp peers beside ours, same run, same VRAM budget.

Runs the vendored llama.cpp's own ``llama-bench`` (built by ``build-cuda-cmake.sh``) on a model
for each VRAM budget, as three peers:

* ``fit-default`` — ``--fit-target`` sized so that llama.cpp's own fitting fills the budget,
  llama-bench's default settings otherwise;
* ``fit-expert``  — the same fit with what an expert sets by hand: ``-lm none -fa on -ub 2048``
  (weights read into host memory instead of mmap, flash attention, 2048-token ubatches);
* ``fit-expert-q8kv`` — ``fit-expert`` with a q8_0 KV cache (``-ctk q8_0 -ctv q8_0``), the lever
  our planner may pull, so that the strongest peer has it too;
* ``ngl-best``    — the paper's baseline: the largest ``-ngl`` (whole layers from the last) that
  fits the budget, default settings otherwise (``ngl:N``: a fixed ``-ngl N``);
* ``ncmoe-best``  — for mixture-of-experts models, what an expert sets by hand: every layer on the
  GPU (``-ngl 99``) with the expert settings above and the expert FFNs of the first N layers in
  host memory (``--n-cpu-moe N``), N the smallest that fits the budget.

Every invocation's peak VRAM is read from NVML in a side thread (every 20 ms): the llama-bench
process's own figure and the device's ``memory.used`` minus the idle baseline taken before it
started, so "same VRAM" is checked, not assumed. A peer whose peak exceeds the budget is
recorded as such (``fits_budget: false``); the fit peers are then re-run once with the overshoot
added to the margin, as a user would, and both rows are kept.

TTFT is a ``-p PROMPT`` test at depth 0 (context PROMPT cells); decode is a ``-n GEN`` test at
depth ``-d DEPTH`` (context GEN + DEPTH cells: llama-bench sizes n_ctx to p + n + d), each its
own invocation so that each gets its own context. Whole turn = TTFT + GEN / decode tok/s.

    python benchmarks/upstream_peers.py --model /tmp/igi-bench/llama3-8b.gguf --budgets 2,4 \
        --bench /tmp/lcpp/build/bin/llama-bench --json out.json

Needs no CUDA in this process (NVML only), so the idle baseline is the device without us.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

GB = 10**9
MIB = 1024**2
EXPERT = ["-lm", "none", "-fa", "on", "-ub", "2048"]
KV_Q8 = ["-ctk", "q8_0", "-ctv", "q8_0"]  # a q8_0 KV cache (needs flash attention)
FIT_EXTRA = {"fit-expert": EXPERT, "fit-expert-q8kv": EXPERT + KV_Q8, "fit-default": []}


def _nvml():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        import pynvml
    pynvml.nvmlInit()
    return pynvml


class Sampler:
    """Peak VRAM of one child process (its own NVML figure) and of the device over a baseline."""

    def __init__(self, nv, handle, baseline: int, period_s: float = 0.02) -> None:
        self.nv, self.h, self.baseline = nv, handle, baseline
        self.pid: int | None = None
        self.proc_peak = self.dev_peak = 0
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, args=(period_s,), daemon=True)
        self._t.start()

    def _run(self, period: float) -> None:
        while not self._stop.is_set():
            self.sample()
            time.sleep(period)

    def sample(self) -> None:
        try:
            used = self.nv.nvmlDeviceGetMemoryInfo(self.h).used
            self.dev_peak = max(self.dev_peak, used - self.baseline)
            if self.pid is not None:
                for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.h):
                    if p.pid == self.pid:
                        self.proc_peak = max(self.proc_peak, int(p.usedGpuMemory or 0))
        except Exception:  # noqa: BLE001 - a sample lost while the process exits
            pass

    def stop(self) -> tuple[int, int]:
        self._stop.set()
        self._t.join()
        return self.proc_peak, self.dev_peak


def run_bench(args: argparse.Namespace, nv, handle, flags: list[str]) -> dict:
    """One llama-bench invocation; its JSON rows and the peaks seen while it ran."""
    time.sleep(0.3)  # let the previous process's memory go back
    baseline = nv.nvmlDeviceGetMemoryInfo(handle).used
    cmd = [args.bench, "-m", args.model, "-t", str(args.threads), "-o", "json", *flags]
    s = Sampler(nv, handle, baseline)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    s.pid = proc.pid
    try:
        out, err = proc.communicate(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
    wall = time.perf_counter() - t0
    proc_peak, dev_peak = s.stop()
    try:
        rows = json.loads(out) if out.strip() else []
    except json.JSONDecodeError:
        rows = []
    if not rows:
        print(f"  llama-bench failed rc={proc.returncode}: "
              + " | ".join(err.strip().splitlines()[-3:]), flush=True)
    return {"cmd": " ".join(cmd), "rows": rows, "rc": proc.returncode, "wall_s": round(wall, 1),
            "proc_peak": proc_peak, "dev_peak": dev_peak, "baseline": baseline,
            "stderr_tail": "\n".join(err.strip().splitlines()[-6:]) if not rows else ""}


def _row(res: dict, kind: str) -> dict | None:
    for r in res["rows"]:
        if kind == "pp" and r.get("n_prompt", 0) > 0 and r.get("n_gen", 0) == 0:
            return r
        if kind == "tg" and r.get("n_gen", 0) > 0 and r.get("n_prompt", 0) == 0:
            return r
    return None


def _peak(res: dict) -> int:
    # the process's own NVML figure; the device's rise over the baseline as a fallback (NVML
    # lists no per-process figure inside some containers)
    return res["proc_peak"] or res["dev_peak"]


def pp_run(args, nv, handle, flags: list[str]) -> dict:
    """The TTFT invocation (``-p PROMPT`` at depth 0, warm-up and ``--pp-reps``): it is also the
    probe that checks a placement against the budget, since it allocates what the decode
    invocation does (bar the decode context's extra cells) and peaks the same way."""
    return run_bench(args, nv, handle, [*flags, "-p", str(args.prompt), "-n", "0", "-d", "0",
                                        "-r", str(args.pp_reps)])


def measure_peer(args, nv, handle, peer: str, budget: float, flags: list[str],
                 pp: dict | None = None) -> dict:
    """TTFT (pp at depth 0, reused when given) and decode (tg at depth) with the same flags."""
    pp = pp or pp_run(args, nv, handle, flags)
    tg = run_bench(args, nv, handle, [*flags, "-p", "0", "-n", str(args.gen), "-d",
                                      str(args.depth), "-r", str(args.tg_reps)])
    p, g = _row(pp, "pp"), _row(tg, "tg")
    peak = max(_peak(pp), _peak(tg))
    ttft = p["avg_ns"] / 1e9 if p else None
    tps = g["avg_ts"] if g else None
    out = {
        "model": Path(args.model).stem, "strategy": peer, "budget_gb": budget,
        "flags": " ".join(flags), "prompt": args.prompt, "gen": args.gen, "depth": args.depth,
        "ctx_pp": args.prompt, "ctx_tg": args.gen + args.depth,
        "ttft_s": round(ttft, 4) if ttft else None,
        "pp_tps": round(p["avg_ts"], 1) if p else None,
        "decode_tps": round(tps, 2) if tps else None,
        "decode_sd": round(g.get("stddev_ts", 0.0), 2) if g else None,
        "turn_s": round(ttft + args.gen / tps, 3) if ttft and tps else None,
        "peak_vram_gb": round(peak / GB, 3),
        "peak_pp_gb": round(_peak(pp) / GB, 3), "peak_tg_gb": round(_peak(tg) / GB, 3),
        "dev_peak_gb": round(max(pp["dev_peak"], tg["dev_peak"]) / GB, 3),
        "fits_budget": peak <= budget * GB,
        "n_gpu_layers": (g or p or {}).get("n_gpu_layers"),
        "env": {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")
                if k in os.environ},
        "tag": args.tag,
        "cmd_pp": pp["cmd"], "cmd_tg": tg["cmd"], "wall_s": pp["wall_s"] + tg["wall_s"],
    }
    if not (p and g):
        out["error"] = (pp["stderr_tail"] + " " + tg["stderr_tail"]).strip()
    print(json.dumps({k: v for k, v in out.items() if not k.startswith("cmd")}), flush=True)
    return out


def fit_flags(free_mib: int, budget: float, extra_mib: int) -> list[str]:
    """--fit-target is the margin llama.cpp leaves free on the device: what is free without us
    minus the budget, so the process (CUDA context included) ends near the budget."""
    margin = free_mib - int(budget * GB / MIB) + extra_mib
    return ["-fitt", str(max(0, margin))]


def layer_bytes(model: str) -> int:
    return max(1, Path(model).stat().st_size // 33)


def n_layers(model: str) -> int:
    """The model's block count, read with gguf-py (importing igi_sdk would set its thread-wait
    policy in this process's environment, which llama-bench children inherit)."""
    from gguf import GGUFReader

    reader = GGUFReader(model)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    return int(reader.fields[f"{arch}.block_count"].parts[-1][0])


def smallest_fitting_ncmoe(args, nv, handle, limit: float) -> tuple[list[str], dict,
                                                                   dict[int, float]]:
    """Bisect --n-cpu-moe for the smallest N whose TTFT run fits ``limit``: (its flags, its TTFT
    run, peak GB per probe)."""
    def flags(n: int) -> list[str]:
        return [*EXPERT, "-ngl", "99", "-ncmoe", str(n)]

    lo, hi = 0, n_layers(args.model)  # hi: every expert FFN in host memory
    runs: dict[int, dict] = {}
    while lo < hi:
        mid = (lo + hi) // 2
        runs[mid] = pp_run(args, nv, handle, flags(mid))
        if runs[mid]["rows"] and _peak(runs[mid]) <= limit:
            hi = mid
        else:
            lo = mid + 1
    if lo not in runs:
        runs[lo] = pp_run(args, nv, handle, flags(lo))
    return flags(lo), runs[lo], {n: round(_peak(r) / GB, 3) for n, r in sorted(runs.items())
                          if r["rows"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--bench", default="/tmp/lcpp/build/bin/llama-bench")
    ap.add_argument("--budgets", default="2,4")
    ap.add_argument("--peers", default="fit-expert,fit-default,ngl-best")
    ap.add_argument("--prompt", type=int, default=1024)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--depth", type=int, default=1024)
    ap.add_argument("--pp-reps", type=int, default=2)
    ap.add_argument("--tg-reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--timeout", type=int, default=120)
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="epoch seconds: start no peer after deadline - 45 s")
    ap.add_argument("--fit-slack-mib", type=int, default=48,
                    help="added to the fit margin from the start (the decode run's extra cells)")
    ap.add_argument("--tag", default="", help="a label stored with every result")
    ap.add_argument("--json", help="append results to this JSON list")
    args = ap.parse_args()
    nv = _nvml()
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    results = json.loads(Path(args.json).read_text()) if args.json and Path(
        args.json).exists() else []

    def save(r: dict) -> None:
        results.append(r)
        if args.json:
            Path(args.json).write_text(json.dumps(results, indent=1))

    over_row = {"model": Path(args.model).stem, "prompt": args.prompt, "fits_budget": False,
                "decode_tps": None, "tag": args.tag}
    for budget in (float(b) for b in args.budgets.split(",")):
        limit = budget * GB
        for peer in args.peers.split(","):
            if args.deadline and time.time() > args.deadline - 45:
                print(f"deadline: skipped {peer} at {budget} GB", flush=True)
                continue
            free_mib = nv.nvmlDeviceGetMemoryInfo(handle).free // MIB
            if peer.startswith("fit"):
                # --fit-target leaves margin = free - budget (+ a safety share); a fit that
                # still peaks over the budget is recorded, then re-fit with the overshoot added
                extra = FIT_EXTRA.get(peer, [])
                add = args.fit_slack_mib
                for _ in range(3):
                    flags = [*extra, *fit_flags(free_mib, budget, add)]
                    pp = pp_run(args, nv, handle, flags)
                    if not pp["rows"] or _peak(pp) <= limit:
                        break
                    save(dict(over_row, strategy=peer, budget_gb=budget, flags=" ".join(flags),
                              ttft_s=round(_row(pp, "pp")["avg_ns"] / 1e9, 4),
                              peak_vram_gb=round(_peak(pp) / GB, 3),
                              note="TTFT run only: this fit went over the budget"))
                    print(f"  {peer} {budget} GB: {_peak(pp) / GB:.3f} GB, re-fit", flush=True)
                    add += math.ceil((_peak(pp) - limit) / MIB) + 32
                save(measure_peer(args, nv, handle, peer, budget, flags, pp))
            elif peer == "ncmoe-best":
                flags, pp, probes = smallest_fitting_ncmoe(args, nv, handle, limit)
                r = measure_peer(args, nv, handle, peer, budget, flags, pp)
                r["ncmoe_probes"] = probes
                save(r)
            elif peer.startswith("ngl:"):  # a fixed -ngl (e.g. the best found before)
                save(measure_peer(args, nv, handle, peer, budget, ["-ngl", peer[4:]]))
            elif peer == "ngl-best":
                # the largest -ngl whose TTFT run fits; start from a size estimate and walk
                per = layer_bytes(args.model)
                ngl = max(0, min(33, int((limit - 0.9 * GB) / per)))
                tried: dict[int, dict] = {}
                for _ in range(5):
                    tried[ngl] = pp_run(args, nv, handle, ["-ngl", str(ngl)])
                    pk = _peak(tried[ngl]) if tried[ngl]["rows"] else 1 << 62
                    fits = [n for n, r in tried.items() if r["rows"] and _peak(r) <= limit]
                    best = max(fits, default=-1)
                    if best >= 0 and (best + 1 in tried or best == 33):
                        break
                    if pk > limit:
                        ngl = max(0, ngl - max(1, math.ceil((pk - limit) / per)))
                    else:
                        ngl = min(33, ngl + max(1, int((limit - pk) / per)))
                    if ngl in tried:
                        break
                fits = [n for n, r in tried.items() if r["rows"] and _peak(r) <= limit]
                best = max(fits, default=min(tried))
                r = measure_peer(args, nv, handle, peer, budget, ["-ngl", str(best)], tried[best])
                r["ngl_probes"] = {str(k): round(_peak(v) / GB, 3)
                                   for k, v in sorted(tried.items())}
                save(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
