"""Measure this machine's profile with llama.cpp's own kernels (see ``runtime.ggml_bench``)."""

from __future__ import annotations

import os
import platform
from collections.abc import Callable
from pathlib import Path

import llama_cpp

from igi_sdk.profile.data import DeviceProfile, Profile, cache_dir
from igi_sdk.runtime import ggml_bench, step_bench
from igi_sdk.runtime.devices import list_devices
from igi_sdk.runtime.loader import default_threads
from igi_sdk.runtime.nvml import handle_for_bus_id, nvml

TYPES = ("F16", "Q8_0", "Q4_0", "Q4_K")
TOKENS = (1, 2, 4, 8, 16, 64, 512, 2048)
# the small batches matter most: they decide the token tier where copy-compute starts to pay
FAST_TOKENS = (1, 4, 16, 64, 512, 2048)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _nvml_facts() -> dict[str, str]:
    pynvml = nvml()
    if pynvml is None:
        return {}
    try:
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        facts = {"driver": str(pynvml.nvmlSystemGetDriverVersion()),
                 "gpu": str(pynvml.nvmlDeviceGetName(h))}
        try:
            gen = pynvml.nvmlDeviceGetCurrPcieLinkGeneration(h)
            width = pynvml.nvmlDeviceGetCurrPcieLinkWidth(h)
            facts["pcie"] = f"gen{gen} x{width}"
        except Exception:  # noqa: BLE001 - not reported on every platform
            pass
        return facts
    finally:
        pynvml.nvmlShutdown()


def _nvml_own_vram(bus_id: str | None) -> int:
    """This process's VRAM per NVML on the GPU with PCI bus id ``bus_id`` (llama.cpp's; NVML's
    numbering can differ), 0 where the driver does not report per-process use."""
    pynvml = nvml()
    if pynvml is None:
        return 0
    try:
        h = handle_for_bus_id(pynvml, bus_id)
        for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h):
            if p.pid == os.getpid():
                return int(p.usedGpuMemory or 0)
    except Exception:  # noqa: BLE001 - absent or unsupported: unknown
        return 0
    return 0


def fingerprint(threads: int) -> dict[str, str]:
    nv = _nvml_facts()
    gpus = [d for d in list_devices() if d.is_gpu]
    return {
        "gpu": nv.get("gpu") or (gpus[0].description if gpus else "none"),
        "driver": nv.get("driver", ""),
        "cpu": _cpu_model(),
        "threads": str(threads),
        "llama_cpp": llama_cpp.__version__,
        "backends": ",".join(sorted({d.name.rstrip("0123456789") for d in list_devices()})),
    }


