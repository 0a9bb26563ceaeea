"""Plot of speculative_bench.py results: decode tok/s vs forced acceptance, beside the plain plan
and upstream llama-bench --fit (expert) at the same budget.

    python benchmarks/plot_speculative.py --spec a.json b.json --upstream up.json --out fig.png
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after the backend is chosen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", nargs="+", type=Path, required=True)
    ap.add_argument("--upstream", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    upstream = {r["budget_gb"]: r for r in json.loads(args.upstream.read_text())
                if r.get("strategy") == "fit-expert" and r.get("decode_tps")}
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for path, color in zip(args.spec, ("tab:blue", "tab:orange", "tab:green"), strict=False):
        d = json.loads(path.read_text())
        gb = d["budget_gb"]
        rows = {r["name"]: r for r in d["rows"]}
        alphas = sorted(float(n.split("=")[1]) for n in rows if n.startswith("alpha="))
        ax.plot(alphas, [rows[f"alpha={a:.2f}"]["decode_tps"] for a in alphas], "o-",
                color=color, label=f"{gb:g} GB: ours, draft k={d['k']} (forced α)")
        plain = rows.get("plain-whole-budget-again") or rows["plain-whole-budget"]
        ax.axhline(plain["decode_tps"], color=color, ls=":", label=f"{gb:g} GB: ours, no draft")
        if gb in upstream:
            ax.axhline(upstream[gb]["decode_tps"], color=color, ls="--",
                       label=f"{gb:g} GB: upstream --fit, expert")
    ax.set_xlabel("acceptance α (forced)")
    ax.set_ylabel("decode tok/s (depth ~1K)")
    ax.set_title("Llama-3-8B Q4_0 + 0.5B draft, H100: speculative decoding in a VRAM budget")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(args.out, dpi=110)


if __name__ == "__main__":
    main()
