"""Where a decode step's time goes outside the model's own compute: one model, one process,
the same context and attention, rows alternating round by round (A B C A B C ...):

    python benchmarks/host_overhead.py [--model PATH] [--ngl 99] [--threads 2] [--ctx 4096]
        [--tokens 128] [--rounds 5] [--seqs 1] [--plan-file PLAN.json]
        [--context llama-bench|engine] [--stream-every-ms 0]
        [--modes decode,argmax,sampler,backend,engine,engine-in-turn]
        [--llama-bench PATH] [--json out.json]

``decode``: ``llama_decode`` of one token and a wait for it, the next token fixed (what
``llama-bench``'s generation test does: its logits come back, nobody reads them);
``argmax``: the same, the next token the greedy pick, an argmax over the logits row (numpy,
as the engine picks greedily); ``sampler``: the pick by llama.cpp's greedy sampler on the host
(``llama_sampler_sample``: what ``llama_cpp.Llama`` and ``llama-cli`` do); ``backend``: a
context whose sequence has a greedy sampler in the graph (llama.cpp's backend sampling): only
the token comes back; ``engine``: igi_sdk's engine, every weight where ``--ngl`` puts them
(all on the GPU, or all on the CPU at 0), greedy, its reply read as the caller reads it, as
shipped (``launch_ahead`` "auto": the next step queued before a token is taken where the
decode call only queues the device's work); ``engine-in-turn``: the same engine with
``launch_ahead`` "off" (each step prepared after the last one's token was taken).
``--llama-bench``: upstream's binary at the same settings, its ``tg`` rate (no sampling).
``--plan-file PATH``: every row on a saved plan's placement (the llama.cpp rows load the
model with its tensor overrides and pinned host weights, as the engine does); ``--context
engine``: the llama.cpp rows' context with the engine's settings for that plan (one KV pool,
its ubatch and output rows) instead of llama.cpp's defaults. Both together tell a gap between
the engine and upstream apart: the Python loop, the context's settings, or the engine.
``--seqs N``: the llama.cpp rows decode N sequences together (each its own copy of the prompt,
one token each a step, every step's N logits rows read and picked, as many NPCs talking at
once), and their figures are per step; the engine rows are not run then.

Prints each round's ms per token, the medians, and each row's median excess over ``decode``
(same round): the host's share of a token. The greedy tokens of ``argmax``, ``sampler``,
``backend`` and ``engine`` are compared. Each round also records what this process's threads
did per token (``threads`` in the JSON: CPU time, voluntary and involuntary switches, by
thread; benchmarks/thread_counts.py). With weights on the CPU and more than one thread, the
engine rows and the llama.cpp rows need separate invocations: each keeps a team of OpenMP
workers, and two teams that together outnumber the CPUs run with libgomp's short spin.
``--stream-every-ms``: the engine rows' text pieces (the sidecar's default is 16).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import llama_cpp as L  # noqa: E402
import numpy as np  # noqa: E402

from igi_sdk.model import default_model_path, read_inventory  # noqa: E402
from igi_sdk.planner import Plan  # noqa: E402
from igi_sdk.runtime import loader  # noqa: E402
from igi_sdk.runtime._native import init_backend, set_streamed_weights  # noqa: E402
from igi_sdk.runtime.devices import first_gpu  # noqa: E402

sys.path.insert(0, str(REPO / "benchmarks"))
import thread_counts  # noqa: E402
from cpu_decode_peer import PROMPT, EnginePeer, alternate, report  # noqa: E402  (shared rows)

LOW_LEVEL = ("decode", "argmax", "sampler", "backend")


class Native:
    """One llama.cpp context on the shared model, driven step by step from Python: ``seqs``
    sequences, each its own copy of the prompt, decoding one token each per step."""

    def __init__(self, model: L.llama_model_p, mode: str, a: argparse.Namespace,
                 prompt: list[int]) -> None:
        self.mode, self.prompt, self.seqs = mode, prompt, a.seqs
        self.vocab = L.llama_model_get_vocab(model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)
        if a.context == "engine":  # the engine's own settings for the plan (loader.py)
            cp = loader.context_params(a.plan, loader.ContextSettings(
                a.ctx, self.seqs, 2048, a.threads), first_gpu() if a.ngl else None)
        else:  # llama.cpp's defaults, as llama-bench sets them
            cp = L.llama_context_default_params()
            cp.n_ctx, cp.n_batch, cp.n_ubatch = a.ctx, 512, 512
            cp.n_seq_max = self.seqs
            cp.n_threads = cp.n_threads_batch = a.threads
            cp.flash_attn_type = 1  # on
            cp.no_perf = True
        # one greedy chain per sequence: llama.cpp's backend sampling keeps a chain's graph
        # state per sequence
        self.chains = []
        for _ in range(self.seqs):
            chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
            self.chains.append(chain)
        if mode == "backend":
            self._cfg = (L.llama_sampler_seq_config * self.seqs)()
            for s, chain in enumerate(self.chains):
                self._cfg[s].seq_id = s
                self._cfg[s].sampler = ctypes.cast(chain, ctypes.c_void_p)
            cp.samplers, cp.n_samplers = self._cfg, self.seqs
        self.ctx = L.llama_init_from_model(model, cp)
        if not self.ctx:
            raise RuntimeError(f"{mode}: no context")
        self.batch = L.llama_batch_init(max(len(prompt), self.seqs), 0, 1)
        self.tokens: list[int] = []

    def _decode(self, toks: list[int], seqs: list[int], pos0: list[int], last_only: bool
                ) -> None:
        b = self.batch
        for i, (tok, seq, pos) in enumerate(zip(toks, seqs, pos0, strict=True)):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, pos, 1
            b.seq_id[i][0] = seq
            b.logits[i] = 0 if last_only and i < len(toks) - 1 else 1
        b.n_tokens = len(toks)
        if L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError(f"{self.mode}: llama_decode failed")

    def _pick(self, i: int, seq: int) -> int:
        if self.mode == "backend":
            return int(L.llama_get_sampled_token_ith(self.ctx, i))
        if self.mode == "sampler":
            return int(L.llama_sampler_sample(self.chains[seq], self.ctx, i))
        row = np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, i), (self.n_vocab,))
        return int(row.argmax())

    def run(self, n: int) -> float:
        """Milliseconds a step (a token of each sequence) over ``n - 1`` steps."""
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        p = len(self.prompt)
        toks = []
        for s in range(self.seqs):
            self._decode(self.prompt, [s] * p, list(range(p)), last_only=True)
            toks.append(self._pick(-1, s))
        out = [toks[0]]
        every = list(range(self.seqs))
        t0 = time.perf_counter()
        for k in range(n - 1):
            self._decode(toks, every, [p + k] * self.seqs, last_only=False)
            if self.mode == "decode":
                L.llama_synchronize(self.ctx)  # as llama-bench waits for each token
                toks = [self.prompt[-1]] * self.seqs
            else:
                toks = [self._pick(i, i) for i in every]
            out.append(toks[0])
        dt = time.perf_counter() - t0
        self.tokens = out if self.mode != "decode" else []
        return dt / (n - 1) * 1000

    def close(self) -> None:
        L.llama_batch_free(self.batch)
        L.llama_free(self.ctx)
        for chain in self.chains:
            L.llama_sampler_free(chain)


class EngineRow(EnginePeer):
    """cpu_decode_peer's engine row, every weight where ``--ngl`` puts them, in ms a token."""

    def __init__(self, path: Path, a: argparse.Namespace, launch_ahead: str = "auto") -> None:
        plan = a.plan
        a = argparse.Namespace(**vars(a), flash="on", sessions=1, batch=512,
                               launch_ahead=launch_ahead)
        super().__init__(path, a, plan)

    def run(self, n: int) -> float:
        return 1000.0 / max(super().run(n), 1e-9)


