"""The pure side of the many-NPC benchmark (benchmarks/many_npcs.py): the NPCs' prompts, one
row's figures from what each NPC's client saw, the next ``-ngl`` to probe when fitting
llama-server to a VRAM budget, and the markdown table. No I/O, no servers.
"""

from __future__ import annotations

import itertools
import math
import random
import statistics
from dataclasses import dataclass
from typing import Any

# --- prompts -------------------------------------------------------------------------------------

NAMES = ("Brom", "Elsa", "Tamsin", "Oduya", "Kettle", "Mirela", "Hale", "Sorrel", "Iven",
         "Petra", "Corwin", "Yusra", "Dagny", "Fenwick", "Lio", "Marguerite", "Anselm", "Rook",
         "Wren", "Basil")
ROLES = ("blacksmith", "innkeeper", "ferryman", "herbalist", "town guard captain", "miller",
         "fortune teller", "fishmonger", "stable master", "temple scribe", "bounty hunter",
         "cartographer", "beekeeper", "tax collector", "bard", "gravedigger")
PLACES = ("Millbrook", "Saltmarsh", "Greywood Crossing", "Oldharbour", "Thornfield",
          "the Copper Hills", "Lowater", "Ravensbridge")
TRAITS = ("gruff but fair", "cheerful and nosy", "suspicious of strangers", "tired and honest",
          "proud of their craft", "superstitious", "fond of long stories", "quick to laugh",
          "greedy but loyal", "quietly grieving", "ambitious", "easily flattered")
TOPICS = ("the price of iron", "wolves raiding the sheepfolds", "the new steward at the manor",
          "a missing fishing boat", "the harvest festival", "strange lights in the marsh",
          "a debt owed to the guild", "the road to the capital", "a sick mule",
          "bandits on the old bridge", "the temple bell that cracked", "a letter from the coast",
          "the river flooding the lower fields", "a stranger asking about old maps",
          "the baron's tax", "a lost ring")
PLAYER_LINES = ("What can you tell me about {t}?", "Have you heard anything new about {t}?",
                "Who else knows about {t}?", "Is {t} something I should worry about?",
                "How long has {t} been going on?", "Would you pay me to look into {t}?")
NPC_LINES = ("{t}? Folk talk of little else since the last market day, and most of it is "
             "nonsense, but some of it worries me.",
             "I keep my ears open. About {t}, the miller's boy swears he saw it himself, and "
             "he is no liar.",
             "Ask the guard captain about {t}. I only know what travellers tell me over a mug "
             "of ale, and they exaggerate.",
             "If you mean {t}, then yes, it has cost me coin and sleep both. Something must be "
             "done before winter comes.",
             "Hush. Talk of {t} gets people into trouble around here. Come back after dark if "
             "you truly want to know more.")
# tokens per word of this text under the synthetic models' tokenizer (measured 2.2-2.4; 1.3 for
# SmolLM2's): a prompt stays under its target in synthetic tokens
TOKENS_PER_WORD = 2.4


@dataclass(frozen=True)
class Npc:
    """One NPC's turn: its card (the system prompt) and the player's line with the scene so
    far (the user message)."""

    card: str
    line: str

    @property
    def words(self) -> int:
        return len(self.card.split()) + len(self.line.split())


def npc_prompts(n: int, lo_tokens: int = 300, hi_tokens: int = 1000) -> list[Npc]:
    """``n`` distinct NPCs whose prompts spread evenly from about ``lo_tokens`` to about
    ``hi_tokens`` (synthetic tokenizer); the same ``n`` always gives the same prompts."""
    if n < 1 or lo_tokens < 50 or hi_tokens < lo_tokens:
        raise ValueError("need n >= 1 and 50 <= lo_tokens <= hi_tokens")
    out = []
    for i in range(n):
        target = lo_tokens + (hi_tokens - lo_tokens) * (i / (n - 1) if n > 1 else 0.0)
        out.append(_npc(i, int(target / TOKENS_PER_WORD)))
    return out


