"""Tables (markdown) and plots (PNG) for docs/benchmarks.md from planner_bench.py results.

    python benchmarks/summarize.py benchmarks/results/h200-planner.json docs/img
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path


def _key(r: dict) -> tuple:
    return (r["model"], r["prompt"] // 512, r["ctx"], r["sessions"], r["budget_gb"])


def ratios(rows: list[dict], peer: str) -> list[str]:
    """Markdown rows: ours vs ``peer`` at the same model/case/budget (same run)."""
    out = []
    ours = {(_key(r), r["run"]): r for r in rows if r["strategy"] == "ours"}
    for r in rows:
        if r["strategy"] != peer:
            continue
        o = ours.get((_key(r), r["run"]))
        if o is None:
            continue
        case = f"{o['prompt']}/{o['ctx']}" + (f" ×{o['sessions']}" if o["sessions"] > 1 else "")
        if o["sessions"] > 1:
            cells = (f"— | — | {o['total_tps']:.1f} vs {r['total_tps']:.1f} | "
                     f"**{o['total_tps'] / r['total_tps']:.2f}×**")
        else:
            gain = r["ttft_s"] / o["ttft_s"]
            cells = (f"{o['ttft_s']:.2f} vs {r['ttft_s']:.2f} | **{gain:.2f}×** "
                     f"| {o['decode_tps']:.1f} vs {r['decode_tps']:.1f} | "
                     f"**{o['decode_tps'] / r['decode_tps']:.2f}×**")
        fits = "" if r.get("fits_budget", True) else " (peer over budget)"
        if r.get("peer_slack_gb"):
            fits += f" (retry, target {r['peer_slack_gb']:.2f} GB lower)"
        out.append(f"| {o['run'][8:]} | {o['model']} | {case} | {o['budget_gb']:.0f} GB | "
                   f"{peer} | {cells} | {o['peak_vram_gb']:.2f} / {r['peak_vram_gb']:.2f}{fits} |")
    return out


def errors(rows: list[dict], run: str) -> tuple[float, float, list[str]]:
    et, ed, lines = [], [], []
    for r in rows:
        if not r["run"].startswith(run) or r["sessions"] > 1 or "pred_ttft_s" not in r:
            continue
        e1 = abs(r["pred_ttft_s"] - r["ttft_s"]) / r["ttft_s"]
        e2 = abs(r["pred_decode_tps"] - r["decode_tps"]) / r["decode_tps"]
        et.append(e1)
        ed.append(e2)
        lines.append(f"| {r['model']} | {r['prompt']}/{r['ctx']} | {r['budget_gb']:.0f} | "
                     f"{r['strategy']} | {r['ttft_s']:.2f} | {r['pred_ttft_s']:.2f} | {e1:.0%} | "
                     f"{r['decode_tps']:.1f} | {r['pred_decode_tps']:.1f} | {e2:.0%} |")
    return statistics.median(et), statistics.median(ed), lines


def plots(rows: list[dict], outdir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    made = []
    for model, prompt, run in (("llama3-8b", 1004, "profile-v4"), ("minitron-8b", 1004,
                                                                    "profile-v4"),
                               ("qwen3-30b-a3b", 1004, "profile-v6b")):
        sel = [r for r in rows if r["model"] == model and r["prompt"] == prompt
               and r["run"] == run and r["sessions"] == 1 and r["budget_gb"] > 0]
        if not sel:
            continue
        fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
        for strat in sorted({r["strategy"] for r in sel}):
            pts = sorted((r["budget_gb"], r["ttft_s"], r["decode_tps"]) for r in sel
                         if r["strategy"] == strat)
            xs = [p[0] for p in pts]
            axes[0].plot(xs, [p[1] for p in pts], marker="o", label=strat)
            axes[1].plot(xs, [p[2] for p in pts], marker="o", label=strat)
        axes[0].set(title=f"{model}: TTFT, {prompt}-token prompt", xlabel="VRAM budget (GB)",
                    ylabel="seconds (lower is better)", yscale="log")
        axes[1].set(title=f"{model}: decode", xlabel="VRAM budget (GB)",
                    ylabel="tokens/s (higher is better)", yscale="log")
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.legend()
        fig.tight_layout()
        path = outdir / f"planner-{model}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        made.append(path)
    return made


def main() -> int:
    rows = json.loads(Path(sys.argv[1]).read_text())
    outdir = Path(sys.argv[2]) if len(sys.argv) > 2 else Path("docs/img")
    for peer in ("P0", "P1", "P2"):
        print(f"\n### ours vs {peer}\n")
        print("| run | model | prompt/ctx | budget | peer | TTFT s ours vs peer | TTFT gain | "
              "decode tok/s ours vs peer | decode gain | peak VRAM GB ours / peer |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(ratios(rows, peer)))
    for run in ("profile-v6", "profile-v5", "profile-v4", "profile-v3", "profile-v2", "profile-v1"):
        mt, md, lines = errors(rows, run)
        print(f"\n### cost model, {run}: median error TTFT {mt:.0%}, decode {md:.0%}\n")
        print("| model | prompt/ctx | budget GB | strategy | TTFT s | predicted | error | "
              "decode tok/s | predicted | error |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        print("\n".join(lines))
    for p in plots(rows, outdir):
        print(f"\nplot: {p}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