class Counted:
    """A row whose runs also count what this process's threads did meanwhile, per token
    (benchmarks/thread_counts.py)."""

    def __init__(self, row: Native | EngineRow) -> None:
        self.row = row
        self.counts: list[dict[str, object]] = []
        self.tokens = row.tokens

    def run(self, n: int) -> float:
        t0 = thread_counts.snapshot()
        ms = self.row.run(n)
        self.counts.append(thread_counts.per_token(t0, thread_counts.snapshot(), n))
        self.tokens = self.row.tokens
        return ms

    def close(self) -> None:
        self.row.close()


def llama_bench(binary: str, path: Path, a: argparse.Namespace) -> float | None:
    cmd = [binary, "-m", str(path), "-p", "0", "-n", str(a.tokens), "-ngl", str(a.ngl),
           "-t", str(a.threads), "-fa", "1", "-r", str(a.rounds), "-o", "json"]
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
        rate = json.loads(run.stdout)[0]["avg_ts"]
    except (subprocess.SubprocessError, OSError, ValueError, KeyError, IndexError) as e:
        print(f"llama-bench: {e}", file=sys.stderr)
        return None
    return 1000.0 / float(rate)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--ngl", type=int, default=0, help="layers on the GPU (99: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--modes", default="decode,argmax,sampler,backend,engine,engine-in-turn")
    ap.add_argument("--plan-file", type=Path, default=None,
                    help="a saved Plan (planner_bench --save-plan): every row on its placement "
                         "(the llama.cpp rows load the model with its tensor overrides)")
    ap.add_argument("--context", choices=("llama-bench", "engine"), default="llama-bench",
                    help="the llama.cpp rows' context: llama.cpp's defaults as llama-bench "
                         "sets them, or the engine's own for the plan (one KV pool, its "
                         "ubatch and output rows)")
    ap.add_argument("--seqs", type=int, default=1,
                    help="sequences decoding together (the llama.cpp rows; figures per step)")
    ap.add_argument("--stream-every-ms", type=float, default=0.0,
                    help="the engine rows' text pieces: at most one a window of this many ms "
                         "(the sidecar's default is 16; 0: every token is a piece)")
    ap.add_argument("--llama-bench", default="")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    path = a.model or default_model_path()
    modes = a.modes.split(",")
    if a.seqs > 1 and any(m.startswith("engine") for m in modes):
        raise SystemExit("--seqs > 1: the llama.cpp rows only (decode, argmax, sampler, backend)")
    a.plan = Plan.load(str(a.plan_file)) if a.plan_file is not None else None
    # as the engine starts llama.cpp (its log goes to the SDK's logger; a plan's copy-compute
    # threshold is read once, at the start)
    init_backend(a.plan.copy_compute_min_batch if a.plan is not None else None)
    mp = L.llama_model_default_params()
    mp.n_gpu_layers = a.ngl
    inventory = read_inventory(path)
    if a.plan is not None:  # the plan's placement, as the engine loads it
        gpu = first_gpu() if a.plan.uses_gpu() else None
        a.ngl = 99 if gpu is not None else 0  # (the engine rows' device; 0: the CPU alone)
        # (the parameters point into _overrides: it lives as long as this function)
        mp, _overrides = loader.model_params(a.plan, inventory, gpu)
        # a pipelined plan's streamed weights, named to ggml's scheduler as the engine does
        set_streamed_weights(a.plan.decode_streamed if gpu is not None else ())
    else:
        a.plan = Plan.all_gpu(inventory) if a.ngl > 0 else Plan.all_cpu()
    on_cpu = {t.name for t in inventory.tensors if t.group != "token_embd"} - a.plan.gpu_set
    if on_cpu and a.threads > 1 and {m.startswith("engine") for m in modes} == {True, False}:
        # the engine's thread and this one would each hold a team of OpenMP workers, and
        # libgomp cuts every team's spin to 100 rounds while they together outnumber the CPUs:
        # both kinds of row ran 1.5x slower so on an H200 host with the MoE's experts on the CPU
        raise SystemExit("weights on the CPU: run the engine rows and the llama.cpp rows in "
                         "separate invocations (two OpenMP teams in one process slow both)")
    model = L.llama_model_load_from_file(str(path).encode(), mp)
    vocab = L.llama_model_get_vocab(model)
    buf = (L.llama_token * 256)()
    n = L.llama_tokenize(vocab, PROMPT.encode(), len(PROMPT.encode()), buf, 256, True, False)
    prompt = list(buf[:n])
    rows: dict[str, Counted] = {}
    for m in modes:
        rows[m] = Counted(EngineRow(path, a) if m == "engine" else
                          EngineRow(path, a, "off") if m == "engine-in-turn" else
                          Native(model, m, a, prompt))
    load0 = os.getloadavg()[0]
    try:
        ms = alternate(rows, modes, a.rounds, a.tokens)
    finally:
        for row in rows.values():
            row.close()
        L.llama_model_free(model)
    out: dict[str, object] = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, load {load0:.2f} at start",
        "model": path.name,
        "args": {k: str(v) for k, v in vars(a).items() if k != "plan"} | {"plan": a.plan.name},
        "ms_per_token": ms, "median_ms": {m: statistics.median(v) for m, v in ms.items()},
        # each round's counts (the warm-up's first), per token: see Counted
        "threads": {m: row.counts for m, row in rows.items()}}
    if "decode" in ms:
        out["median_excess_ms"] = {
            m: round(statistics.median(x - y for x, y in zip(v, ms["decode"], strict=True)), 4)
            for m, v in ms.items() if m != "decode"}
    picks = {m: rows[m].tokens for m in modes if m != "decode"}
    # the greedy tokens themselves, for comparing runs of separate processes (a variant of the
    # environment each: the same placement must pick the same tokens)
    out["greedy_tokens"] = {m: t[:64] for m, t in picks.items()}
    if len(picks) > 1:
        k = min(len(t) for t in picks.values())
        first = next(iter(picks.values()))[:k]
        out["greedy_same"] = all(t[:k] == first for t in picks.values())
    if a.llama_bench:
        out["llama_bench_ms"] = llama_bench(a.llama_bench, path, a)
    return report(out, a.json)


if __name__ == "__main__":
    sys.exit(main())
