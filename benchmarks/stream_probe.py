"""The prefill probes (``step_bench.copy_compute_seconds``) at several model sizes, priced.

A prefill ubatch of a model's first N layers (``--presets``: Llama-3-8B's, Qwen3-30B-A3B's),
its weights in host memory and streamed to the GPU layer by layer (``streamed``), or all in
VRAM (``gpu``: the same ubatch's GPU work without the copies). With ``--profile`` each run is
set beside the cost model's price of the same ubatch (``planner.cost.ubatch_cost`` with that
profile's terms as measured, copies at the raw host-to-GPU rate) and the difference is printed:
what the model does not price, per layer (and token after the first, as the profile's prefill
term is fitted) and per streamed tensor, from one layer count to the next (what does not grow
with the layers drops out).

    python benchmarks/stream_probe.py --layers 2,6 --presets llama3-8b,qwen3-30b-a3b \
        --modes streamed,gpu --profile profile.json --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import igi_sdk  # noqa: F401  (native import order)


def _priced(run, prof) -> dict[str, float]:  # type: ignore[no-untyped-def]
    from igi_sdk.planner.cost import ubatch_cost

    base = prof.model_copy(update={"stream_pinned_bps": 0.0, "stream_mapped_bps": 0.0})
    u = ubatch_cost(run.inventory, run.plan, base, run.tokens, 0, output_tokens=1)
    return {"gpu_s": u.gpu_s, "copy_s": u.copy_s, "attn_s": u.attn_s,
            "overhead_s": u.overhead_s + u.split_s + u.cpu_s, "total_s": u.total}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="2,6")
    ap.add_argument("--presets", default="llama3-8b")
    ap.add_argument("--modes", default="streamed", help="streamed, gpu (comma-separated)")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 4)
    ap.add_argument("--mapped", action="store_true", help="host weights mapped, not pinned")
    ap.add_argument("--profile", help="price each run with this profile")
    ap.add_argument("--json")
    args = ap.parse_args()
    from igi_sdk.profile import Profile
    from igi_sdk.runtime.step_bench import copy_compute_seconds

    prof = Profile.load(Path(args.profile)) if args.profile else None
    out = []
    for preset in args.presets.split(","):
        for mode in args.modes.split(","):
            prev: dict | None = None
            for n in (int(x) for x in args.layers.split(",")):
                run = copy_compute_seconds(pinned=not args.mapped, threads=args.threads,
                                           n_layers=n, preset=preset, tokens=args.tokens,
                                           streamed=mode == "streamed")
                assert run.inventory is not None
                streamed = [t for t in run.inventory.tensors if t.group != "token_embd"]
                r: dict = {"preset": preset, "mode": mode, "n_layers": n,
                           "pinned": not args.mapped, "tokens": run.tokens,
                           "seconds": run.seconds, "weight_bytes": run.weight_bytes,
                           "tensors": len(streamed) if mode == "streamed" else 0}
                if prof is not None:
                    r["priced"] = _priced(run, prof)
                    r["unpriced_s"] = run.seconds - r["priced"]["total_s"]
                    if prev is not None:
                        layers = n - prev["n_layers"]
                        extra = r["unpriced_s"] - prev["unpriced_s"]
                        r["unpriced_per_layer_s"] = extra / layers
                        r["unpriced_per_layer_token_s"] = extra / layers / max(
                            1, run.tokens - 1)
                        tensors = r["tensors"] - prev["tensors"]
                        if tensors:
                            r["unpriced_per_tensor_s"] = extra / tensors
                print(json.dumps(r), flush=True)
                out.append(r)
                prev = r
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