def _npc(i: int, words: int) -> Npc:
    rng = random.Random(1000 + i)
    name = NAMES[i % len(NAMES)] + ("" if i < len(NAMES) else f" the {i // len(NAMES) + 1}th")
    role, place = ROLES[i % len(ROLES)], PLACES[rng.randrange(len(PLACES))]
    traits = rng.sample(TRAITS, 3)
    topics = rng.sample(TOPICS, 6)
    card = (f"You are {name}, the {role} of {place}. You are {traits[0]}, {traits[1]} and "
            f"{traits[2]}. You have lived in {place} for {rng.randrange(3, 60)} years. Lately "
            f"people talk about {topics[0]}, {topics[1]} and {topics[2]}. You know a little "
            f"about {topics[3]} and nothing about {topics[4]}. Speak in short, plain sentences, "
            "stay in character, never mention that you are an AI, and answer in at most three "
            "sentences.")
    scene: list[str] = []
    used = len(card.split())
    k = 0
    while True:  # whole exchanges while they fit the word target
        t = topics[k % len(topics)]
        pair = (f"Player: {rng.choice(PLAYER_LINES).format(t=t)}\n"
                f"{name}: {rng.choice(NPC_LINES).format(t=t)}")
        if used + len(pair.split()) > words:
            break
        scene.append(pair)
        used += len(pair.split())
        k += 1
    line = ("The conversation so far:\n" + "\n".join(scene) + "\n\nPlayer: "
            + PLAYER_LINES[i % len(PLAYER_LINES)].format(t=topics[5])) if scene else (
        "Player: " + PLAYER_LINES[0].format(t=topics[5]))
    return Npc(card, line)


# --- one row's figures ---------------------------------------------------------------------------

@dataclass(frozen=True)
class Reply:
    """One NPC's streamed reply as its client saw it; times in seconds on one clock."""

    npc: int
    sent: float  # the request went out
    first: float | None  # the first piece of text arrived
    end: float | None  # the stream ended (its last token and the final event)
    tokens: int  # tokens generated, the server's count
    prompt_tokens: int = 0
    finish: str = ""
    error: str | None = None
    max_gap_s: float | None = None  # the longest wait between two tokens after the first


def nearest_rank(xs: list[float], q: float) -> float:
    """The ``q`` quantile by nearest rank (an observed value: p90 of 4 NPCs is the slowest)."""
    s = sorted(xs)
    return s[max(0, math.ceil(q * len(s)) - 1)]


def _gaps(gaps: list[float]) -> dict[str, float]:
    if not gaps:
        return {}
    return {"gap_max_median_s": round(statistics.median(gaps), 4),
            "gap_max_s": round(max(gaps), 4)}


def summarize(replies: list[Reply], want_tokens: int) -> dict[str, Any]:
    """Aggregate tokens/s (every NPC's tokens over the wall from the first request to the last
    stream's end), each NPC's TTFT (median, p90, max), and what went wrong."""
    ok = [r for r in replies if r.error is None and r.first is not None and r.end is not None]
    out: dict[str, Any] = {"npcs": len(replies), "completed": len(ok),
                           "errors": [f"NPC {r.npc}: {r.error}" for r in replies if r.error]}
    if not ok:
        return out
    start = min(r.sent for r in replies)
    wall = max(r.end for r in ok if r.end is not None) - start
    tokens = sum(r.tokens for r in ok)
    ttft = [r.first - r.sent for r in ok if r.first is not None]
    decode = [(r.tokens - 1) / (r.end - r.first) for r in ok
              if r.first is not None and r.end is not None and r.tokens > 1 and r.end > r.first]
    out.update({
        "tokens": tokens, "wall_s": round(wall, 4),
        "aggregate_tps": round(tokens / wall, 2) if wall > 0 else None,
        "ttft_median_s": round(statistics.median(ttft), 4),
        "ttft_p90_s": round(nearest_rank(ttft, 0.9), 4), "ttft_max_s": round(max(ttft), 4),
        "npc_decode_tps_median": round(statistics.median(decode), 2) if decode else None,
        # a talking NPC that stops mid-sentence: each NPC's longest wait between tokens
        **_gaps([r.max_gap_s for r in ok if r.max_gap_s is not None]),
        "prompt_tokens": sum(r.prompt_tokens for r in ok),
        # a reply that ended before its length (the model's end-of-turn token; the sidecar's
        # protocol has no ignore-EOS) has fewer tokens in the aggregate, never a longer wall
        "short_replies": sum(1 for r in ok if r.tokens < want_tokens),
        "finish": sorted({r.finish for r in ok}),
    })
    return out


# --- fitting llama-server's -ngl to a budget ------------------------------------------------------

