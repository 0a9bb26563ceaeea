"""Measure this machine's profile with llama.cpp's own kernels (see ``runtime.ggml_bench``)."""

from __future__ import annotations

import logging
import math
import os
import platform
import statistics
import threading
import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp

from igi_sdk import omp_wait
from igi_sdk import threads as threads_mod
from igi_sdk.errors import IgiError
from igi_sdk.planner.cost import ubatch_cost
from igi_sdk.profile.data import DeviceProfile, Profile, cache_dir
from igi_sdk.runtime import ggml_bench, step_bench
from igi_sdk.runtime.devices import list_devices
from igi_sdk.runtime.loader import default_threads
from igi_sdk.runtime.nvml import handle_for_bus_id, nvml

TYPES = ("F16", "Q8_0", "Q4_0", "Q4_K")
TOKENS = (1, 2, 4, 8, 16, 64, 512, 2048)
# the small batches matter most: they decide the token tier where copy-compute starts to pay
FAST_TOKENS = (1, 4, 16, 64, 512, 2048)

# Plausible decode overheads on any machine that runs a model at a useful speed: tens of
# microseconds per layer (kernel launches, thread-pool barriers), well under a millisecond per
# step. A probe beyond these was disturbed (another process took the cores, a page-in) — one
# such probe, cached as 0.42 s per step, made every later plan predict ~2 tok/s — so it is
# measured again, and a profile beyond them is never cached.
MAX_LAYER_OVERHEAD_S = 2e-3
MAX_STEP_OVERHEAD_S = 20e-3
# beyond this the timing was disturbed (a copy cannot take more than all of the memory bandwidth:
# the CPU at a quarter of its speed is already far past the 1.28x measured on the H200 host)
MAX_STREAM_CPU_SLOWDOWN = 3.0
_OVERHEAD_RUNS = 3  # undisturbed probes whose median is kept
_OVERHEAD_TRIES = 8  # probes at most

log = logging.getLogger("igi_sdk.tuning")


class NoisyProfileError(IgiError):
    """The machine was too busy to measure: the probes kept disagreeing or ran beyond any
    plausible bound. Nothing was cached; measure again when the machine is quieter."""

    code = "profile_noisy"
    retryable = True


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
        "wait": omp_wait.in_effect(os.environ),
        "llama_cpp": llama_cpp.__version__,
        "backends": ",".join(sorted({d.name.rstrip("0123456789") for d in list_devices()})),
        "cpu_weights": "repacked" if cpu_weights_repacked(bool(gpus)) else "plain",
    }


def cpu_weights_repacked(has_gpu: bool) -> bool:
    """Whether llama.cpp will load this process's CPU-resident weights repacked (its
    ``CPU_REPACK`` buffer, interleaved for faster kernels: 1.5x the plain Q4_0 rate at one
    token on an AVX2 machine). It puts a GPU's pinned host buffer first wherever there is a
    GPU (weights a large batch streams to the GPU must keep the file's layout); without one the
    repacking buffer comes first. (``exact_verify`` engines load without it.)"""
    return not has_gpu and ggml_bench.repack_buffer_type() is not None


def measure_profile(
    *,
    threads: int | None = None,
    fast: bool = False,
    k: int = 4096,
    n: int = 4096,
    progress: Callable[[float, str], None] | None = None,
    scale_down: bool = False,
    problems: list[str] | None = None,
) -> Profile:
    """Run the micro-benchmarks (``scale_down``: tiny graphs, for tests). ``problems`` hears why
    the measurement may not hold for an idle machine (other processes took CPU time from it, a
    probe stayed disturbed): such a profile serves the run at hand but is not for caching."""
    threads = threads or default_threads()
    found: list[str] = []
    with _OthersCpu(threads) as others:
        prof = _on_own_thread(lambda: _measure_profile(
            threads=threads, fast=fast, k=k, n=n, progress=progress, scale_down=scale_down,
            problems=found))
    busy = others.busy()
    if busy:
        found.insert(0, busy)
    if problems is not None:
        problems.extend(found)
    return prof


