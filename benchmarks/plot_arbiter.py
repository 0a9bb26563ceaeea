"""Plot an arbiter benchmark run: the model's VRAM plan against the game's budget over time,
with each reshard's duration, and the frame times of the render stand-in.

    python benchmarks/plot_arbiter.py RUN.json OUT.png [FRAMES.json]

FRAMES.json: an ``arbiter_bench.py --only frames`` run, for the frame-time panel.
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


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