def next_ngl(probes: dict[int, int], limit: int, max_ngl: int) -> int | None:
    """The next ``-ngl`` to try given the peaks (bytes) seen so far, or None when the best that
    fits is known: the largest probed value within ``limit`` with the next one over it (or at
    ``max_ngl``, every layer and the output). Steps by the per-layer slope the probes show."""
    fits = [k for k, p in probes.items() if p <= limit]
    over = [k for k, p in probes.items() if p > limit]
    lo, hi = max(fits, default=-1), min(over, default=max_ngl + 1)
    if hi - lo <= 1 or lo >= max_ngl:
        return None
    pts = sorted(probes.items())
    slope = None
    if len(pts) >= 2:
        (k0, p0), (k1, p1) = min(itertools.pairwise(pts),
                                 key=lambda ab: abs(ab[0][0] - lo) + abs(ab[1][0] - hi))
        slope = (p1 - p0) / (k1 - k0) if k1 != k0 and p1 > p0 else None
    if slope is None:  # one probe: halve the open interval
        return (max(lo, 0) + min(hi, max_ngl + 1)) // 2 if lo >= 0 else max(0, hi // 2)
    ref_k, ref_p = (lo, probes[lo]) if lo >= 0 else (hi, probes[hi])
    guess = ref_k + math.floor((limit - ref_p) / slope)
    return min(max(guess, lo + 1), hi - 1)


def best_ngl(probes: dict[int, int], limit: int) -> int | None:
    fits = [k for k, p in probes.items() if p <= limit]
    return max(fits) if fits else None


# --- the table ------------------------------------------------------------------------------------

def _f(x: float | None, fmt: str) -> str:
    return "–" if x is None else format(x, fmt)


def _gap(r: dict[str, Any]) -> str:
    if r.get("gap_max_median_s") is None:
        return "–"
    return f"{r['gap_max_median_s']:.2f} / {r['gap_max_s']:.2f}"


def _ttft(r: dict[str, Any]) -> str:
    if r.get("ttft_median_s") is None:
        return "–"
    return f"{r['ttft_median_s']:.2f} / {r['ttft_p90_s']:.2f} / {r['ttft_max_s']:.2f}"


def _gb(r: dict[str, Any]) -> str:
    peak = (r.get("vram") or {}).get("peak")
    return "–" if peak is None else f"{peak / 1e9:.2f}"


def pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """Each of our rows with the fastest upstream row of the same budget and NPC count."""
    out = []
    for o in (r for r in rows if r["side"] == "ours"):
        peers = [r for r in rows if r["side"] == "upstream" and r["budget"] == o["budget"]
                 and r["n"] == o["n"] and r.get("aggregate_tps")]
        out.append((o, max(peers, key=lambda r: r["aggregate_tps"], default=None)))
    return out


def markdown(rows: list[dict[str, Any]], tokens: int) -> str:
    """Ours beside upstream llama-server --parallel N: aggregate tok/s and their ratio, TTFT
    (median / p90 / max), the whole wall, NVML peaks; every upstream placement tried below."""
    head = ("| budget | NPCs | ours tok/s | llama-server tok/s | ratio | ours TTFT s (med / p90 "
            "/ max) | llama-server TTFT s | longest token gap s, ours (med / max) | "
            "llama-server | ours wall s | llama-server wall s | VRAM peak GB "
            "(ours / llama-server) | llama-server placement |")
    lines = [f"Aggregate decode: every NPC's {tokens} tokens over the wall from the first "
             "request to the last token. Longest token gap: each NPC's longest wait between two "
             "tokens after its first (median over the NPCs / the longest).", "", head,
             "|" + " --- |" * 13]
    for o, u in pairs(rows):
        u = u or {}
        ratio = (o["aggregate_tps"] / u["aggregate_tps"]
                 if o.get("aggregate_tps") and u.get("aggregate_tps") else None)
        lines.append(
            f"| {o['budget']} | {o['n']} | {_f(o.get('aggregate_tps'), '.1f')} | "
            f"{_f(u.get('aggregate_tps'), '.1f')} | {_f(ratio, '.2f')}{'×' if ratio else ''} | "
            f"{_ttft(o)} | {_ttft(u)} | {_gap(o)} | {_gap(u)} | {_f(o.get('wall_s'), '.2f')} | "
            f"{_f(u.get('wall_s'), '.2f')} | {_gb(o)} / {_gb(u)} | {u.get('placement', '–')} |")
    notes = [f"- {r['side']} {r['budget']} N={r['n']} {r.get('placement', '')}: "
             f"{r.get('aggregate_tps')} tok/s, peak {_gb(r)} GB"
             + ("" if r.get("fits_budget", True) else " (over the budget)")
             + (f", {r['short_replies']} replies short of {tokens} tokens"
                if r.get("short_replies") else "")
             + (f"; errors: {'; '.join(r['errors'])[:300]}" if r.get("errors") else "")
             + (f"; {r['status']}" if r.get("status", "ok") != "ok" else "")
             for r in rows]
    return "\n".join([*lines, "", "Every row:", *notes]) + "\n"
