"""The cost model against measurements: predicted vs measured TTFT and decode for saved plans.

For every planner_bench row that ran a saved plan (``--save-plan``; the plan files beside the
results), the current cost model prices the same plan with the profile the run planned with
and compares with what was measured. ``--stream-probe`` (a ``stream_probe.py`` JSON with two
sizes) replaces the profile's copy-compute rate by the marginal rate the profile now measures
(``igi_sdk.tuning.measure.stream_rate``), for profiles taken before it did. The prediction the
run itself printed (the cost model of that day) is kept beside it.

    python benchmarks/cost_model_check.py --results benchmarks/results/h100-peers-planner.json \
        --plans benchmarks/results/h100-plans --profile benchmarks/results/h100-profile-peers.json \
        --stream-probe benchmarks/results/h100-stream-probe.json \
        --json benchmarks/results/h100-cost-check.json

Needs no GPU: the model's inventory is read from a synthetic file's header (no weights).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


def synthetic_inventory(preset: str):
    """The inventory of a synthetic preset without writing its weights (a sparse file)."""
    from igi_sdk.model import read_inventory, write_synthetic_gguf

    tmp = Path(tempfile.mkdtemp(prefix="igi-inv-")) / f"{preset}.gguf"
    write_synthetic_gguf(tmp, preset, data=False)  # the header; the data a hole
    inv = read_inventory(tmp)
    tmp.unlink()
    return inv


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", required=True, help="planner_bench JSON (rows with 'run')")
    ap.add_argument("--plans", required=True, help="folder of {run}-{strategy}-{budget}-{ctx}.json")
    ap.add_argument("--profile", required=True)
    ap.add_argument("--stream-probe", help="stream_probe.py JSON: the marginal copy rate")
    ap.add_argument("--json")
    args = ap.parse_args(argv)

    from igi_sdk.planner import Plan
    from igi_sdk.planner.cost import decode_tps, ttft_seconds
    from igi_sdk.profile import Profile

    prof = Profile.load(Path(args.profile))
    if args.stream_probe:
        from igi_sdk.runtime.step_bench import CopyComputeRun
        from igi_sdk.tuning.measure import stream_rate

        runs = sorted((CopyComputeRun(r["seconds"], r["tokens"], r["weight_bytes"], r["n_layers"])
                       for r in json.loads(Path(args.stream_probe).read_text())),
                      key=lambda r: r.n_layers)
        before = prof.stream_pinned_bps
        prof.stream_pinned_bps = stream_rate(prof, runs[-1], runs[0])
        print(f"copy-compute rate (pinned): profile {before / 1e9:.1f} GB/s -> marginal "
              f"{prof.stream_pinned_bps / 1e9:.1f} GB/s ({runs[0].n_layers} vs "
              f"{runs[-1].n_layers} layers)")
    invs: dict[str, object] = {}
    out = []
    for r in json.loads(Path(args.results).read_text()):
        if r.get("sessions", 1) != 1 or r["strategy"] != "ours":
            continue
        name = r.get("plan_file") or (f"{r['strategy']}-{r['budget_gb']}-"
                                      f"{r.get('plan_ctx') or r['ctx']}.json")
        path = Path(args.plans) / f"{r['run']}-{name}"
        if not path.exists():
            continue
        plan = Plan.load(path)
        if len(plan.gpu_tensors) != r["gpu_tensors"]:
            continue  # not the plan this row ran
        inv = invs.setdefault(r["model"], synthetic_inventory(r["model"]))
        ttft = ttft_seconds(inv, plan, prof, r["prompt"])
        tps = decode_tps(inv, plan, prof, r["prompt"] + 64)
        row = {
            "run": r["run"], "tag": r.get("tag", ""), "env": r.get("env", {}),
            "budget_gb": r["budget_gb"], "ctx": r["ctx"], "plan_ctx": r.get("plan_ctx"),
            "plan": plan.name, "cpu_weight_gb": r.get("cpu_weight_gb"),
            "ttft_s": r["ttft_s"], "decode_tps": r["decode_tps"],
            "pred_ttft_then": r.get("pred_ttft_s"), "pred_tps_then": r.get("pred_decode_tps"),
            "pred_ttft_s": round(ttft, 4), "pred_decode_tps": round(tps, 2),
            "ttft_err": round(ttft / r["ttft_s"] - 1, 3),
            "decode_err": round(tps / r["decode_tps"] - 1, 3),
            "ttft_err_then": round(r["pred_ttft_s"] / r["ttft_s"] - 1, 3),
            "decode_err_then": round(r["pred_decode_tps"] / r["decode_tps"] - 1, 3),
        }
        out.append(row)
    print(f"\n{'run':<5} {'tag':<17} {'GB':>3} {'ctx':>5} {'CPU GB':>6}  {'TTFT s':>6} "
          f"{'pred':>6} {'err':>6} {'(then)':>7}  {'tok/s':>6} {'pred':>6} {'err':>6} "
          f"{'(then)':>7}")
    for x in out:
        print(f"{x['run']:<5} {x['tag']:<17} {x['budget_gb']:>3.0f} {x['ctx']:>5} "
              f"{x['cpu_weight_gb']:>6.3f}  {x['ttft_s']:>6.3f} {x['pred_ttft_s']:>6.3f} "
              f"{x['ttft_err']:>+6.1%} {x['ttft_err_then']:>+7.1%}  {x['decode_tps']:>6.1f} "
              f"{x['pred_decode_tps']:>6.1f} {x['decode_err']:>+6.1%} "
              f"{x['decode_err_then']:>+7.1%}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
