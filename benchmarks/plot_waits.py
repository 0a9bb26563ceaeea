"""Plot of the thread-wait rows (``gpu_run.sh shipped`` with ``SHIPPED_SPIN=1 SPINS=...``,
``busy``, and ``busy`` with ``BUSY_GAME``): each wait's whole turn against expert ``--fit`` on an
idle host, its decode against the best fixed policy beside busy CPUs, and what it cost a game's
frame loop.

    python benchmarks/plot_waits.py --results benchmarks/results --date 2026-11-28 \\
        --out docs/img/waits-h200.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen

GEN = 128  # tokens of a turn after its 1K prompt (planner_bench and upstream_peers alike)
WAITS = {"passive": ("PASSIVE (old default)", "tab:red"),
         "spin20000": ("spin 20000", "tab:orange"),
         "spin300000": ("spin 300000 (default)", "tab:blue")}


def _wait(row: dict) -> str | None:
    """The wait a row ran with, as its engine reported it (``threads.setting``, e.g.
    ``2xspin300000``); None for a fixed policy's row and for the build without OpenMP."""
    t = row.get("threads") or {}
    if "fixed" in row.get("tag", "") or t.get("mechanism") != "openmp":
        return None
    wait = str(t.get("setting", "")).partition("x")[2]
    return wait if wait in WAITS else None


def idle_ratios(results: Path, date: str) -> list[tuple[str, str, float]]:
    """(case, wait, the peer's whole turn ÷ ours) per idle row with an expert peer."""
    out = []
    for planner in sorted(results.glob(f"h200-shipped-{date}-*-planner.json")):
        machine = planner.name.split(f"{date}-")[1].split("-")[0]
        peers_file = planner.with_name(planner.name.replace("-planner", "-peers"))
        peers = json.loads(peers_file.read_text()) if peers_file.exists() else []
        for r in json.loads(planner.read_text()):
            wait = _wait(r)
            peer = [p for p in peers if p.get("turn_s") and p["model"] == r["model"]
                    and p["budget_gb"] == r["budget_gb"]]
            if wait is None or not peer or not r.get("decode_tps"):
                continue
            turn = r["ttft_s"] + GEN / r["decode_tps"]
            model = "MoE" if "a3b" in r["model"] else "8B"
            out.append((f"{model} {r['budget_gb']:.0f} GB\n{machine}", wait,
                        min(p["turn_s"] for p in peer) / turn))
    return out


def busy_ratios(results: Path, date: str) -> list[tuple[str, str, float]]:
    """(machine, wait, decode ÷ the best fixed policy's) per busy row."""
    out = []
    for f in sorted(results.glob(f"h200-busy-{date}-*-planner.json")):
        machine = f.name.split(f"{date}-")[1].split("-")[0]
        rows = json.loads(f.read_text())
        fixed = [r["decode_tps"] for r in rows if "fixed" in r.get("tag", "")]
        if not fixed:
            continue
        for r in rows:
            wait = _wait(r)
            if wait is not None:
                out.append((machine, wait, r["decode_tps"] / max(fixed)))
    return out


def game_rows(results: Path, date: str) -> list[tuple[str, str, float, float]]:
    """(machine, wait, decode tok/s, the game's late share in %) per row beside the game."""
    out = []
    for f in sorted(results.glob(f"h200-game-frames-{date}-*.json")):
        machine = f.stem.rsplit("-", 1)[1]
        d = json.loads(f.read_text())
        for r in d["planner"]:
            wait = _wait(r)
            frames = d["frames"].get(r["tag"])
            if wait is not None and frames:
                out.append((machine, wait, r["decode_tps"], 100 * frames["late_share"]))
    return out


def _bars(ax, rows: list[tuple], value: int, ylabel: str, ref: float | None) -> None:
    cases = list(dict.fromkeys(r[0] for r in rows))
    width = 0.8 / len(WAITS)
    for i, (wait, (label, color)) in enumerate(WAITS.items()):
        xs, ys = [], []
        for j, case in enumerate(cases):
            got = [r[value] for r in rows if r[0] == case and r[1] == wait]
            if got:
                xs.append(j + (i - 1) * width)
                ys.append(got[0])
        if xs:
            ax.bar(xs, ys, width, label=label, color=color)
    if ref is not None:
        ax.axhline(ref, color="black", lw=0.8, ls="--")
    ax.set_xticks(range(len(cases)), cases, fontsize=7)
    ax.set_ylabel(ylabel, fontsize=8)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=Path("benchmarks/results"))
    ap.add_argument("--date", default="2026-11-28")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    idle, busy = idle_ratios(args.results, args.date), busy_ratios(args.results, args.date)
    game = game_rows(args.results, args.date)
    fig, axes = plt.subplots(1, 4, figsize=(17, 4), gridspec_kw={"width_ratios": [3, 2, 1, 1]})
    _bars(axes[0], idle, 2, "whole turn speed ÷ expert --fit (idle)", 1.0)
    axes[0].set_title("idle host", fontsize=9)
    _bars(axes[1], busy, 2, "decode ÷ best fixed policy", 0.9)
    axes[1].set_title("14 of 16 CPUs busy (MoE 4 GB)", fontsize=9)
    _bars(axes[2], game, 2, "decode tok/s", None)
    axes[2].set_title("beside a game's frame loop", fontsize=9)
    _bars(axes[3], game, 3, "game frames late (%)", None)
    axes[3].set_title("the game's frames", fontsize=9)
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle(f"Thread waits on H200 hosts ({args.date}), one run per bar", fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}: {len(idle)} idle, {len(busy)} busy, {len(game)} game rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
