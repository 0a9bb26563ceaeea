"""`igi-sdk` command line: chat with an NPC, inspect a model, check the machine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import igi_sdk
from igi_sdk.errors import IgiError

DEFAULT_PERSONA = (
    "You are Brom, the blacksmith of the village of Oakvale. You are gruff but kind, proud of "
    "your swords, and you speak to travellers in one or two short sentences, always in character."
)
DEFAULT_LINE = "Greetings, smith! I need a blade for the road north. What can you offer me?"


def _fmt_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"


class _ProgressBar:
    """A one-line load progress bar on stderr (only when stderr is a terminal or forced)."""

    def __init__(self, label: str, enabled: bool) -> None:
        self.label, self.enabled, self.last = label, enabled, -1

    def __call__(self, p: float) -> None:
        pct = int(p * 100)
        if not self.enabled or pct == self.last:
            return
        self.last = pct
        bar = "#" * (pct // 4)
        sys.stderr.write(f"\r{self.label} [{bar:<25}] {pct:3d}%")
        if pct >= 100:
            sys.stderr.write("\n")
        sys.stderr.flush()


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
    raise IgiError(f"unknown plan '{name}': use all-cpu, all-gpu, attn-gpu or a plan JSON file")


# --- chat ----------------------------------------------------------------------------------------


def cmd_chat(args: argparse.Namespace) -> int:
    from igi_sdk.model import default_model_path, read_inventory
    from igi_sdk.runtime import Engine, EngineConfig, SamplingParams

    path = Path(args.model) if args.model else default_model_path()
    inventory = read_inventory(path)
    plan = _resolve_plan(args.plan, inventory)
    sampling = SamplingParams.create(temperature=args.temperature, seed=args.seed)
    bar = _ProgressBar(f"loading {path.name}", enabled=sys.stderr.isatty() or args.progress)
    config = EngineConfig(n_ctx=args.ctx, max_sessions=2, n_threads=args.threads)
    with Engine(path, plan, config, progress=bar) as engine:  # type: ignore[arg-type]
        sid = engine.open_session(args.system, sampling=sampling, priority=1)
        schema = Path(args.json_schema).read_text() if args.json_schema else None
        if args.message is not None or not sys.stdin.isatty():
            line = args.message if args.message is not None else sys.stdin.read().strip()
            _say(engine, sid, line or DEFAULT_LINE, args, schema)
            return 0
        print("(type a line for the NPC; an empty line or /quit ends)", file=sys.stderr)
        while True:
            try:
                line = input("you> ").strip()
            except EOFError:
                break
            if not line or line == "/quit":
                break
            _say(engine, sid, line, args, schema)
    return 0


def _say(engine: object, sid: str, line: str, args: argparse.Namespace, schema: str | None) -> None:
    print(f"you> {line}")
    gen = engine.chat(sid, line, max_tokens=args.max_tokens, json_schema=schema)  # type: ignore[attr-defined]
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

    from igi_sdk.model import default_model_path
    from igi_sdk.runtime import list_devices

    print(f"igi-sdk           {igi_sdk.__version__}")
    print(f"llama-cpp-python  {llama_cpp.__version__}")
    print(f"llama.cpp system  {llama_cpp.llama_print_system_info().decode().strip()}")
    print(f"GPU offload       {'yes' if llama_cpp.llama_supports_gpu_offload() else 'no'}")
    print("devices:")
    for d in list_devices():
        print(f"  [{d.index}] {d.name:<10} {d.kind:<5} {d.description}  "
              f"free {_fmt_bytes(d.free_bytes)} / {_fmt_bytes(d.total_bytes)}  "
              f"(buffer {d.buffer_type})")
    print(f"NVML              {_nvml_status()}")
    try:
        print(f"default model     {default_model_path()}")
    except IgiError as e:
        print(f"default model     missing: {e}")
    return 0


def _nvml_status() -> str:
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:  # noqa: BLE001 - any failure means "no NVML here"
        return f"not available ({type(e).__name__})"
    try:
        n = pynvml.nvmlDeviceGetCount()
        names = [pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i)) for i in range(n)]
        gpus = ", ".join(map(str, names))
        return f"driver {pynvml.nvmlSystemGetDriverVersion()}, {n} GPU(s): {gpus}"
    finally:
        pynvml.nvmlShutdown()


# --- entry point ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="igi-sdk", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    c = sub.add_parser("chat", help="talk to an NPC (one line as an argument, or interactive)")
    c.add_argument("message", nargs="?", help="the player's line; omit for an interactive chat")
    c.add_argument("--model", help="GGUF file (default: the embedded SmolLM2-135M-Instruct)")
    c.add_argument("--system", default=DEFAULT_PERSONA, help="the NPC's persona / system prompt")
    c.add_argument("--plan", default="all-cpu",
                   help="placement: all-cpu, all-gpu, attn-gpu, or a plan JSON file")
    c.add_argument("--max-tokens", type=int, default=96)
    c.add_argument("--temperature", type=float, default=0.7)
    c.add_argument("--seed", type=int, default=42)
    c.add_argument("--ctx", type=int, default=2048)
    c.add_argument("--threads", type=int, default=0, help="CPU threads (0 = all cores)")
    c.add_argument("--json-schema", help="constrain the reply to this JSON schema file")
    c.add_argument("--progress", action="store_true", help="show load progress even when piped")
    c.set_defaults(fn=cmd_chat)

    i = sub.add_parser("inspect", help="tensor inventory of a GGUF: bytes per group and layer")
    i.add_argument("model")
    i.add_argument("--layers", type=int, nargs="*", help="only these layers in the per-layer table")
    i.set_defaults(fn=cmd_inspect)

    d = sub.add_parser("doctor", help="llama.cpp build, devices, NVML, default model")
    d.set_defaults(fn=cmd_doctor)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.fn(args))
    except IgiError as e:
        print(f"igi-sdk: error [{e.code}]: {e.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
