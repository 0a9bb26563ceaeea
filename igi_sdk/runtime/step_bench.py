"""Costs of a real llama.cpp decode that micro-benchmarks of single ops miss, measured through
llama.cpp on small synthetic models.

* ``step_overhead``: a decode step costs more than its weights' bytes over the device's
  bandwidth: every layer launches a few dozen kernels (GPU) or synchronises the thread pool a
  few dozen times (CPU), whatever the layer's size. On a large model at one token that fixed
  cost is a third of a GPU step. Two Llama models whose weights are too small to matter, with
  4 and 16 layers, are decoded one token at a time on one device; the difference per added
  layer is the per-layer overhead, what remains of the 4-layer step the per-step overhead.
* ``copy_compute_seconds``: a prefill ubatch of a model whose weights all stay in host memory,
  so llama.cpp streams every weight to the GPU and multiplies it there (copy-compute), copy and
  matmul in turn on one stream; its KV cache is in VRAM, as in the planner's placements. Its
  weights are real-sized (Llama-3-8B's layers), so the copies run at the rate a real model's
  do, from pinned or memory-mapped host memory. The same ubatch with every weight in VRAM
  (``streamed=False``) is the GPU's own prefill work.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import llama_cpp

from igi_sdk.model import (
    ModelInventory,
    TensorInfo,
    read_inventory,
    spec_with,
    write_synthetic_gguf,
)
from igi_sdk.planner import Plan
from igi_sdk.runtime import _native, loader

_LAYERS = (4, 16)


@dataclass(frozen=True)
class StepOverhead:
    layer_s: float  # per layer and decode step, the tiny layer's own weights included
    step_s: float  # per decode step (graph build, scheduling, output)
    layer_weight_bytes: dict[str, int]  # ggml type -> bytes of one tiny layer, to subtract


def _median_decode_seconds(
    path: Path, inv: ModelInventory, plan: Plan, threads: int, *, n_tokens: int, runs: int,
    warmup: int, restart: bool,
) -> float:
    """Median time of ``llama_decode`` of ``n_tokens`` tokens, over ``runs`` timed calls after
    ``warmup`` untimed ones (CUDA graph capture, allocator growth). ``restart``: every call
    decodes from position 0 in an emptied cache (a prefill); otherwise the calls continue one
    sequence (decode steps)."""
    total = warmup + runs
    n_ctx = n_tokens if restart else n_tokens * total + 64
    settings = loader.ContextSettings(n_ctx=n_ctx, n_seq_max=1, n_batch=max(n_tokens, 512),
                                      n_threads=threads)
    with _native.streamed_weights_kept():  # (a probe's plan, not the running model's)
        loaded = loader.load(path, inv, plan, settings)
    batch = llama_cpp.llama_batch_init(n_tokens, 0, 1)
    mem = llama_cpp.llama_get_memory(loaded.ctx)
    try:
        times, pos = [], 0
        for call in range(total):
            if restart:
                llama_cpp.llama_memory_clear(mem, True)
                pos = 0
            batch.n_tokens = n_tokens
            for i in range(n_tokens):
                batch.token[i] = 1 + (pos * 7 + call) % 100
                batch.pos[i] = pos
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = 1 if i == n_tokens - 1 else 0
                pos += 1
            t0 = time.perf_counter()
            if llama_cpp.llama_decode(loaded.ctx, batch) != 0:
                raise RuntimeError(f"llama_decode failed while timing {path.name}")
            llama_cpp.llama_synchronize(loaded.ctx)
            if call >= warmup:
                times.append(time.perf_counter() - t0)
        return statistics.median(times)
    finally:
        llama_cpp.llama_batch_free(batch)
        loader.free(loaded)


def _bytes_by_type(tensors: Iterable[TensorInfo]) -> dict[str, int]:
    out: dict[str, int] = {}
    for t in tensors:
        out[t.ggml_type] = out.get(t.ggml_type, 0) + t.n_bytes
    return out


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
            seconds[n_layers] = _median_decode_seconds(path, inv, plan, threads, n_tokens=1,
                                                       runs=steps, warmup=4, restart=False)
            layer_bytes = _bytes_by_type(inv.layer_tensors(0))
    lo, hi = _LAYERS
    layer_s = max(0.0, (seconds[hi] - seconds[lo]) / (hi - lo))
    return StepOverhead(layer_s=layer_s, step_s=max(0.0, seconds[lo] - lo * layer_s),
                        layer_weight_bytes=layer_bytes)


@dataclass(frozen=True)
class CopyComputeRun:
    seconds: float  # one prefill ubatch of ``tokens`` tokens
    tokens: int
    weight_bytes: dict[str, int]  # ggml type -> bytes of the weights (the token embedding excluded)
    n_layers: int
    # the probe's model and plan, for a cost model to price the same ubatch (None: not kept)
    inventory: ModelInventory | None = None
    plan: Plan | None = None


def copy_compute_seconds(*, pinned: bool, threads: int, tokens: int = 512,
                         reps: int = 4, n_layers: int = 2, preset: str = "llama3-8b",
                         streamed: bool = True) -> CopyComputeRun:
    """Time of one ``tokens``-token prefill ubatch of ``preset``'s first ``n_layers`` layers:
    with every weight streamed to the GPU (``streamed``), or with every weight in VRAM (the
    same ubatch's GPU work without the copies)."""
    spec = spec_with(preset, n_layers=n_layers, n_vocab=2048)
    with tempfile.TemporaryDirectory(prefix="igi-copy-") as tmp:
        path = write_synthetic_gguf(Path(tmp) / "copy.gguf", spec)
        inv = read_inventory(path)
        if streamed:  # every weight in host memory, the KV cache in VRAM (as a real plan's)
            plan = Plan(name="copy-probe", gpu_tensors=(), kv_on_gpu=True, op_offload=True,
                        copy_compute_min_batch=32, pinned_host=pinned, flash_attn="on",
                        n_ubatch=tokens)
        else:
            plan = Plan.all_gpu(inv).model_copy(update={
                "name": "prefill-probe", "flash_attn": "on", "n_ubatch": tokens})
        seconds = _median_decode_seconds(path, inv, plan, threads, n_tokens=tokens, runs=reps,
                                         warmup=1, restart=True)
    weights = _bytes_by_type(t for t in inv.tensors if t.group != "token_embd")
    return CopyComputeRun(seconds, tokens, weights, inv.arch.n_layers, inv, plan)
