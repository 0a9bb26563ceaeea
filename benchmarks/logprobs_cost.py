"""What logprobs and the OpenAI samplers cost per token: decode tokens/s of one reply with and
without them, alternated in one run (each setting's runs interleave, so a busy host slows all
of them alike).

    python benchmarks/logprobs_cost.py [--model M.gguf] [--tokens 128] [--rounds 4]
        [--threads 2] [--json out.json]

Settings: plain sampling (temperature 0.7, the session's default), ``logprobs`` 5 and 20, and
the frequency/presence penalties with a 50-token logit bias.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import llama_cpp

from igi_sdk.model import default_model_path, read_inventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams, loader
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.runtime.sampling import SamplerChain

SETTINGS: dict[str, dict[str, object]] = {
    "plain": {},
    "logprobs 5": {"logprobs": 5},
    "logprobs 20": {"logprobs": 20},
    "penalties + 50 biases": {"sampling": {
        "frequency_penalty": 0.5, "presence_penalty": 0.3,
        "logit_bias": {str(t): -1.0 for t in range(1000, 1050)}}},
}


def sampler_us(model: Path, calls: int = 400) -> dict[str, float]:
    """The sampler's own time per token (µs, median of 5 batches of ``calls``) on the model's
    logits row: what logprobs and the penalties add, without the decode around them."""
    loaded = loader.load(model, read_inventory(model), Plan.all_cpu(),
                         ContextSettings(256, 1, 64, 1, n_outputs=1))
    batch = llama_cpp.llama_batch_init(1, 0, 1)
    batch.token[0], batch.pos[0], batch.n_seq_id[0] = 1, 0, 1
    batch.seq_id[0][0], batch.logits[0], batch.n_tokens = 0, 1, 1
    assert llama_cpp.llama_decode(loaded.ctx, batch) == 0
    vocab = llama_cpp.llama_model_get_vocab(loaded.model)
    history = list(range(100, 164))
    cases = {"plain": (SamplingParams(seed=1), None),
             "logprobs 5": (SamplingParams(seed=1), 5),
             "logprobs 20": (SamplingParams(seed=1), 20),
             "penalties + 50 biases": (SamplingParams(
                 seed=1, frequency_penalty=0.5, presence_penalty=0.3,
                 logit_bias={str(t): -1.0 for t in range(1000, 1050)}), None),
             "greedy": (SamplingParams(temperature=0.0), None),
             "greedy, logprobs 5": (SamplingParams(temperature=0.0), 5)}
    out = {}
    try:
        for name, (params, lp) in cases.items():
            chain = SamplerChain(params, vocab, grammar=None, history=history,
                                 reply_tokens=[], logprobs=lp)
            batches = []
            for _ in range(5):
                t0 = time.perf_counter()
                for step in range(calls):
                    chain.sample(loaded.ctx, 0, step)
                batches.append((time.perf_counter() - t0) / calls * 1e6)
            chain.close()
            out[name] = round(statistics.median(batches), 1)
    finally:
        llama_cpp.llama_batch_free(batch)
        loader.free(loaded)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    model = args.model or default_model_path()
    rates: dict[str, list[float]] = {name: [] for name in SETTINGS}
    with Engine(model, Plan.all_cpu(), EngineConfig(n_ctx=2048, max_sessions=1,
                                                    n_threads=args.threads)) as eng:
        for _ in range(args.rounds):
            for name, options in SETTINGS.items():
                sid = eng.open_session("You are a storyteller.", sampling=SamplingParams(seed=1))
                try:
                    r = eng.chat(sid, "Tell me a long story.", max_tokens=args.tokens,
                                 ignore_eos=True, **options).result(600)  # type: ignore[arg-type]
                finally:
                    eng.close_session(sid)
                rates[name].append(r.decode_tps)
    base = statistics.median(rates["plain"])
    out = {name: {"median_tps": round(statistics.median(v), 2),
                  "vs_plain": round(statistics.median(v) / base, 3),
                  "runs": [round(x, 2) for x in v]} for name, v in rates.items()}
    out["sampler_us_per_token"] = sampler_us(Path(model))  # type: ignore[assignment]
    out["_setup"] = {"model": Path(model).name, "tokens": args.tokens, "rounds": args.rounds,
                     "threads": args.threads}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
