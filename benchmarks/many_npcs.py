"""Many NPCs talking at once: the sidecar as shipped against upstream ``llama-server --parallel N``.

For each VRAM budget and each NPC count N, two kinds of rows on the same model, the same prompts
and the same machine:

* ``ours``     — ``igi-sdk serve --vram B --max-sessions N --ctx N x CTX`` (the arbiter on, its
  plan settled first); one client connection and one session per NPC (a connection streams at
  most four replies at once, and a game's NPCs may live in different clients);
* ``upstream`` — ``llama-server --parallel N -c N x CTX -fa on -ub 2048 -b 2048`` on the same
  model, placed within the NVML peak of our row: by llama.cpp's own ``--fit`` (``--fit-target``
  = free memory minus that peak, re-fitted with the overshoot added) where this llama-server has
  it, else by the largest ``-ngl`` whose peak fits (a short search); ``--peer-placement`` picks
  (``fit``, ``ngl`` or both, the faster row then compared). Budget ``full``: ours without a cap,
  llama-server with ``-ngl 99``.

Each NPC has its own card and scene (about 300 to 1000 tokens, spread evenly over the NPCs: see
npc_scenes.py). All N requests go out together (a barrier), greedy, each for exactly TOKENS
tokens: llama-server with ``ignore_eos``; the sidecar's protocol has no such switch, so a reply
that ends early is counted with the tokens it has (the table notes it). Per row: aggregate
tokens/s (every NPC's tokens over the wall from the first request to the last stream's end),
each NPC's TTFT (median, p90, max), the wall, and the NVML peak of the process (the device's
used memory over the baseline taken before it started; the process's own figure beside it).
Without NVML (a CPU machine) there are no peaks, and llama-server runs on the CPU (``-ngl 0``).

Every row has a timeout, the whole run a deadline; servers are stopped when a row ends, fails, or
the run is killed (SIGTERM). JSON (``npcs.json``), a markdown table (``npcs.md``) and the
servers' logs go to ``--out`` after every row.

    python benchmarks/many_npcs.py --model /tmp/igi-bench/llama3-8b.gguf --budgets 4,8 \
        --npcs 4,16 --tokens 128 --threads 16 --llama-server /tmp/lcpp/build/bin/llama-server \
        --out OUT [--profile P] [--deadline EPOCH] [-- more serve arguments]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from http_peer import MIB, GapClock, VramSampler, gpu_free_bytes, stream_chat
from npc_scenes import Npc, Reply, best_ngl, markdown, next_ngl, npc_prompts, summarize

if TYPE_CHECKING:
    from igi_sdk.client import Client

GB = 10**9
T0 = time.monotonic()
_live: list[subprocess.Popen[bytes]] = []  # servers to stop whatever happens


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f} s] {msg}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    if proc in _live:
        _live.remove(proc)


def _child_env() -> dict[str, str]:
    # the servers get the caller's environment, without this process's client-only switch
    return {k: v for k, v in os.environ.items() if k != "IGI_SDK_CLIENT_ONLY"}


def _peak(v: dict[str, int | None]) -> int | None:
    """The device's used memory over its baseline (what the budget means), else the process's
    own NVML figure."""
    return v.get("dev_peak") or v.get("proc_peak") or None


def run_npcs(npcs: list[Npc], one: Callable[[int, Npc, threading.Barrier], Reply],
             deadline: float, on_late: Callable[[], None]) -> list[Reply]:
    """Each NPC's turn on its own thread, all released together; past ``deadline`` (monotonic)
    ``on_late`` ends the server so that every stream ends."""
    barrier = threading.Barrier(len(npcs))
    got: dict[int, Reply] = {}

    def body(i: int, npc: Npc) -> None:
        try:
            got[i] = one(i, npc, barrier)
        except Exception as e:  # noqa: BLE001 - recorded in the row
            barrier.abort()
            got[i] = Reply(i, time.perf_counter(), None, None, 0, error=repr(e)[:300])

    threads = [threading.Thread(target=body, args=(i, n), daemon=True)
               for i, n in enumerate(npcs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    if any(t.is_alive() for t in threads):
        say("  the row ran past its timeout: its server is stopped")
        on_late()
        for t in threads:
            t.join(20)
    return [got.get(i, Reply(i, time.perf_counter(), None, None, 0, error="no answer in time"))
            for i in range(len(npcs))]


# --- ours -------------------------------------------------------------------------------------

def ours_row(args: argparse.Namespace, budget: str, n: int, npcs: list[Npc],
             end: float) -> dict[str, Any]:
    from igi_sdk.client import Client  # here: the process is client-only by then (main)

    ep = f"ipc://{tempfile.mkdtemp(prefix='igi-npcs-')}/s.sock"
    model = Path(args.model)
    # -X faulthandler: a sidecar that never becomes ready is asked for its threads' stacks
    cmd = [sys.executable, "-X", "faulthandler", "-m", "igi_sdk.cli", "serve", "--endpoint", ep,
           "--model-dir",
           str(model.parent), "--model", model.name, "--max-sessions", str(n), "--ctx",
           str(n * args.ctx_per_npc), "--log-file", str(args.logs / f"ours-{budget}-{n}.log"),
           *(["--threads", str(args.threads)] if args.threads else []),
           *(["--vram", str(int(float(budget) * GB))] if budget != "full" else []),
           *(["--profile", args.profile] if args.profile else []),
           *(["--talking", str(n)] if args.talking_all else []), *args.extra]
    row: dict[str, Any] = {"side": "ours", "budget": budget, "n": n, "cmd": " ".join(cmd),
                           "placement": "as shipped"}
    out = (args.logs / f"ours-{budget}-{n}.out").open("w")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=_child_env())
    _live.append(proc)
    sampler = VramSampler(proc.pid)
    clients: list[Client] = []
    try:
        ctl = Client(ep, timeout=30)
        clients.append(ctl)
        try:
            _wait_ready(ctl, proc, end - 30)
        except Exception:
            row["not_ready"] = _why_not_ready(ctl, proc)
            raise
        row["plan"] = _settle(ctl, args.settle_s, end - 30)
        row["ready_s"] = round(time.monotonic() - T0, 1)
        warm = ctl.open_session("You are a guard.", sampling={"temperature": 0})
        ctl.chat(warm, "Hello there.", max_tokens=4).result()
        ctl.close_session(warm)
        say(f"  ours ready on plan {row['plan']}; VRAM so far {sampler.mark()}")
        sids = []
        for npc in npcs:  # one connection per NPC: a connection streams four replies at most
            c = Client(ep, timeout=30)
            clients.append(c)
            sids.append(c.open_session(npc.card, sampling={"temperature": 0}))

        def one(i: int, npc: Npc, barrier: threading.Barrier) -> Reply:
            barrier.wait(30)
            sent = time.perf_counter()
            clock = GapClock()
            stream = clients[i + 1].chat(sids[i], npc.line, max_tokens=args.tokens)
            for _ in stream:
                clock.piece()
            done = stream.done or {}
            usage = done.get("usage") or {}
            return Reply(i, sent, clock.first, time.perf_counter(),
                         int(usage.get("completion_tokens", 0)),
                         int(usage.get("prompt_tokens", 0)), str(done.get("finish_reason")),
                         max_gap_s=clock.max_gap_s)

        watch = EngineWatch(Client(ep, timeout=5), every_s=args.watch_every_s)
        try:
            replies = run_npcs(npcs, one, end, lambda: _stop(proc))
        finally:
            row["engine_samples"] = watch.stop()
        row.update(summarize(replies, args.tokens))
        row["replies"] = [asdict(r) for r in replies]
        row["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - the next rows still run
        row["status"] = f"failed: {e!r}"[:400]
        row["trace"] = traceback.format_exc()[-1500:]
    finally:
        for c in clients:
            c.close()
        _stop(proc)
        out.close()
        row["vram"] = {**sampler.stop(), "baseline": sampler.baseline or None}
        row["vram"]["peak"] = _peak(row["vram"])
    if row.get("status") != "ok":
        # a device call brings few files back: the sidecar's last words go into the row
        row["sidecar_output_tail"] = _tail(args.logs / f"ours-{budget}-{n}.out", 120)
    row["fits_budget"] = _fits(row["vram"]["peak"], budget)
    return row


class EngineWatch:
    """The sidecar's engine as the NPCs talk: every ``every_s`` its ``stats`` (the last step's
    time and prompt chunk, the replies decoding, the thread setting), on a thread and a
    connection of its own (a client's sockets belong to one thread)."""

    MAX_SAMPLES = 600

    def __init__(self, client: Client, every_s: float = 1.0) -> None:
        self._client, self._every = client, every_s
        self._stop = threading.Event()
        self.samples: list[dict[str, Any]] = []
        self._t0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._every) and len(self.samples) < self.MAX_SAMPLES:
            try:
                eng = self._client.stats().get("engine") or {}
            except Exception:  # noqa: BLE001 - a sample missed; the run goes on
                continue
            step, threads = eng.get("step") or {}, eng.get("threads") or {}
            self.samples.append({"t": round(time.monotonic() - self._t0, 2),
                                 "replies": eng.get("active_replies"),
                                 "step_s": step.get("last_s"), "chunk": step.get("chunk"),
                                 "target_s": step.get("target_s"),
                                 "threads": threads.get("setting")})

    def stop(self) -> list[dict[str, Any]]:
        self._stop.set()
        self._thread.join(10)
        self._client.close()
        return self.samples


