"""Plot of vlm_bench.py results: each configuration's NVML peak against the budget, and its
end-to-end latency, per image size.

    python benchmarks/plot_vlm.py --json vlm.json --out fig.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen

SIZES = ("480p", "720p", "1080p", "1440p")
CONFIGS = {"ours": "tab:blue", "ours-reserved": "tab:cyan", "ours-borrowed": "tab:purple",
           "naive": "tab:red", "upstream-defaults": "tab:gray", "paper-baseline": "tab:orange"}


def _as_asked(r: dict) -> bool:
    """False for a row of a forced mode (``ours-borrowed``) that ran another one."""
    forced = r["config"].partition("ours-")[2]
    return not forced or r.get("mode") == forced


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    rows = [json.loads(line) for line in args.json.read_text().splitlines() if line.strip()]
    budgets = sorted({r["budget_gb"] for r in rows})
    fig, axes = plt.subplots(2, len(budgets), figsize=(4 * len(budgets), 6), sharex=True)
    for col, budget in enumerate(budgets):
        for config, color in CONFIGS.items():
            got = {r["res"]: r for r in rows if r["budget_gb"] == budget and r["config"] == config
                   and r.get("ran") and _as_asked(r)}
            xs = [i for i, s in enumerate(SIZES) if s in got]
            axes[0][col].plot(xs, [got[SIZES[i]]["peak_vram_mib"] / 1024 for i in xs], "o-",
                              color=color, label=config)
            axes[1][col].plot(xs, [got[SIZES[i]]["e2e_s"] for i in xs], "o-", color=color,
                              label=config)
        axes[0][col].axhline(budget, color="black", ls="--", lw=1, label="budget")
        axes[0][col].set_title(f"budget {budget:g} GiB")
        axes[1][col].set_xticks(range(len(SIZES)), SIZES)
    axes[0][0].set_ylabel("NVML peak (GiB)")
    tokens = max((r.get("completion_tokens", 0) for r in rows), default=0)
    axes[1][0].set_ylabel(f"end to end, {tokens} tokens (s)")
    for ax in axes[1]:
        ax.set_yscale("log")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Synthetic Qwen2.5-VL-7B (Q4_0 LM, F16 tower), one image, H100", fontsize=10)
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
