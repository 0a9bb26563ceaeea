"""What giving a placement's VRAM back costs, step by step (NVIDIA machine).

A game's ``reserve_vram`` is granted once the model's GPU placement is closed, so the grant can be
no faster than the close. This loads placements of a model (default: the llama3-8b Q4_0
synthetic) one after another in this process, decodes a few tokens on each (so compute buffers
and CUDA graphs exist, as in a sidecar), then times each part of closing it: the context
(``llama_free``), the model (``llama_model_free``), and NVML's device use after each. Raw CUDA
allocations of the same sizes (``cudaMalloc``/``cudaFree``, ``cudaMallocHost``/``cudaFreeHost``)
are timed beside them: the driver's own floor.

    python benchmarks/release_cost.py --workdir /tmp/igi-bench --repeat 3 --json out.json
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import time
from pathlib import Path

import igi_sdk  # noqa: F401  (native import order: llama_cpp before numpy)

MIB = 2**20


def _used() -> int | None:
    from igi_sdk.runtime.nvml import nvml

    pynvml = nvml()
    if pynvml is None:
        return None
    return int(pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(0)).used)


def _plans(inventory, names: list[str]):
    from igi_sdk.planner import Plan

    for name in names:
        base, _, pin = name.partition(":")
        if base == "all-gpu":
            plan = Plan.all_gpu(inventory)
        elif base == "attn-gpu":
            plan = Plan.attention_on_gpu(inventory)
        else:
            raise SystemExit(f"unknown plan {name}")
        plan = plan.model_copy(update={"flash_attn": "on", "name": name,
                                       "pinned_host": pin != "mmap"})
        yield plan


def _decode_a_little(loaded, n_tokens: int) -> None:
    import llama_cpp

    batch = llama_cpp.llama_batch_init(n_tokens, 0, 1)
    try:
        batch.n_tokens = n_tokens
        for i in range(n_tokens):
            batch.token[i] = 1 + i
            batch.pos[i] = i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i == n_tokens - 1
        assert llama_cpp.llama_decode(loaded.ctx, batch) == 0
        for k in range(8):  # single-token steps (CUDA graphs)
            batch.n_tokens = 1
            batch.token[0] = 7 + k
            batch.pos[0] = n_tokens + k
            batch.logits[0] = True
            assert llama_cpp.llama_decode(loaded.ctx, batch) == 0
    finally:
        llama_cpp.llama_batch_free(batch)


def placement_rows(model: Path, names: list[str], repeat: int, threads: int) -> list[dict]:
    import llama_cpp

    from igi_sdk.model import read_inventory
    from igi_sdk.runtime import loader
    from igi_sdk.runtime.loader import ContextSettings

    inventory = read_inventory(model)
    settings = ContextSettings(n_ctx=4096, n_seq_max=4, n_batch=512, n_threads=threads)
    rows = []
    for plan in _plans(inventory, names):
        for r in range(repeat):
            t0 = time.perf_counter()
            loaded = loader.load(model, inventory, plan, settings)
            load_s = time.perf_counter() - t0
            _decode_a_little(loaded, 64)
            before = _used()
            t0 = time.perf_counter()
            llama_cpp.llama_free(loaded.ctx)
            t1 = time.perf_counter()
            after_ctx = _used()
            t2 = time.perf_counter()
            llama_cpp.llama_model_free(loaded.model)
            t3 = time.perf_counter()
            after_model = _used()
            loaded.ctx = loaded.model = None
            row = {"plan": plan.name, "trial": r, "load_s": round(load_s, 3),
                   "ctx_free_ms": round((t1 - t0) * 1e3, 2),
                   "model_free_ms": round((t3 - t2) * 1e3, 2),
                   "vram_freed_by_ctx_mib": None if before is None or after_ctx is None
                   else round((before - after_ctx) / MIB),
                   "vram_freed_by_model_mib": None if after_ctx is None or after_model is None
                   else round((after_ctx - after_model) / MIB)}
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def _cudart() -> ctypes.CDLL | None:
    for name in ("libcudart.so", "libcudart.so.12", "libcudart.so.13",
                 ctypes.util.find_library("cudart")):
        if not name:
            continue
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def raw_rows(sizes_mib: list[int], repeat: int) -> list[dict]:
    rt = _cudart()
    if rt is None:
        print("no libcudart: raw rows skipped")
        return []
    rows = []
    for kind, alloc, free in (("device", rt.cudaMalloc, rt.cudaFree),
                              ("pinned-host", rt.cudaMallocHost, rt.cudaFreeHost)):
        for size in sizes_mib:
            for r in range(repeat):
                p = ctypes.c_void_p()
                t0 = time.perf_counter()
                rc = alloc(ctypes.byref(p), ctypes.c_size_t(size * MIB))
                t1 = time.perf_counter()
                if rc != 0:
                    print(f"{kind} {size} MiB: alloc failed rc={rc}")
                    break
                if kind == "device":
                    rt.cudaMemset(p, 0, ctypes.c_size_t(size * MIB))
                    rt.cudaDeviceSynchronize()
                t2 = time.perf_counter()
                free(p)
                t3 = time.perf_counter()
                row = {"raw": kind, "mib": size, "trial": r,
                       "alloc_ms": round((t1 - t0) * 1e3, 2),
                       "free_ms": round((t3 - t2) * 1e3, 2)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workdir", default="/tmp/igi-bench")
    ap.add_argument("--model")
    ap.add_argument("--plans", default="all-gpu,all-gpu:mmap,attn-gpu,attn-gpu:mmap")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--raw-mib", default="256,1024,5120")
    ap.add_argument("--json")
    args = ap.parse_args()
    model = Path(args.model) if args.model else Path(args.workdir) / "llama3-8b.gguf"
    if not model.exists():
        from igi_sdk.model import write_synthetic_gguf

        model.parent.mkdir(parents=True, exist_ok=True)
        write_synthetic_gguf(str(model), "llama3-8b")
    rows = raw_rows([int(x) for x in args.raw_mib.split(",") if x], args.repeat)
    rows += placement_rows(model, args.plans.split(","), args.repeat, args.threads)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
