"""The q8_0 KV lever, output-first and the wait policy, from committed results.

Prints the markdown tables of docs/benchmarks.md ("Planner levers at a fixed budget") and draws
its plot, from two H100 runs (``gpu_run.sh OUT peers3`` = run3, ``peers4`` = run4: ours and
upstream llama-bench in the same call) and the local coexistence runs of
``benchmarks/coexist_spin.py``:

    python benchmarks/kv_report.py --plot docs/img/kvq8-peers-h100.png \
        > benchmarks/results/h100-kvq8-table.md
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

RES = Path(__file__).resolve().parent / "results"
GEN = 128

# what each of our rows ran (planner_bench --tag), in the words of the table
OURS = {
    ("run3", "kv-auto"): "igi-sdk, q8_0 KV allowed on CPU-resident layers (the rule before run4)",
    ("run3", "kv-f16"): "igi-sdk, f16 KV only",
    ("run4", "shipped"): "igi-sdk with output-first allowed (run4's default)",
    ("run4", "attn-first-f16"): "igi-sdk, f16 KV, attn-first",
    ("run4", "kv-f16"): "igi-sdk, f16 KV only",
}
# the row that is the planner as committed now (q8_0 KV only with every layer's KV in VRAM,
# output-first off): at 4 GB it is the q8_0 plan (245 tensors, all KV in VRAM), at 2 GB the
# f16 attn-first plan (no q8_0 plan holds every layer's KV within 2 GB)
NOW = {("run3", 4.0): "kv-auto", ("run4", 4.0): "shipped", ("run4", 2.0): "attn-first-f16"}
NOW_LABEL = {"kv-auto": "q8_0 KV, every layer's KV in VRAM", "shipped":
             "q8_0 KV, every layer's KV in VRAM", "attn-first-f16": "f16 KV: no q8_0 plan holds "
             "every layer's KV in 2 GB"}
PEERS = {"fit-expert": "upstream `--fit`, expert",
         "fit-expert-q8kv": "upstream `--fit`, expert + q8_0 KV"}


def load(run: str) -> tuple[list[dict], list[dict]]:
    ours = json.loads((RES / f"h100-kvq8-{run}-planner.json").read_text())
    up = json.loads((RES / f"h100-kvq8-{run}-upstream.json").read_text())
    return ours, [r for r in up if r.get("decode_tps")]


def turn(r: dict) -> float:
    return r["ttft_s"] + GEN / r["decode_tps"]


def rows_for(run: str, budget: float) -> list[dict]:
    ours, up = load(run)
    out = []
    for r in ours:
        if r["budget_gb"] != budget:
            continue
        now = NOW.get((run, budget)) == r["tag"]
        label = OURS.get((run, r["tag"]), r["tag"])
        out.append(dict(
            runner=f"**igi-sdk as committed** ({NOW_LABEL[r['tag']]})" if now else label,
            now=now, peer=None, ttft=r["ttft_s"], tps=r["decode_tps"],
            pred_tps=r.get("pred_decode_tps"), turn=turn(r), peak=r["peak_vram_gb"],
            fits=r["fits_budget"],
            settings=f"`{r['plan']}, n_ubatch {r['n_ubatch']}, {r['gpu_tensors']} GPU tensors, "
                     f"KV {r['type_k']}, KV layers on GPU {r['gpu_layers']}, "
                     f"CPU weights {r['cpu_weight_gb']:.2f} GB`"))
    for r in up:
        if r["budget_gb"] == budget and r["strategy"] in PEERS:
            out.append(dict(runner=PEERS[r["strategy"]], now=False, peer=r["strategy"],
                            ttft=r["ttft_s"], tps=r["decode_tps"], pred_tps=None, turn=turn(r),
                            peak=r["peak_vram_gb"], fits=r["fits_budget"],
                            settings=f"`{r['flags']}`"))
    return out


def table(run: str, budget: float) -> str:
    rows = rows_for(run, budget)
    if not rows:
        return ""
    lines = [f"#### {budget:g} GB budget ({run})", "",
             "| runner | TTFT (1K prompt) | decode tok/s (depth 1K) | predicted tok/s | whole turn "
             "(1K + 128) | NVML peak VRAM | within budget | settings |",
             "| --- | ---: | ---: | ---: | ---: | ---: | :---: | --- |"]
    for r in rows:
        pred = f"{r['pred_tps']:.1f}" if r["pred_tps"] else "—"
        lines.append(f"| {r['runner']} | {r['ttft']:.3f} s | {r['tps']:.1f} | {pred} | "
                     f"{r['turn']:.2f} s | {r['peak']:.2f} GB | {'yes' if r['fits'] else '**no**'} "
                     f"| {r['settings']} |")
    now = next((r for r in rows if r["now"]), None)
    peers = [r for r in rows if r["peer"] and r["fits"]]
    lines.append("")
    if now and peers:
        best = min(peers, key=lambda r: r["turn"])
        for p in sorted(peers, key=lambda r: r["turn"]):
            lines.append(f"- {budget:g} GB, {run}: igi-sdk as committed against {p['runner']}"
                         f"{' (the faster peer here)' if p is best else ''}: whole turn "
                         f"{p['turn'] / now['turn']:.2f}x as fast, TTFT "
                         f"{p['ttft'] / now['ttft']:.2f}x, decode {now['tps'] / p['tps']:.2f}x "
                         "(above 1: igi-sdk leads).")
    return "\n".join(lines) + "\n"


def pairs() -> str:
    """The q8_0 lever on the same machine: ours q8_0 vs ours f16, upstream q8kv vs upstream."""
    lines = ["| run | budget | igi-sdk f16 → q8_0 KV decode | upstream `--fit` expert f16 → q8_0 "
             "KV decode |", "| --- | ---: | --- | --- |"]
    for run in ("run3", "run4"):
        ours, up = load(run)
        for budget in (2.0, 4.0):
            o = {r["tag"]: r for r in ours if r["budget_gb"] == budget}
            u = {r["strategy"]: r for r in up if r["budget_gb"] == budget}
            q8 = next((r for r in o.values() if r["type_k"] == "q8_0"), None)
            f16 = o.get("kv-f16") or o.get("attn-first-f16")
            a = (f"{f16['decode_tps']:.1f} → {q8['decode_tps']:.1f} "
                 f"({q8['decode_tps'] / f16['decode_tps'] - 1:+.0%}; KV layers on GPU "
                 f"{q8['gpu_layers']})" if q8 and f16 else "—")
            b = (f"{u['fit-expert']['decode_tps']:.1f} → {u['fit-expert-q8kv']['decode_tps']:.1f} "
                 f"({u['fit-expert-q8kv']['decode_tps'] / u['fit-expert']['decode_tps'] - 1:+.0%})"
                 if "fit-expert" in u and "fit-expert-q8kv" in u else "—")
            lines.append(f"| {run} | {budget:g} GB | {a} | {b} |")
    return "\n".join(lines) + "\n"


def coexist() -> str:
    rows = json.loads((RES / "local-2cpu-coexist-spin.json").read_text())
    by: dict[str, list[dict]] = {}
    for r in rows:
        by.setdefault(r["setting"], []).append(r)
    lines = ["| setting (2 decode threads on 2 CPUs) | runs | idle tok/s (median of runs) | "
             "busy tok/s | busy / idle | CPUs busy elsewhere |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    names = {"passive": "`OMP_WAIT_POLICY=PASSIVE` (the SDK's default)",
             "libgomp": "libgomp's default (spin ~300,000 rounds)"}
    for s, rs in by.items():
        idle = statistics.median(r["idle_tps"] for r in rs)
        busy = statistics.median(r["busy_tps"] for r in rs)
        el = ", ".join(f"{r['raw']['cpus_used_elsewhere']:.2f}" for r in rs)
        name = names.get(s, f"`GOMP_SPINCOUNT={s.split(':')[1]}`" if ":" in s else s)
        lines.append(f"| {name} | {len(rs)} | {idle:.1f} | {busy:.1f} | "
                     f"{busy / idle if idle else 0:.0%} | {el} |")
    return "\n".join(lines) + "\n"


def plot(path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = [("run3", 4.0), ("run4", 4.0), ("run4", 2.0)]
    fig, ax = plt.subplots(figsize=(8, 4))
    width = 0.27
    series = [("igi-sdk as committed", lambda rs: next((r for r in rs if r["now"]), None)),
              ("upstream --fit expert", lambda rs: next(
                  (r for r in rs if r["peer"] == "fit-expert"), None)),
              ("upstream --fit expert + q8_0 KV", lambda rs: next(
                  (r for r in rs if r["peer"] == "fit-expert-q8kv"), None))]
    for i, (name, pick) in enumerate(series):
        vals = []
        for run, b in cases:
            r = pick(rows_for(run, b))
            vals.append(r["turn"] if r else 0.0)
        ax.bar([x + (i - 1) * width for x in range(len(cases))], vals, width, label=name)
    ax.set_xticks(range(len(cases)), [f"{b:g} GB, {run}" for run, b in cases])
    ax.set_ylabel("whole turn, s (1K prompt + 128 tokens; lower is better)")
    ax.set_title("Llama-3-8B Q4_0 (synthetic), H100: ours vs upstream llama-bench, same run")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--plot", help="write the plot (PNG) here")
    a = ap.parse_args()
    for run, b in (("run4", 2.0), ("run4", 4.0), ("run3", 2.0), ("run3", 4.0)):
        print(table(run, b))
    print("The q8_0 KV lever, same machine, one decode run each:\n")
    print(pairs())
    print("Thread wait policy beside a busy core (this 2-CPU development machine, "
          "`benchmarks/coexist_spin.py`):\n")
    print(coexist())
    if a.plot:
        plot(a.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
