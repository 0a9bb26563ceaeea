"""Plot an arbiter benchmark run: the model's VRAM plan against the game's budget over time,
with each reshard's duration, and the frame times of the render stand-in.

    python benchmarks/plot_arbiter.py RUN.json OUT.png [FRAMES.json]

FRAMES.json: an ``arbiter_bench.py --only frames`` run, for the frame-time panel.
RUN.json from ``arbiter_bench.py --only greedy`` gives the greedy game's plot instead: the model's
VRAM and the game's over time, with the reshards, and the control messages' round trips.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

GB = 1e9


def main(src: str, out: str, frames_src: str | None = None) -> int:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run = json.loads(Path(src).read_text())
    if "model_vram_timeline" in run.get("summary", {}):
        return plot_greedy(run["summary"], out, plt)
    events, decisions = run["events"], run["stats"]["arbiter"]["decisions"]
    s = run["summary"]
    t0 = next(e["t"] for e in events if e["event"] == "menu")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [2, 1]})

    # the model's budget, phase by phase (what the game leaves it), and the plan it runs
    budgets = [(e["t"] - t0, e["budget"]) for e in events if "budget" in e]
    reserve = next((e for e in events if e["event"] == "reserve_vram"), None)
    if reserve:
        menu = next(e["budget"] for e in events if e["event"] == "menu")
        budgets.append((reserve["t"] - t0, menu - reserve["bytes"]))
    budgets.sort()
    end = max(e["t"] for e in events) - t0  # the budget is known up to the last event
    xs, ys = [], []
    for i, (t, b) in enumerate(budgets):
        xs += [t, budgets[i + 1][0] if i + 1 < len(budgets) else end]
        ys += [b / GB, b / GB]
    ax.plot(xs, ys, color="tab:orange", label="model budget (pool − game − headroom)")
    px, py = [0.0], [None]
    for d in sorted(decisions, key=lambda d: d["at"]):
        start = d["at"] - d["seconds"] - t0
        ax.axvspan(start, d["at"] - t0, color="tab:red", alpha=0.15)
        px.append(d["at"] - t0)
        py.append(d["vram"] / GB)
    py[0] = py[1]
    ax.step(px, py, where="post", color="tab:blue", label="model's plan (planned VRAM)")
    for e in events:
        if e["event"] in ("level load: game grows", "gameplay: game frees", "reserve_vram"):
            ax.annotate(e["event"].split(":")[0], (e["t"] - t0, 6.3), fontsize=8)
    ax.set_xlabel("seconds since the menu")
    ax.set_ylabel("GB")
    ax.set_ylim(0, 7)
    ax.set_title("8B Q4_0 beside a game on an H200 (8 GB shared pool); red: reshards")
    ax.legend(loc="lower right", fontsize=8)

    names = ["frames: idle", "frames: chatting, unpaced", "frames: chatting, paced"]
    table = json.loads(Path(frames_src).read_text())["frames"] if frames_src else s["frames"]
    frames = [table[n] for n in names if n in table]
    labels = [n.split(": ")[1] for n in names if n in table]
    x = range(len(frames))
    bx.bar([i - 0.2 for i in x], [f["frame_p50_ms"] for f in frames], 0.4, label="p50")
    bx.bar([i + 0.2 for i in x], [f["frame_p99_ms"] for f in frames], 0.4, label="p99")
    bx.axhline(1000 / 60, color="gray", ls="--", lw=1)
    bx.set_xticks(list(x), labels)
    bx.set_ylabel("frame time, ms (GPU-bound render stand-in)")
    bx.set_title("frame times" + (" (paced: the model yields)" if frames_src else ""))
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


def plot_greedy(s: dict, out: str, plt) -> int:
    """The greedy game: the model's VRAM (measured, and its plan's) and the game's, over time."""
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.2), gridspec_kw={"width_ratios": [2, 1]})
    rows = [r for r in s["model_vram_timeline"] if r[0] is not None]
    t = [r[0] for r in rows]
    for col, label, color in ((1, f"model VRAM ({s.get('model_vram_source')})", "tab:blue"),
                              (3, "model's plan (planned VRAM)", "tab:cyan"),
                              (4, "game (its allocations in the pool)", "tab:orange")):
        ax.plot(t, [r[col] / GB if r[col] is not None else None for r in rows], label=label,
                color=color, lw=1.2)
    for d in s.get("reshards") or []:
        if d.get("t_s") is not None and d.get("seconds"):
            ax.axvspan(d["t_s"] - d["seconds"], d["t_s"], color="tab:red", alpha=0.15)
    ax.set_ylim(bottom=0)
    for name, x in (s.get("marks_s") or {}).items():
        ax.axvline(x, color="gray", ls=":", lw=1)
        ax.annotate(name.replace("_", " "), (x, ax.get_ylim()[1] * 0.95), fontsize=7,
                    rotation=90, va="top")
    cfg = s.get("config") or {}
    g = s.get("game") or {}
    ax.set_xlabel("seconds since the game turned greedy")
    ax.set_ylabel("GB")
    ax.set_title(f"greedy game, {cfg.get('pool', 0) / GB:.1f} GB pool: "
                 f"{g.get('failed_allocations')} failed allocations, longest stall "
                 f"{g.get('longest_stall_s') or 0:.2f} s; red: reshards", fontsize=9)
    ax.legend(loc="center right", fontsize=8)
    lat = s.get("control_latency_ms") or {}
    names = sorted(lat)
    x = range(len(names))
    for i, (key, label) in enumerate((("p50_ms", "p50"), ("p99_ms", "p99"), ("max_ms", "max"))):
        bx.bar([j + (i - 1) * 0.27 for j in x], [lat[n][key] or 0 for n in names], 0.27,
               label=label)
    bx.set_xticks(list(x), names)
    bx.set_ylabel("round trip, ms")
    bx.set_title("control messages during the run", fontsize=9)
    bx.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
