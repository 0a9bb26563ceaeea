"""TTFT of one long prompt alone, as shipped (chunks of about a second of work while no other
reply decodes) against fixed 512-token chunks, on the CPU plan of the default model.

    python benchmarks/prefill_chunks.py [--threads 2] [--repeats 4]

Not a peer comparison: both rows are this runtime. (The peer for prefill on CPU plans is
llama-bench's pp, measured by benchmarks/upstream_peers.py on a GPU machine.)
"""

from __future__ import annotations

import argparse
import statistics

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
    a = ap.parse_args()
    for name, config in (("fixed 512-token chunks", {"prefill_chunk": 512}),
                         ("as shipped", {})):
        prompt, s = ttft(a.threads, a.repeats, **config)
        print(f"{name:24s} {prompt} prompt tokens, TTFT {s:.2f} s (median)")


if __name__ == "__main__":
    main()
