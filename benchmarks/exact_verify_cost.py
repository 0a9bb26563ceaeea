"""What ``--exact-verify`` costs: decode steps of 1 and k + 1 tokens with the CPU weights
repacked (llama.cpp's default, ``use_extra_bufts``) and not (exact verification), on the CPU.

Repacked kernels round a multi-token batch differently from one-token steps, so a greedy reply
verified in batches can differ from one decoded a token at a time; without repacking both give
the same logits, at the cost of the slower kernels. Both loads run in this process, their steps
interleaved round by round (a machine's drift hits both alike); the median of each is reported.

    python benchmarks/exact_verify_cost.py --model target.gguf [--k 4] [--rounds 30] [--json F]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import llama_cpp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from igi_sdk.model import read_inventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import loader


class Side:
    """One load of the model (repacked or not) with a context at ``depth`` tokens."""

    def __init__(self, model: Path, *, repacked: bool, n_threads: int, depth: int,
                 outputs: int) -> None:
        settings = loader.ContextSettings(depth + 64, 1, 512, n_threads, n_outputs=outputs,
                                          extra_bufts=repacked)
        self.loaded = loader.load(model, read_inventory(model), Plan.all_cpu(), settings)
        self.depth = depth
        self.vocab = llama_cpp.llama_n_vocab(llama_cpp.llama_model_get_vocab(self.loaded.model))
        # the context the steps extend (its last row's logits only)
        self._decode(list(range(100, 100 + depth)), 0, all_logits=False)

    def _decode(self, tokens: list[int], pos: int, *, all_logits: bool = True) -> float:
        n = len(tokens)
        batch = llama_cpp.llama_batch_init(n, 0, 1)
        try:
            for i, tok in enumerate(tokens):
                batch.token[i] = tok
                batch.pos[i] = pos + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = all_logits or i == len(tokens) - 1
            batch.n_tokens = n
            t0 = time.perf_counter()
            if llama_cpp.llama_decode(self.loaded.ctx, batch) != 0:
                raise RuntimeError("llama_decode failed")
            llama_cpp.llama_get_logits(self.loaded.ctx)  # the step's logits are ready
            return time.perf_counter() - t0
        finally:
            llama_cpp.llama_batch_free(batch)

    def step(self, n_tokens: int) -> float:
        """A step of ``n_tokens`` after the context, then the cells dropped again."""
        took = self._decode([200 + i for i in range(n_tokens)], self.depth)
        mem = llama_cpp.llama_get_memory(self.loaded.ctx)
        llama_cpp.llama_memory_seq_rm(mem, 0, self.depth, -1)
        return took

    def close(self) -> None:
        llama_cpp.llama_free(self.loaded.ctx)
        llama_cpp.llama_model_free(self.loaded.model)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--k", type=int, default=4, help="drafted tokens: verify batches of k + 1")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--depth", type=int, default=256, help="context tokens before the steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json")
    args = ap.parse_args()
    model = Path(args.model)
    sides = {name: Side(model, repacked=name == "repacked", n_threads=args.threads,
                        depth=args.depth, outputs=args.k + 1) for name in ("repacked", "exact")}
    times: dict[str, dict[int, list[float]]] = {n: {1: [], args.k + 1: []} for n in sides}
    for _ in range(2):  # warm-up
        for side in sides.values():
            side.step(1)
            side.step(args.k + 1)
    for _ in range(args.rounds):
        for name, side in sides.items():
            for n in (1, args.k + 1):
                times[name][n].append(side.step(n))
    for side in sides.values():
        side.close()
    med = {name: {n: statistics.median(v) for n, v in by.items()} for name, by in times.items()}
    v = args.k + 1
    out = {"model": model.name, "k": args.k, "rounds": args.rounds, "depth": args.depth,
           "threads": args.threads,
           "machine": f"{platform.processor() or platform.machine()}, {args.threads} threads",
           "median_s": {name: {str(n): round(t, 5) for n, t in by.items()}
                        for name, by in med.items()},
           "exact_over_repacked": {"plain": round(med["exact"][1] / med["repacked"][1], 3),
                                   "verify": round(med["exact"][v] / med["repacked"][v], 3)}}
    print(f"{model.name}, {args.threads} threads, k = {args.k}, median of {args.rounds}:")
    for name in sides:
        print(f"  {name:<9} 1 token {med[name][1] * 1e3:7.1f} ms   {v} tokens "
              f"{med[name][v] * 1e3:7.1f} ms")
    print(f"  exact / repacked: plain {out['exact_over_repacked']['plain']}x, "
          f"verify {out['exact_over_repacked']['verify']}x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
