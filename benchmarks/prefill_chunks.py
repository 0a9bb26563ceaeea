"""TTFT of one long prompt alone, as shipped (chunks of about a second of work while no other
reply decodes) against fixed 512-token chunks, on the CPU plan of the default model.

    python benchmarks/prefill_chunks.py [--threads 2] [--repeats 4] [--llama-bench PATH]

With ``--llama-bench`` (upstream's tool built from the same llama.cpp sources for the CPU), its
prompt-processing rate for the same number of tokens and threads is measured in the same run
and shown as the TTFT it implies: the peer for prefill on CPU plans.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess

from igi_sdk.model import default_model_path
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams

TEXT = " ".join(f"The ledger lists item {i} for the smithy." for i in range(90))


def ttft(threads: int, repeats: int, **config: int) -> tuple[int, float]:
    cfg = EngineConfig(n_ctx=4096, max_sessions=2, n_threads=threads, context_floor=0, **config)
    out, prompt = [], 0
    with Engine(default_model_path(), Plan.all_cpu(), cfg) as eng:
        for k in range(repeats):
            sid = eng.open_session(None, sampling=SamplingParams(temperature=0.0))
            r = eng.chat(sid, f"{TEXT} {k}", max_tokens=1).result(300)
            out.append(r.ttft_s)
            prompt = r.prompt_tokens
            eng.close_session(sid)
    return prompt, statistics.median(out[1:] or out)  # the first one warms the engine


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--llama-bench", help="upstream llama-bench (CPU build) to run beside")
    a = ap.parse_args()
    for name, config in (("fixed 512-token chunks", {"prefill_chunk": 512}),
                         ("as shipped", {})):
        prompt, s = ttft(a.threads, a.repeats, **config)
        print(f"{name:24s} {prompt} prompt tokens, TTFT {s:.2f} s (median)")
    if a.llama_bench:
        out = subprocess.run([a.llama_bench, "-m", str(default_model_path()), "-p", str(prompt),
                              "-n", "0", "-t", str(a.threads), "-r", str(a.repeats), "-o",
                              "json"], capture_output=True, text=True, timeout=600).stdout
        tps = json.loads(out)[0]["avg_ts"]
        print(f"{'llama-bench pp' + str(prompt):24s} {prompt} prompt tokens, TTFT "
              f"{prompt / tps:.2f} s ({tps:.1f} tok/s)")


if __name__ == "__main__":
    main()
