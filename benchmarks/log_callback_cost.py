"""What llama.cpp's log callback costs a decode: the same engine and plan, turns alternating
between log sinks, in one process.

    python benchmarks/log_callback_cost.py --model M.gguf [--plan-file plan.json] [--ctx 1152]
        [--prompt 1000] [--gen 128] [--rounds 3] [--threads 0] [--json out.json]

llama.cpp hands every log line, debug lines included, to one process-wide callback; the SDK's
is a Python function (runtime/_native.py), so each line takes the GIL on the thread that
logs it, which during a decode is the thread computing the graph. Sinks, one turn each, in
turn: ``python`` (the callback the SDK installs), ``native`` (a C function that does nothing
with its arguments, libc's ``abs``: no Python, no GIL) and ``count`` (a Python callback that
counts the lines by level and text, printed per decoded token). ``--plan-file``: a saved plan
(default: every tensor in VRAM; ``--cpu``: on the CPU). Each turn is a fresh session with a
prompt of its own.
"""

from __future__ import annotations

import argparse
import collections
import ctypes
import ctypes.util
import json
import statistics
import sys
from pathlib import Path

import llama_cpp
from planner_bench import diverse_prompt  # benchmarks/, this script's folder

import igi_sdk  # noqa: F401  (native import order: llama_cpp before numpy)
from igi_sdk.cli import STREAM_EVERY_MS
from igi_sdk.model import read_inventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams, _native


def _libc_abs() -> object:
    """libc's ``abs`` as a log callback: it reads the level and returns, the text unread."""
    name = ctypes.util.find_library("c")
    libc = ctypes.cdll.msvcrt if sys.platform == "win32" else ctypes.CDLL(name)
    return llama_cpp.llama_log_callback(ctypes.cast(libc.abs, ctypes.c_void_p).value)


class Counter:
    def __init__(self) -> None:
        self.lines: collections.Counter[tuple[int, str]] = collections.Counter()

        @llama_cpp.llama_log_callback
        def cb(level: int, text: bytes, _user: ctypes.c_void_p) -> None:
            self.lines[(level, text.decode("utf-8", "replace")[:48].strip())] += 1

        self.cb = cb


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--plan-file", type=Path)
    ap.add_argument("--cpu", action="store_true", help="every tensor on the CPU (no plan file)")
    ap.add_argument("--ctx", type=int, default=1152)
    ap.add_argument("--prompt", type=int, default=1000, help="prompt tokens per turn")
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="0: the engine's choice")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()

    plan = (Plan.load(a.plan_file) if a.plan_file else Plan.all_cpu() if a.cpu
            else Plan.all_gpu(read_inventory(a.model)))
    cfg = EngineConfig(n_ctx=a.ctx, max_sessions=1, n_batch=2048, n_threads=a.threads,
                       stream_every_s=STREAM_EVERY_MS / 1000)
    counter = Counter()
    sinks = {"python": _native._on_log, "native": _libc_abs(), "count": counter.cb}
    greedy = SamplingParams(temperature=0.0, repeat_penalty=1.0)
    tps: dict[str, list[float]] = {k: [] for k in sinks}
    with Engine(a.model, plan, cfg) as eng:
        sid = eng.open_session(sampling=greedy)
        eng.chat(sid, "hello " * 32, max_tokens=4, ignore_eos=True).result()  # warm-up
        eng.close_session(sid)
        tokens = 0
        for r in range(a.rounds):
            for k, (name, sink) in enumerate(sinks.items()):
                text = diverse_prompt(eng, a.prompt - 24, seed=r * len(sinks) + k)
                llama_cpp.llama_log_set(sink, ctypes.c_void_p(0))
                sid = eng.open_session(sampling=greedy)
                try:
                    res = eng.chat(sid, text, max_tokens=a.gen, ignore_eos=True).result()
                finally:
                    llama_cpp.llama_log_set(_native._on_log, ctypes.c_void_p(0))
                    eng.close_session(sid)
                tps[name].append(round(res.decode_tps, 2))
                if name == "count":
                    tokens += res.completion_tokens
                print(f"round {r} {name:6s} decode {res.decode_tps:7.2f} tok/s", flush=True)
        threads = eng.status().get("threads")
    per_token = {f"{lvl}:{msg}": round(n / max(1, tokens), 2)
                 for (lvl, msg), n in counter.lines.most_common(8)}
    out = {"model": a.model.name, "plan": plan.name, "decode_tps": tps,
           "median": {k: statistics.median(v) for k, v in tps.items() if v},
           "log_lines_per_token": per_token,
           "all_lines_per_token": round(sum(counter.lines.values()) / max(1, tokens), 2),
           "threads": threads}
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
