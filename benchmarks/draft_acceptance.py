"""Acceptance of drafted tokens on game-NPC dialogue: the per-token α of a draft model and of
n-gram proposals (no draft model), with tokens per verify pass, greedy and sampled, on the CPU.

Acceptance is a property of the pair (or the proposer) and the text, not of the machine, so it
is measured here on the CPU and combined with GPU step timings at forced α
(``speculative_bench.py``). Every scene is one NPC persona (chat-templated by the engine) and
one player line; names and items recur so that n-grams can hit. Drafting is forced on every
eligible step (``adaptive=False``) so that α is measured over the whole reply.

    python benchmarks/draft_acceptance.py                       # default model, n-grams only
    python benchmarks/draft_acceptance.py --model target.gguf --draft draft.gguf --json out.json

α is the per-token acceptance (the planner's: ``igi-sdk plan --alpha``); accepted ÷ drafted is
printed as ``rate``. With ``--compare``, greedy replies are also decoded without drafting and
the scenes whose text differs are counted (``--exact-verify`` loads without weight repacking).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from igi_sdk.model import default_model_path
from igi_sdk.planner import Plan
from igi_sdk.planner.speculative import expected_tokens_per_pass
from igi_sdk.runtime.engine import Engine, EngineConfig
from igi_sdk.runtime.sampling import SamplingParams
from igi_sdk.runtime.speculative import SpeculativeConfig

SCENES: list[tuple[str, str]] = [
    ("You are Bram, keeper of the Rusty Tankard tavern in Eldham. You sell Eldham ale, honey "
     "mead and mutton stew. Rooms cost 5 silver a night.",
     "Evening, Bram. What does the Rusty Tankard have tonight, and what does a room cost?"),
    ("You are Sergeant Mira of the Iron Gate of Eldham. Nobody passes the Iron Gate after dark "
     "without a writ from Captain Aldric.",
     "Sergeant Mira, I need to pass the Iron Gate tonight. What does Captain Aldric require?"),
    ("You are Oska, a merchant in the Eldham market. You sell iron swords for 40 silver, oak "
     "shields for 25 silver and healing draughts for 10 silver.",
     "Oska, how much for an iron sword and an oak shield together?"),
    ("You are Elder Fenwick, who gives quests in Eldham. Wolves from the Greywood have taken "
     "three sheep from the Millbrook farm.",
     "Elder Fenwick, tell me about the wolves of the Greywood and the Millbrook farm."),
    ("You are Lysa, the blacksmith of Eldham. You repair swords for 5 silver and forge new "
     "blades from Greywood iron.",
     "Lysa, my sword is chipped. Can you repair my sword, and what would a new blade cost?"),
    ("You are Brother Cael, healer at the Temple of the Dawn. The Temple of the Dawn heals "
     "wounds for a donation and sells blessed water.",
     "Brother Cael, I am wounded. Can the Temple of the Dawn heal me?"),
    ("You are Pip, a street urchin of Eldham who knows every rumour. The rumour is that the "
     "Silver Key was stolen from the Mayor's vault.",
     "Pip, what do you know about the Silver Key and the Mayor's vault?"),
    ("You are Captain Aldric, commander of the Eldham guard. Bandits on the King's Road have "
     "robbed three caravans this month.",
     "Captain Aldric, what do you know of the bandits on the King's Road?"),
    ("You are Greta, the stable master of Eldham. A horse costs 80 silver; stabling costs 2 "
     "silver a night.",
     "Greta, how much for a horse, and how much to stable my horse for a night?"),
    ("You are the ferryman of the Black River. The crossing of the Black River costs 3 copper, "
     "and the ferry does not cross after sunset.",
     "Ferryman, how much to cross the Black River, and when is the last crossing?"),
    ("You are Mage Orlen of the Blue Tower. The Blue Tower teaches fire spells and sells "
     "scrolls of fire for 30 silver.",
     "Mage Orlen, can the Blue Tower teach me fire spells, or should I buy a scroll of fire?"),
    ("You are Hilde, a farmer at the Millbrook farm. Wolves took three sheep from the Millbrook "
     "farm and you offer 20 silver for every wolf pelt.",
     "Hilde, Elder Fenwick sent me about the wolves. What will you pay for a wolf pelt?"),
    ("You are Tobin, a corporal of the Iron Gate. You are bored and gossip about Sergeant Mira "
     "and Captain Aldric.",
     "Corporal Tobin, what do you think of Sergeant Mira and Captain Aldric?"),
    ("You are Ada, the librarian of the Eldham archive. The archive holds the Chronicle of the "
     "Silver Key and maps of the Greywood.",
     "Ada, may I read the Chronicle of the Silver Key and see the maps of the Greywood?"),
    ("You are Rolf, a hunter of the Greywood. You sell wolf traps for 12 silver and know the "
     "paths of the Greywood.",
     "Rolf, I am hunting the wolves of the Greywood. Do you sell wolf traps?"),
    ("You are the Mayor of Eldham. The Silver Key opens the vault of Eldham, and whoever "
     "returns the Silver Key earns 500 silver.",
     "Mayor, I have heard the Silver Key was stolen. What is the reward for the Silver Key?"),
    ("You are Nell, the baker of Eldham. You sell bread for 1 copper, honey cakes for 3 copper "
     "and travel rations for 5 copper.",
     "Nell, I need bread, honey cakes and travel rations for the King's Road."),
    ("You are Vex, a fence in the Eldham docks. You buy stolen goods and know who stole the "
     "Silver Key.",
     "Vex, who stole the Silver Key? I can pay in silver."),
    ("You are Sister Ilse of the Temple of the Dawn. The Temple of the Dawn needs blessed water "
     "carried to the Millbrook farm.",
     "Sister Ilse, I can carry the blessed water to the Millbrook farm. What do I need to know?"),
    ("You are Bram, keeper of the Rusty Tankard tavern in Eldham. A bard plays at the Rusty "
     "Tankard every night, and Eldham ale costs 2 copper.",
     "Bram, order me an Eldham ale and tell me who plays at the Rusty Tankard tonight."),
]


def run(model: Path, *, draft: Path | None, ngram: bool, temperature: float, k: int,
        max_tokens: int, threads: int, exact_verify: bool) -> dict:
    spec = SpeculativeConfig(k=k, adaptive=False, ngram=ngram)
    cfg = EngineConfig(n_ctx=1024, max_sessions=1, n_threads=threads, prefill_chunk=256,
                       draft_model=str(draft) if draft else None, speculative=spec,
                       exact_verify=exact_verify)
    texts: list[str] = []
    t0 = time.perf_counter()
    with Engine(model, Plan.all_cpu(), cfg) as eng:
        for i, (system, line) in enumerate(SCENES):
            sampling = SamplingParams.create(temperature=temperature, seed=100 + i)
            sid = eng.open_session(system, sampling=sampling)
            texts.append(eng.chat(sid, line, max_tokens=max_tokens).result(timeout=600).text)
            eng.close_session(sid)
        st = eng.status()["speculative"]
    row = {k: st[k] for k in ("drafted", "accepted", "passes", "alpha", "acceptance_rate",
                              "tokens_per_pass")}
    row["by_source"] = st["by_source"]
    row["step_s"] = st["step_s"]  # measured plain and verify step times (what exactness costs)
    row["seconds"] = round(time.perf_counter() - t0, 1)
    if row["alpha"] is not None:
        row["E(alpha,k)"] = round(expected_tokens_per_pass(row["alpha"], k), 3)
    return {"row": row, "texts": texts}


def plain_texts(model: Path, *, max_tokens: int, threads: int, exact_verify: bool) -> list[str]:
    cfg = EngineConfig(n_ctx=1024, max_sessions=1, n_threads=threads, prefill_chunk=256,
                       exact_verify=exact_verify)
    out = []
    with Engine(model, Plan.all_cpu(), cfg) as eng:
        for system, line in SCENES:
            sid = eng.open_session(system, sampling=SamplingParams.create(temperature=0.0))
            out.append(eng.chat(sid, line, max_tokens=max_tokens).result(timeout=600).text)
            eng.close_session(sid)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="target GGUF (default: the embedded SmolLM2-135M)")
    ap.add_argument("--draft", help="draft GGUF of the target's tokenizer (else n-grams only)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--temperatures", default="0,0.7")
    ap.add_argument("--compare", action="store_true",
                    help="also decode greedy replies without drafting and count differences")
    ap.add_argument("--exact-verify", action="store_true")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    model = Path(args.model) if args.model else default_model_path()
    draft = Path(args.draft) if args.draft else None
    out: dict = {"model": model.name, "draft": draft.name if draft else None, "k": args.k,
                 "scenes": len(SCENES), "max_tokens": args.max_tokens,
                 "machine": f"{platform.processor() or platform.machine()}, "
                            f"{args.threads or 'default'} threads", "rows": {}}
    kinds = [("draft", draft, False)] if draft else []
    kinds.append(("ngram", None, True))
    plain = (plain_texts(model, max_tokens=args.max_tokens, threads=args.threads,
                         exact_verify=args.exact_verify) if args.compare else None)
    print("drafter  temp   α      rate   tokens/pass  E(α,k)  passes  differ  s")
    for name, d, ng in kinds:
        for temp in (float(t) for t in args.temperatures.split(",")):
            r = run(model, draft=d, ngram=ng, temperature=temp, k=args.k,
                    max_tokens=args.max_tokens, threads=args.threads,
                    exact_verify=args.exact_verify)
            row = r["row"]
            if plain is not None and temp == 0.0:
                row["greedy_scenes_differing"] = sum(a != b for a, b in zip(plain, r["texts"],
                                                                            strict=True))
            out["rows"][f"{name} t={temp}"] = row
            print(f"{name:<8} {temp:<5} {row['alpha']!s:<6} {row['acceptance_rate']!s:<6} "
                  f"{row['tokens_per_pass']!s:<12} {row.get('E(alpha,k)')!s:<7} "
                  f"{row['passes']:<7} {row.get('greedy_scenes_differing', '-')!s:<7} "
                  f"{row['seconds']}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
