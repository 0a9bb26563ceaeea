"""Plot frame-game runs (benchmarks/frame_game.py): VRAM over time (the game's, the model's, the
arbiter's budget) and every NPC token (a tick each, a row per NPC), reshards marked.

    python benchmarks/plot_frame_game.py OUT.png RUN.json [AFTER.json] [--mode nvml]
    python benchmarks/plot_frame_game.py --handoff OUT.png RUN.json --mode nvml

One column per run: the runs of RUN.json, then AFTER.json's (before/after a change), each
titled with its starved frames, longest allocation wait and NPCs' longest silence.
``--handoff``: one run as one picture (the README's): the pool, filled by the game and the
model as measured, the model giving VRAM to the game's level loads and taking it back, and the
NPC's tokens under it.
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


def _steps(series: list[tuple[float, float]], grid: list[float]) -> list[float]:
    """``series`` (time, value), sorted, read at each time of ``grid``: the last value at or
    before it (the first value before the series starts)."""
    out, i = [], 0
    for t in grid:
        while i + 1 < len(series) and series[i + 1][0] <= t:
            i += 1
        out.append(series[i][1])
    return out


def plot_handoff(path: str, out: str, mode: str | None = None,
                 start_s: float = -2.0) -> int:
    """One run as one picture: the game's and the model's VRAM (measured: the game's own
    allocations, the sidecar's NVML per-process use) stacked in the pool they share, and every
    token of the NPCs below, from ``start_s`` (seconds from the menu) on."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = runs_of([path], mode)
    if not runs:
        print("no runs to plot", file=sys.stderr)
        return 1
    _, run = runs[0]
    raw = Path(path).read_bytes()
    if path.endswith(".gz"):
        raw = gzip.decompress(raw)
    pool = json.loads(raw)["config"]["pool_gib"]
    s, series = run["summary"], run["series"]
    game = [(t, b / GIB) for t, b in series["game_vram"] if t >= start_s - 1]
    cols = series["model_vram"]["columns"]
    i_model = cols.index("model")
    model = [(r[0], r[i_model] / GIB) for r in series["model_vram"]["rows"]
             if r[0] >= start_s - 1 and r[i_model] is not None]
    end = min(game[-1][0], model[-1][0])
    grid = [start_s + k * 0.02 for k in range(int((end - start_s) / 0.02) + 1)]
    g, m = _steps(game, grid), _steps(model, grid)

    fig, (ax, bx) = plt.subplots(2, 1, figsize=(9, 4.6), sharex=True,
                                 gridspec_kw={"height_ratios": [4, 1]})
    ax.fill_between(grid, 0, g, color="tab:orange", alpha=0.85, lw=0,
                    label="game (its allocations)")
    top = [a + b for a, b in zip(g, m, strict=True)]
    ax.fill_between(grid, g, top, color="tab:blue", alpha=0.85, lw=0,
                    label="model (the sidecar's VRAM, NVML)")
    ax.axhline(pool, color="black", ls="--", lw=1)
    ax.annotate(f"the {pool:.0f} GiB the game and the model share", (grid[0] + 0.3, pool + 0.25),
                fontsize=8)
    box = {"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85}
    for ph in run.get("phases") or []:
        if ph["t0"] < start_s:
            continue
        if ph.get("kind") == "load":
            ax.annotate("level loads: the model\ngives way", (ph["t0"] + 0.2, 9.9),
                        fontsize=8, va="top", bbox=box)
        elif ph.get("kind") == "unloaded":
            ax.annotate("level unloaded: the\nmodel takes it back", (ph["t0"] + 0.2, 9.9),
                        fontsize=8, va="top", bbox=box)
        if ph.get("kind") in ("load", "unloaded"):
            ax.axvline(ph["t0"], color="gray", ls=":", lw=0.8)
    ax.set_ylim(0, pool * 1.12)
    ax.set_ylabel("GiB of VRAM")
    ax.legend(loc="lower left", fontsize=8, framealpha=0.9)
    npcs = s.get("npcs") or {}
    silence = max((x["longest_silence_s"] or 0 for x in npcs.values()), default=0)
    ax.set_title(f"An 8B model beside a 60 Hz game on one GPU (H200): "
                 f"{s.get('starved_frames')} starved frames, the game waited at most "
                 f"{(s.get('longest_alloc_wait_s') or 0) * 1000:.0f} ms for memory,\n"
                 f"{s.get('reshards')} re-placements of the model, the NPC's longest silence "
                 f"{silence:.2f} s", fontsize=9)
    toks = series.get("npc_tokens") or {}
    names = sorted(toks, key=int)
    bx.eventplot([[t for t in toks[n] if start_s <= t <= end] for n in names],
                 lineoffsets=list(range(len(names))), linelengths=0.8, linewidths=0.5,
                 colors="tab:blue")
    bx.set_yticks(list(range(len(names))), [f"NPC {n}" for n in names] if len(names) > 1
                  else ["NPC"])
    bx.set_title("the NPC talking through it: a tick per token", fontsize=8)
    bx.set_xlabel("seconds")
    bx.set_xlim(start_s, end)
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
    ap.add_argument("--handoff", action="store_true",
                    help="the first run of RUN.json as one picture (the README's)")
    a = ap.parse_args(argv)
    if a.handoff:
        return plot_handoff(a.runs[0], a.out, a.mode)
    return plot(a.runs, a.out, a.mode)


if __name__ == "__main__":
    sys.exit(main())