def measure_profile(
    *,
    threads: int | None = None,
    fast: bool = False,
    k: int = 4096,
    n: int = 4096,
    progress: Callable[[float, str], None] | None = None,
    scale_down: bool = False,
) -> Profile:
    """Run the micro-benchmarks (``scale_down``: tiny graphs, for tests)."""
    threads = threads or default_threads()
    devices = list_devices()
    cpu = next(d for d in devices if d.kind == "cpu")
    gpu = next((d for d in devices if d.is_gpu), None)
    tokens = FAST_TOKENS if fast else TOKENS
    reps = 2 if fast else 3
    steps = len(TYPES) * len(tokens) * (2 if gpu else 1) + (6 if gpu else 1)
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done / steps, what)

    def device_rates(
        index: int, n_threads: int, label: str, budget: dict[int, int],
        shape: tuple[int, int] = (k, n),
    ) -> dict[str, dict[int, float]]:
        rates: dict[str, dict[int, float]] = {}
        with ggml_bench.backend(index, n_threads) as be:
            for t in TYPES:
                rates[t] = {}
                for tok in tokens:
                    s = ggml_bench.matmul_seconds(be, t, *shape, tok, reps=reps,
                                                  total_bytes=budget[tok])
                    rates[t][tok] = ggml_bench.ggml_weight_bytes(t, *shape) / s
                    tick(f"{label} {t} x{tok}")
        return rates

    # weight bytes per timed graph: beyond the CPU's caches for the memory-bound small batches,
    # enough work to hide launch overhead on a GPU, little for the compute-bound large batches
    mib = 1024 * 1024
    cpu_bytes = {1: 512 * mib, 2: 512 * mib, 4: 384 * mib, 8: 256 * mib, 16: 256 * mib,
                 64: 128 * mib, 512: 32 * mib, 2048: 16 * mib}
    gpu_bytes = {1: 1024 * mib, 2: 1024 * mib, 4: 1024 * mib, 8: 1024 * mib, 16: 1024 * mib,
                 64: 1024 * mib, 512: 512 * mib, 2048: 256 * mib}
    if gpu is not None:  # never take more than a quarter of what is free
        gpu_bytes = {t: min(b, gpu.free_bytes // 4) for t, b in gpu_bytes.items()}
    if scale_down:
        cpu_bytes = {t: b // 64 for t, b in cpu_bytes.items()}

    n_kv, n_q = (512, 64) if scale_down else (4096, 512)

    def attention(index: int, n_threads: int) -> tuple[float, float]:
        """(FLOP/s of a prefill batch, KV bytes/s of one decode query) of flash attention."""
        heads, kv_heads, dim = 32, 8, 128
        with ggml_bench.backend(index, n_threads) as be:
            prefill = ggml_bench.attention_seconds(be, n_q, n_kv, reps=reps)
            decode = ggml_bench.attention_seconds(be, 1, n_kv, reps=reps)
        return (4.0 * heads * dim * n_q * n_kv / prefill, n_kv * kv_heads * dim * 2 * 2 / decode)

    cpu_prof = DeviceProfile(name=cpu.description or cpu.name, kind="cpu", threads=threads,
                             total_bytes=cpu.total_bytes, free_bytes=cpu.free_bytes,
                             matmul_rate=device_rates(cpu.index, threads, "cpu", cpu_bytes))
    cpu_prof.attn_flops, cpu_prof.attn_kv_bps = attention(cpu.index, threads)
    _add_step_overhead(cpu_prof, gpu=False, threads=threads)
    tick("cpu step overhead")
    prof = Profile(fingerprint=fingerprint(threads), cpu=cpu_prof)
    if gpu is None:
        return prof
    # larger weights on the GPU: fewer kernel launches per byte, as in a real decode step
    gpu_rates = device_rates(gpu.index, 1, "gpu", gpu_bytes, shape=(2 * k, 2 * n))
    size = 256 * 1024 * 1024 if not fast else 128 * 1024 * 1024
    pinned = size / ggml_bench.h2d_seconds(gpu.index, size, pinned=True)
    tick("h2d pinned")
    pageable = size / ggml_bench.h2d_seconds(gpu.index, size, pinned=False)
    tick("h2d pageable")
    fresh = next(d for d in list_devices() if d.index == gpu.index)
    prof.gpu = DeviceProfile(name=gpu.description or gpu.name, kind="gpu",
                             total_bytes=fresh.total_bytes, free_bytes=fresh.free_bytes,
                             matmul_rate=gpu_rates)
    prof.gpu.attn_flops, prof.gpu.attn_kv_bps = attention(gpu.index, 1)
    _add_step_overhead(prof.gpu, gpu=True, threads=threads)
    tick("gpu step overhead")
    prof.stream_pinned_bps = _stream_rate(prof, pinned=True, threads=threads)
    tick("copy-compute pinned")
    prof.stream_mapped_bps = _stream_rate(prof, pinned=False, threads=threads)
    tick("copy-compute mapped")
    prof.h2d_pinned_bps = pinned
    prof.h2d_pageable_bps = pageable
    prof.pcie = _nvml_facts().get("pcie", "")
    prof.gpu_fixed_bytes = _nvml_own_vram(gpu.pci_bus_id)
    return prof


def _add_step_overhead(dev: DeviceProfile, *, gpu: bool, threads: int) -> None:
    """Per-layer and per-step decode overhead, net of the tiny layers' own weight reads."""
    o = step_bench.step_overhead(gpu=gpu, threads=threads)
    weights_s = sum(b / dev.rate(t, 1) for t, b in o.layer_weight_bytes.items())
    dev.layer_overhead_s = max(0.0, o.layer_s - weights_s)
    dev.step_overhead_s = o.step_s


def _stream_rate(prof: Profile, *, pinned: bool, threads: int) -> float:
    return stream_rate(prof, step_bench.copy_compute_seconds(pinned=pinned, threads=threads))


def stream_rate(prof: Profile, run: step_bench.CopyComputeRun) -> float:
    """Weight bytes per second streamed by copy-compute in a real prefill: the ubatch's time
    less what the profile already prices (the GPU's matmuls and step overheads), never above a
    single large pinned copy's rate."""
    assert prof.gpu is not None
    matmul_s = sum(b / prof.gpu.rate(t, run.tokens) for t, b in run.weight_bytes.items())
    fixed_s = run.n_layers * prof.gpu.layer_overhead_s + prof.gpu.step_overhead_s
    streamed = sum(run.weight_bytes.values())
    copy_s = run.seconds - matmul_s - fixed_s
    ceiling = prof.h2d_pinned_bps or float("inf")
    return ceiling if copy_s <= 0 else min(ceiling, streamed / copy_s)


def cached_before_backend(threads: int | None = None,
                          directory: Path | None = None) -> Profile | None:
    """This machine's cached profile, found without starting llama.cpp's backend — which
    :func:`fingerprint` does (it lists llama.cpp's devices), and which fixes the copy-compute
    threshold for the process. Matches every fingerprint entry known without the backend (all
    but the backends, and the GPU's name without NVML); None unless exactly one profile with a
    GPU matches. Only for choosing that threshold: plans use :func:`load_or_measure`'s."""
    known = {"cpu": _cpu_model(), "threads": str(threads or default_threads()),
             "llama_cpp": llama_cpp.__version__}
    nv = _nvml_facts()
    known["driver"] = nv.get("driver", "")
    if "gpu" in nv:
        known["gpu"] = nv["gpu"]
    found = []
    for path in sorted((directory or cache_dir()).glob("*.json")):
        try:
            prof = Profile.load(path)
        except (OSError, ValueError):  # unreadable or from another version: not ours
            continue
        if prof.gpu is not None and all(prof.fingerprint.get(k) == v for k, v in known.items()):
            found.append(prof)
    return found[0] if len(found) == 1 else None


def load_or_measure(
    *, threads: int | None = None, fast: bool = True, refresh: bool = False,
    progress: Callable[[float, str], None] | None = None,
) -> Profile:
    """The cached profile for this machine, measuring (and caching) it if there is none."""
    threads = threads or default_threads()
    if not refresh:
        cached = Profile.cached(fingerprint(threads))
        if cached is not None:
            return cached
    prof = measure_profile(threads=threads, fast=fast, progress=progress)
    prof.save()
    return prof
