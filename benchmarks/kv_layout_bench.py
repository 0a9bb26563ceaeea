"""One decode step of many sessions with llama.cpp's KV cache shared by all sequences (one
unified pool, as the sidecar runs it) against one stream per sequence (as `llama-server
--parallel N` runs it), in one process, steps interleaved by layout, on the CPU.

Each session first reads its own prompt; then every step decodes one token for each session in
``--talking`` (all of them, or every other one: a game where NPCs 0, 2, 4, ... talk). With one
pool, each token's attention walks every used cell of the cache (the other sessions' cells
masked); with streams, only its own. But llama.cpp splits a batch over streams into ubatches of
consecutively numbered sequences, so sessions that talk with gaps between their numbers cost
one pass over the weights per run of consecutive numbers.

    python benchmarks/kv_layout_bench.py [--model GGUF] [--sessions 16] [--prompt 700]
        [--talking all|every-other] [--threads 2] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import llama_cpp

from igi_sdk.model import default_model_path


def _context(model: object, sessions: int, prompt: int, unified: bool,
             threads: int) -> object:
    cp = llama_cpp.llama_context_default_params()
    cp.n_ctx = sessions * max(1024, prompt + 256)
    cp.n_batch, cp.n_ubatch, cp.n_seq_max = 2048, 512, sessions
    cp.kv_unified = unified
    cp.n_threads = cp.n_threads_batch = threads
    cp.flash_attn_type = llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED
    ctx = llama_cpp.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama.cpp could not create the context")
    return ctx


def measure(model: object, n_vocab: int, args: argparse.Namespace, unified: bool) -> float:
    """Median seconds of one decode step over the talking sessions."""
    ctx = _context(model, args.sessions, args.prompt, unified, args.threads)
    batch = llama_cpp.llama_batch_init(2048, 0, args.sessions)
    rnd = random.Random(0)

    def decode(items: list[tuple[int, int, int, bool]]) -> None:
        batch.n_tokens = len(items)
        for i, (tok, pos, seq, logits) in enumerate(items):
            batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos, 1
            batch.seq_id[i][0], batch.logits[i] = seq, logits
        if llama_cpp.llama_decode(ctx, batch) != 0:
            raise SystemExit("llama_decode failed")

    try:
        for s in range(args.sessions):
            for off in range(0, args.prompt, 512):
                n = min(512, args.prompt - off)
                decode([(rnd.randrange(n_vocab), off + j, s, j == n - 1) for j in range(n)])
        talking = range(0, args.sessions, 1 if args.talking == "all" else 2)
        times = []
        for step in range(args.steps + 2):
            t = time.perf_counter()
            decode([(rnd.randrange(n_vocab), args.prompt + step, s, True) for s in talking])
            times.append(time.perf_counter() - t)
        return statistics.median(times[2:])  # the first two warm up
    finally:
        llama_cpp.llama_batch_free(batch)
        llama_cpp.llama_free(ctx)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None, help="GGUF (default: the embedded model)")
    ap.add_argument("--sessions", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=700, help="tokens each session holds")
    ap.add_argument("--talking", choices=("all", "every-other"), default="all")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2, help="each layout this many times, alternated")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    path = args.model or str(default_model_path())
    llama_cpp.llama_backend_init()
    model = llama_cpp.llama_model_load_from_file(path.encode(),
                                                 llama_cpp.llama_model_default_params())
    if not model:
        raise SystemExit(f"cannot load {path}")
    n_vocab = llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(model))
    steps: dict[str, list[float]] = {"one pool": [], "one stream per session": []}
    try:
        for _ in range(args.rounds):
            for name, unified in (("one pool", True), ("one stream per session", False)):
                steps[name].append(measure(model, n_vocab, args, unified))
    finally:
        llama_cpp.llama_model_free(model)
    pool, streams = (statistics.median(v) for v in steps.values())
    res = {"model": Path(path).name, "sessions": args.sessions, "prompt": args.prompt,
           "talking": args.talking, "threads": args.threads,
           "step_ms": {k: [round(x * 1000, 1) for x in v] for k, v in steps.items()},
           "pool_over_streams": round(pool / streams, 2)}
    print(json.dumps(res))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