def _on_own_thread(measure: Callable[[], Profile]) -> Profile:
    """``measure()`` on a thread of its own, which ends with it. OpenMP keeps the team of
    every thread that ran a parallel region until that thread exits, and libgomp counts the
    teams of all threads against the CPUs: a profile timed on the caller's thread left its
    team behind, and the engine's team beside it then ran with libgomp's short spin
    (100 rounds, not 300,000) for the life of the process (a 16-layer 30B-A3B decoded 35
    tok/s instead of 53 on a 2-core machine)."""
    out: list[Profile] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            out.append(measure())
        except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
            failed.append(e)

    t = threading.Thread(target=run, name=threads_mod.PROFILER, daemon=True)
    t.start()
    t.join()
    if failed:
        raise failed[0]
    return out[0]


class _OthersCpu:
    """How much CPU other processes took while a measurement ran: system-wide busy time
    (``/proc/stat``) less this process's own. Linux only (elsewhere nothing is found)."""

    def __init__(self, threads: int) -> None:
        self.threads = threads

    def __enter__(self) -> _OthersCpu:
        self.t0, self.sys0, self.own0 = time.perf_counter(), _system_busy_s(), _own_cpu_s()
        return self

    def __exit__(self, *_: object) -> None:
        self.t1, self.sys1, self.own1 = time.perf_counter(), _system_busy_s(), _own_cpu_s()

    def cores(self) -> float | None:
        """Cores' worth of CPU time the other processes used, on average (None: unknown)."""
        if self.sys0 is None or self.sys1 is None or self.t1 <= self.t0:
            return None
        others = (self.sys1 - self.sys0) - (self.own1 - self.own0)
        return max(0.0, others / (self.t1 - self.t0))

    def busy(self) -> str:
        """Why the machine was too busy for the measurement to hold (empty: it was not):
        the other processes needed more than the cores the measurement left free."""
        used, n_cpus = self.cores(), _system_cpus()
        if used is None or not n_cpus:
            return ""
        spare = max(0, n_cpus - self.threads)
        if used <= spare + max(0.5, 0.1 * self.threads):
            return ""
        return (f"other processes used {used:.1f} of the {n_cpus} CPU cores while it was "
                f"measured with {self.threads} threads, so it understates this machine")


def _proc_stat() -> list[str]:
    try:
        with open("/proc/stat") as f:
            return f.read().splitlines()
    except OSError:
        return []


def _system_busy_s() -> float | None:
    """Seconds of CPU time the whole system has been busy (all cores), or None."""
    lines = _proc_stat()
    if not lines or not lines[0].startswith("cpu "):
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    ticks = [int(x) for x in lines[0].split()[1:9]]
    busy = sum(ticks) - ticks[3] - ticks[4]
    return busy / os.sysconf("SC_CLK_TCK")


def _system_cpus() -> int:
    return sum(1 for line in _proc_stat() if line.startswith("cpu") and line[3:4].isdigit())


def _own_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


def expert_scale_on(index: int, n_threads: int, dense_rate: float, budget: int, *,
                    reps: int = 2, scale_down: bool = False,
                    weights_buft: int | None = None) -> dict[str, float]:
    """A device's routed-expert rates at one token against ``dense_rate`` (its Q4_0 rate at
    one token): Qwen3-30B-A3B's experts (2048 x 768, 8 a token), gate/up and down. Each timed
    tensor holds 16 experts, not 128: the 8 a token uses are what is read, and ``budget`` bytes
    of them keep the timing out of the caches without allocating the unused ones. On a GPU the
    share is mostly launch and small-matrix time: three expert matmuls of 7 MB each a layer
    read far below the bandwidth one large weight reaches."""
    width, ff = (256, 96) if scale_down else (2048, 768)
    out = {}
    with ggml_bench.backend(index, n_threads) as be:
        for kind, (kk, nn, shared) in {"gate_up": (width, ff, True),
                                       "down": (ff, width, False)}.items():
            s = ggml_bench.expert_matmul_seconds(
                be, "Q4_0", kk, nn, 16, 8, 1, reps=reps, total_bytes=budget,
                shared_input=shared, weights_buft=weights_buft)
            rate = 8 * ggml_bench.ggml_weight_bytes("Q4_0", kk, nn) / s
            out[kind] = round(min(2.0, rate / dense_rate), 3)
    return out


