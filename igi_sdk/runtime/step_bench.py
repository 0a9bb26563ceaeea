"""Per-layer step overhead of a real llama.cpp decode, measured on a tiny model.

A decode step costs more than its weights' bytes over the device's bandwidth: every layer
launches a few dozen kernels (GPU) or synchronises the thread pool a few dozen times (CPU),
whatever the layer's size. On a large model at one token that fixed cost is a third of a
GPU step. It is measured here with llama.cpp itself: two synthetic Llama models whose weights
are too small to matter, with 4 and 16 layers, decoded one token at a time on one device; the
difference per added layer is the per-layer overhead, what remains of the 4-layer step the
per-step (graph) overhead.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from igi_sdk.model import read_inventory, spec_with, write_synthetic_gguf
from igi_sdk.planner import Plan
from igi_sdk.runtime import loader

_LAYERS = (4, 16)


@dataclass(frozen=True)
class StepOverhead:
    layer_s: float  # per layer and decode step, the tiny layer's own weights included
    step_s: float  # per decode step (graph build, scheduling, output)
    layer_weight_bytes: dict[str, int]  # ggml type -> bytes of one tiny layer, to subtract


def _decode_step_seconds(path: Path, plan: Plan, threads: int, steps: int) -> float:
    inv = read_inventory(path)
    settings = loader.ContextSettings(n_ctx=steps + 64, n_seq_max=1, n_batch=512,
                                      n_threads=threads)
    loaded = loader.load(path, inv, plan, settings)
    batch = llama_cpp.llama_batch_init(1, 0, 1)
    try:
        times = []
        for pos in range(steps + 4):  # the first steps build the CUDA graphs: not timed
            batch.n_tokens = 1
            batch.token[0] = 1 + pos % 100
            batch.pos[0] = pos
            batch.n_seq_id[0] = 1
            batch.seq_id[0][0] = 0
            batch.logits[0] = 1
            t0 = time.perf_counter()
            if llama_cpp.llama_decode(loaded.ctx, batch) != 0:
                raise RuntimeError("llama_decode failed while measuring the step overhead")
            llama_cpp.llama_synchronize(loaded.ctx)
            if pos >= 4:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        llama_cpp.llama_batch_free(batch)
        loader.free(loaded)


def step_overhead(*, gpu: bool, threads: int, steps: int = 48) -> StepOverhead:
    """Per-layer and per-step decode overhead on the GPU (``gpu``) or the CPU."""
    with tempfile.TemporaryDirectory(prefix="igi-step-") as tmp:
        seconds, layer_bytes = {}, {}
        for n_layers in _LAYERS:
            # heads of 64: the GPU's flash-attention kernels take them, as in real models
            spec = spec_with("tiny-llama", n_layers=n_layers, n_embd=128, n_head=2, n_head_kv=1,
                             n_ff=128)
            path = write_synthetic_gguf(Path(tmp) / f"step-{n_layers}.gguf", spec)
            inv = read_inventory(path)
            plan = Plan.all_gpu(inv) if gpu else Plan.all_cpu()
            seconds[n_layers] = _decode_step_seconds(path, plan, threads, steps)
            layer_bytes = {}
            for t in inv.layer_tensors(0):
                layer_bytes[t.ggml_type] = layer_bytes.get(t.ggml_type, 0) + t.n_bytes
    lo, hi = _LAYERS
    layer_s = max(0.0, (seconds[hi] - seconds[lo]) / (hi - lo))
    return StepOverhead(layer_s=layer_s, step_s=max(0.0, seconds[lo] - lo * layer_s),
                        layer_weight_bytes=layer_bytes)
