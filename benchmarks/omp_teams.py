"""What a second OpenMP team in the process costs a decode loop: the default model's one-token
``llama_decode`` on this thread, alone, then while another thread that ran one decode of its
own (and so holds a team of OpenMP workers, idle) is alive, then after it has exited.

    python benchmarks/omp_teams.py [--threads 2] [--tokens 64] [--rounds 3] [--json out.json]

libgomp counts the workers of every thread's team against the CPUs, and while they outnumber
them it cuts every waiting thread's spin to 100 rounds: a team whose threads would have spun
between graph nodes then sleeps and is woken at each one. An idle team is enough, which is why
the runtime times a profile on a thread that ends (tuning/measure.py) and why
``host_overhead.py`` runs the engine and the llama.cpp rows in separate processes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import llama_cpp as L

from igi_sdk.model import default_model_path
from igi_sdk.runtime._native import init_backend


def context(model: L.llama_model_p, threads: int) -> L.llama_context_p:
    cp = L.llama_context_default_params()
    cp.n_ctx, cp.no_perf = 512, True
    cp.n_threads = cp.n_threads_batch = threads
    ctx = L.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("no context")
    return ctx


def ms_per_token(ctx: L.llama_context_p, n: int) -> float:
    """One token a step at positions 0..n-1 (the token fixed, as llama-bench's generation)."""
    b = L.llama_batch_init(1, 0, 1)
    try:
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        t0 = time.perf_counter()
        for k in range(n):
            b.n_tokens, b.token[0], b.pos[0], b.n_seq_id[0], b.logits[0] = 1, 1, k, 1, 1
            b.seq_id[0][0] = 0
            if L.llama_decode(ctx, b) != 0:
                raise SystemExit("llama_decode failed")
            L.llama_synchronize(ctx)
        return (time.perf_counter() - t0) / n * 1000
    finally:
        L.llama_batch_free(b)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    init_backend()
    model = L.llama_model_load_from_file(str(default_model_path()).encode(),
                                         L.llama_model_default_params())
    ctx = context(model, a.threads)
    ms_per_token(ctx, 16)  # warm-up: this thread's own team exists from here

    def rounds() -> list[float]:
        return [round(ms_per_token(ctx, a.tokens), 3) for _ in range(a.rounds)]

    out: dict[str, object] = {"machine": f"{platform.machine()} {os.cpu_count()} CPUs",
                              "threads": a.threads, "tokens": a.tokens}
    out["alone"] = rounds()
    ready, leave = threading.Event(), threading.Event()

    def other() -> None:  # its own context and one decode: a team of its own, then idle
        c = context(model, a.threads)
        ms_per_token(c, 2)
        ready.set()
        leave.wait()
        L.llama_free(c)

    t = threading.Thread(target=other, name="second-team")
    t.start()
    ready.wait()
    out["second_team_alive"] = rounds()
    leave.set()
    t.join()
    out["after_it_exited"] = rounds()
    L.llama_free(ctx)
    L.llama_model_free(model)
    alone = statistics.median(out["alone"])  # type: ignore[arg-type]
    out["ratio_alive_to_alone"] = round(
        statistics.median(out["second_team_alive"]) / alone, 3)  # type: ignore[arg-type]
    print(json.dumps(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