# the batch a GPU's expert prefill share is timed at (64 tokens an expert, as a 1K prompt)
EXPERT_PREFILL_PROBE_TOKENS = 1024


def expert_prefill_scale_on(index: int, dev: DeviceProfile, *,
                            tokens: int = EXPERT_PREFILL_PROBE_TOKENS, reps: int = 2,
                            scale_down: bool = False) -> float:
    """A GPU's routed experts in a prefill batch against its dense rates (``dev``): Qwen3-30B-
    A3B's gate experts (128 of 2048 x 768, 8 a token) over ``tokens`` tokens, priced as the
    cost model prices them (the experts some token picks, at the dense rate for each one's
    share of the tokens), over the time they took. llama.cpp's grouped expert kernels reach a
    fraction of a dense matmul's throughput at the same tokens per weight."""
    width, ff, n_expert, used = (256, 96, 16, 2) if scale_down else (2048, 768, 128, 8)
    with ggml_bench.backend(index, 1) as be:
        s = ggml_bench.expert_matmul_seconds(be, "Q4_0", width, ff, n_expert, used, tokens,
                                             reps=reps, shared_input=True)
    picked = 1.0 - (1.0 - used / n_expert) ** tokens  # as planner.cost._active
    per_expert = max(1.0, tokens * used / (n_expert * picked))
    priced = (n_expert * picked * ggml_bench.ggml_weight_bytes("Q4_0", width, ff)
              / dev.rate("Q4_0", per_expert))
    return round(min(2.0, priced / s), 3)


def prefill_token_seconds(prof: Profile, small: step_bench.CopyComputeRun,
                          large: step_bench.CopyComputeRun) -> tuple[float, float]:
    """What a prefill in VRAM spends beyond the cost model's price of it (the profile's rates
    and overheads, without these terms), per token after the first: (per layer, per ubatch).
    The larger probe's extra over the smaller one's, per added layer, is the first; what the
    smaller one has left beyond its layers' share, the second. A probe faster than its price
    gives 0."""
    assert prof.gpu is not None
    base = prof.model_copy(update={"gpu": prof.gpu.model_copy(
        update={"prefill_token_layer_s": 0.0, "prefill_token_s": 0.0})})

    def unpriced(r: step_bench.CopyComputeRun) -> float:
        assert r.inventory is not None and r.plan is not None
        return r.seconds - ubatch_cost(r.inventory, r.plan, base, r.tokens, 0,
                                       output_tokens=1).total

    layers, tokens = large.n_layers - small.n_layers, large.tokens - 1
    if layers <= 0 or tokens <= 0:
        return 0.0, 0.0
    per_layer = max(0.0, (unpriced(large) - unpriced(small)) / (layers * tokens))
    rest = unpriced(small) - small.n_layers * tokens * per_layer
    return per_layer, max(0.0, rest / tokens)