def _wait_ready(ctl: Client, proc: subprocess.Popen[bytes], end: float) -> None:
    """``ctl.wait_ready`` in short polls until ``end`` (monotonic), failing as soon as the
    sidecar has exited (a start that fails, e.g. on an import, is seen in seconds, not at the
    row's timeout)."""
    from igi_sdk.client import SidecarUnavailable

    while True:
        try:
            ctl.wait_ready(min(1.0, max(0.1, end - time.monotonic())))
            return
        except SidecarUnavailable:
            if proc.poll() is not None:
                raise SidecarUnavailable(f"the sidecar exited ({proc.returncode}) "
                                         "before it was ready") from None
            if time.monotonic() >= end:
                raise


def _why_not_ready(ctl: Client, proc: subprocess.Popen[bytes]) -> dict[str, Any]:
    """What a sidecar that did not become ready was doing: its last ``stats`` (if it answers)
    and, by SIGABRT under ``-X faulthandler``, every thread's stack in its output."""
    why: dict[str, Any] = {"exit_code": proc.poll()}
    try:
        why["stats"] = ctl.request("stats", timeout=2.0)
    except Exception as e:  # noqa: BLE001 - recorded
        why["stats"] = repr(e)[:200]
    if proc.poll() is None:
        proc.send_signal(signal.SIGABRT)
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            pass
    return why


