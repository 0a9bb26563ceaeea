"""Plot frame-game runs (benchmarks/frame_game.py): VRAM over time (the game's, the model's, the
arbiter's budget) and every NPC token (a tick each, a row per NPC), reshards marked.

    python benchmarks/plot_frame_game.py OUT.png RUN.json [AFTER.json] [--mode nvml]

One column per run: the runs of RUN.json, then AFTER.json's (before/after a change), each
titled with its starved frames, longest allocation wait and NPCs' longest silence.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path
from typing import Any

GIB = 1024**3


def runs_of(paths: list[str], mode: str | None) -> list[tuple[str, dict[str, Any]]]:
    out = []
    for p in paths:
        raw = Path(p).read_bytes()
        data = json.loads(gzip.decompress(raw) if p.endswith(".gz") else raw)
        for run in data.get("runs") or []:
            if mode is None or run.get("mode") == mode:
                args = (run.get("summary") or {}).get("serve_args") or ""
                how = "serve " + args if args else "as shipped"
                out.append((f"{run.get('mode')}, {how}", run))
    return out


def plot(paths: list[str], out: str, mode: str | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = runs_of(paths, mode)
    if not runs:
        print("no runs to plot", file=sys.stderr)
        return 1
    fig, axes = plt.subplots(2, len(runs), figsize=(6.5 * len(runs), 6.4), squeeze=False,
                             sharex="col", gridspec_kw={"height_ratios": [2, 1]})
    for col, (label, run) in enumerate(runs):
        ax, bx = axes[0][col], axes[1][col]
        s, series = run["summary"], run["series"]
        game = series.get("game_vram") or []
        ax.plot([r[0] for r in game], [r[1] / GIB for r in game], color="tab:orange", lw=1.2,
                label="game (its allocations in the pool)")
        rows = series["model_vram"]["rows"]
        cols = series["model_vram"]["columns"]
        t = [r[0] for r in rows]
        for key, name, color, style in (
                ("model", f"model ({s.get('model_vram_source')})", "tab:blue", "-"),
                ("plan_vram", "model's plan", "tab:cyan", "--"),
                ("budget", "arbiter's budget", "tab:green", ":")):
            i = cols.index(key)
            ax.plot(t, [r[i] / GIB if r[i] is not None else None for r in rows], color=color,
                    ls=style, lw=1.1, label=name)
        for d in series.get("decisions") or []:
            start, end = d["t"], d["t"] + (d.get("seconds") or 0.0)
            for x in (ax, bx):
                x.axvspan(start, end, color="tab:red" if d.get("failures") else "tab:purple",
                          alpha=0.15, lw=0)
            ax.annotate(str(d.get("action")), (start, 0), fontsize=6, rotation=90, va="bottom",
                        color="tab:purple")
        for ph in run.get("phases") or []:
            if ph.get("kind") in ("load", "unloaded"):
                ax.axvline(ph["t0"], color="gray", ls=":", lw=0.8)
        # the scale of the game and the model (the budget reads the whole card until the
        # ballast that makes the pool is in place)
        peak = max([r[1] for r in game] + [r[cols.index("model")] or 0 for r in rows] + [1])
        ax.set_ylim(0, 1.35 * peak / GIB)
        ax.set_ylabel("GiB")
        ax.legend(loc="upper right", fontsize=7)
        npcs = s.get("npcs") or {}
        silence = max((x["longest_silence_s"] or 0 for x in npcs.values()), default=0)
        wait = s.get("longest_alloc_wait_s")
        ax.set_title(f"{label}: {s.get('starved_frames')} starved frames, longest allocation "
                     f"wait {wait or 0:.2f} s,\n{s.get('reshards')} reshards, "
                     f"{s.get('failed_loads')} failed loads; NPCs' longest silence "
                     f"{silence:.2f} s", fontsize=9)
        toks = series.get("npc_tokens") or {}
        names = sorted(toks, key=int)
        bx.eventplot([toks[n] for n in names], lineoffsets=list(range(len(names))),
                     linelengths=0.8, linewidths=0.6, colors="tab:blue")
        bx.set_yticks(list(range(len(names))), [f"NPC {n}" for n in names])
        bx.set_xlabel("seconds from the menu's start (purple: reshards, red: with failures)")
        bx.set_title("tokens (a tick each): white is an NPC falling silent", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("out", help="PNG to write (docs/img/...)")
    ap.add_argument("runs", nargs="+", help="one or two frame_game.py JSONs (before, after)")
    ap.add_argument("--mode", help="only this mode's runs")
    a = ap.parse_args(argv)
    return plot(a.runs, a.out, a.mode)


if __name__ == "__main__":
    sys.exit(main())
