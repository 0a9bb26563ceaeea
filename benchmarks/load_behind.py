"""What a placement loading behind the decode costs an NPC decoding on the CPU standby, for a
GPU rung whose host weights are pinned (in pieces, as shipped, or in one allocation, as stock
llama.cpp pins them) and for the same budget's rung with them mapped.

    python3 benchmarks/load_behind.py --model M.gguf --profile P.json --budget-gib 4.5 \
        --threads 12 --rounds 2 --json OUT/load-behind.json

One process, as the sidecar runs a reshard behind the decode (runtime/background_load.py): the
CPU standby (the file's memory-mapped pages) decodes an NPC's lines — a prefill of ``--line``
tokens, then ``--reply`` one-token steps, each line in fresh positions — while a loader thread
opens the GPU rung for ``--budget-gib`` (planned as the sidecar plans it, host weights pinned or
mapped), which is then closed again. A third thread maps, touches and unmaps a fresh 4 MiB
anonymous region every 20 ms: the address-space work that any allocation of a large block or a
new Python arena does, and which waits while another thread holds the process's memory map
(page-locking host memory does). Each round runs both variants, mapped first. Per load: its
seconds, and beside the same span before it (``--before-s``, the same standby): the longest
standby call, the medians of its prefills and steps, and the longest map probe.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import llama_cpp

from igi_sdk.errors import IgiError
from igi_sdk.model import read_inventory
from igi_sdk.planner import Plan
from igi_sdk.profile import Profile
from igi_sdk.runtime import _native, loader
from igi_sdk.tuning.autoplan import plan_for_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from map_probe import MapProbe

N_CTX, SESSIONS = 4096, 8


class Standby:
    """The CPU placement and one NPC's lines on it; every call's (start, seconds, kind)."""

    def __init__(self, path: Path, threads: int, line: int, reply: int) -> None:
        self.inv = read_inventory(path)
        self.settings = loader.ContextSettings(n_ctx=N_CTX, n_seq_max=SESSIONS, n_batch=512,
                                               n_threads=threads, n_outputs=SESSIONS)
        self.loaded = loader.load(path, self.inv, Plan.all_cpu(), self.settings)
        self.mem = llama_cpp.llama_get_memory(self.loaded.ctx)
        self.batch = llama_cpp.llama_batch_init(max(line, 1), 0, 1)
        self.line, self.reply, self.pos = line, reply, 0
        self.calls: list[tuple[float, float, str]] = []

    def _decode(self, n: int, kind: str) -> None:
        if self.pos + n > N_CTX:
            llama_cpp.llama_memory_clear(self.mem, True)
            self.pos = 0
        b = self.batch
        b.n_tokens = n
        for i in range(n):
            b.token[i] = 1 + (self.pos * 7) % 100
            b.pos[i] = self.pos
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if i == n - 1 else 0
            self.pos += 1
        t0 = time.perf_counter()
        if llama_cpp.llama_decode(self.loaded.ctx, b) != 0:
            raise RuntimeError("llama_decode failed on the standby")
        self.calls.append((t0, time.perf_counter() - t0, kind))

    def run_line(self) -> None:
        self._decode(self.line, "prefill")
        for _ in range(self.reply):
            self._decode(1, "step")

    def close(self) -> None:
        llama_cpp.llama_batch_free(self.batch)
        loader.free(self.loaded)


def window(standby: Standby, probe: MapProbe, t0: float, t1: float) -> dict[str, Any]:
    calls = [c for c in standby.calls if t0 <= c[0] < t1]
    maps = probe.within(t0, t1)

    def med(kind: str) -> float | None:
        xs = [c[1] for c in calls if c[2] == kind]
        return round(statistics.median(xs), 5) if xs else None

    return {"calls": len(calls), "longest_call_s": round(max((c[1] for c in calls),
                                                           default=0.0), 4),
            "prefill_median_s": med("prefill"), "step_median_s": med("step"),
            "map_probes": len(maps), "longest_map_s": round(max(maps, default=0.0), 4)}


def one_load(path: Path, standby: Standby, probe: MapProbe, plan: Plan,
             before_s: float) -> dict[str, Any]:
    """Decode on the standby for ``before_s``, then while ``plan`` loads behind, then close it."""
    t_before = time.perf_counter()
    while time.perf_counter() - t_before < before_s:
        standby.run_line()
    got: dict[str, Any] = {}
    progress: list[tuple[float, float]] = []

    def load() -> None:
        t = time.perf_counter()
        try:
            got["loaded"] = loader.load(path, standby.inv, plan, standby.settings,
                                        progress=lambda f: progress.append(
                                            (time.perf_counter(), f)))
        except IgiError as e:  # reported, not raised: the standby's figures still count
            got["error"] = f"{type(e).__name__}: {e}"
        got["seconds"] = time.perf_counter() - t

    t_load = time.perf_counter()
    th = threading.Thread(target=load, name="igi-loader")
    th.start()
    while th.is_alive():
        standby.run_line()
    t_done = time.perf_counter()
    t_close = time.perf_counter()
    if "loaded" in got:
        loader.free(got["loaded"])
    close_s = time.perf_counter() - t_close
    time.sleep(0.05)  # the probe's map that started during the close has ended
    close_maps = probe.within(t_close, t_close + close_s)
    weights_from = next((t for t, f in progress if f > 0.0), None)
    return {"plan": plan.name, "pinned_host": plan.pinned_host,
            "streamed": len(plan.decode_streamed), "load_s": round(got["seconds"], 3),
            "close_s": round(close_s, 3), "error": got.get("error"),
            "close_longest_map_s": round(max(close_maps, default=0.0), 4),
            "first_progress_s": None if weights_from is None else round(weights_from - t_load, 3),
            "before": window(standby, probe, t_before, t_load),
            "during": window(standby, probe, t_load, t_done)}


def pieces(on: bool) -> None:
    """Pinned host weights in pieces (as the product loads them) or in one allocation (as
    stock llama.cpp does): GGML_HOST_ALLOC_CHUNK_MIB=0 keeps the loader from setting pieces."""
    if on:
        os.environ.pop("GGML_HOST_ALLOC_CHUNK_MIB", None)
    else:
        os.environ["GGML_HOST_ALLOC_CHUNK_MIB"] = "0"
        _native.set_host_alloc_chunk(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--profile", required=True)
    ap.add_argument("--budget-gib", type=float, default=4.5)
    ap.add_argument("--threads", type=int, default=12)
    ap.add_argument("--line", type=int, default=24, help="tokens of a line's prefill")
    ap.add_argument("--reply", type=int, default=8, help="one-token steps after each line")
    ap.add_argument("--before-s", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--variants", default="mapped,pinned",
                    help="comma-separated: mapped, pinned (as shipped: in pieces where the "
                         "build can), pinned-whole (one cudaMallocHost, as stock llama.cpp)")
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    path, prof = Path(args.model), Profile.load(Path(args.profile))
    inv = read_inventory(path)
    budget = int(args.budget_gib * (1 << 30))
    plans = {hw: plan_for_model(path, inv, budget=budget, n_ctx=N_CTX, max_sessions=SESSIONS,
                                n_threads=args.threads, profile=prof, pin_host=hw == "pinned").best
             for hw in ("mapped", "pinned")}
    for hw, p in plans.items():
        print(f"{hw}: plan '{p.name}', pinned {p.pinned_host}, {len(p.decode_streamed)} "
              f"streamed, {p.vram_bytes.get('total', 0) / (1 << 30):.2f} GiB", flush=True)
    standby = Standby(path, args.threads, args.line, args.reply)
    probe = MapProbe(every_s=0.02)
    probe.start()
    rows: list[dict[str, Any]] = []
    try:
        standby.run_line()  # the standby's buffers at their size for these calls
        for rnd in range(args.rounds):
            for hw in args.variants.split(","):
                whole = hw == "pinned-whole"
                plan = plans["pinned" if whole else hw]
                pieces(not whole)
                row = {"round": rnd, "host_weights": hw, "pinned_in_pieces":
                       plan.pinned_host and not whole and _native.pins_in_pieces(),
                       **one_load(path, standby, probe, plan, args.before_s)}
                rows.append(row)
                b, d = row["before"], row["during"]
                print(f"round {rnd} {hw:6s} load {row['load_s']:.2f} s (close "
                      f"{row['close_s']:.3f}): longest standby call {b['longest_call_s']:.3f} "
                      f"-> {d['longest_call_s']:.3f} s, prefill {b['prefill_median_s']} -> "
                      f"{d['prefill_median_s']}, step {b['step_median_s']} -> "
                      f"{d['step_median_s']}, longest map {b['longest_map_s']:.4f} -> "
                      f"{d['longest_map_s']:.4f} s, during the close "
                      f"{row['close_longest_map_s']:.4f} s {row['error'] or ''}", flush=True)
    finally:
        probe.stop.set()
        standby.close()
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
