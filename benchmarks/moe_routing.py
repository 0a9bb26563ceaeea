"""Which experts a MoE's router picks: per layer, over a prompt and over decoded tokens.

    python benchmarks/moe_routing.py --model qwen3-30b-a3b.gguf [--prompt-tokens 1024]
        [--gen 32] [--threads 2] [--json out.json]

The cost model prices a batch's routed experts as the share that ``tokens`` independent picks
of ``k`` of ``E`` experts touch, ``1 - (1 - k/E)^tokens`` (all of them for a 1K-token prompt),
and llama.cpp's scheduler copies only the experts a batch uses when it streams CPU-held
experts to the GPU. A router that sends every token to the same few experts therefore makes
prefill look cheaper than a trained model's (trained with a load-balancing loss, its experts
are used about evenly) and the cost model look wrong. This reads the router's choices
(``ffn_moe_topk-<layer>``, through llama.cpp's eval callback, every weight on the CPU) and
reports, per layer, the distinct experts the prompt used against the independent-pick
expectation, and how many experts a decoded token shares with the one before it.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import llama_cpp as L
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from igi_sdk.model import read_inventory
from igi_sdk.runtime._native import ggml, init_backend
from igi_sdk.runtime.ggml_bench import TensorHead

ggml.ggml_get_name.restype = ctypes.c_char_p
ggml.ggml_get_name.argtypes = [ctypes.c_void_p]
ggml.ggml_nbytes.restype = ctypes.c_size_t
ggml.ggml_nbytes.argtypes = [ctypes.c_void_p]
ggml.ggml_backend_tensor_get.restype = None
ggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t,
                                         ctypes.c_size_t]

PREFIX = b"ffn_moe_topk-"


class Router:
    """Collects the top-k expert ids of every layer for every llama_decode."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.picks: dict[int, list[np.ndarray]] = defaultdict(list)  # layer -> [tokens × k]
        self.callback = L.ggml_backend_sched_eval_callback(self._seen)

    def _seen(self, t: ctypes.c_void_p, ask: bool, _user: ctypes.c_void_p) -> bool:
        name = ggml.ggml_get_name(t) or b""
        if not name.startswith(PREFIX):
            return not ask  # asked: not this one; computed: go on
        if ask:
            return True
        # a view of the router's argsort: k ids at the start of each token's row of E
        head = TensorHead.from_address(t)
        n = ggml.ggml_nbytes(t)
        buf = np.zeros((n + head.nb[1] - 1) // 4 + 1, dtype=np.int32)
        ggml.ggml_backend_tensor_get(t, buf.ctypes.data, 0, n)
        rows = np.lib.stride_tricks.as_strided(
            buf, shape=(head.ne[1], head.ne[0]), strides=(head.nb[1], head.nb[0]))
        self.picks[int(name[len(PREFIX):])].append(rows.copy())
        return True

    def reset(self) -> None:
        self.picks.clear()


def routing(path: Path, *, prompt_tokens: int, gen: int, threads: int,
            seed: int = 0) -> dict[str, Any]:
    """The router's choices over a random prompt of ``prompt_tokens`` and ``gen`` greedy
    decode steps of the MoE at ``path`` (every weight on the CPU)."""
    arch = read_inventory(path).arch
    k, e = arch.n_expert_used, arch.n_expert
    if not e:
        raise ValueError(f"{path.name} is not a MoE (no experts)")
    init_backend()
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    router = Router(k)
    cp = L.llama_context_default_params()
    cp.n_ctx = prompt_tokens + gen + 16
    cp.n_batch = cp.n_ubatch = prompt_tokens
    cp.n_threads = cp.n_threads_batch = threads
    cp.cb_eval = router.callback
    ctx = L.llama_init_from_model(model, cp)
    try:
        return _measure(ctx, model, router, path, prompt_tokens, gen, seed, k, e)
    finally:
        L.llama_free(ctx)
        L.llama_model_free(model)


def _measure(ctx: L.llama_context_p, model: L.llama_model_p, router: Router, path: Path,
             prompt_tokens: int, gen: int, seed: int, k: int, e: int) -> dict[str, Any]:
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    rng = np.random.default_rng(seed)
    # random tokens above the specials: a prompt of varied text, as a trained model would see
    prompt = rng.integers(min(1000, n_vocab // 2), n_vocab, prompt_tokens).tolist()
    arr = (L.llama_token * len(prompt))(*prompt)
    if L.llama_decode(ctx, L.llama_batch_get_one(arr, len(prompt))) != 0:
        raise RuntimeError("prefill failed")
    expected = e * (1 - (1 - k / e) ** prompt_tokens)
    layers: dict[int, dict[str, float]] = {}
    for layer, picks in sorted(router.picks.items()):
        ids = np.concatenate(picks)
        counts = np.bincount(ids.ravel(), minlength=e)
        top = np.sort(counts)[::-1]
        layers[layer] = {"distinct": int((counts > 0).sum()),
                         "top_k_share": round(float(top[:k].sum() / counts.sum()), 3),
                         "distinct_pick_sets": len({tuple(sorted(r)) for r in ids.tolist()})}
    # decode: greedy from the prompt, one token a step
    router.reset()
    one = (L.llama_token * 1)()
    tok = prompt[-1]
    for _ in range(gen):
        one[0] = tok
        if L.llama_decode(ctx, L.llama_batch_get_one(one, 1)) != 0:
            raise RuntimeError("decode failed")
        row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, -1), (n_vocab,))
        tok = int(row.argmax())
    overlap = []  # per layer: experts a token shares with the token before it, on average
    for _layer, picks in sorted(router.picks.items()):
        steps = [set(p.ravel().tolist()) for p in picks]
        shared = [len(x & y) for x, y in itertools.pairwise(steps)]
        overlap.append(statistics.mean(shared) if shared else 0.0)
    # the last layer computes only the rows that give logits (llama.cpp skips the others): one
    # token of a prompt, so it is left out of the prompt's figures
    last = max(layers)
    spread = [v for i, v in layers.items() if i != last] or list(layers.values())
    return {
        "model": path.name, "n_expert": e, "n_expert_used": k,
        "prompt_tokens": prompt_tokens, "gen": gen,
        "prompt_distinct_expected": round(expected, 1),
        "prompt_distinct_median": statistics.median(v["distinct"] for v in spread),
        "prompt_distinct_min": min(v["distinct"] for v in spread),
        "prompt_top_k_share_median": statistics.median(v["top_k_share"] for v in spread),
        "prompt_top_k_share_even": round(k / e, 3),
        "prompt_pick_sets_median": statistics.median(v["distinct_pick_sets"] for v in spread),
        "decode_shared_with_previous_median": round(statistics.median(overlap), 2),
        "decode_shared_expected": round(k * k / e, 2),
        "layers": layers,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, type=Path)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    try:
        out = routing(a.model, prompt_tokens=a.prompt_tokens, gen=a.gen, threads=a.threads,
                      seed=a.seed)
    except ValueError as e:
        print(e, file=sys.stderr)
        return 2
    print(json.dumps({x: y for x, y in out.items() if x != "layers"}, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
