"""Speculative decoding's mechanism: decode tok/s versus acceptance α, paying a real draft's cost.

    python benchmarks/speculative_bench.py --target llama3-8b.gguf --draft draft.gguf \
        --profile profile.json --budget-gb 4 --alphas 0.5,0.6,0.7,0.8,0.9 --json out.json

Random-weight models agree on nothing, so a real acceptance rate cannot be shown with them.
What is measured instead is the mechanism at a chosen rate: the draft model runs for real (its
decodes cost what they cost), the target verifies its k drafts in one batch for real and picks
its own token at each position, and then the verdict is forced: draft ``i`` is kept with
probability α (given the ones before it were), else the target's pick replaces it. Every cost is
the real one (draft decodes, the k+1-token verify, cache trims); only the text differs from the
target's own greedy reply, since kept drafts are the draft's tokens. (Forcing the draft's
proposals to match a recorded greedy reply instead breaks on a GPU: a k+1-token verify rounds
differently from a 1-token decode, random weights give near-ties everywhere, and one flipped
token misaligns the reference for the rest of the reply.) Rows:

* ``plain-whole-budget``: no draft, the planner's best plan for the whole budget;
* ``plain-draft-plan``: no draft, the smaller target plan that leaves room for the draft;
* ``draft-as-is``: that plan with the (unrelated) draft and the runtime's acceptance tracking on,
  as in a game: drafting that loses turns itself off;
* ``alpha=…``: that plan with the draft at each forced acceptance rate, drafting every step
  (tracking off: the mechanism itself). ``kept_share`` = kept / drafted, ``tokens_per_pass`` =
  tokens per verify pass (E(α, k) = (1 - α^(k+1)) / (1 - α) expected).

A turn is a ``--prompt-tokens`` prompt (a padded system prompt, so decoding runs at the same depth
as ``upstream_peers.py``'s ``-d``) and ``--gen`` tokens; ``turn_s`` = TTFT + gen / decode tok/s,
as there. Each engine's peak VRAM (NVML, this process) is recorded beside the budget (GB = 10^9).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from planner_bench import GB, PeakVram  # benchmarks/, this script's folder

from igi_sdk.model import read_inventory
from igi_sdk.planner import Plan, Workload, speculative
from igi_sdk.profile import Profile
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams
from igi_sdk.runtime.drafting import Drafting
from igi_sdk.runtime.speculative import SpeculativeConfig

GREEDY = SamplingParams(temperature=0.0, repeat_penalty=1.0)
SYSTEM = "You are Brom, the blacksmith of Oakvale."
LORE = ("Oakvale lies where the river bends below the old mine; its smiths have forged for the "
        "king's guard since the war of the three crowns, and every blade carries a rune. ")
LINE = "Tell me everything about the swords you forge, the ore, the fire and the old songs."


def _system_prompt(eng: Engine, tokens: int) -> str:
    """The system prompt padded with lore to about ``tokens`` tokens (the template adds a few)."""
    per = max(1, len(eng.tokenize(LORE)))
    return SYSTEM + " " + LORE * max(0, (tokens - len(eng.tokenize(SYSTEM + LINE))) // per)


def _reply(eng: Engine, gen: int, system: str = SYSTEM) -> dict[str, Any]:
    sid = eng.open_session(system, sampling=GREEDY)
    before = dict(eng.status()["speculative"]) if eng.config.draft_model else {}
    r = eng.chat(sid, LINE, max_tokens=gen, ignore_eos=True).result(timeout=600)
    spec = eng.status()["speculative"] if eng.config.draft_model else {}
    eng.close_session(sid)
    decode_s = max(r.total_s - r.ttft_s, 1e-9)
    tps = (r.completion_tokens - 1) / decode_s
    row = {"ttft_s": round(r.ttft_s, 4), "decode_tps": round(tps, 2),
           "prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
           "total_s": round(r.total_s, 4), "turn_s": round(r.ttft_s + gen / tps, 3)}
    if spec:
        drafted = spec["drafted"] - before.get("drafted", 0)
        accepted = spec["accepted"] - before.get("accepted", 0)
        passes = spec["passes"] - before.get("passes", 0)
        row.update(drafted=drafted, accepted=accepted, verify_passes=passes,
                   acceptance_rate=round(accepted / drafted, 3) if drafted else None,
                   tokens_per_pass=round((accepted + passes) / passes, 3) if passes else None,
                   alpha=spec["alpha"],  # per-token, over the engine's life
                   step_s=spec["step_s"], predicted_step_s=spec["predicted_step_s"])
    return {"row": row}


class _ForcedAcceptance:
    """Forces greedy verification's verdict: draft ``i`` is kept with probability ``alpha``.

    Patches the engine's verify seam, ``Drafting.verify_pick`` (runtime/drafting.py), on the
    class while active: every engine's drafting then goes through it."""

    def __init__(self, n_vocab: int, seed: int = 0) -> None:
        self.n_vocab = n_vocab
        self.alpha = 0.0
        self.rng = random.Random(seed)
        self._original = Drafting.verify_pick

    def __enter__(self) -> _ForcedAcceptance:
        forced = self

        def verify_pick(d: Drafting, t: Any, idx: int, proposal: Any, i: int,
                        *target: Any) -> tuple[int, bool]:
            tok, _ = forced._original(d, t, idx, proposal, i, *target)  # the target's real pick
            if i >= len(proposal.tokens):
                return tok, False  # the bonus token after k kept drafts
            drafted = proposal.tokens[i]
            if forced.rng.random() < forced.alpha:
                return drafted, True
            return (tok if tok != drafted else (tok + 1) % forced.n_vocab), False

        Drafting.verify_pick = verify_pick  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Drafting.verify_pick = self._original  # type: ignore[method-assign]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", required=True, type=Path)
    ap.add_argument("--draft", required=True, type=Path)
    ap.add_argument("--profile", required=True, type=Path)
    ap.add_argument("--budget-gb", type=float, default=4.0, help="total VRAM, GB = 10^9 bytes")
    ap.add_argument("--alphas", default="0.5,0.6,0.7,0.8,0.9")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=1024)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args(argv)

    prof = Profile.load(args.profile)
    inv, dinv = read_inventory(args.target), read_inventory(args.draft)
    budget = int(args.budget_gb * GB)
    wl = Workload(n_ctx=args.ctx, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen)
    choice = speculative.choose(inv, dinv, prof, budget, k=args.k, alpha=0.7, wl=wl)
    spec_plan: Plan = choice.speculative_plan or choice.plain_plan
    out: dict[str, Any] = {
        "target": args.target.name, "draft": args.draft.name, "budget_gb": args.budget_gb,
        "k": args.k, "gen": args.gen, "n_ctx": args.ctx,
        "draft_vram": vars(choice.draft_vram), "choice": choice.why,
        "predicted": {"plain_tps": choice.plain_tps,
                      "speculative_tps_at_0.7": choice.speculative_tps},
        "rows": []}

    def emit(name: str, row: dict[str, Any]) -> None:
        out["rows"].append({"name": name, **row})
        print(f"{name:22s} {json.dumps(row)}", flush=True)

    cfg = EngineConfig(n_ctx=args.ctx, max_sessions=2, n_threads=args.threads)
    def peak_row(peak: PeakVram) -> dict[str, Any]:
        vram = peak.stop()
        return {"peak_vram_gb": round(vram / GB, 3), "fits_budget": vram <= budget}

    def plain(name: str, plan: Plan, config: EngineConfig) -> None:
        peak = PeakVram()
        with Engine(args.target, plan, config) as eng:
            system = _system_prompt(eng, args.prompt_tokens)
            _reply(eng, 4)  # warm-up
            row = _reply(eng, args.gen, system)["row"]
        emit(name, {**row, "plan_vram": plan.vram_bytes, **peak_row(peak)})

    plain("plain-whole-budget", choice.plain_plan, cfg)
    # the same with one session (one logits row per step) and, at the end, again: what a
    # second process-local load and the session count change
    plain("plain-whole-budget-1seq", choice.plain_plan, replace(cfg, max_sessions=1))
    plain("plain-draft-plan", spec_plan, cfg)

    spec_cfg = EngineConfig(n_ctx=args.ctx, max_sessions=2, n_threads=args.threads,
                            draft_model=str(args.draft),
                            # as the sidecar runs it: this plan's predicted costs decide
                            # until measured
                            speculative=SpeculativeConfig(k=args.k, profile=prof))
    peak = PeakVram()
    with Engine(args.target, spec_plan, spec_cfg) as eng:
        out["draft_memory"] = eng.status()["speculative"]["draft_memory"]
        system = _system_prompt(eng, args.prompt_tokens)
        emit("draft-as-is", _reply(eng, args.gen, system)["row"])  # an unrelated draft
    forced_cfg = replace(spec_cfg, speculative=SpeculativeConfig(k=args.k, adaptive=False))
    with Engine(args.target, spec_plan, forced_cfg) as eng:
        with _ForcedAcceptance(inv.arch.n_vocab) as forced:
            for alpha in (float(a) for a in args.alphas.split(",")):
                forced.alpha = alpha
                emit(f"alpha={alpha:.2f}", _reply(eng, args.gen, system)["row"])
    # the runtime's own choice (whether and how much to draft) at forced acceptance: drafting
    # where it pays must stay on (a step share near 1 at α = 0.5 where the break-even is lower)
    with Engine(args.target, spec_plan, spec_cfg) as eng:
        with _ForcedAcceptance(inv.arch.n_vocab) as forced:
            for alpha in (float(a) for a in args.alphas.split(",")):
                forced.alpha = alpha
                emit(f"adaptive alpha={alpha:.2f}", _reply(eng, args.gen, system)["row"])
    out["speculative_peak"] = peak_row(peak)  # both engines with the draft
    plain("plain-whole-budget-again", choice.plain_plan, cfg)
    print(f"speculative engine peak {json.dumps(out['speculative_peak'])}", flush=True)
    out["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