def _tail(path: Path, lines: int = 40) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()[-lines:]
    except OSError as e:
        return [f"(unreadable: {e})"]


def _settle(c: Client, settle_s: float, end: float) -> str | None:
    """Under the VRAM arbiter the model climbs its plan ladder first: wait until the plan has
    held ``settle_s``."""
    seen: object = None
    since = time.monotonic()
    while time.monotonic() - since < settle_s and time.monotonic() < end:
        st = c.stats()
        now = (st.get("plan"), (st.get("arbiter") or {}).get("reshards"))
        if now != seen:
            seen, since = now, time.monotonic()
        time.sleep(0.25)
    return c.stats().get("plan")


def _fits(peak: int | None, budget: str) -> bool:
    return budget == "full" or peak is None or peak <= float(budget) * GB


# --- upstream ---------------------------------------------------------------------------------

class Upstream:
    """One llama-server: started, ready, warmed by one short reply (it allocates at start; the
    reply makes the peak a turn's), then stopped."""

    def __init__(self, args: argparse.Namespace, n: int, placement: list[str], tag: str,
                 env: dict[str, str] | None = None) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.cmd = [args.llama_server, "-m", args.model, "--parallel", str(n), "-c",
                    str(n * args.ctx_per_npc), "-fa", "on", "-ub", "2048", "-b", "2048",
                    "--host", "127.0.0.1", "--port", str(port),
                    *(["-t", str(args.threads)] if args.threads else []),
                    *(["--no-webui"] if "--no-webui" in args.server_help else []),
                    *placement, *args.peer_args.split()]
        self.log = args.logs / f"llama-server-{tag}.log"
        env = env or {}
        with self.log.open("a") as f:
            f.write(" ".join([*(f"{k}={v}" for k, v in env.items()), *self.cmd]) + "\n")
        self._logf = self.log.open("a")
        # the copy-compute threshold is the placement's to set (fit-stream), never inherited:
        # a plain --fit peer runs at llama.cpp's default
        base = {k: v for k, v in _child_env().items() if k != STREAM_ENV}
        self.proc = subprocess.Popen(self.cmd, stdout=self._logf, stderr=subprocess.STDOUT,
                                     env={**base, **env})
        _live.append(self.proc)
        self.sampler = VramSampler(self.proc.pid)
        self.vram: dict[str, int | None] | None = None

    def ready(self, end: float) -> float:
        t0 = time.monotonic()
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode} "
                                   f"(log {self.log})")
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    with httpx.Client() as c:
                        stream_chat(c, f"{self.url}/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": "Hello there."}],
                                     "max_tokens": 4, "temperature": 0}, end)
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise TimeoutError("llama-server was not ready in time")

    def peak(self) -> int | None:
        v = self.sampler.mark()
        return _peak(v)

    def offload(self) -> str:
        """What it placed where, from its log."""
        self._logf.flush()
        keep = ("offloaded", "n_gpu_layers", "fit", "CUDA0 model buffer", "CUDA0 KV buffer",
                "CUDA0 compute buffer", "CPU_Mapped model buffer", "KV buffer size")
        lines = [ln.strip() for ln in self.log.read_text(errors="replace").splitlines()
                 if any(k in ln for k in keep)]
        return " | ".join(lines[-8:])[:1200]

    def stop(self) -> dict[str, int | None]:
        if self.vram is None:
            _stop(self.proc)
            self._logf.close()
            v = self.sampler.stop()
            self.vram = {**v, "peak": _peak(v), "baseline": self.sampler.baseline or None}
        return self.vram


