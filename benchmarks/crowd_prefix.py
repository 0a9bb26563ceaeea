"""A crowd of NPCs with one system prompt and tool block (Mantella's Lydia and her four
Advanced Actions): the prompt tokens each NPC's first line reads, and its time to first token,
with prompt prefixes shared between sessions (``EngineConfig.share_prefixes``, the default) and
without, in one process, alternating rounds so that a loaded host slows each alike. Prints the
medians and their ratios.

    python benchmarks/crowd_prefix.py [--npcs 8] [--rounds 3] [--threads 2] [--model GGUF]
"""

from __future__ import annotations

import argparse
import statistics
import time

from tool_calls_cost import TOOLS  # Mantella's actions, as the tools benchmark declares them

import igi_sdk  # noqa: F401  (native import order)
from igi_sdk.model.default import default_model_path
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams
from igi_sdk.runtime.tools import ToolSpec

SYSTEM = ("You are Lydia, a Nord housecarl in Whiterun. You are talking with the Dragonborn. "
          "Speak briefly, in character.")
LINES = ["Follow me, Lydia.", "Attack that bandit!", "Let's trade.", "Wait here for me.",
         "How are you today?", "What do you think of Whiterun?", "Any news from the road?",
         "Are you ready to travel?"]


def crowd(eng: Engine, npcs: int) -> tuple[list[int], list[float]]:
    """Each NPC opens and says its first line, one after another: (tokens read, TTFT s)."""
    read, ttft = [], []
    spec = ToolSpec.of(TOOLS)
    for i in range(npcs):
        sid = eng.open_session(SYSTEM, sampling=SamplingParams(temperature=0.0))
        t0 = time.perf_counter()
        gen = eng.chat(sid, LINES[i % len(LINES)], max_tokens=4, tools=spec)
        next(iter(gen), None)
        first = time.perf_counter() - t0
        r = gen.result(timeout=300)
        read.append(r.prompt_tokens)
        ttft.append(r.ttft_s if r.ttft_s > 0 else first)
    for sid in eng.sessions():
        eng.close_session(sid)
    return read, ttft


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(default_model_path()))
    ap.add_argument("--npcs", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    cfg = EngineConfig(n_ctx=512 * args.npcs, max_sessions=args.npcs, n_threads=args.threads)
    off_cfg = EngineConfig(**{**cfg.__dict__, "share_prefixes": False})
    rows: dict[str, tuple[list[int], list[float]]] = {"shared": ([], []), "unshared": ([], [])}
    with Engine(args.model, Plan.all_cpu(), cfg) as on, \
            Engine(args.model, Plan.all_cpu(), off_cfg) as off:
        for _ in range(args.rounds):
            for name, eng in (("shared", on), ("unshared", off)):
                read, ttft = crowd(eng, args.npcs)
                rows[name][0].extend(read[1:])  # the first NPC reads the whole prompt in both
                rows[name][1].extend(ttft[1:])
    print(f"{args.npcs} NPCs x {args.rounds} rounds, one system prompt + 4 tools, "
          f"{args.threads} threads; NPCs after the first:")
    for name, (read, ttft) in rows.items():
        print(f"  {name:9s} tokens read median {statistics.median(read):6.0f}   "
              f"TTFT median {1000 * statistics.median(ttft):7.1f} ms")
    r_read = statistics.median(rows["shared"][0]) / statistics.median(rows["unshared"][0])
    r_ttft = statistics.median(rows["shared"][1]) / statistics.median(rows["unshared"][1])
    print(f"  shared / unshared: tokens read {r_read:.3f}x, TTFT {r_ttft:.3f}x")


if __name__ == "__main__":
    main()
