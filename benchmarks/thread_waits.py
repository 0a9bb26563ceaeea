"""Decode speed on the CPU plan under each thread/wait policy, on an idle host and beside busy
cores (processes spinning on N-1 .. of the CPUs used).

    python benchmarks/thread_waits.py [--cpus 2] [--rounds 3] [--busy 1] [--tokens 48]
        [--python /path/to/venv-without-openmp/bin/python] [--model model.gguf] [--json out]

Each policy runs in a process of its own (libgomp reads its wait policy once, when loaded),
restricted to the first ``--cpus`` CPUs. Conditions alternate within each round (idle, busy,
idle, ...) so that load from elsewhere on a shared machine hits them alike; each figure is the
median over rounds, with the range. Policies: with the OpenMP build (this interpreter),
``OMP_WAIT_POLICY`` PASSIVE and ACTIVE and ``GOMP_SPINCOUNT=20000`` at every CPU's thread (a
spinning count is lowered while other processes want its cores), and the adaptive runtime (its
default wait, libgomp's spin, and ``PASSIVE``, the default before); with a
build without OpenMP (``--python``), ggml's pools at poll 0 (sleep), 1 (poll) and 100 (spin)
and the adaptive runtime. "auto" starts from every CPU's thread; "auto-default" from the
runtime's default count.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

_CHILD = textwrap.dedent("""
    import json, os, subprocess, sys, time
    cfg = json.loads(sys.argv[1])
    cpus = sorted(os.sched_getaffinity(0))[:cfg["cpus"]]
    os.sched_setaffinity(0, cpus)
    import igi_sdk
    from igi_sdk.model import default_model_path
    from igi_sdk.planner import Plan
    from igi_sdk.runtime import Engine, EngineConfig

    model = cfg["model"] or str(default_model_path())
    ec = EngineConfig(n_ctx=1024, max_sessions=1, n_threads=cfg["threads"],
                      thread_wait=cfg["wait"], adapt_threads=cfg["adapt"])
    eng = Engine(__import__("pathlib").Path(model), Plan.all_cpu(), ec)

    def rate():
        s = eng.open_session("You are Brom, the village blacksmith.")
        g = eng.chat(s, "Tell me about your forge.", max_tokens=cfg["tokens"], ignore_eos=True)
        try:
            r = g.result(timeout=cfg["timeout"])
        except TimeoutError:
            g.cancel()
            r = g.result(timeout=120)
        eng.close_session(s)
        return r.decode_tps

    def hogs(n):
        return [subprocess.Popen([sys.executable, "-c", "while True: pass"],
                                 preexec_fn=lambda c=c: os.sched_setaffinity(0, [c]))
                for c in cpus[len(cpus) - n:]]

    out = {"idle": [], "busy": [], "status": []}
    try:
        rate()
        for _ in range(cfg["rounds"]):
            out["idle"].append(rate())
            hs = hogs(cfg["busy"])
            try:
                time.sleep(1.2)  # a load sample or two reaches the controller
                out["busy"].append(rate())
                out["status"].append(eng.status()["threads"])
            finally:
                for h in hs:
                    h.kill()
                    h.wait()
            time.sleep(1.2)
        out["final"] = eng.status()["threads"]
    finally:
        eng.close()
    print(json.dumps(out))
""")


def policies(openmp: bool, cpus: int) -> list[tuple[str, dict, dict]]:
    """(name, child config, environment) of each policy one build can run."""
    fixed = {"threads": cpus, "adapt": False}
    if openmp:
        rows = [("omp-passive", {**fixed, "wait": "auto"}, {"OMP_WAIT_POLICY": "PASSIVE"}),
                ("omp-active", {**fixed, "wait": "auto"}, {"OMP_WAIT_POLICY": "ACTIVE"}),
                # a bounded spin: the fixed count then follows the free cores
                ("omp-spin20000", {**fixed, "wait": "auto"}, {"GOMP_SPINCOUNT": "20000"})]
    else:
        rows = [(f"pool-{w}", {**fixed, "wait": w}, {}) for w in ("sleep", "poll", "spin")]
    tag = "omp-" if openmp else "pool-"
    rows.append((tag + "auto", {"threads": cpus, "adapt": True, "wait": "auto"}, {}))
    rows.append((tag + "auto-default", {"threads": 0, "adapt": None, "wait": "auto"}, {}))
    if openmp:  # the default wait before 2026-11-28, the count chosen the same way
        rows.append(("omp-auto-default-passive", {"threads": 0, "adapt": None, "wait": "auto"},
                     {"OMP_WAIT_POLICY": "PASSIVE"}))
    return rows


def is_openmp(python: str) -> bool:
    code = "import llama_cpp; print(b'OPENMP = 1' in llama_cpp.llama_print_system_info())"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip().endswith("True")


def run(python: str, name: str, cfg: dict, env: dict, args: argparse.Namespace) -> dict:
    full = {"cpus": args.cpus, "rounds": args.rounds, "busy": args.busy, "tokens": args.tokens,
            "timeout": args.timeout, "model": args.model, **cfg}
    base = {k: v for k, v in os.environ.items()
            if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "IGI_SDK_THREADS")}
    out = subprocess.run([python, "-c", _CHILD, json.dumps(full)], env={**base, **env},
                         cwd=REPO, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        return {"policy": name, "error": out.stderr[-1500:]}
    r = json.loads(out.stdout.strip().splitlines()[-1])
    r["policy"] = name
    return r


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):6.1f} ({min(xs):.1f}-{max(xs):.1f})" if xs else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", type=int, default=min(2, len(os.sched_getaffinity(0))))
    ap.add_argument("--busy", type=int, default=1, help="CPUs kept busy in the busy condition")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--timeout", type=float, default=6.0, help="a slower reply is cut short")
    ap.add_argument("--model", default="")
    ap.add_argument("--python", action="append", default=[],
                    help="another interpreter (e.g. a venv whose llama.cpp has no OpenMP)")
    ap.add_argument("--only", default="", help="comma-separated policy names")
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    rows = []
    for python in [sys.executable, *args.python]:
        openmp = is_openmp(python)
        for name, cfg, env in policies(openmp, args.cpus):
            if args.only and name not in args.only.split(","):
                continue
            r = run(python, name, cfg, env, args)
            rows.append(r)
            if "error" in r:
                print(f"{name:18s} failed: {r['error'][-300:]}", flush=True)
                continue
            final = r.get("final", {}).get("setting", "")
            print(f"{name:18s} idle {fmt(r['idle'])}  busy {fmt(r['busy'])} tok/s  "
                  f"[{final}]", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
