"""Image chat within a VRAM budget: where the vision encoder runs, with what, and for how long.

For each image size and budget, three configurations, each in a process of its own (a failure or
an out-of-memory is a row, not a crash):

* ``naive``: the LM all in VRAM where it fits (else the planner's plan), encoder on the GPU,
  no flash attention in either, the encoder resident beside the LM;
* ``upstream-defaults``: as mtmd-cli runs it: encoder on the GPU with warmup, flash attention
  ``auto``, resident; the LM as in ``naive`` with flash attention ``auto``;
* ``ours``: ``planner.vision.plan_with_vision``: the LM planned for the budget less what the
  encoder needs where it goes to the GPU, the encoder where ``choose_vision`` puts it, flash
  attention on, freed after each image (``vision_resident=False``).

Per row: the process's NVML peak, whether it ran, the encoder's time, TTFT (one image and a
32-token line) and the end-to-end time of 32 generated tokens.

    python benchmarks/vlm_bench.py --json out.json                 # GPU: Qwen2.5-VL-7B shapes
    python benchmarks/vlm_bench.py --tiny --cpu-only --json t.json  # anywhere: the tiny pair
"""

from __future__ import annotations

import igi_sdk  # noqa: F401  (native import order: llama_cpp before numpy)

# isort: split
import argparse
import json
import os
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

GIB = 1 << 30
MIB = 1 << 20
CONFIGS = ("ours", "naive", "upstream-defaults", "paper-baseline")
# ours with one mode forced (planner.vision.VisionPlan.mode); plain "ours" lets the planner pick
MODES = {"ours-cpu": ("cpu",), "ours-reserved": ("reserved",), "ours-borrowed": ("borrowed",)}
TINY_RESOLUTIONS = {"480p": (160, 90), "720p": (256, 144), "1080p": (384, 216), "1440p": (512, 288)}
LINE = ("Brom, look closely at this picture of the old sword I found in the ruins and tell me "
        "what the markings on its blade mean and what you would pay for it")


# --- inputs --------------------------------------------------------------------------------------


