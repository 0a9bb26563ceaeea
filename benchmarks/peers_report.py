"""Tables and a plot of ours vs the upstream llama.cpp peers.

Reads planner_bench rows (ours) and upstream_peers rows of the same runs (a ``run`` field in
each) and prints, per run and budget, a markdown table: TTFT, decode tok/s, whole turn (TTFT +
GEN / decode), NVML peak VRAM, whether the budget held, the flags; then ours against the
strongest peer that kept the budget (the one with the shortest whole turn). Writes a plot.

    python benchmarks/peers_report.py --planner benchmarks/results/h100-peers-planner.json \
        --peers benchmarks/results/h100-peers-upstream.json --run run2 \
        --plot docs/img/peers-llama3-8b-h100.png > benchmarks/results/h100-peers-table.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

GEN = 128
NAMES = {"ours": "**igi-sdk** (planner, as shipped)", "fit-expert": "upstream `--fit`, expert",
         "fit-default": "upstream `--fit`, defaults", "ngl-best": "upstream best `-ngl`"}


def rows_for(planner: list[dict], peers: list[dict], run: str, budget: float) -> list[dict]:
    out = []
    for r in planner:
        if (r["run"] == run and r["strategy"] == "ours" and r["budget_gb"] == budget
                and r.get("tag") == "ctx2048" and r.get("sessions", 1) == 1):
            out.append({"who": "ours", "ttft": r["ttft_s"], "tps": r["decode_tps"],
                        "peak": r["peak_vram_gb"], "fits": r["fits_budget"],
                        "flags": f"{r['plan']}, n_ubatch {r['n_ubatch']}, n_ctx {r['ctx']}, "
                                 f"{r['gpu_tensors']} GPU tensors"})
    for r in planner:
        if (r["run"] == run and r["strategy"] == "ours" and r["budget_gb"] == budget
                and r.get("tag") == "omp-active"):
            out.append({"who": "ours-active", "ttft": r["ttft_s"], "tps": r["decode_tps"],
                        "peak": r["peak_vram_gb"], "fits": r["fits_budget"],
                        "flags": "same plan, OMP_WAIT_POLICY=ACTIVE (upstream's default)"})
    for r in peers:
        if r["run"] != run or r["budget_gb"] != budget or r.get("decode_tps") is None:
            continue
        who = r["strategy"] if not r.get("tag") else f"{r['strategy']} ({r['tag']})"
        env = " ".join(f"{k}={v}" for k, v in (r.get("env") or {}).items())
        out.append({"who": who, "ttft": r["ttft_s"], "tps": r["decode_tps"],
                    "peak": r["peak_vram_gb"], "fits": r["fits_budget"],
                    "flags": (env + " " if env else "") + r["flags"]})
    for x in out:
        x["turn"] = round(x["ttft"] + GEN / x["tps"], 3)
    return out


def table(rows: list[dict], budget: float) -> str:
    lines = ["| runner | TTFT (1K prompt) | decode tok/s (depth 1K) | whole turn (1K + 128) | "
             "NVML peak VRAM | within budget | settings |",
             "| --- | ---: | ---: | ---: | ---: | :---: | --- |"]
    for x in rows:
        name = NAMES.get(x["who"], x["who"].replace("ours-active", "igi-sdk, spinning threads"))
        lines.append(f"| {name} | {x['ttft']:.3f} s | {x['tps']:.1f} | {x['turn']:.2f} s | "
                     f"{x['peak']:.2f} GB | {'yes' if x['fits'] else '**no**'} | "
                     f"`{x['flags']}` |")
    ours = next((x for x in rows if x["who"] == "ours"), None)
    peers = [x for x in rows if x["who"] in ("fit-expert", "fit-default", "ngl-best")
             and x["fits"]]
    if ours and peers:
        lines.append("")
        best = min(peers, key=lambda x: x["turn"])
        expert = next((x for x in peers if x["who"] == "fit-expert"), None)
        for label, x in (("upstream `--fit` expert", expert),
                         ("the peer with the shortest whole turn", best)):
            if x is None:
                continue
            lines.append(
                f"- {budget:.0f} GB, against {label} ({NAMES[x['who']]}): igi-sdk's whole turn "
                f"{x['turn'] / ours['turn']:.2f}x as fast, TTFT {x['ttft'] / ours['ttft']:.2f}x, "
                f"decode {ours['tps'] / x['tps']:.2f}x (above 1: igi-sdk leads).")
    return "\n".join(lines)


def ctx_table(planner: list[dict], budget: float = 4.0) -> str:
    """Ours at n_ctx 2048 and 4096, and each plan run at the other context (``--plan-ctx``)."""
    tags = ("ctx2048", "ctx4096", "plan4096-at-2048", "plan2048-at-4096")
    lines = ["| run | plan made for | run at n_ctx | CPU-resident weights | KV (GPU) | "
             "decode tok/s | TTFT |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in planner:
        if r["budget_gb"] == budget and r.get("tag") in tags and r["strategy"] == "ours":
            lines.append(f"| {r['run']} | n_ctx {r['plan_ctx']} | {r['ctx']} | "
                         f"{r['cpu_weight_gb']:.3f} GB | {r['memory_mib']['gpu']['kv']} MiB | "
                         f"{r['decode_tps']:.1f} | {r['ttft_s']:.3f} s |")
    return "\n".join(lines)


def plot(per_budget: dict[float, list[dict]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    order = ["ours", "fit-expert", "fit-default", "ngl-best"]
    colors = {"ours": "#1f77b4", "fit-expert": "#d62728", "fit-default": "#ff7f0e",
              "ngl-best": "#7f7f7f"}
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    budgets = sorted(per_budget)
    width = 0.8 / len(order)
    for ax, key, label in zip(axes, ("ttft", "tps", "turn"),
                              ("TTFT, 1K prompt (s)", "decode tok/s at depth 1K",
                               "whole turn, 1K + 128 tokens (s)"), strict=True):
        for i, who in enumerate(order):
            xs, ys = [], []
            for j, b in enumerate(budgets):
                x = next((r for r in per_budget[b] if r["who"] == who and r["fits"]), None)
                if x:
                    xs.append(j + (i - 1.5) * width)
                    ys.append(x[key])
            ax.bar(xs, ys, width, label=NAMES[who].replace("**", ""), color=colors[who])
        ax.set_xticks(range(len(budgets)), [f"{b:.0f} GB" for b in budgets])
        ax.set_title(label, fontsize=10)
        if key == "tps":
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--planner", required=True)
    ap.add_argument("--peers", required=True)
    ap.add_argument("--run", default="run2")
    ap.add_argument("--budgets", default="2,4,8")
    ap.add_argument("--plot")
    ap.add_argument("--ctx-table", action="store_true",
                    help="print only the n_ctx 2048/4096 same-placement table (4 GB, all runs)")
    ap.add_argument("--title", default="Llama-3-8B Q4_0 (synthetic), same VRAM budget")
    args = ap.parse_args()
    planner = json.loads(Path(args.planner).read_text())
    peers = json.loads(Path(args.peers).read_text())
    if args.ctx_table:
        print(ctx_table(planner))
        return 0
    per_budget = {}
    for b in (float(x) for x in args.budgets.split(",")):
        rows = rows_for(planner, peers, args.run, b)
        if not rows:
            continue
        per_budget[b] = rows
        print(f"\n#### {b:.0f} GB budget ({args.run})\n")
        print(table(rows, b))
    if args.plot and per_budget:
        plot(per_budget, args.plot, args.title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
