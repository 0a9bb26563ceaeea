"""Per decoded token: the engine's own work around llama_decode (Python, bookkeeping, events)
apart from the native time (llama_decode, the sampler's calls into llama.cpp, other llama_*
calls), on the real engine.

    python benchmarks/per_token_overhead.py [--models tiny,default] [--gpu] [--threads 2]
        [--tokens 96] [--repeats 3] [--json out.json]
    python benchmarks/per_token_overhead.py --tps MODEL.gguf [--gpu]   # decode tok/s as shipped

``--tps``: decode tokens per second of one reply as shipped (``EngineConfig()``), greedy and
sampled, 128 tokens, three replies each: the figure to set beside upstream's
``llama-bench -m MODEL.gguf -p 0 -n 128 -ngl 99 -fa on`` on the same machine.

Cases: one reply greedy, one sampled (temperature 0.7, top-p 0.9), one under a JSON schema,
and 16 replies decoding in the same steps (greedy). Every ``llama_*`` function of llama_cpp is
wrapped while a case runs (:class:`NativeProbe`; nothing is wrapped otherwise) and every
``llama_decode`` is stamped, so a steady decode step is split into: the interval from one
``llama_decode`` to the next, the native time inside it, and the rest, which is the engine's
own work. On a GPU llama_decode returns before the graph is done and the wait lands in the
first call that reads the logits (the sampler's): native time still holds it. The wrappers'
own cost, calibrated on the same host, is taken off the rest. Medians over steady steps (every
reply feeding its one sampled token), per decoded token; ``--json`` writes every figure.

Models: ``tiny`` (the 2-layer synthetic Llama: llama_decode is short, the per-token work shows),
``tiny-128k`` (the same layers with Llama-3's 128 256-token vocabulary: the sampler's cost per
vocabulary entry shows), ``llama3-2l`` (two of Llama-3-8B's layers, its width and vocabulary:
a real output head), ``default`` (SmolLM2-135M). ``--gpu``: every tensor in VRAM
(``Plan.all_gpu``), the case this measures for.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import llama_cpp

from igi_sdk.model import default_model_path, read_inventory, spec_with, write_synthetic_gguf
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams, sampling

SCHEMA = {"type": "object", "properties": {
    "mood": {"type": "string", "enum": ["calm", "angry", "afraid"]},
    "line": {"type": "string"}, "gold": {"type": "integer"}},
    "required": ["mood", "line", "gold"]}
# the sampler's own calls into llama.cpp (the logits read included: on a GPU it is the wait)
_SAMPLER = ("llama_sampler_", "llama_get_logits", "igi_sdk.runtime.sampling.")
# where the engine's native functions are: llama_cpp's bindings, and the sampler's own binding
# of the logits read (module attributes, looked up at each call)
_WRAPPED = ((llama_cpp, "llama_"), (sampling, "_logits_at"))


@dataclass
class _Call:
    calls: int = 0
    ns: int = 0


@dataclass
class NativeProbe:
    """Wraps every ``llama_*`` ctypes function of llama_cpp (module attributes, which is how
    the engine calls them) to count calls and time them; ``decodes`` stamps each llama_decode
    as (start ns, end ns, batch tokens, native ns before it, native calls before it). Undo
    with :meth:`close`."""

    by_name: dict[str, _Call] = field(default_factory=dict)
    decodes: list[tuple[int, int, int, int, int]] = field(default_factory=list)
    native_ns: int = 0
    n_calls: int = 0
    log: list[str] | None = None  # every call's name, in order, when a list is given
    _saved: dict[str, Callable[..., object]] = field(default_factory=dict)

    def install(self) -> NativeProbe:
        for module, prefix in _WRAPPED:
            for name in dir(module):
                fn = getattr(module, name)
                if name.startswith(prefix) and isinstance(fn, ctypes._CFuncPtr):
                    label = name if module is llama_cpp else f"{module.__name__}.{name}"
                    self._saved[label] = fn
                    setattr(module, name, self._wrap(label, fn))
        return self

    def close(self) -> None:
        for module, _prefix in _WRAPPED:
            for label, fn in self._saved.items():
                name = label.rpartition(".")[2]
                if (label == name) == (module is llama_cpp) and hasattr(module, name):
                    setattr(module, name, fn)
        self._saved.clear()

    def reset(self) -> None:
        self.by_name.clear()
        self.decodes.clear()
        self.native_ns = 0
        self.n_calls = 0

    def _wrap(self, name: str, fn: Callable[..., object]) -> Callable[..., object]:
        clock = time.perf_counter_ns
        rec = self.by_name

        if name == "llama_decode":
            def decode(ctx: object, batch: llama_cpp.llama_batch) -> object:
                before, calls = self.native_ns, self.n_calls
                self.n_calls += 1
                if self.log is not None:
                    self.log.append(name)
                t0 = clock()
                out = fn(ctx, batch)
                t1 = clock()
                self.native_ns += t1 - t0
                c = rec.setdefault(name, _Call())
                c.calls += 1
                c.ns += t1 - t0
                self.decodes.append((t0, t1, batch.n_tokens, before, calls))
                return out
            return decode

        def call(*args: object) -> object:
            t0 = clock()
            out = fn(*args)
            dt = clock() - t0
            self.native_ns += dt
            self.n_calls += 1
            if self.log is not None:
                self.log.append(name)
            c = rec.setdefault(name, _Call())
            c.calls += 1
            c.ns += dt
            return out
        return call

    def calls_matching(self, prefixes: tuple[str, ...]) -> tuple[int, int]:
        """(calls, ns) of the functions whose names start with one of ``prefixes``."""
        hits = [c for n, c in self.by_name.items() if n.startswith(prefixes)]
        return sum(c.calls for c in hits), sum(c.ns for c in hits)

    def steady_steps(self, width: int) -> list[tuple[int, int, int]]:
        """(interval ns, native ns, llama_decode ns) from each llama_decode of ``width``
        tokens to the next one of ``width`` tokens (steady steps: every reply feeding its one
        sampled token)."""
        out = []
        for a, b in zip(self.decodes, self.decodes[1:], strict=False):
            if a[2] == width and b[2] == width:
                out.append((b[0] - a[0], b[3] - a[3], a[1] - a[0]))
        return out

    def steady_calls(self, width: int) -> list[int]:
        """Native calls from each llama_decode of ``width`` tokens to the next such one (the
        llama_decode included)."""
        return [b[4] - a[4] for a, b in zip(self.decodes, self.decodes[1:], strict=False)
                if a[2] == width and b[2] == width]


@contextmanager
def probed() -> Iterator[NativeProbe]:
    probe = NativeProbe().install()
    try:
        yield probe
    finally:
        probe.close()


def wrapper_cost_ns(rounds: int = 20000) -> float:
    """What one wrapped call adds outside its timed span (the wrapper's entry, exit and
    bookkeeping), on a native call that does almost nothing."""
    fn = llama_cpp.llama_time_us
    probe = NativeProbe()
    wrapped = probe._wrap("llama_time_us", fn)
    best_raw = best_wrapped = float("inf")
    for _ in range(5):
        t0 = time.perf_counter_ns()
        for _ in range(rounds):
            fn()
        best_raw = min(best_raw, (time.perf_counter_ns() - t0) / rounds)
        probe.reset()
        t0 = time.perf_counter_ns()
        for _ in range(rounds):
            wrapped()
        inside = probe.native_ns / rounds
        best_wrapped = min(best_wrapped, (time.perf_counter_ns() - t0) / rounds - inside)
    return max(0.0, best_wrapped)


@dataclass(frozen=True)
class Case:
    name: str
    replies: int
    sampling: SamplingParams
    json_schema: dict | None = None


CASES = (
    Case("1 reply, greedy", 1, SamplingParams(temperature=0.0, repeat_penalty=1.0)),
    Case("1 reply, sampled", 1, SamplingParams(temperature=0.7, top_p=0.9, seed=7)),
    Case("1 reply, json schema", 1, SamplingParams(temperature=0.0, repeat_penalty=1.0),
         SCHEMA),
    Case("16 replies, greedy", 16, SamplingParams(temperature=0.0, repeat_penalty=1.0)),
)


@dataclass
class Row:
    model: str
    case: str
    replies: int
    steps: int  # steady steps measured
    step_us: float  # median interval between llama_decode starts
    decode_us: float  # median llama_decode per step
    sampler_us: float  # per step: the sampler's calls into llama.cpp
    other_native_us: float  # per step: every other llama_* call
    overhead_us: float  # per decoded token: the engine's own work (probe cost taken off)
    overhead_range_us: tuple[float, float]  # over the repeats
    around_us: float  # per decoded token: all but llama_decode (sampler natives + our work)
    around_range_us: tuple[float, float]
    native_calls_per_token: float
    calls: dict[str, float]  # llama_* calls per decoded token, by name


def run_case(eng: Engine, case: Case, tokens: int, probe_ns: float) -> dict[str, object]:
    sids = [eng.open_session("You are a blacksmith in a village.", sampling=case.sampling)
            for _ in range(case.replies)]
    try:
        # prompts first, untimed: the steady steps that follow feed one token per reply
        with probed() as probe:
            hs = [eng.chat(s, "Tell me about the old mine north of town.", max_tokens=tokens,
                           ignore_eos=case.json_schema is None, json_schema=case.json_schema)
                  for s in sids]
            results = [h.result(600) for h in hs]
        n_tok = sum(r.completion_tokens for r in results)
        steps = probe.steady_steps(case.replies)
        if not steps:
            widths = [d[2] for d in probe.decodes]
            raise RuntimeError(f"{case.name}: no steady decode steps ({n_tok} tokens, "
                               f"batches of {widths})")
        sampler_calls, sampler_ns = probe.calls_matching(_SAMPLER)
        all_calls = sum(c.calls for c in probe.by_name.values())
        decode = probe.by_name["llama_decode"]
        other_ns = probe.native_ns - sampler_ns - decode.ns
        per_step_calls = all_calls / max(1, decode.calls)
        probe_step = per_step_calls * probe_ns
        overheads = [(iv - nat - probe_step) / case.replies for iv, nat, _ in steps]
        # everything but llama_decode: the sampler's native calls and the engine's own work
        around = [(iv - dec - probe_step) / case.replies for iv, _, dec in steps]
        return {
            "steps": len(steps),
            "step_us": statistics.median(iv for iv, _, _ in steps) / 1e3,
            "decode_us": statistics.median(d for _, _, d in steps) / 1e3,
            "sampler_us": sampler_ns / max(1, decode.calls) / 1e3,
            "other_native_us": other_ns / max(1, decode.calls) / 1e3,
            "overhead_us": statistics.median(overheads) / 1e3,
            "around_us": statistics.median(around) / 1e3,
            "native_calls_per_token": all_calls / max(1, n_tok),
            "calls": {n: round(c.calls / max(1, n_tok), 3)
                      for n, c in sorted(probe.by_name.items()) if c.calls},
            "sampler_calls_per_token": sampler_calls / max(1, n_tok),
        }
    finally:
        for s in sids:
            eng.close_session(s)


def model_path(name: str, tmp: Path) -> Path:
    if name == "default":
        return default_model_path()
    if name == "tiny":
        return write_synthetic_gguf(tmp / "tiny-llama.gguf", "tiny-llama")
    if name == "tiny-128k":
        return write_synthetic_gguf(tmp / "tiny-128k.gguf",
                                    spec_with("tiny-llama", n_vocab=128256))
    if name == "llama3-2l":
        return write_synthetic_gguf(tmp / "llama3-2l.gguf", spec_with("llama3-8b", n_layers=2))
    raise SystemExit(f"unknown model {name!r} (tiny, tiny-128k, llama3-2l, default)")


def measure(model: str, path: Path, *, gpu: bool, threads: int, tokens: int,
            repeats: int, cases: tuple[Case, ...]) -> list[Row]:
    plan = Plan.all_gpu(read_inventory(path)) if gpu else Plan.all_cpu()
    # prompts in one or two steps: the 16 replies then decode together from the start
    cfg = EngineConfig(n_ctx=16 * (tokens + 160), max_sessions=16, n_threads=threads,
                       context_floor=0, prefill_chunk=1024)
    probe_ns = wrapper_cost_ns()
    rows = []
    with Engine(path, plan, cfg) as eng:
        run_case(eng, CASES[0], 16, probe_ns)  # warm-up: graphs, allocator, grammar tokenizer
        for case in cases:
            runs = [run_case(eng, case, tokens, probe_ns) for _ in range(repeats)]
            mid = sorted(runs, key=lambda r: r["overhead_us"])[len(runs) // 2]
            over = [float(r["overhead_us"]) for r in runs]  # type: ignore[arg-type]
            around = [float(r["around_us"]) for r in runs]  # type: ignore[arg-type]
            rows.append(Row(model, case.name, case.replies, int(mid["steps"]),  # type: ignore[arg-type]
                            round(float(mid["step_us"]), 1), round(float(mid["decode_us"]), 1),  # type: ignore[arg-type]
                            round(float(mid["sampler_us"]), 1),  # type: ignore[arg-type]
                            round(float(mid["other_native_us"]), 1),  # type: ignore[arg-type]
                            round(float(mid["overhead_us"]), 1),  # type: ignore[arg-type]
                            (round(min(over), 1), round(max(over), 1)),
                            round(float(mid["around_us"]), 1),  # type: ignore[arg-type]
                            (round(min(around), 1), round(max(around), 1)),
                            round(float(mid["native_calls_per_token"]), 2),  # type: ignore[arg-type]
                            mid["calls"]))  # type: ignore[arg-type]
    return rows


def decode_tps(path: Path, *, gpu: bool, tokens: int = 128) -> dict[str, list[float]]:
    plan = Plan.all_gpu(read_inventory(path)) if gpu else Plan.all_cpu()
    out: dict[str, list[float]] = {}
    with Engine(path, plan, EngineConfig()) as eng:
        for name, sp in (("greedy", SamplingParams(temperature=0.0, repeat_penalty=1.0)),
                         ("sampled", SamplingParams(temperature=0.7, top_p=0.9, seed=1))):
            sid = eng.open_session(None, sampling=sp)
            eng.chat(sid, "hello " * 16, max_tokens=8, ignore_eos=True).result()  # warm-up
            out[name] = [round(eng.chat(sid, f"tell me {k}", max_tokens=tokens,
                                        ignore_eos=True).result().decode_tps, 1)
                         for k in range(3)]
            eng.close_session(sid)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="tiny,default")
    ap.add_argument("--gpu", action="store_true", help="every tensor in VRAM (Plan.all_gpu)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=96, help="tokens per reply")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cases", default="", help="comma-separated case numbers (1-4); all")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--tps", type=Path, help="decode tok/s of this GGUF as shipped, then exit")
    a = ap.parse_args()
    if a.tps:
        tps = decode_tps(a.tps, gpu=a.gpu)
        print("decode tok/s", json.dumps(tps), {k: statistics.median(v) for k, v in tps.items()})
        return
    picked = tuple(CASES[int(i) - 1] for i in a.cases.split(",") if i) or CASES
    rows: list[Row] = []
    print(f"probe cost {wrapper_cost_ns():.0f} ns per wrapped call (taken off)", file=sys.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        for m in a.models.split(","):
            rows += measure(m, model_path(m, Path(tmp)), gpu=a.gpu, threads=a.threads,
                            tokens=a.tokens, repeats=a.repeats, cases=picked)
    print("per step: step (llama_decode to llama_decode), decode (inside it), µs; per decoded "
          "token: all but llama_decode, and of that the engine's own (non-native) work, µs "
          "(median of the repeats' medians, range over repeats)")
    print(f"{'model':10s} {'case':22s} {'step':>8s} {'decode':>8s} {'all but decode':>22s} "
          f"{'own work':>22s} {'llama_*/tok':>11s}")
    for r in rows:
        print(f"{r.model:10s} {r.case:22s} {r.step_us:8.1f} {r.decode_us:8.1f} "
              f"{r.around_us:7.1f} ({r.around_range_us[0]:5.1f}-{r.around_range_us[1]:5.1f}) "
              f"{r.overhead_us:7.1f} ({r.overhead_range_us[0]:5.1f}-{r.overhead_range_us[1]:5.1f}) "
              f"{r.native_calls_per_token:11.2f}")
    if a.json:
        a.json.write_text(json.dumps({"gpu": a.gpu, "threads": a.threads,
                                      "rows": [asdict(r) for r in rows]}, indent=1))


if __name__ == "__main__":
    main()