def png(width: int, height: int) -> bytes:
    """A synthetic 8-bit RGB PNG (gradients and a checker), zlib only."""
    row_x = bytes(((x * 255) // max(1, width - 1)) for x in range(width))
    rows = []
    for y in range(height):
        g = (y * 255) // max(1, height - 1)
        b = 255 if (y // 32) % 2 else 0
        rgb = bytearray(width * 3)
        rgb[0::3] = row_x
        rgb[1::3] = bytes([g]) * width
        rgb[2::3] = bytes((b ^ (255 if (x // 32) % 2 else 0)) for x in range(width))
        rows.append(b"\0" + bytes(rgb))

    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr)
            + chunk(b"IDAT", zlib.compress(b"".join(rows), 1)) + chunk(b"IEND", b""))


def resolutions(args: argparse.Namespace) -> dict[str, tuple[int, int]]:
    from igi_sdk.planner.vision import RESOLUTIONS

    return TINY_RESOLUTIONS if args.tiny else RESOLUTIONS


def load_profile(args: argparse.Namespace) -> Any:
    from igi_sdk.profile import Profile

    prof = Profile.load(Path(args.profile))
    return prof.model_copy(update={"gpu": None}) if args.cpu_only else prof


# --- one configuration (child process) -----------------------------------------------------------


def lm_plan(config: str, inv: Any, prof: Any, budget: int | None, wl: Any) -> Any:
    from igi_sdk.planner import Plan, plan_for
    from igi_sdk.planner.planner import vram_by_category

    if prof.gpu is None or budget is None:
        return Plan.all_cpu()
    fa = "off" if config == "naive" else "auto"
    full = Plan.all_gpu(inv).model_copy(update={"flash_attn": fa})
    if vram_by_category(inv, full, prof, wl)["total"] <= budget:
        return full
    return plan_for(inv, prof, budget, wl).best.model_copy(update={"flash_attn": fa})


def child(args: argparse.Namespace) -> dict[str, Any]:
    from planner_bench import PeakVram

    from igi_sdk.model import read_inventory
    from igi_sdk.model.mmproj import read_encoder
    from igi_sdk.planner import Plan, Workload
    from igi_sdk.planner.vision import grid_for, plan_with_vision
    from igi_sdk.runtime import Engine, EngineConfig, SamplingParams, image_turn
    from igi_sdk.runtime.encoder import EncoderRoom
    from igi_sdk.runtime.image_turn import ImageInput

    prof = load_profile(args)
    inv, enc = read_inventory(args.model), read_encoder(args.mmproj)
    w, h = resolutions(args)[args.res]
    grid = grid_for(enc, (w, h))
    n_ctx = (grid.n_tokens + args.prompt_tokens + args.gen + 128 + 255) // 256 * 256
    wl = Workload(n_ctx=n_ctx, prompt_tokens=args.prompt_tokens, gen_tokens=args.gen)
    budget = None if prof.gpu is None else int(args.budget * GIB)
    row: dict[str, Any] = {"config": args.config, "budget_gb": args.budget, "res": args.res,
                           "image": f"{w}x{h}", "image_tokens": grid.n_tokens, "n_ctx": n_ctx,
                           "ran": False}
    gpu = prof.gpu is not None
    vision_plan: EncoderRoom | None = None
    if args.config.startswith("ours"):
        modes = MODES.get(args.config, ("cpu", "reserved", "borrowed"))
        vp = plan_with_vision(inv, enc, prof, budget, grid, wl, modes=modes)
        if args.config in MODES and vp.mode not in modes:
            row["error"] = f"no {modes[0]} mode at this budget and image size"
            return row
        plan, v = vp.lm, vp.vision
        # reserved: the encoder's VRAM is set aside, so it stays open (reopening it costs
        # every image turn and frees nothing the budget could use)
        vision = {"vision_gpu": v.on_gpu, "vision_flash_attn": v.flash_attn,
                  "vision_resident": vp.mode != "borrowed"}
        if vp.encode_lm is not None:
            encode_lm = vp.encode_lm
            vision_plan = EncoderRoom.always(encode_lm, fallback=plan)
        row["mode"] = vp.mode
        row["predicted"] = {"encoder_vram_mib": v.vram / MIB, "encode_s": v.encode_s,
                            "peak_mib": vp.peak_vram / MIB, "turn_s": vp.turn_s,
                            "by_mode_s": vp.predicted, "why": v.why,
                            "encode_plan": vp.encode_lm.name if vp.encode_lm else None}
    elif args.config == "paper-baseline":
        # the paper's Table 8 baseline: llama-mtmd-cli at its defaults of the time (no -ngl:
        # n_gpu_layers 0, so the LM's weights and KV cache on the CPU with large batches
        # offloaded op by op; no flash attention), the encoder on the GPU without flash
        # attention, resident
        plan = Plan(name="paper-baseline", gpu_layers=0, kv_on_gpu=False, op_offload=gpu,
                    flash_attn="off", n_ubatch=512)
        vision = {"vision_gpu": gpu, "vision_flash_attn": "off", "vision_resident": True}
    else:
        plan = lm_plan(args.config, inv, prof, budget, wl)
        upstream = args.config == "upstream-defaults"
        vision = {"vision_gpu": gpu, "vision_flash_attn": "auto" if upstream else "off",
                  "vision_resident": True, "vision_warmup": upstream}
    if not gpu:
        plan = plan.model_copy(update={"flash_attn": "off" if args.config == "naive" else "auto"})
    row.update(plan=plan.name, plan_vram_mib=plan.vram_bytes.get("total", 0) / MIB, **vision)
    encodes: list[float] = []
    inner = image_turn.eval_next

    def timed(*a: Any, **kw: Any) -> Any:  # the engine's image step: record the encoder's time
        result = inner(*a, **kw)
        encodes.extend(result.encode_s)
        return result

    image_turn.eval_next = timed  # type: ignore[assignment]
    peak = PeakVram()
    image = ImageInput(data=png(w, h))
    try:
        t0 = time.perf_counter()
        config = EngineConfig(n_ctx=n_ctx, max_sessions=1, n_threads=args.threads,
                              mmproj=str(args.mmproj), **vision)
        with Engine(args.model, plan, config, encoder_room=vision_plan) as eng:
            row["load_s"] = time.perf_counter() - t0
            words, line = (LINE + " " + LINE).split(), ""
            while words and len(eng.tokenize(line)) < args.prompt_tokens:  # a ~32-token line
                line = f"{line} {words.pop(0)}".strip()
            sid = eng.open_session("You are Brom, the blacksmith.",
                                   sampling=SamplingParams(temperature=0.0))
            t1 = time.perf_counter()
            res = eng.chat(sid, line, images=[image], max_tokens=args.gen,
                           ignore_eos=True).result(timeout=args.timeout)
            row.update(ran=True, ttft_s=res.ttft_s, e2e_s=time.perf_counter() - t1,
                       completion_tokens=res.completion_tokens, prompt_tokens=res.prompt_tokens,
                       encode_s=sum(encodes), decode_tps=res.decode_tps,
                       vision_opens=eng.vision_opens, reshards=eng.reshard_count,
                       last_reshard_s=eng.last_reshard_s)
    except Exception as e:  # noqa: BLE001 - an OOM or a load failure is a result here
        row["error"] = f"{type(e).__name__}: {e}"[:400]
    finally:
        row["peak_vram_mib"] = peak.stop() / MIB
        if budget is not None:
            row["within_budget"] = row["peak_vram_mib"] * MIB <= budget
    return row


# --- the matrix (parent process) -----------------------------------------------------------------


def write_pair(args: argparse.Namespace) -> tuple[Path, Path]:
    from igi_sdk.model.synthetic_vlm import write_synthetic_vlm

    preset = "tiny" if args.tiny else "qwen2.5-vl-7b"
    d = Path(args.workdir) / preset
    # the full-size pair: headers with holes for data (zero weights: the timings do not depend
    # on the values, and nothing 5.7 GB has to be written); the tiny one has random weights
    files = write_synthetic_vlm(d, preset, data=args.tiny or args.random_weights)
    return files.model, files.mmproj


def run_row(args: argparse.Namespace, model: Path, mmproj: Path, config: str, budget: float,
            res: str, limit: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", "--config", config, "--budget", str(budget),
           "--res", res, "--model", str(model), "--mmproj", str(mmproj), "--profile",
           args.profile, "--threads", str(args.threads), "--gen", str(args.gen),
           "--prompt-tokens", str(args.prompt_tokens), "--timeout", str(limit)]
    cmd += ["--tiny"] * args.tiny + ["--cpu-only"] * args.cpu_only
    base = {"config": config, "budget_gb": budget, "res": res, "ran": False}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=limit + 15)
    except subprocess.TimeoutExpired:
        return {**base, "error": f"timed out after {limit:.0f} s"}
    for ln in reversed(p.stdout.splitlines()):
        if ln.startswith("{"):
            return json.loads(ln)
    tail = " | ".join(p.stderr.strip().splitlines()[-3:])
    return {**base, "error": f"exit {p.returncode}: {tail}"[:400]}


def fmt(r: dict[str, Any]) -> str:
    where = "gpu" if r.get("vision_gpu") else "cpu"
    if not r.get("ran"):
        return (f"{r['config']:<18} {r['budget_gb']:>5} GB {r['res']:>6}  FAILED "
                f"peak {r.get('peak_vram_mib', 0):7.0f} MiB  {r.get('error', '')[:120]}")
    return (f"{r['config']:<18} {r['budget_gb']:>5} GB {r['res']:>6} {r['image_tokens']:>5} tok "
            f"enc-{where} plan {r['plan']:<14} peak {r['peak_vram_mib']:7.0f} MiB  "
            f"encode {r['encode_s'] * 1e3:8.1f} ms  ttft {r['ttft_s'] * 1e3:8.1f} ms  "
            f"e2e {r['e2e_s'] * 1e3:8.1f} ms  {r.get('mode', '')} reshards {r.get('reshards', 0)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--budgets", default="8,4,14.5", help="GB, most important first")
    ap.add_argument("--resolutions", default="1080p,720p,1440p,480p")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--profile", default=".gpu/profile.json")
    ap.add_argument("--workdir", default="/tmp/igi-bench/vlm")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per row")
    ap.add_argument("--deadline", type=float, default=0.0,
                    help="epoch seconds by which to stop (rows that cannot start are skipped)")
    ap.add_argument("--min-row-s", type=float, default=25.0,
                    help="skip a row when less than this is left before the deadline")
    ap.add_argument("--tiny", action="store_true", help="the tiny pair and small images")
    ap.add_argument("--cpu-only", action="store_true", help="no GPU: CPU plans, CPU encoder")
    ap.add_argument("--random-weights", action="store_true",
                    help="write the full-size pair with random weights (slow)")
    ap.add_argument("--json", help="append one JSON line per row")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    ap.add_argument("--budget", type=float, help=argparse.SUPPRESS)
    ap.add_argument("--res", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--mmproj", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return
    t0 = time.perf_counter()
    model, mmproj = write_pair(args)
    print(f"pair ready in {time.perf_counter() - t0:.1f} s: {model.name}, {mmproj.name}",
          flush=True)
    budgets = [float(b) for b in args.budgets.split(",")]
    if args.cpu_only:
        budgets = budgets[:1]  # no VRAM: the budget changes nothing
    rows = [(r, b, c) for r in args.resolutions.split(",") for b in budgets
            for c in args.configs.split(",")]
    for res, budget, config in rows:
        left = args.deadline - time.time() if args.deadline else args.timeout
        if left < args.min_row_s:
            print(f"skipped {config} {budget} GB {res}: no time", flush=True)
            continue
        row = run_row(args, model, mmproj, config, budget, res, min(args.timeout, left - 10))
        print(fmt(row), flush=True)
        if args.json:
            with open(args.json, "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
