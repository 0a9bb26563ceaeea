"""A draft that cannot pay (the default model drafting for itself): greedy decode with it
against the same engine settings without it, alternating in one run (A B A B ...), on an idle
host or beside ``--busy`` processes spinning.

    python benchmarks/draft_no_pay.py [--threads 0] [--tokens 128] [--rounds 4] [--busy 1]
        [--json out.json]

Both engines live in this process (one libgomp wait for both); each round decodes one reply
on each, in alternating order. Prints each round's rates, the medians, the median ratio
(with ÷ without, of the same round), whether the greedy tokens are the same, and the draft's
figures (steps drafted, the decision's measured step costs).
"""

from __future__ import annotations

import argparse
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

from igi_sdk.model import default_model_path  # noqa: E402
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams  # noqa: E402

PROMPT = "Tell me about the castle on the hill and its long history, in detail."


def reply(eng: Engine, n: int) -> tuple[float, list[int]]:
    sid = eng.open_session("You are a guard.", sampling=SamplingParams(temperature=0.0))
    gen = eng.chat(sid, PROMPT, max_tokens=n, ignore_eos=True)
    stamps = [time.perf_counter() for _piece in gen]
    tokens = list(gen.result().tokens)
    eng.close_session(sid)
    rate = (len(tokens) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return rate, tokens


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=0, help="EngineConfig.n_threads (0: adaptive)")
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--busy", type=int, default=0, help="processes spinning meanwhile")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    path = default_model_path()
    base = EngineConfig(n_ctx=a.ctx, max_sessions=2, n_threads=a.threads)
    with_draft = EngineConfig(n_ctx=a.ctx, max_sessions=2, n_threads=a.threads,
                              draft_model=str(path))
    engines = {"plain": Engine(path, None, base), "draft": Engine(path, None, with_draft)}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    rates: dict[str, list[float]] = {m: [] for m in engines}
    tokens: dict[str, list[int]] = {}
    load0 = os.getloadavg()[0]
    try:
        for eng in engines.values():
            reply(eng, 16)  # warm-up
        names = list(engines)
        for r in range(a.rounds):
            for m in (names if r % 2 == 0 else names[::-1]):
                rate, tokens[m] = reply(engines[m], a.tokens)
                rates[m].append(round(rate, 2))
            print(f"round {r}: " + "  ".join(f"{m} {rates[m][-1]:.1f}" for m in names),
                  flush=True)
        spec = engines["draft"].status().get("speculative", {})
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        for eng in engines.values():
            eng.close()
    out = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, load {load0:.2f} at start, "
                   f"{os.getloadavg()[0]:.2f} at end",
        "args": vars(a), "tok_s": rates,
        "median_tok_s": {m: statistics.median(v) for m, v in rates.items()},
        "ratio_draft_to_plain": round(statistics.median(
            x / y for x, y in zip(rates["draft"], rates["plain"], strict=True)), 3),
        "greedy_same": tokens["draft"] == tokens["plain"],
        "speculative": {k: spec.get(k) for k in ("drafted", "accepted", "passes", "alpha",
                                                  "step_s", "drafted_steps")}}
    print(json.dumps(out, default=str))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1, default=str) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