def _measure_profile(
    *, threads: int, fast: bool, k: int, n: int, progress: Callable[[float, str], None] | None,
    scale_down: bool, problems: list[str],
) -> Profile:
    devices = list_devices()
    cpu = next(d for d in devices if d.kind == "cpu")
    gpu = next((d for d in devices if d.is_gpu), None)
    tokens = FAST_TOKENS if fast else TOKENS
    reps = 2 if fast else 3
    steps = len(TYPES) * len(tokens) * (2 if gpu else 1) + (10 if gpu else 1) + 1
    done = 0

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        if progress:
            progress(done / steps, what)

    # CPU weights timed in the layout llama.cpp will load them in here
    cpu_buft = ggml_bench.repack_buffer_type() if cpu_weights_repacked(gpu is not None) else None

    def device_rates(
        index: int, n_threads: int, label: str, budget: dict[int, int],
        shape: tuple[int, int] = (k, n), weights_buft: int | None = None,
    ) -> dict[str, dict[int, float]]:
        rates: dict[str, dict[int, float]] = {}
        with ggml_bench.backend(index, n_threads) as be:
            for t in TYPES:
                rates[t] = {}
                for tok in tokens:
                    s = ggml_bench.matmul_seconds(be, t, *shape, tok, reps=reps,
                                                  total_bytes=budget[tok],
                                                  weights_buft=weights_buft)
                    rates[t][tok] = ggml_bench.ggml_weight_bytes(t, *shape) / s
                    tick(f"{label} {t} x{tok}")
        return rates

    def expert_scale(index: int, n_threads: int, dense_rate: float, budget: int,
                     weights_buft: int | None) -> dict[str, float]:
        out = expert_scale_on(index, n_threads, dense_rate, budget, reps=reps,
                              scale_down=scale_down, weights_buft=weights_buft)
        tick("experts")
        return out

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
                             matmul_rate=device_rates(cpu.index, threads, "cpu", cpu_bytes,
                                                      weights_buft=cpu_buft))
    cpu_prof.expert_scale = expert_scale(cpu.index, threads, cpu_prof.matmul_rate["Q4_0"][1],
                                         cpu_bytes[1] // 2, cpu_buft)
    cpu_prof.attn_flops, cpu_prof.attn_kv_bps = attention(cpu.index, threads)
    _add_step_overhead(cpu_prof, gpu=False, threads=threads, problems=problems)
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
    prof.gpu.expert_scale = expert_scale(gpu.index, 1, gpu_rates["Q4_0"][1], gpu_bytes[1] // 2,
                                         None)
    prof.gpu.expert_scale["prefill"] = expert_prefill_scale_on(gpu.index, prof.gpu, reps=reps,
                                                               scale_down=scale_down)
    tick("experts in a prefill")
    _add_step_overhead(prof.gpu, gpu=True, threads=threads, problems=problems)
    tick("gpu step overhead")
    prof.h2d_pinned_bps = pinned  # (the stream rates' ceiling)
    prof.h2d_pageable_bps = pageable
    prof.stream_cpu_slowdown = cpu_slowdown_under_copy(
        cpu.index, gpu.index, threads, cpu_bytes[1], cpu_buft, shape=(k, n), reps=reps)
    tick("cpu beside a copy")
    # before the stream rates: their probes' prefills pay it too
    small, large = (step_bench.copy_compute_seconds(pinned=True, threads=threads, n_layers=n,
                                                    tokens=PREFILL_PROBE_TOKENS, streamed=False)
                    for n in STREAM_PROBE_LAYERS)
    prof.gpu.prefill_token_layer_s, prof.gpu.prefill_token_s = prefill_token_seconds(
        prof, small, large)
    tick("prefill in VRAM")
    prof.stream_pinned_bps = _stream_rate(prof, pinned=True, threads=threads)
    tick("copy-compute pinned")
    prof.stream_mapped_bps = _stream_rate(prof, pinned=False, threads=threads)
    tick("copy-compute mapped")
    prof.pcie = _nvml_facts().get("pcie", "")
    prof.gpu_fixed_bytes = _nvml_own_vram(gpu.pci_bus_id)
    return prof


COPY_BESIDE_BYTES = 256 * 1024 * 1024  # one copy of the loop beside the CPU's timed matmuls


def slowdown(alone_before_s: float, beside_s: float, alone_after_s: float) -> float:
    """How much longer work took beside another (0: no slower), against the mean of the same
    work alone just before and just after it (a drift of the machine's speed cancels)."""
    alone = (alone_before_s + alone_after_s) / 2
    if not (alone > 0 and math.isfinite(beside_s)):
        raise ValueError(f"not a timing: {alone_before_s}, {beside_s}, {alone_after_s}")
    return max(0.0, beside_s / alone - 1.0)


def cpu_slowdown_under_copy(cpu_index: int, gpu_index: int, threads: int, total_bytes: int,
                            weights_buft: int | None, *, shape: tuple[int, int],
                            reps: int) -> float:
    """``Profile.stream_cpu_slowdown`` measured: the CPU's one-token Q4_0 matmuls (the CPU's
    share of a pipelined decode) timed alone, beside a pinned host-to-GPU copy looping on a
    thread of its own (the streamed weights' copies read the same host memory), and alone
    again."""
    k, n = shape

    def timed(be: int) -> float:
        return ggml_bench.matmul_seconds(be, "Q4_0", k, n, 1, reps=reps, total_bytes=total_bytes,
                                         weights_buft=weights_buft)

    with ggml_bench.backend(cpu_index, threads) as be:
        before = timed(be)
        with ggml_bench.h2d_copying(gpu_index, COPY_BESIDE_BYTES) as copies:
            beside = timed(be)
            if copies() == 0:  # the copy never ran beside the timing: nothing was measured
                raise RuntimeError("no host-to-GPU copy finished beside the CPU's matmuls")
        after = timed(be)
    return slowdown(before, beside, after)


def _add_step_overhead(dev: DeviceProfile, *, gpu: bool, threads: int,
                       problems: list[str]) -> None:
    """Per-layer and per-step decode overhead (see :func:`step_overhead`); left at 0 (not
    measured: the cost model leaves it out) where every probe was disturbed.

    The probe's tiny layers (tens of KB of weights) are read from the CPU's caches, at a rate
    no profile entry holds: pricing them at the memory rate of the matmul table, as this once
    did, subtracted more than they cost — on a 2-core CPU all of the ~17 us measured, leaving
    a per-layer overhead of 0. So the whole per-layer time counts as overhead (on a GPU those
    bytes take nanoseconds either way)."""
    try:
        o = step_overhead(gpu=gpu, threads=threads)
    except NoisyProfileError as e:
        problems.append(f"{dev.kind} decode overhead not measured: {e.message}")
        dev.layer_overhead_s = dev.step_overhead_s = 0.0
        return
    dev.layer_overhead_s = o.layer_s
    dev.step_overhead_s = o.step_s


def _plausible(o: step_bench.StepOverhead) -> bool:
    return 0.0 <= o.layer_s <= MAX_LAYER_OVERHEAD_S and 0.0 <= o.step_s <= MAX_STEP_OVERHEAD_S


def step_overhead(*, gpu: bool, threads: int, runs: int = _OVERHEAD_RUNS,
                  tries: int = _OVERHEAD_TRIES) -> step_bench.StepOverhead:
    """The decode overhead probe, repeated until ``runs`` undisturbed probes agree: the median
    of those. A probe is disturbed when it runs beyond the plausible bounds, or when its
    per-layer cost comes out as none (the 4-layer model was slowed more than the 16-layer one:
    a real per-layer cost is tens of microseconds). Raises :class:`NoisyProfileError` when not
    one of ``tries`` probes is plausible."""
    kept: list[step_bench.StepOverhead] = []
    flat: list[step_bench.StepOverhead] = []  # plausible, but no per-layer cost seen
    seen: list[step_bench.StepOverhead] = []
    for _ in range(tries):
        o = step_bench.step_overhead(gpu=gpu, threads=threads)
        seen.append(o)
        if _plausible(o):
            (kept if o.layer_s > 0 else flat).append(o)
        if len(kept) >= runs:
            break
    if not kept and len(flat) < runs:
        worst = max(seen, key=lambda o: o.step_s)
        raise NoisyProfileError(
            f"the machine was too busy to measure its decode overhead ({len(seen)} probes, "
            f"up to {worst.step_s * 1e3:.1f} ms per step and {worst.layer_s * 1e6:.0f} us per "
            f"layer; a quiet machine takes well under {MAX_STEP_OVERHEAD_S * 1e3:.0f} ms and "
            f"{MAX_LAYER_OVERHEAD_S * 1e6:.0f} us): nothing was cached; measure again when it "
            "is quieter")
    use = kept or flat  # none with a per-layer cost in any probe: it is too small to see
    if len(kept) < len(seen):
        log.info("decode overhead: kept %d of %d probes (the others were disturbed)",
                 len(use), len(seen))
    return step_bench.StepOverhead(layer_s=statistics.median(o.layer_s for o in use),
                                   step_s=statistics.median(o.step_s for o in use),
                                   layer_weight_bytes=use[0].layer_weight_bytes)


def profile_problems(prof: Profile) -> list[str]:
    """Why ``prof`` cannot be a measurement of an undisturbed machine (empty: it can): rates
    that are not positive and finite, decode overheads beyond the plausible bounds."""
    problems = []
    for dev in (prof.cpu, prof.gpu):
        if dev is None:
            continue
        bad = [f"{ty} x{tok}" for ty, table in dev.matmul_rate.items()
               for tok, rate in table.items() if not (math.isfinite(rate) and rate > 0)]
        if not dev.matmul_rate or bad:
            problems.append(f"{dev.kind} matmul rates missing or not positive ({', '.join(bad)})")
        if not 0 <= dev.layer_overhead_s <= MAX_LAYER_OVERHEAD_S:
            problems.append(f"{dev.kind} per-layer overhead {dev.layer_overhead_s * 1e6:.0f} us "
                            f"(plausible: at most {MAX_LAYER_OVERHEAD_S * 1e6:.0f} us)")
        if not 0 <= dev.step_overhead_s <= MAX_STEP_OVERHEAD_S:
            problems.append(f"{dev.kind} per-step overhead {dev.step_overhead_s * 1e3:.1f} ms "
                            f"(plausible: at most {MAX_STEP_OVERHEAD_S * 1e3:.0f} ms)")
        for name in ("attn_flops", "attn_kv_bps"):
            value = getattr(dev, name)
            if not (math.isfinite(value) and value >= 0):
                problems.append(f"{dev.kind} {name} {value}")
    if not 0 <= prof.stream_cpu_slowdown <= MAX_STREAM_CPU_SLOWDOWN:
        problems.append(f"the CPU {prof.stream_cpu_slowdown:.2f}x slower beside a copy to the GPU "
                        f"(plausible: at most {MAX_STREAM_CPU_SLOWDOWN:.0f}x)")
    return problems


STREAM_PROBE_LAYERS = (2, 6)
PREFILL_PROBE_TOKENS = 1024  # a 1K prompt's ubatch


def _stream_rate(prof: Profile, *, pinned: bool, threads: int) -> float:
    small, large = (step_bench.copy_compute_seconds(pinned=pinned, threads=threads, n_layers=n)
                    for n in STREAM_PROBE_LAYERS)
    return stream_rate(prof, large, small)


def stream_rate(prof: Profile, run: step_bench.CopyComputeRun,
                smaller: step_bench.CopyComputeRun | None = None) -> float:
    """Weight bytes per second streamed by copy-compute in a real prefill: the ubatch's time
    less what the cost model prices of it besides the copies (matmuls, attention, overheads,
    the per-token prefill work; for a run without its model and plan, the GPU's matmuls and
    step overheads), never above a single large pinned copy's rate.

    With ``smaller`` (the same probe with fewer layers) the rate is the marginal one: the extra
    layers' bytes over their extra time. A ubatch also pays costs that do not grow with the
    streamed bytes (the first copy's latency, the embeddings and logits, synchronisation:
    about 1 ms on an H100 host); divided into one 2-layer probe's 250 MB they understated the
    rate a real model streams at by a fifth (31 vs 39 GB/s), and TTFT came out 15% high."""
    assert prof.gpu is not None
    # copies at the raw rate: the model's price of everything else is taken off
    raw = prof.model_copy(update={"stream_pinned_bps": 0.0, "stream_mapped_bps": 0.0})

    def priced(r: step_bench.CopyComputeRun) -> tuple[float, int]:
        streamed = sum(r.weight_bytes.values())
        if r.inventory is not None and r.plan is not None:  # the probe's own ubatch, priced
            u = ubatch_cost(r.inventory, r.plan, raw, r.tokens, 0, output_tokens=1)
            return r.seconds - (u.total - u.copy_s), streamed
        matmul_s = sum(b / prof.gpu.rate(t, r.tokens) for t, b in r.weight_bytes.items())
        fixed_s = r.n_layers * prof.gpu.layer_overhead_s + prof.gpu.step_overhead_s
        return r.seconds - matmul_s - fixed_s, streamed

    copy_s, streamed = priced(run)
    if smaller is not None and smaller.n_layers < run.n_layers:
        copy_small, streamed_small = priced(smaller)
        copy_s, streamed = copy_s - copy_small, streamed - streamed_small
    # (no ceiling and no time left over: 0, unmeasured, and the copy rates stand in; an
    # infinite rate would be written to the profile's JSON as null)
    ceiling = prof.h2d_pinned_bps
    if copy_s <= 0:
        return ceiling
    return min(ceiling, streamed / copy_s) if ceiling > 0 else streamed / copy_s


def cached_before_backend(threads: int | None = None,
                          directory: Path | None = None) -> Profile | None:
    """This machine's cached profile, found without starting llama.cpp's backend — which
    :func:`fingerprint` does (it lists llama.cpp's devices), and which fixes the copy-compute
    threshold for the process. Matches every fingerprint entry known without the backend (all
    but the backends, and the GPU's name without NVML); None unless exactly one profile with a
    GPU matches. Only for choosing that threshold: plans use :func:`load_or_measure`'s."""
    known = {"cpu": _cpu_model(), "threads": str(threads or default_threads()),
             "wait": omp_wait.in_effect(os.environ), "llama_cpp": llama_cpp.__version__}
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
        if (prof.gpu is not None and all(prof.fingerprint.get(k) == v for k, v in known.items())
                and not profile_problems(prof)):
            found.append(prof)
    return found[0] if len(found) == 1 else None


def cached_profile(threads: int | None = None, directory: Path | None = None) -> Profile | None:
    """This machine's cached profile, or None: none cached, or the cached one is implausible
    (a disturbed measurement cached by an older version), which is then measured again."""
    cached = Profile.cached(fingerprint(threads or default_threads()), directory)
    if cached is None:
        return None
    problems = profile_problems(cached)
    if problems:
        log.warning("the cached profile %s was measured on a busy machine (%s): measuring again",
                    cached.key, "; ".join(problems))
        return None
    return cached


def load_or_measure(
    *, threads: int | None = None, fast: bool = True, refresh: bool = False,
    progress: Callable[[float, str], None] | None = None, problems: list[str] | None = None,
) -> Profile:
    """The cached profile for this machine, measuring (and caching) it if there is none, or
    ``refresh``. A noisy measurement is never cached: one beyond the plausible bounds raises
    :class:`NoisyProfileError`; one taken while other processes held the CPU serves this run
    only, with the reasons added to ``problems`` (or logged as a warning without that list)."""
    threads = threads or default_threads()
    if not refresh:
        cached = cached_profile(threads)
        if cached is not None:
            return cached
    noted: list[str] = []
    prof = measure_profile(threads=threads, fast=fast, progress=progress, problems=noted)
    implausible = profile_problems(prof)
    if implausible:
        raise NoisyProfileError("the machine was too busy to measure (" + "; ".join(implausible)
                                + "): nothing was cached; measure again when it is quieter "
                                "(igi-sdk profile --refresh)")
    if noted:
        if problems is not None:
            problems.extend(noted)
        else:
            log.warning("this machine's profile is not cached: %s; measure again when it is "
                        "quieter (igi-sdk profile --refresh)", "; ".join(noted))
        return prof
    prof.save()
    return prof
