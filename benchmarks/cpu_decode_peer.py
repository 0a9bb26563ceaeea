"""Greedy decode of the default model through igi_sdk against llama-cpp-python's own loop
(``llama_cpp.Llama.generate``), at the same threads, context, batch and attention, alternating
in one run (A B A B ...), so a shared, loaded host weighs on both alike.

    python benchmarks/cpu_decode_peer.py [--threads 2] [--ctx 2048] [--tokens 128] [--rounds 4]
        [--modes engine,llama,sidecar] [--sessions 1] [--wait spin] [--json out.json]

``engine``: the engine in this process (no sockets: its own cost); ``llama``: ``Llama.generate``
at temperature 0 (its greedy sampler), each token's text detokenized as the engine does;
``sidecar``: ``igi-sdk serve`` in a process of its own, streamed to this one over IPC (as
shipped; ``sidecar-each``: ``--stream-every-ms 0``, each token's text sent as it comes;
``sidecar-base``: the sidecar of another checkout, ``--base-tree``, for a change's A/B). libgomp
reads its wait once, when it loads: this process has igi_sdk's default (or the one in the
environment), and the sidecar is started with the same (``--wait``). libgomp cuts its spin to
100 rounds while its teams hold more threads than there are CPUs: ``engine`` and ``llama`` in
this one process make two teams, so beside ``engine`` both run so (like with like, but not as
``llama`` runs alone); leave ``engine`` out to compare the sidecar with ``llama`` as each runs
alone. Every mode reads the same
raw prompt (no chat template) and decodes ``--tokens`` tokens; a rate counts the tokens after
the first over the time after the first, as the caller saw them. Prints each round's rates, the
medians and each mode's median ratio to ``llama`` (ratios of the same round, A and B back to
back); the greedy tokens of ``engine`` and ``llama`` are compared.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from igi_sdk.client import Client  # noqa: E402
from igi_sdk.model import default_model_path  # noqa: E402
from igi_sdk.planner import Plan  # noqa: E402
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams  # noqa: E402

PROMPT = ("The history of the old castle on the hill is long. It was built by a king who "
          "wanted to guard the river crossing, and over the centuries")


class Row(Protocol):
    def run(self, n: int) -> float: ...


def _rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0


class LlamaPeer:
    def __init__(self, path: Path, a: argparse.Namespace) -> None:
        import llama_cpp  # after igi_sdk: libgomp loads with the wait igi_sdk sets

        self.llm = llama_cpp.Llama(str(path), n_ctx=a.ctx, n_batch=a.batch, n_ubatch=a.batch,
                                   n_threads=a.threads, n_threads_batch=a.threads,
                                   flash_attn=a.flash == "on", verbose=False)
        self.prompt = self.llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
        self.tokens: list[int] = []

    def run(self, n: int) -> float:
        self.llm.reset()
        stamps: list[float] = []
        out: list[int] = []
        for tok in self.llm.generate(self.prompt, temp=0.0, repeat_penalty=1.0):
            self.llm.detokenize([tok])
            stamps.append(time.perf_counter())
            out.append(tok)
            if len(out) >= n:
                break
        self.tokens = out
        return _rate(stamps)


class EnginePeer:
    def __init__(self, path: Path, a: argparse.Namespace, plan: Plan | None = None) -> None:
        plan = (plan or Plan.all_cpu()).model_copy(update={"flash_attn": a.flash})
        cfg = EngineConfig(n_ctx=a.ctx, max_sessions=a.sessions, n_batch=a.batch,
                           n_threads=a.threads,
                           launch_ahead=getattr(a, "launch_ahead", "auto"),
                           stream_every_s=getattr(a, "stream_every_ms", 0.0) / 1000)
        self.eng = Engine(path, plan, cfg)
        self.greedy = SamplingParams(temperature=0.0, repeat_penalty=1.0)
        self.tokens: list[int] = []

    def run(self, n: int) -> float:
        gen = self.eng.complete_async(PROMPT, sampling=self.greedy, max_tokens=n,
                                      ignore_eos=True).result()
        stamps = [time.perf_counter() for _piece in gen]
        self.tokens = list(gen.result().tokens)
        while self.eng.sessions():  # its session closes after the reply: the slot is free
            time.sleep(0.001)
        # pieces may hold several tokens (an incomplete UTF-8 sequence waits for the next)
        return (len(self.tokens) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0

    def close(self) -> None:
        self.eng.close()


class SidecarPeer:
    def __init__(self, path: Path, a: argparse.Namespace, stream_every_ms: float | None = None,
                 tree: Path = REPO) -> None:
        endpoint = f"ipc://{tempfile.mkdtemp(prefix='igi-peer-')}/s.sock"
        cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint,
               "--threads", str(a.threads), "--ctx", str(a.ctx), "--max-sessions",
               str(a.sessions), "--wait", a.wait, "--no-arbiter"]
        if stream_every_ms is not None:
            cmd += ["--stream-every-ms", str(stream_every_ms)]
        # ``-m`` puts the working directory first on the path: the tree's igi_sdk runs
        self.proc = subprocess.Popen(cmd, cwd=tree, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        self.c = Client(endpoint, timeout=60)
        self.c.wait_ready(180)
        self.tokens: list[int] = []
        self.settings: list[dict[str, object]] = []
        self.pieces: list[int] = []  # text pieces each reply came in

    def run(self, n: int) -> float:
        stream = self.c.complete(PROMPT, max_tokens=n, sampling={"temperature": 0,
                                                                 "repeat_penalty": 1})
        stamps = [time.perf_counter() for _ in stream]
        # a piece may carry several tokens (serve --stream-every-ms); the first carries one
        tokens = int((stream.done or {})["usage"]["completion_tokens"])
        # the thread setting it ran at, and why (the host's load it read)
        threads = self.c.stats().get("engine", {}).get("threads", {})
        self.settings.append({k: threads.get(k) for k in ("setting", "ceiling", "other_cores",
                                                          "other_runnable", "switches")})
        self.pieces.append(len(stamps))
        return (tokens - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0

    def close(self) -> None:
        self.c.close()
        self.proc.kill()
        self.proc.wait()


def alternate(rows: Mapping[str, Row], modes: list[str], rounds: int, tokens: int,
              settle: float = 0.0) -> dict[str, list[float]]:
    """Each row's figure for ``tokens`` tokens, ``rounds`` times, the rows alternating (A B,
    then B A, ...) after one warm-up each (graphs, allocators), ``settle`` seconds before each."""
    out: dict[str, list[float]] = {m: [] for m in modes}
    for m in modes:
        rows[m].run(16)
    for r in range(rounds):
        for m in modes if r % 2 == 0 else modes[::-1]:
            time.sleep(settle)
            out[m].append(round(rows[m].run(tokens), 4))
        print(f"round {r}: " + "  ".join(f"{m} {out[m][-1]:.3f}" for m in modes), flush=True)
    return out


def report(out: dict[str, object], path: str) -> int:
    """Print the run's figures as one JSON line and, given a ``path``, write them there."""
    print(json.dumps(out))
    if path:
        Path(path).write_text(json.dumps(out, indent=1) + "\n")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--sessions", type=int, default=1, help="engine/sidecar max_sessions")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--flash", choices=("on", "off"), default="on")
    ap.add_argument("--wait", choices=("auto", "spin", "sleep"), default="spin",
                    help="the sidecar's serve --wait (set this process's with the environment)")
    ap.add_argument("--modes", default="engine,llama")
    ap.add_argument("--busy", type=int, default=0, help="processes spinning meanwhile")
    ap.add_argument("--settle", type=float, default=2.0,
                    help="seconds between rows: the sidecar reads the host's load over a "
                         "one-second window and runs fewer threads while another process "
                         "works, so a row right after the peer's would run beside its shadow")
    ap.add_argument("--stream-every-ms", type=float, default=None,
                    help="the sidecar row's serve --stream-every-ms (default: serve's own)")
    ap.add_argument("--base-tree", type=Path, default=None,
                    help="another checkout (git worktree add DIR REV) whose sidecar runs as "
                         "the sidecar-base row, as shipped there")
    ap.add_argument("--json", default="")
    a = ap.parse_args()
    path = default_model_path()
    modes = a.modes.split(",")
    if "sidecar-base" in modes and a.base_tree is None:
        ap.error("the sidecar-base row runs another checkout's sidecar: give --base-tree DIR")
    make: dict[str, Callable[[Path, argparse.Namespace], Row]] = {
        "engine": EnginePeer, "llama": LlamaPeer,
        "sidecar": lambda p, a: SidecarPeer(p, a, stream_every_ms=a.stream_every_ms),
        # the sidecar sending every token's text as it comes (serve --stream-every-ms 0)
        "sidecar-each": lambda p, a: SidecarPeer(p, a, stream_every_ms=0),
        # another checkout's sidecar (--base-tree), as shipped there: a change A/B in one run
        "sidecar-base": lambda p, a: SidecarPeer(p, a, tree=a.base_tree)}
    peers = {m: make[m](path, a) for m in modes}
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(a.busy)]
    load0 = os.getloadavg()[0]
    try:
        rates = alternate(peers, modes, a.rounds, a.tokens, a.settle)
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        for p in peers.values():
            if hasattr(p, "close"):
                p.close()
    out: dict[str, object] = {
        "machine": f"{platform.machine()} {os.cpu_count()} CPUs, load {load0:.2f} at start, "
                   f"{os.getloadavg()[0]:.2f} at end",
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "wait_env": {k: os.environ.get(k) for k in
                                      ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")},
        "tok_s": rates, "median_tok_s": {m: statistics.median(v) for m, v in rates.items()}}
    for m in ("sidecar", "sidecar-each", "sidecar-base"):
        if m in peers:
            out[f"{m}_threads"] = peers[m].settings  # type: ignore[attr-defined]
            out[f"{m}_pieces"] = peers[m].pieces  # type: ignore[attr-defined]
    if "llama" in rates:
        out["ratio_to_llama"] = {
            m: round(statistics.median(x / y for x, y in zip(v, rates["llama"], strict=True)), 3)
            for m, v in rates.items() if m != "llama"}
    if "engine" in peers and "llama" in peers:
        n = min(len(peers["engine"].tokens), len(peers["llama"].tokens))
        out["greedy_same"] = peers["engine"].tokens[:n] == peers["llama"].tokens[:n]
    return report(out, a.json)


if __name__ == "__main__":
    sys.exit(main())