def upstream_rows(args: argparse.Namespace, budget: str, n: int, npcs: list[Npc],
                  limit: int | None, end: float) -> list[dict[str, Any]]:
    """One row per placement asked for (each its own share of the time left)."""
    if not args.llama_server or not Path(args.llama_server).exists():
        return [{"side": "upstream", "budget": budget, "n": n,
                 "status": f"skipped: no llama-server ({args.llama_server or 'none given'})"}]
    nvml = gpu_free_bytes() is not None
    if budget == "full" or not nvml:
        modes = ["all-gpu" if nvml else "cpu"]
    else:
        modes = [m for m in args.peer_placement.split(",") if m != "auto"] or \
            ["fit" if "--fit" in args.server_help else "ngl"]
    rows = []
    for k, mode in enumerate(modes):
        share = end - (end - time.monotonic()) * (len(modes) - k - 1) / (len(modes) - k)
        rows.append(upstream_row(args, budget, n, npcs, limit, mode, share))
    return rows


def _fit_off(args: argparse.Namespace) -> list[str]:
    return ["--fit", "off"] if "--fit" in args.server_help else []


def upstream_row(args: argparse.Namespace, budget: str, n: int, npcs: list[Npc],
                 limit: int | None, mode: str, end: float) -> dict[str, Any]:
    row: dict[str, Any] = {"side": "upstream", "budget": budget, "n": n, "mode": mode,
                           "limit_bytes": limit, "attempts": []}
    tag = f"{budget}-{n}-{mode}"
    srv: Upstream | None = None
    try:
        time.sleep(1.0)  # the previous server's memory goes back to the device
        if mode in ("all-gpu", "cpu"):
            placement = [*_fit_off(args), "-ngl", "99" if mode == "all-gpu" else "0"]
            srv = Upstream(args, n, placement, tag)
            row["attempts"].append({"flags": " ".join(placement),
                                    "ready_s": round(srv.ready(end - 20), 1),
                                    "peak": srv.peak()})
        elif limit is None:
            raise RuntimeError("no VRAM figure of ours to fit to")
        elif mode == "fit":
            srv, placement = _fit(args, n, limit, tag, end, row["attempts"])
        elif mode == "fit-stream":
            srv, placement = _fit(args, n, limit, tag, end, row["attempts"], stream=True)
        elif mode == "ngl":
            srv, placement = _ngl(args, n, limit, tag, end, row["attempts"])
        else:
            raise ValueError(f"unknown placement {mode!r} (fit, fit-stream, ngl)")
        row["placement"] = " ".join(placement)
        row["offload"] = srv.offload()
        say(f"  llama-server {row['placement']}: {row['attempts'][-1]}")
        running = srv
        url = f"{srv.url}/v1/chat/completions"

        def one(i: int, npc: Npc, barrier: threading.Barrier) -> Reply:
            body = {"messages": [{"role": "system", "content": npc.card},
                                 {"role": "user", "content": npc.line}],
                    "max_tokens": args.tokens, "n_predict": args.tokens, "ignore_eos": True,
                    "temperature": 0}
            with httpx.Client() as c:
                barrier.wait(30)
                sent = time.perf_counter()
                t = stream_chat(c, url, body, end)
            return Reply(i, sent, sent + t.ttft_s if t.completion_tokens else None,
                         sent + t.turn_s, t.completion_tokens, t.prompt_tokens,
                         "cut" if t.cut else "length", max_gap_s=t.max_gap_s)

        replies = run_npcs(npcs, one, end, running.stop)
        row.update(summarize(replies, args.tokens))
        row["replies"] = [asdict(r) for r in replies]
        row["status"] = "ok"
    except Exception as e:  # noqa: BLE001 - the next rows still run
        row["status"] = f"failed: {e!r}"[:400]
        row["trace"] = traceback.format_exc()[-1500:]
    finally:
        if srv is not None:
            row["vram"] = srv.stop()
    peak = (row.get("vram") or {}).get("peak")
    row["fits_budget"] = limit is None or peak is None or peak <= limit + args.tolerance_mib * MIB
    return row


