"""What constrained decoding of tool calls costs: decode tokens/s of the same prompt (a
Mantella-style system prompt with four actions) with ``tool_choice`` "none" (the tools are in
the prompt, decoding is free), "auto" (text that holds no call tag, or calls) and "required"
(calls only), run alternately in one process so that a loaded host slows each alike; prints
the medians and their ratios to "none".

    python benchmarks/tool_calls_cost.py [--rounds 6] [--max-tokens 48] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics

import igi_sdk  # noqa: F401  (native import order)
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams
from igi_sdk.runtime.tools import ToolSpec

SYSTEM = "You are Lydia, a Nord housecarl in Whiterun. Speak briefly, in character."
TOOLS = [
    ("Follow", "Start following the player.",
     {"type": "object", "properties": {"source": {"type": "string"}}, "required": ["source"]}),
    ("Attack", "Attack someone nearby.",
     {"type": "object", "properties": {"source": {"type": "string"},
                                       "target": {"type": "string"}},
      "required": ["source", "target"]}),
    ("Inventory", "Open your inventory to trade.", {"type": "object", "properties": {}}),
    ("Wait", "Wait here.", {"type": "object", "properties": {
        "minutes": {"type": "integer", "minimum": 1, "maximum": 120}}, "required": ["minutes"]}),
]
LINES = ["Attack that bandit!", "How are you today?", "Follow me.", "Let's trade."]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    eng = Engine(config=EngineConfig(n_ctx=2048, n_threads=args.threads))
    tps: dict[str, list[float]] = {"none": [], "auto": [], "required": []}
    calls = {k: 0 for k in tps}
    try:
        for r in range(args.rounds):
            for choice in tps:
                sid = eng.open_session(SYSTEM, sampling=SamplingParams(temperature=0.9,
                                                                       seed=r + 1))
                res = eng.chat(sid, LINES[r % len(LINES)], max_tokens=args.max_tokens,
                               tools=ToolSpec.of(TOOLS, choice)).result()
                eng.close_session(sid)
                if res.completion_tokens >= 8:  # a rate needs a few tokens
                    tps[choice].append(res.decode_tps)
                calls[choice] += len(res.tool_calls)
    finally:
        eng.close()
    base = statistics.median(tps["none"])
    for choice, xs in tps.items():
        med = statistics.median(xs)
        print(f"{choice:9s} decode {med:6.1f} tok/s (median of {len(xs)}), "
              f"{med / base:.2f}x of none, calls {calls[choice]}")


if __name__ == "__main__":
    main()