STREAM_ENV = "GGML_OP_OFFLOAD_MIN_BATCH"  # ggml-cuda's copy-compute threshold (default 32)


def stream_setting(min_batch: int) -> tuple[list[str], dict[str, str]]:
    """What an expert gives llama-server so that a decode batch of several NPCs streams its
    CPU-resident weights to the GPU, as our planner does when NPCs talk together: the weights in
    pinned host memory (``-lm none``: llama.cpp then loads them into the CUDA host buffer, not a
    mapping) and ggml-cuda's copy-compute threshold lowered from its default 32 tokens."""
    return ["-lm", "none"], {STREAM_ENV: str(min_batch)}


def _fit(args: argparse.Namespace, n: int, limit: int, tag: str, end: float,
         attempts: list[dict[str, Any]], *, stream: bool = False) -> tuple[Upstream, list[str]]:
    """llama.cpp's own fit: ``--fit-target`` is the memory it leaves free, so free memory minus
    our peak; an overshoot is added to the margin and it is fitted again (three tries).
    ``stream``: with ``stream_setting(--peer-stream-from)``."""
    free = gpu_free_bytes() or 0
    margin = max(0, (free - limit) // MIB) + args.fit_slack_mib
    extra, env = stream_setting(args.peer_stream_from) if stream else ([], {})
    for k in range(3):
        flags = ["--fit", "on", "--fit-target", str(margin), *extra]
        srv = Upstream(args, n, flags, tag, env)
        # the label names the environment too: it is part of the placement
        placement = [*(f"{name}={value}" for name, value in env.items()), *flags]
        rec: dict[str, Any] = {"flags": " ".join(placement)}
        attempts.append(rec)
        rec["ready_s"] = round(srv.ready(end - 30), 1)
        rec["peak"] = peak = srv.peak()
        over = (peak or 0) - limit
        if over <= args.tolerance_mib * MIB or k == 2:
            return srv, placement
        say(f"  --fit-target {margin}: {over / MIB:.0f} MiB over; fitted again")
        srv.stop()
        margin += -(-over // MIB) + 32
    raise AssertionError("unreachable")


def _ngl(args: argparse.Namespace, n: int, limit: int, tag: str, end: float,
         attempts: list[dict[str, Any]]) -> tuple[Upstream, list[str]]:
    """The largest ``-ngl`` whose peak fits our peak: probes stepped by the per-layer cost they
    show (npc_scenes.next_ngl); the last probe's server is kept when it is the one chosen."""
    top = args.n_layers + 1  # every repeating layer and the output layer
    probes: dict[int, int] = {}
    ngl: int | None = max(0, min(top, int(top * limit / max(1, args.model_bytes + limit))))
    srv: Upstream | None = None
    running = -1  # the -ngl of srv
    for _ in range(args.ngl_probes):
        if ngl is None or time.monotonic() > end - 60:
            break
        if srv is not None:
            srv.stop()
        placement = [*_fit_off(args), "-ngl", str(ngl)]
        srv, running = Upstream(args, n, placement, tag), ngl
        rec: dict[str, Any] = {"flags": " ".join(placement)}
        attempts.append(rec)
        rec["ready_s"] = round(srv.ready(end - 30), 1)
        probes[ngl] = rec["peak"] = srv.peak() or 0
        ngl = next_ngl(probes, limit, top)
    best = best_ngl(probes, limit)
    best = min(probes, default=0) if best is None else best  # none fits: the smallest tried
    placement = [*_fit_off(args), "-ngl", str(best)]
    if srv is None or running != best:
        if srv is not None:
            srv.stop()
        srv = Upstream(args, n, placement, tag)
        rec = {"flags": " ".join(placement), "ready_s": round(srv.ready(end - 30), 1)}
        rec["peak"] = srv.peak()
        attempts.append(rec)
    return srv, placement


# --- the run ----------------------------------------------------------------------------------

def _model_layers(model: str) -> int:
    """The model's block count (gguf-py; no llama.cpp in this process)."""
    from gguf import GGUFReader

    reader = GGUFReader(model)
    arch = bytes(reader.fields["general.architecture"].parts[-1]).decode()
    return int(reader.fields[f"{arch}.block_count"].parts[-1][0])


def _server_help(binary: str | None) -> str:
    if not binary or not Path(binary).exists():
        return ""
    try:
        r = subprocess.run([binary, "--help"], capture_output=True, text=True, timeout=30)
        return r.stdout + r.stderr
    except (OSError, subprocess.TimeoutExpired):
        return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--budgets", default="4", help="VRAM budgets in GB (10^9 bytes), or 'full'")
    ap.add_argument("--npcs", default="4,16", help="NPC counts")
    ap.add_argument("--tokens", type=int, default=128, help="tokens each NPC's reply streams")
    ap.add_argument("--ctx-per-npc", type=int, default=1280,
                    help="KV cells per NPC (both servers get N times this)")
    ap.add_argument("--prompt-tokens", default="300:1000",
                    help="LO:HI, the NPCs' prompt lengths (synthetic tokens) spread evenly")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--profile", help="the machine profile `serve` plans with")
    ap.add_argument("--talking-all", action="store_true",
                    help="tell ours that all N NPCs talk at once (serve --talking N)")
    ap.add_argument("--settle-s", type=float, default=4.0,
                    help="our plan must hold this long before measuring")
    ap.add_argument("--llama-server", help="upstream llama-server (its rows skipped if absent)")
    ap.add_argument("--peer-placement", default="auto",
                    help="fit, fit-stream, ngl, or several (fit,fit-stream); auto: fit where "
                         "llama-server has --fit. fit-stream: --fit with the weights pinned and "
                         "decode batches streaming them (stream_setting)")
    ap.add_argument("--peer-stream-from", type=int, default=2,
                    help="fit-stream's GGML_OP_OFFLOAD_MIN_BATCH (tokens)")
    ap.add_argument("--peer-args", default="", help="more llama-server arguments")
    ap.add_argument("--fit-slack-mib", type=int, default=0,
                    help="added to --fit-target from the first try")
    ap.add_argument("--tolerance-mib", type=int, default=16,
                    help="how far llama-server's peak may exceed ours and still count as fitting")
    ap.add_argument("--ngl-probes", type=int, default=6)
    ap.add_argument("--watch-every-s", type=float, default=1.0,
                    help="how often ours is asked for its engine's last step (engine_samples; "
                         "0.05 traces a sub-second row's prompt reading, step by step at best)")
    ap.add_argument("--row-timeout", type=float, default=180.0)
    ap.add_argument("--deadline", type=float, help="epoch seconds by which the run must end")
    ap.add_argument("--out", default=".", help="npcs.json, npcs.md and the servers' logs")
    ap.add_argument("extra", nargs="*", help="more `igi-sdk serve` arguments (after --)")
    args = ap.parse_args(argv)
    # this process only talks to servers: no llama.cpp here, and no thread-wait policy of the
    # SDK's in the environment llama-server inherits
    os.environ["IGI_SDK_CLIENT_ONLY"] = "1"
    out = Path(args.out)
    args.logs = out / "npcs-logs"
    args.logs.mkdir(parents=True, exist_ok=True)
    args.server_help = _server_help(args.llama_server)
    args.n_layers = _model_layers(args.model)
    args.model_bytes = Path(args.model).stat().st_size
    lo, hi = (int(x) for x in args.prompt_tokens.split(":"))
    deadline = time.monotonic() + ((args.deadline - time.time()) if args.deadline else 3600)
    res: dict[str, Any] = {"model": Path(args.model).name, "tokens": args.tokens,
                           "ctx_per_npc": args.ctx_per_npc, "threads": args.threads,
                           "prompt_tokens": args.prompt_tokens, "serve_extra": args.extra,
                           "llama_server": args.llama_server,
                           "llama_server_has_fit": "--fit" in args.server_help, "rows": []}

    def write() -> None:
        (out / "npcs.json").write_text(json.dumps(res, indent=1))
        (out / "npcs.md").write_text(markdown(res["rows"], args.tokens))

    def add(row: dict[str, Any]) -> None:
        res["rows"].append(row)
        write()
        say(f"{row['side']} {row['budget']} N={row['n']} {row.get('placement', '')}: "
            f"{row.get('aggregate_tps')} tok/s, TTFT median {row.get('ttft_median_s')} s, "
            f"p90 {row.get('ttft_p90_s')} s, wall {row.get('wall_s')} s, peak "
            f"{(row.get('vram') or {}).get('peak')} B, {row.get('status')}")

    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # finally: servers stopped
    say(f"many_npcs: {res['model']}, budgets {args.budgets}, NPCs {args.npcs}, "
        f"{(deadline - time.monotonic()):.0f} s; llama-server --fit: "
        f"{res['llama_server_has_fit']}")
    try:
        for budget in args.budgets.split(","):
            for n in (int(x) for x in args.npcs.split(",")):
                npcs = npc_prompts(n, lo, hi)
                left = deadline - time.monotonic()
                if left < 60:
                    say(f"{budget} N={n}: skipped, {left:.0f} s left")
                    res["rows"].append({"side": "ours", "budget": budget, "n": n,
                                        "status": "skipped: no time left"})
                    continue
                # ours gets up to half of what is left: llama-server's fitting needs more
                end = time.monotonic() + min(args.row_timeout, left / 2)
                say(f"ours, {budget} GB, {n} NPCs ({end - time.monotonic():.0f} s at most)")
                ours = ours_row(args, budget, n, npcs, end)
                add(ours)
                limit = ours["vram"]["peak"]
                if limit is None and budget != "full" and gpu_free_bytes() is not None:
                    limit = int(float(budget) * GB)  # ours failed: the nominal budget
                left = deadline - time.monotonic()
                end = time.monotonic() + min(args.row_timeout * 1.5, left - 5)
                say(f"llama-server, {budget} GB, {n} NPCs ({end - time.monotonic():.0f} s)")
                for row in upstream_rows(args, budget, n, npcs, limit, end):
                    add(row)
    finally:
        for p in list(_live):
            _stop(p)
        write()
        print(markdown(res["rows"], args.tokens), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
