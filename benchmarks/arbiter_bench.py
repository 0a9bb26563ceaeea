"""The VRAM arbiter on a real GPU: a game that allocates and frees VRAM, the sidecar resharding.

    python3 benchmarks/arbiter_bench.py --json OUT/arbiter.json [--pool-gb 8] [--threads 12]

This process is the *game*: it renders a GPU-bound stand-in every frame at 60 FPS (a loop of
matrix products sized to ``--render-ms`` of GPU time), sends ``frame`` ticks with its VRAM use,
and allocates and frees real device memory (``cudaMalloc``/``cudaFree`` through CuPy) as its
phases demand. It first fills the card with a ballast allocation so that the game and the model
share exactly ``--pool-gb`` of VRAM: an allocation past that fails for real, as on a consumer
card. NPCs chat the whole time from a child process on their own connection, logging every
token. Runs, one after another, each with a fresh sidecar (``igi-sdk serve``):

1. **trace** (arbiter on, NVML + the game's reports): menu (model budget 6 GB) → level load (the
   game grows by 4 GB: budget 2 GB) → gameplay (the game frees it: 6 GB) → ``reserve_vram`` of
   3 GB due next frame → gameplay. Then frame times with the NPCs idle, chatting unpaced (no
   target in the ticks) and chatting paced (target 16.7 ms).
2. **static** (arbiter off): the planner's plan for each phase's budget, the same NPC chatter:
   tokens/s beside the trace's phases, and the reference text of a run with no reshards.

``--only trace`` runs the trace alone (no static runs, no reference text): the ``reserve_vram``
figures (VRAM freed, the reply's wait and its outcome: ``granted``, the older ``acknowledged``,
or the error code, e.g. ``cannot_free``, ``deadline_missed``) in a fraction of the time.
``--only prepare`` only writes the model and measures the profile.

``--only greedy`` runs the **greedy game** instead: a game process (``--role greedy-game``, CuPy)
that never speaks the protocol — it never connects to the sidecar, so the arbiter only learns of
it from NVML. It leaves ``--greedy-free-gib`` of the pool to the model, waits for the model to
settle, then, while two NPCs chat, takes device memory in ``--greedy-chunk-mib`` pieces as fast as
it can (a failed ``cudaMalloc`` is counted and retried after ``--greedy-retry-ms``) until it
leaves only ``--greedy-leave-gib`` of the pool or ``--greedy-max-s`` pass, holds it for
``--greedy-hold-s``, frees it, and the run waits for the model to grow back. Meanwhile a probe
process sends ``ping``, ``stats`` and ``frame`` (no VRAM fields: it tells the arbiter nothing)
every ``--probe-ms`` and records each round trip; the bench samples the model's VRAM (NVML's
figure for the sidecar's process, else the arbiter's plan) and plan every ``--sample-ms``.
Result: the game's failed allocations and longest stall, the model's VRAM and plan over time,
control-message latency by type, streams lost (no ``done``, or gaps in the token numbering), the
time to grow back and the reshard records.

``--sim`` runs the same script anywhere: a simulated device (the game's allocations counted, the
model's VRAM from its plan), the render on the CPU, a small model (the default model if installed,
else the synthetic ``tiny-llama``) and a given GPU profile (default: the stored H200 one). With no
NVML, the sidecar learns the greedy game's use from a scripted VRAM trace (``--vram-trace``) of
the same schedule: the pool sizes must then be scaled to the small model's plan ladder, e.g.

    python3 benchmarks/arbiter_bench.py --sim --only greedy --threads 2 --pool-gb 2 \
        --greedy-free-gib 1.3 --greedy-leave-gib 0.7 --greedy-chunk-mib 32 --max-tokens 16 \
        --greedy-settle-s 20 --greedy-max-s 8 --greedy-hold-s 4 --json /tmp/greedy-sim.json

(SmolLM2-135M's ladder on the H200 profile: the CPU plan at 0.57 GiB, all-GPU at 0.89 GiB.)
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import queue
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

# the game and the NPCs only talk to the sidecar: no llama.cpp in these processes (the game
# runs CuPy, whose CUDA libraries must not meet llama.cpp's in one process)
os.environ["IGI_SDK_CLIENT_ONLY"] = "1"

from igi_sdk.client import BridgeError, Client

GB = 10**9
MIB = 1024**2
FPS = 60
FRAME_S = 1 / FPS
HEADROOM = 256 * MIB  # the policy's default headroom
GIB = 1024**3
CHUNK = 256 * MIB  # the game allocates its working set in pieces, as a streaming pool would

# every child process this run starts (sidecars, NPCs, the probe, the greedy game): all are ended
# on the way out, whatever happens
CHILDREN: list[subprocess.Popen] = []
# what the trace and frames runs have so far, for the JSON of a run that fails part-way
PARTIAL: dict = {}


def spawn(cmd: list[str], **kw) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, **kw)
    CHILDREN.append(proc)
    return proc


def end_process(proc: subprocess.Popen, timeout: float = 10.0) -> int | None:
    """SIGTERM, then SIGKILL after ``timeout``; returns the exit code (None if it would not die)."""
    if proc.poll() is None:
        try:
            proc.terminate()
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
        except OSError:
            pass
    try:
        return proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        return None


def end_children() -> None:
    for proc in reversed(CHILDREN):
        if proc.poll() is None:
            try:
                proc.terminate()
            except OSError:
                pass
    end = time.monotonic() + 10
    for proc in reversed(CHILDREN):
        try:
            proc.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                print(f"child {proc.pid} would not die", file=sys.stderr)


def write_json(path: str | Path, data) -> None:
    """Write atomically: a reader (or a run cut short) never sees half a file."""
    tmp = Path(f"{path}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=str))
    os.replace(tmp, path)


def parent_gone(parent: int) -> bool:
    return os.getppid() != parent


# ------------------------------------------------------------------------------ the device


def calibrate(dev, render_ms: float) -> float:
    """Size the device's render loop to ``render_ms`` per frame; returns the median frame."""
    dev.iters = 8
    for _ in range(5):  # warm up (cuBLAS handles, clocks) before timing anything
        dev.render()
    for _ in range(3):  # converge: the clocks settle as the load grows
        one = statistics.median(dev.render() for _ in range(5)) / dev.iters
        dev.iters = max(1, round(render_ms / one))
    return statistics.median(dev.render() for _ in range(20))


class CudaDevice:
    """Real device memory and a GPU-bound render stand-in (CuPy), device figures from NVML."""

    def __init__(self) -> None:
        import cupy as cp
        import pynvml as nv

        self.cp, self.nv = cp, nv
        nv.nvmlInit()
        self.h = nv.nvmlDeviceGetHandleByIndex(0)
        before = self.used()
        cp.cuda.Device(0).use()
        self.a = cp.random.random((2048, 2048), dtype=cp.float32)
        self.b = cp.random.random((2048, 2048), dtype=cp.float32)
        cp.cuda.Device(0).synchronize()
        self.context_bytes = self.used() - before  # this process's CUDA context and buffers
        self.blocks: list = []
        self.iters = 1

    def used(self) -> int:
        return int(self.nv.nvmlDeviceGetMemoryInfo(self.h).used)

    def free(self) -> int:
        return int(self.nv.nvmlDeviceGetMemoryInfo(self.h).free)

    def total(self) -> int:
        return int(self.nv.nvmlDeviceGetMemoryInfo(self.h).total)

    def alloc(self, nbytes: int):
        return self.cp.cuda.Memory(nbytes)  # a plain cudaMalloc, no pool: freed on release

    def render(self) -> float:
        """One frame of GPU work; returns its GPU time in ms (CUDA events)."""
        cp = self.cp
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record()
        c = self.a
        for _ in range(self.iters):
            c = self.a @ self.b
        e1.record()
        e1.synchronize()
        del c
        return cp.cuda.get_elapsed_time(e0, e1)


class SimDevice:
    """A simulated card for running the bench without a GPU: the game's allocations are counted,
    the model's VRAM is its plan's (from ``stats``), the render is a CPU loop."""

    def __init__(self, total: int, model_vram) -> None:
        import numpy as np

        self.np = np
        self._total, self.model_vram = total, model_vram
        self.allocated = 0
        self.context_bytes = 0
        self.a = np.random.random((256, 256)).astype(np.float32)
        self.iters = 1

    def used(self) -> int:
        return self.allocated + self.model_vram()

    def free(self) -> int:
        return self._total - self.used()

    def total(self) -> int:
        return self._total

    def alloc(self, nbytes: int):
        if nbytes > self.free():
            raise MemoryError(f"out of memory allocating {nbytes} bytes")
        dev = self

        class Block:
            def __init__(self) -> None:
                dev.allocated += nbytes
                self.size = nbytes

            def __del__(self) -> None:
                dev.allocated -= self.size

        return Block()

    def render(self) -> float:
        t0 = time.perf_counter()
        for _ in range(self.iters):
            self.a @ self.a
        return (time.perf_counter() - t0) * 1000


# ------------------------------------------------------------------------------ the NPCs


PERSONAS = [("You are Brom, the village smith. Answer in one or two sentences.", 1),
            ("You are Mira, who keeps the inn. Answer in one or two sentences.", 0)]


def follow(c: Client, stream, on_token) -> dict:
    """Read a chat stream's events to its end, ``on_token(body)`` for each token; returns the
    ``done`` body (an ``error`` event raises :class:`BridgeError`)."""
    while stream.done is None:
        rtype, body = c.next_event(stream.id, stream=True)
        if rtype == "token":
            on_token(body)
        elif rtype == "done":
            stream.done = body
        elif rtype == "error":
            raise BridgeError(body.get("code", "error"), body.get("message", ""),
                              bool(body.get("retryable")))
    return stream.done


def npc_role(args: argparse.Namespace) -> int:
    """Child process: two NPCs take turns chatting until SIGTERM or ``--chats`` are done.
    One reply at a time, so every decode step holds one sequence and the text does not depend
    on how replies happened to batch together. The log is rewritten after every chat, so a run
    cut short still has every finished one."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    c = Client(args.endpoint, timeout=120, engine="arbiter-bench-npcs")
    chats: list[dict] = []
    sids: list[str] = []
    k = 0
    try:
        while not stop.is_set() and (args.chats <= 0 or k < args.chats):
            if parent_gone(parent):
                break
            who = k % 2
            if k % 8 == 0:  # fresh conversations now and then: bounded context, same for all runs
                for sid in sids:
                    c.close_session(sid)
                sids = [c.open_session(p, sampling={"seed": 100 + k + i}, priority=prio)
                        for i, (p, prio) in enumerate(PERSONAS)]
            row = {"k": k, "npc": who, "t0": time.time(), "times": [], "seq": [], "text": "",
                   "streamed": ""}
            stream = c.chat(sids[who], f"Traveller {k} asks: what news from the road?",
                            max_tokens=args.max_tokens)
            try:
                def token(body: dict, row: dict = row) -> None:
                    row["times"].append(time.time())
                    row["seq"].append(body["i"])
                    row["streamed"] += body["text"]

                follow(c, stream, token)
                row["completion_tokens"] = stream.done["usage"]["completion_tokens"]
                row["finish"] = stream.done.get("finish_reason")
                row["text"] = stream.done["text"]
            except BridgeError as e:
                row["error"] = f"{e}"
                row["code"] = e.code
            row["t1"] = time.time()
            chats.append(row)
            write_json(args.out, chats)
            k += 1
    finally:
        write_json(args.out, chats)
        c.close()
    return 0


def start_npcs(args: argparse.Namespace, endpoint: str, out: Path, chats: int = 0):
    cmd = [sys.executable, __file__, "--role", "npcs", "--endpoint", endpoint, "--out", str(out),
           "--chats", str(chats), "--max-tokens", str(args.max_tokens)]
    return spawn(cmd)


def stop_npcs(proc, out: Path, timeout: float = 300) -> list[dict]:
    """Ask the NPCs to stop after the reply under way; kill them after ``timeout``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"  the NPCs did not stop in {timeout:.0f} s: killed", flush=True)
        end_process(proc, 1)
    try:
        return json.loads(out.read_text()) if out.exists() else []
    except ValueError:
        return []


# ------------------------------------------------------------------------------ the sidecar


def start_sidecar(args: argparse.Namespace, endpoint: str, *, arbiter: bool,
                  trace: Path | None = None, extra: list[str] | None = None):
    cmd = [sys.executable, "-X", "faulthandler", "-m", "igi_sdk.cli", "serve",
           "--endpoint", endpoint,
           "--model-dir", str(Path(args.model).parent), "--threads", str(args.threads),
           "--profile", args.profile, "--grow-hold", str(args.grow_hold),
           "--game-pid", str(os.getpid())]
    if not arbiter:
        cmd.append("--no-arbiter")
    if trace is not None:
        cmd += ["--vram-trace", str(trace)]
    cmd += extra or []
    log = open(Path(args.workdir) / "sidecar.log", "a")
    return spawn(cmd, stdout=log, stderr=log, env=native_env())


def native_env() -> dict[str, str]:
    """The environment for a process that runs llama.cpp (the sidecar, the profiler)."""
    return {k: v for k, v in os.environ.items() if k != "IGI_SDK_CLIENT_ONLY"}


def stop_sidecar(client: Client, side, timeout: float = 60.0) -> None:
    """Ask the sidecar to exit; kill it if it has not within ``timeout``."""
    try:
        client.shutdown()
    except BridgeError as e:
        print(f"  shutdown: {e}", flush=True)
    client.close()
    try:
        side.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        print("  the sidecar did not exit: killed", flush=True)
        end_process(side, 5)


def greet(client: Client, side, timeout: float = 60.0) -> None:
    """Say hello once the sidecar listens (it takes a moment to start)."""
    end = time.monotonic() + timeout
    while True:
        if side.poll() is not None:
            raise RuntimeError(f"the sidecar exited with code {side.returncode}; see sidecar.log")
        try:
            client.hello()
            return
        except Exception:  # not listening yet
            if time.monotonic() > end:
                raise
            time.sleep(0.2)


class Game:
    """The game's side: frames, its VRAM (ballast + working set), a log of everything."""

    def __init__(self, args: argparse.Namespace, dev, client: Client, pool: int) -> None:
        self.args, self.dev, self.client = args, dev, client
        self.frame = 0
        self.frames: list[dict] = []  # per frame: t, phase, frame_ms, gpu_ms
        self.events: list[dict] = []
        self.ballast: list = []
        self.ws: list = []
        self.ws_target = 0
        self.oom = 0
        self.pool = pool
        self.base_used = 0  # device use that is neither the game's allocations nor the model
        self.target_ms: float | None = None
        self.phase = "start"
        self.samples: list[tuple[float, int, int]] = []  # (t, device used, game allocations)
        self._stop = threading.Event()
        self._sampler: threading.Thread | None = None

    # --- memory ---------------------------------------------------------------------------------

    def allocated(self) -> int:
        return sum(getattr(b, "size", 0) for b in self.ballast + self.ws)

    def fill_ballast(self, model_now: int) -> None:
        """Allocate everything but the pool: the game's working set and the model share it."""
        want = self.dev.free() - (self.pool - model_now)
        while want > 0:
            n = min(want, 4 * 1024 * MIB)
            self.ballast.append(self.dev.alloc(n))
            want -= n

    def game_used(self) -> int:
        """What the game tells the sidecar it uses: its context, ballast and working set target
        (the target, not what it holds yet: it announces before it allocates)."""
        return self.base_used + sum(b.size for b in self.ballast) + self.ws_target

    def grow_ws(self) -> None:
        """Take more of the working set, a chunk at a time, only from VRAM that is free — the
        game never over-allocates (no OOM), it waits for the model to let go."""
        held = sum(b.size for b in self.ws)
        while held < self.ws_target:
            n = min(CHUNK, self.ws_target - held)
            if self.dev.free() < n + 64 * MIB:
                return
            try:
                self.ws.append(self.dev.alloc(n))
            except Exception:  # noqa: BLE001 - cupy's OutOfMemoryError, or the simulation's
                self.oom += 1
                return
            held += n

    def shrink_ws(self) -> None:
        while self.ws and sum(b.size for b in self.ws) > self.ws_target:
            self.ws.pop()  # cudaFree

    def ws_done(self) -> bool:
        return sum(b.size for b in self.ws) >= self.ws_target

    # --- sampling -------------------------------------------------------------------------------

    def start_sampler(self, period_s: float) -> None:
        def run() -> None:
            while not self._stop.is_set():
                self.samples.append((time.time(), self.dev.used(), self.allocated()))
                time.sleep(period_s)

        self._sampler = threading.Thread(target=run, daemon=True)
        self._sampler.start()

    def stop_sampler(self) -> None:
        self._stop.set()
        if self._sampler:
            self._sampler.join()

    # --- frames ---------------------------------------------------------------------------------

    def run_frames(self, seconds: float, phase: str, each=None) -> None:
        """Render at 60 FPS for ``seconds``; ``each(game)`` runs once per frame (allocations)."""
        self.phase = phase
        end = time.monotonic() + seconds
        next_t = time.monotonic()
        while (now := time.monotonic()) < end:
            t0 = time.perf_counter()
            gpu_ms = self.dev.render()
            frame_ms = (time.perf_counter() - t0) * 1000
            extra = {"vram_used": self.game_used(), "vram_budget": self.pool_total()}
            if self.target_ms:
                extra["target_frame_time_ms"] = self.target_ms
            self.client.frame(self.frame, frame_ms, **extra)
            self.frames.append({"t": time.time(), "phase": phase, "frame_ms": frame_ms,
                                "gpu_ms": gpu_ms})
            if each is not None:
                each(self)
            self.frame += 1
            next_t += FRAME_S
            if next_t < now:  # behind: drop the missed frames rather than rush them
                next_t = time.monotonic()
            time.sleep(max(0.0, next_t - time.monotonic()))

    def pool_total(self) -> int | None:
        return None if not self.args.sim else self.dev.total()

    def mark(self, what: str, **kw) -> None:
        self.events.append({"t": time.time(), "event": what, **kw})
        print(f"  {time.strftime('%H:%M:%S')} {what} {kw or ''}", flush=True)


# ------------------------------------------------------------------------------ the runs


def reserve_outcome(body: dict) -> dict:
    """The ``ok`` answer to ``reserve_vram``, old or new: ``{"acknowledged": true}`` (protocol
    v1 as first written) or ``{"granted": true, ...}`` (the typed outcome)."""
    if body.get("granted") is not None:
        outcome = "granted" if body["granted"] else "not granted"
    elif body.get("acknowledged") is not None:
        outcome = "acknowledged" if body["acknowledged"] else "not acknowledged"
    else:
        outcome = "ok"
    return {"outcome": outcome, "reply": body}


def wait_settled(g: Game, seconds: float, quiet_s: float = 3.0) -> dict:
    """Render until the arbiter has made no reshard for ``quiet_s`` (or ``seconds`` pass)."""
    end = time.monotonic() + seconds
    last, since = None, time.monotonic()
    st: dict = {}
    while time.monotonic() < end:
        g.run_frames(0.5, g.phase, each=Game.grow_ws)
        st = g.client.stats().get("arbiter") or {}
        if st.get("reshards") != last:
            last, since = st.get("reshards"), time.monotonic()
        elif time.monotonic() - since >= quiet_s and g.ws_done():
            break
    return st


def trace_run(args: argparse.Namespace, dev, tmp: Path) -> dict:
    endpoint = f"ipc://{tmp / 'trace.sock'}"
    pool = int(args.pool_gb * GB)
    # everything on the device before the sidecar starts: the game's context, the driver's
    # reserve, other processes; the model's use is then used − base − the game's allocations
    base = dev.used()
    side = start_sidecar(args, endpoint, arbiter=True)
    client = Client(endpoint, timeout=120, engine="arbiter-bench-game", game_pid=os.getpid())
    greet(client, side)
    g = Game(args, dev, client, pool)
    g.base_used = base
    PARTIAL["events"] = g.events
    client.load_model(Path(args.model).name, n_ctx=args.ctx, max_sessions=4)
    time.sleep(0.5)
    model0 = dev.used() - base
    g.fill_ballast(model0)
    g.mark("ballast", bytes=g.allocated(), model=model0, base=base)
    g.start_sampler(0.002 if not args.sim else 0.02)
    phases = {}

    def phase_budget(ws: int) -> int:
        return pool - ws - HEADROOM

    ws_menu = pool - int(args.high_gb * GB) - HEADROOM
    ws_level = pool - int(args.low_gb * GB) - HEADROOM
    g.ws_target = ws_menu
    g.grow_ws()
    g.mark("menu", budget=phase_budget(ws_menu))
    wait_settled(g, 60)  # the model climbs from the CPU plan to the best that fits
    npc_out = tmp / "npcs-trace.json"
    npcs = start_npcs(args, endpoint, npc_out)
    t = time.time()
    g.run_frames(args.phase_s, "menu", each=Game.grow_ws)
    phases["menu"] = (t, time.time())

    def settle_and_play(name: str, t: float) -> None:
        """Render until the model has settled, then the phase itself; record its span."""
        g.phase = name
        st = wait_settled(g, 60)
        g.mark(f"{name} settled", plan=st.get("plan"), plan_vram=st.get("plan_vram"))
        g.run_frames(args.phase_s, name, each=Game.grow_ws)
        phases[name] = (t, time.time())

    # level load: the game announces its new use, then allocates as the model lets go
    g.ws_target = ws_level
    g.mark("level load: game grows", budget=phase_budget(ws_level))
    settle_and_play("level load", g.events[-1]["t"])

    # gameplay: the game frees it; the model grows back after the budget holds
    g.ws_target = ws_menu
    g.shrink_ws()
    g.mark("gameplay: game frees", budget=phase_budget(ws_menu))
    settle_and_play("gameplay", g.events[-1]["t"])

    # a sudden reservation, due next frame; the game allocates once it is acknowledged
    reserve = int(args.reserve_gb * GB)
    acked: dict = {}

    def ask() -> None:
        c = Client(endpoint, timeout=120, engine="arbiter-bench-reserve")
        t0 = time.time()
        try:
            acked.update(reserve_outcome(c.reserve_vram(reserve, 1)))
            acked["t"] = time.time()
        except BridgeError as e:  # cannot_free, deadline_missed (typed outcomes), or no answer
            acked.update(outcome=e.code, code=e.code, error=str(e))
        except Exception as e:  # noqa: BLE001 - recorded, never left to kill the thread silently
            acked.update(outcome="exception", error=repr(e))
        acked["wait_s"] = time.time() - t0
        c.close()

    t = time.time()
    g.mark("reserve_vram", bytes=reserve)
    asker = threading.Thread(target=ask)
    asker.start()
    g.phase = "reserved"
    while asker.is_alive():
        g.run_frames(FRAME_S, "reserved")
    g.mark("reserve acknowledged", wait_ms=round(acked.get("wait_s", 0) * 1000, 1),
           outcome=acked.get("outcome"), code=acked.get("code"), reply=acked.get("reply"))
    g.ws_target = ws_menu + reserve
    settle_and_play("reserved", t)

    # frame pacing, at the top plan: NPCs idle, chatting unpaced, chatting paced
    g.ws_target = ws_menu
    g.shrink_ws()
    g.mark("back: game frees", budget=phase_budget(ws_menu))
    g.phase = "back"
    wait_settled(g, 60)
    chats = stop_npcs(npcs, npc_out)
    g.run_frames(args.frame_s, "frames: idle")
    npcs2 = start_npcs(args, endpoint, tmp / "npcs-frames.json")
    g.run_frames(2.0, "warm")
    g.run_frames(args.frame_s, "frames: chatting, unpaced")
    g.target_ms = 1000 / FPS
    g.run_frames(4.0, "pacing: settling")  # frames over target: the model leaves the GPU
    g.run_frames(args.frame_s, "frames: chatting, paced")
    g.target_ms = None
    frame_chats = stop_npcs(npcs2, tmp / "npcs-frames.json")
    stats = client.stats()
    g.stop_sampler()
    stop_sidecar(client, side)
    return {"phases": phases, "events": g.events, "frames": g.frames, "chats": chats,
            "frame_chats": frame_chats, "samples": g.samples, "oom": g.oom,
            "stats": stats, "base_used": g.base_used, "pool": pool,
            "ballast": sum(b.size for b in g.ballast)}


def frames_run(args: argparse.Namespace, dev, tmp: Path) -> dict:
    """Frame pacing alone: no ballast (VRAM is plenty), the model on its all-GPU plan; frames
    with the NPCs idle, chatting unpaced, and chatting paced (the arbiter may yield the GPU)."""
    endpoint = f"ipc://{tmp / 'frames.sock'}"
    side = start_sidecar(args, endpoint, arbiter=True)
    client = Client(endpoint, timeout=120, engine="arbiter-bench-game", game_pid=os.getpid())
    greet(client, side)
    g = Game(args, dev, client, 0)
    PARTIAL["events"] = g.events
    client.load_model(Path(args.model).name, n_ctx=args.ctx, max_sessions=4)
    g.phase = "climb"
    wait_settled(g, 60, quiet_s=2.0)
    g.mark("settled", plan=client.stats()["arbiter"]["plan"])
    g.run_frames(args.frame_s, "frames: idle")
    out = tmp / "npcs-frames.json"
    npcs = start_npcs(args, endpoint, out)
    g.run_frames(2.0, "warm")
    g.run_frames(args.frame_s, "frames: chatting, unpaced")
    g.target_ms = 1000 / FPS
    g.run_frames(4.0, "pacing: settling")
    arb = client.stats()["arbiter"]
    g.mark("paced", plan=arb["plan"], yielding=arb.get("yielding_gpu"))
    g.run_frames(args.frame_s, "frames: chatting, paced")
    arb = client.stats()["arbiter"]
    g.mark("paced end", plan=arb["plan"], yielding=arb.get("yielding_gpu"))
    chats = stop_npcs(npcs, out)
    stop_sidecar(client, side)
    frames = frame_stats(g.frames, FRAME_PHASES, chats)
    return {"frames": frames, "events": g.events, "stats": arb}


def static_run(args: argparse.Namespace, dev, tmp: Path, budget: int, chats: int,
               seconds: float) -> dict:
    """A fixed plan for ``budget``, the same chatter (the first ``chats`` chats, or ``seconds``)
    with the render running and no frame target."""
    endpoint = f"ipc://{tmp / f'static{budget}.sock'}"
    side = start_sidecar(args, endpoint, arbiter=False)
    client = Client(endpoint, timeout=120, engine="arbiter-bench-static", game_pid=os.getpid())
    greet(client, side)
    client.load_model(Path(args.model).name, n_ctx=args.ctx, max_sessions=4,
                      vram_budget=budget)
    plan = client.stats().get("plan")
    g = Game(args, dev, client, 0)
    out = tmp / f"npcs-static-{budget}.json"
    npcs = start_npcs(args, endpoint, out, chats=chats)
    t0 = time.monotonic()
    while npcs.poll() is None and (chats > 0 or time.monotonic() - t0 < seconds):
        g.run_frames(0.5, "static")
    rows = stop_npcs(npcs, out)
    stop_sidecar(client, side)
    return {"budget": budget, "plan": plan, "chats": rows}


# ------------------------------------------------------------------------------ the greedy game


class Shared:
    """Two int64 slots in a file both processes map: the game's allocated bytes (written by the
    game, read by the sampler) and, in the simulation, the model's VRAM (written by the
    sampler, read by the simulated device)."""

    GAME, MODEL = 0, 1

    def __init__(self, path: str | Path, create: bool = False) -> None:
        if create:
            Path(path).write_bytes(bytes(16))
        self._f = open(path, "r+b")
        self._m = mmap.mmap(self._f.fileno(), 16)

    def get(self, slot: int) -> int:
        return struct.unpack_from("q", self._m, 8 * slot)[0]

    def set(self, slot: int, value: int) -> None:
        struct.pack_into("q", self._m, 8 * slot, int(value))


def emit(event: str, **kw) -> None:
    """The greedy game's report to the bench, one line on stdout (never to the sidecar)."""
    print("@@" + json.dumps({"ev": event, "t": time.time(), **kw}, default=str), flush=True)


def greedy_game_role(args: argparse.Namespace) -> int:
    """Child process: the greedy game. It holds real device memory (CuPy, ``cudaMalloc``) and
    never talks to the sidecar; the bench drives it with JSON lines on stdin:

    - ``setup {pool, model, game}``: a ballast so that the game and the model share ``pool``
      (the model holds ``model`` now), then ``game`` bytes of working set;
    - ``greedy {cap, chunk, max_s, hold_s, retry_s, free_at}``: take ``chunk`` pieces as fast as
      it can until its working set is ``cap`` or ``max_s`` pass, hold them ``hold_s`` (or until
      ``free_at``), free them;
    - ``exit`` (or stdin closed, or the bench gone): free everything and leave."""
    parent = os.getppid()
    shm = Shared(args.shm)
    if args.sim:
        dev = SimDevice(int(args.pool_gb * GB), lambda: shm.get(Shared.MODEL))
    else:
        dev = CudaDevice()
    cmds: queue.Queue = queue.Queue()
    stop = threading.Event()

    def read() -> None:
        for line in sys.stdin:
            try:
                cmd = json.loads(line)
            except ValueError:
                continue
            if cmd.get("cmd") == "exit":
                stop.set()
            cmds.put(cmd)
        stop.set()
        cmds.put({"cmd": "exit"})

    threading.Thread(target=read, daemon=True).start()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    ballast: list = []
    ws: list = []
    grabbed: list = []

    def held(blocks: list) -> int:
        return sum(b.size for b in blocks)

    def publish() -> None:
        shm.set(Shared.GAME, held(ballast) + held(ws) + held(grabbed))

    emit("ready", total=dev.total(), free=dev.free(), used=dev.used(),
         context_bytes=dev.context_bytes)
    try:
        while not stop.is_set() and not parent_gone(parent):
            try:
                cmd = cmds.get(timeout=0.5)
            except queue.Empty:
                continue
            what = cmd.get("cmd")
            if what == "exit":
                break
            if what == "setup":  # the model's VRAM now, by the bench's last sample
                model = shm.get(Shared.MODEL) or cmd["model"]
                want = dev.free() - (cmd["pool"] - model)
                piece = 4 * GIB
                while want > 0 and piece >= 64 * MIB:
                    n = min(want, piece)
                    try:
                        ballast.append(dev.alloc(n))
                        want -= n
                    except Exception:  # noqa: BLE001 - the model grew meanwhile: smaller pieces
                        piece //= 2
                publish()
                fails, end = 0, time.monotonic() + 30
                while held(ws) < cmd["game"] and time.monotonic() < end and not stop.is_set():
                    try:
                        ws.append(dev.alloc(min(CHUNK, cmd["game"] - held(ws))))
                        publish()
                    except Exception:  # noqa: BLE001 - cupy's OutOfMemoryError, or the sim's
                        fails += 1
                        time.sleep(0.05)
                emit("setup_done", ballast=held(ballast), game=held(ws), failed=fails,
                     free=dev.free(), used=dev.used())
            elif what == "greedy":
                greedy_phase(dev, cmd, grabbed, held(ws), publish, stop, parent)
        return 0
    except Exception as e:  # noqa: BLE001 - reported to the bench, which records it
        emit("error", message=repr(e), trace=traceback.format_exc())
        return 1
    finally:
        grabbed.clear()
        ws.clear()
        ballast.clear()


def greedy_phase(dev, cmd: dict, grabbed: list, base_ws: int, publish, stop: threading.Event,
                 parent: int) -> None:
    """Grow to the cap as fast as allocations succeed, hold, free; every step reported."""
    chunk, cap = int(cmd["chunk"]), int(cmd["cap"])
    max_s, hold_s = float(cmd["max_s"]), float(cmd["hold_s"])
    retry_s = float(cmd["retry_s"])
    t0 = time.monotonic()
    emit("greedy_start", game=base_ws, cap=cap)
    last_ok = t0
    longest_stall = longest_iter = 0.0
    ok = failed = 0
    held = base_ws
    timeline: list[tuple[float, int]] = [(0.0, held)]
    reason = "time limit"
    errors: dict[str, int] = {}
    while not stop.is_set():
        it0 = time.monotonic()
        if held + min(chunk, 1) > cap:
            reason = "cap"
            break
        if it0 - t0 > max_s or parent_gone(parent):
            break
        n = min(chunk, cap - held)
        try:
            grabbed.append(dev.alloc(n))
            held += n
            ok += 1
            now = time.monotonic()
            longest_stall = max(longest_stall, now - last_ok)
            last_ok = now
            publish()
            timeline.append((round(now - t0, 4), held))
        except Exception as e:  # noqa: BLE001 - cupy's OutOfMemoryError, or the sim's
            failed += 1
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            time.sleep(retry_s)
        longest_iter = max(longest_iter, time.monotonic() - it0)
    t_grown = time.monotonic()
    if reason != "cap":  # still wanting more when it stopped: that wait is a stall too
        longest_stall = max(longest_stall, t_grown - last_ok)
    grow = {"reason": reason, "grow_s": t_grown - t0, "time_to_cap_s": (t_grown - t0)
            if reason == "cap" else None, "game": held, "grabbed": held - base_ws,
            "ok_allocations": ok, "failed_allocations": failed, "alloc_errors": errors,
            "longest_stall_s": longest_stall, "longest_iteration_s": longest_iter}
    emit("grow_end", **grow)
    free_at = cmd.get("free_at")
    end = time.time() + hold_s if free_at is None else float(free_at)
    while time.time() < end and not stop.is_set() and not parent_gone(parent):
        time.sleep(0.02)
    emit("free_start", game=held)
    f0 = time.monotonic()
    grabbed.clear()  # cudaFree, piece by piece
    publish()
    emit("freed", seconds=time.monotonic() - f0, game=base_ws)
    emit("result", **grow, timeline=timeline, hold_s=hold_s)


class GameProc:
    """The bench's handle on the greedy game: commands in, reports out (stdout lines)."""

    def __init__(self, args: argparse.Namespace, shm_path: Path) -> None:
        cmd = [sys.executable, __file__, "--role", "greedy-game", "--shm", str(shm_path),
               "--pool-gb", str(args.pool_gb)] + (["--sim"] if args.sim else [])
        self.proc = spawn(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                          bufsize=1, env=os.environ.copy())
        self.events: list[dict] = []
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("@@"):
                try:
                    ev = json.loads(line[2:])
                except ValueError:
                    continue
                self.events.append(ev)
                self._q.put(ev)
            else:
                sys.stdout.write(f"  [game] {line}")
        self._q.put(None)

    def send(self, **cmd) -> None:
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            pass

    def wait(self, name: str, timeout: float) -> dict:
        end = time.monotonic() + timeout
        while True:
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"the greedy game did not report '{name}' in {timeout:.0f} s")
            try:
                ev = self._q.get(timeout=left)
            except queue.Empty:
                continue
            if ev is None:
                raise RuntimeError(f"the greedy game exited (code {self.proc.poll()}) "
                                   f"before '{name}'")
            if ev["ev"] == "error":
                raise RuntimeError(f"the greedy game failed: {ev.get('message')}\n"
                                   f"{ev.get('trace', '')}")
            if ev["ev"] == name:
                return ev

    def close(self) -> None:
        self.send(cmd="exit")
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            end_process(self.proc, 5)


def probe_role(args: argparse.Namespace) -> int:
    """Child process: the control-latency probe. Its own connection sends each of
    ``--probe-types`` every ``--probe-ms`` and logs ``[t, type, round trip s, error code]``.
    Its ``frame`` carries no VRAM figures (nor a frame-time target): it tells the arbiter
    nothing, only measures how fast the socket thread answers."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    types = [x for x in args.probe_types.split(",") if x]
    period = args.probe_ms / 1000
    c = Client(args.endpoint, timeout=10, engine="arbiter-bench-probe")
    rows: list[list] = []
    end = time.monotonic() + 60
    while not stop.is_set():
        try:
            c.hello()
            break
        except BridgeError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)
    frame = 0
    next_t = time.monotonic()
    last_write = next_t
    try:
        while not stop.is_set() and not parent_gone(parent):
            for typ in types:
                t = time.time()
                t0 = time.perf_counter()
                err = None
                try:
                    if typ == "frame":
                        c.frame(frame, args.probe_ms)
                    else:
                        c.request(typ)
                except BridgeError as e:
                    err = e.code
                rows.append([t, typ, time.perf_counter() - t0, err])
            frame += 1
            now = time.monotonic()
            if now - last_write > 1.0:
                write_json(args.out, rows)
                last_write = now
            next_t += period
            if next_t < now:  # late (a slow answer): keep the period from now on
                next_t = now
            time.sleep(max(0.0, next_t - time.monotonic()))
    finally:
        write_json(args.out, rows)
        c.close()
    return 0


class Nvml:
    """The device's figures and one process's share, for the bench's sampler."""

    def __init__(self) -> None:
        import pynvml as nv

        nv.nvmlInit()
        self.nv = nv
        self.h = nv.nvmlDeviceGetHandleByIndex(0)

    def used(self) -> int:
        return int(self.nv.nvmlDeviceGetMemoryInfo(self.h).used)

    def process_used(self, pid: int) -> int | None:
        try:
            for p in self.nv.nvmlDeviceGetComputeRunningProcesses(self.h):
                if p.pid == pid and p.usedGpuMemory is not None:
                    return int(p.usedGpuMemory)
        except Exception:  # noqa: BLE001 - not supported (WDDM, some containers)
            return None
        return None


def gpu_bytes(memory) -> int | None:
    """The GPU share of ``stats`` → ``memory`` (``{"gpu": {"weights", "kv", "compute"}}``)."""
    gpu = (memory or {}).get("gpu") if isinstance(memory, dict) else None
    if isinstance(gpu, dict):
        return sum(int(v) for v in gpu.values() if isinstance(v, (int, float)))
    return int(gpu) if isinstance(gpu, (int, float)) else None


class Sampler:
    """Every ``period_s``: the model's VRAM (NVML's figure for the sidecar's process where the
    driver gives it; the device's use less the game's and everything else there before; the
    arbiter's plan; the engine's accounting) and plan, on a connection of its own. It also
    collects every reshard decision ``stats`` shows (the last 8 at a time)."""

    def __init__(self, endpoint: str, side_pid: int, period_s: float, nv: Nvml | None,
                 base: int, shm: Shared, sim: bool) -> None:
        self.endpoint, self.side_pid, self.period_s = endpoint, side_pid, period_s
        self.nv, self.base, self.shm, self.sim = nv, base, shm, sim
        self.rows: list[dict] = []
        self.decisions: dict[tuple, dict] = {}
        self.last: dict = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=15)

    def sample(self, c: Client) -> dict:
        row: dict = {"t": time.time(), "game": self.shm.get(Shared.GAME)}
        if self.nv is not None:
            row["dev_used"] = used = self.nv.used()
            row["nvml_pid"] = self.nv.process_used(self.side_pid)
            row["dev_model"] = used - self.base - row["game"]
        try:
            st = c.stats()
            arb = st.get("arbiter") or {}
            row.update(plan=st.get("plan"), arb_plan=arb.get("plan"),
                       plan_vram=arb.get("plan_vram"), budget=arb.get("budget"),
                       reshards=arb.get("reshards"), engine_reshards=st.get("reshards"),
                       mem_gpu=gpu_bytes(st.get("memory")), yielding=arb.get("yielding_gpu"))
            for d in arb.get("decisions") or []:
                self.decisions[(d.get("at"), d.get("action"), d.get("plan"))] = d
        except Exception as e:  # noqa: BLE001 - a slow or missing answer is data too
            row["error"] = repr(e)
        for key in ("nvml_pid", "dev_model", "plan_vram", "mem_gpu"):
            if row.get(key) is not None:
                row["model"], row["model_src"] = row[key], key
                break
        if row.get("model") is not None:  # the game sizes its ballast by it; in the simulation
            self.shm.set(Shared.MODEL, row["model"])  # it is the simulated device's model share
        self.last = row
        return row

    def _run(self) -> None:
        c = Client(self.endpoint, timeout=10, engine="arbiter-bench-sampler")
        try:
            while not self._stop.is_set():
                t0 = time.monotonic()
                self.rows.append(self.sample(c))
                self._stop.wait(max(0.0, self.period_s - (time.monotonic() - t0)))
        finally:
            c.close()


def start_probe(args: argparse.Namespace, endpoint: str, out: Path):
    cmd = [sys.executable, __file__, "--role", "probe", "--endpoint", endpoint, "--out", str(out),
           "--probe-ms", str(args.probe_ms), "--probe-types", args.probe_types]
    return spawn(cmd)


def stop_probe(proc, out: Path) -> list[list]:
    end_process(proc, 15)
    try:
        return json.loads(out.read_text()) if out.exists() else []
    except ValueError:
        return []


def wait_quiet(client: Client, seconds: float, quiet_s: float, patience_s: float) -> dict:
    """Poll ``stats`` until the arbiter has resharded and then made no reshard for ``quiet_s``,
    or made none at all for ``patience_s`` (nothing to climb to), or ``seconds`` pass. (A
    reshard is counted once it is done, so a quiet spell alone may be one under way.)"""
    end = time.monotonic() + seconds
    first = last = None
    since = time.monotonic()
    arb: dict = {}
    while time.monotonic() < end:
        try:
            arb = client.stats().get("arbiter") or {}
        except BridgeError:
            time.sleep(0.2)
            continue
        n = arb.get("reshards")
        if first is None:
            first = last = n
        if n != last:
            last, since = n, time.monotonic()
        quiet = time.monotonic() - since
        if quiet >= (quiet_s if n != first else patience_s):
            break
        time.sleep(0.2)
    return arb


def plan_snapshot(client: Client, sampler: Sampler) -> dict:
    """Which plan the model is on now, and its VRAM by every measure the sampler has."""
    row = dict(sampler.sample(client))
    return {k: row.get(k) for k in ("t", "plan", "arb_plan", "plan_vram", "model", "model_src",
                                    "nvml_pid", "dev_model", "mem_gpu", "budget", "reshards")}


def greedy_trace(args: argparse.Namespace, path: Path, pool: int, ws0: int, cap: int) -> dict:
    """The simulation's stand-in for NVML: the greedy game's schedule as a VRAM trace (seconds
    from the model's load): its start use, its cap from the greedy phase on, its start use again
    once it frees."""
    t_greedy = args.greedy_settle_s + args.greedy_warm_s
    t_free = t_greedy + args.greedy_max_s + args.greedy_hold_s
    trace = {"total": pool, "points": [{"t": 0.0, "game": ws0}, {"t": t_greedy, "game": cap},
                                       {"t": t_free, "game": ws0}]}
    path.write_text(json.dumps(trace))
    return {"t_greedy": t_greedy, "t_free": t_free, **trace}


def greedy_run(args: argparse.Namespace, tmp: Path, res: dict) -> None:
    """The greedy game beside the sidecar; fills ``res`` as it goes, so that a run cut short
    still leaves what it measured."""
    pool = int(args.pool_gb * GB)
    ws0 = pool - int(args.greedy_free_gib * GIB)
    cap = pool - int(args.greedy_leave_gib * GIB)
    res["config"] = {"pool": pool, "game_start": ws0, "game_cap": cap,
                     "chunk": args.greedy_chunk_mib * MIB, "max_s": args.greedy_max_s,
                     "hold_s": args.greedy_hold_s, "retry_ms": args.greedy_retry_ms,
                     "probe_ms": args.probe_ms, "probe_types": args.probe_types,
                     "sample_ms": args.sample_ms, "threads": args.threads, "sim": args.sim,
                     "model": args.model, "max_tokens": args.max_tokens,
                     "grow_hold": args.grow_hold}
    marks: list[dict] = res.setdefault("marks", [])

    def mark(what: str, **kw) -> None:
        marks.append({"t": time.time(), "event": what, **kw})
        print(f"  {time.strftime('%H:%M:%S')} {what} {kw or ''}", flush=True)

    shm_path = tmp / "greedy.shm"
    shm = Shared(shm_path, create=True)
    game = GameProc(args, shm_path)
    res["game_events"] = game.events
    try:
        ready = game.wait("ready", 180)
        nv = None if args.sim else Nvml()
        base = nv.used() if nv else 0  # the game's context and everything not the model's
        mark("game ready", total=ready.get("total"), free=ready.get("free"), base=base)
        endpoint = f"ipc://{tmp / 'greedy.sock'}"
        trace = None
        if args.sim:
            trace = tmp / "greedy-trace.json"
            res["sim_trace"] = greedy_trace(args, trace, pool, ws0, cap)
        side = start_sidecar(args, endpoint, arbiter=True, trace=trace)
        # the bench's own control connection (load, settle, snapshots), not the game's
        client = Client(endpoint, timeout=120, engine="arbiter-bench-control")
        greet(client, side)
        t_sent = time.time()
        client.load_model(Path(args.model).name, n_ctx=args.ctx, max_sessions=4)
        t_loaded = time.time()
        if args.sim:  # the trace's clock starts somewhere inside the load
            res["sim_trace"]["clock_uncertainty_s"] = t_loaded - t_sent
        sampler = Sampler(endpoint, side.pid, args.sample_ms / 1000, nv, base, shm, args.sim)
        res["samples"] = sampler.rows
        time.sleep(0.3)  # for NVML to see the model's buffers
        snap = sampler.sample(client)
        if "error" in snap or snap.get("plan_vram") is None:
            raise RuntimeError(f"the sidecar runs no VRAM arbiter (no NVML, no GPU profile?): "
                               f"{snap}")
        model0 = snap.get("model") or 0
        sampler.start()
        mark("loaded", plan=snap.get("plan"), model=model0, source=snap.get("model_src"))
        game.send(cmd="setup", pool=pool, model=model0, game=ws0)
        setup = game.wait("setup_done", 180)
        mark("game set up", ballast=setup.get("ballast"), game=setup.get("game"),
             failed=setup.get("failed"), free=setup.get("free"))
        # the model climbs to the best plan that fits what the game left it
        settle_until = t_sent + args.greedy_settle_s
        wait_quiet(client, max(1.0, settle_until - time.time()), quiet_s=args.grow_hold + 3.0,
                   patience_s=args.grow_hold + 12.0)
        before = plan_snapshot(client, sampler)
        res["plan_before"] = before
        mark("settled", plan=before["plan"], plan_vram=before["plan_vram"], model=before["model"])
        npc_out, probe_out = tmp / "npcs-greedy.json", tmp / "probe-greedy.json"
        npcs = start_npcs(args, endpoint, npc_out)
        probe = start_probe(args, endpoint, probe_out)
        res["npcs_started"] = time.time()
        times: dict = res.setdefault("times", {})
        try:
            # in the simulation the game keeps to the trace's schedule: it turns greedy at the
            # earliest the trace can (so its failed allocations are always exercised; its stall
            # may read long by up to clock_uncertainty_s) and frees at the latest (the grow-back
            # may read short by as much)
            go = (t_sent + res["sim_trace"]["t_greedy"]) if args.sim else (
                time.time() + args.greedy_warm_s)
            time.sleep(max(0.0, go - time.time()))
            free_at = (t_loaded + res["sim_trace"]["t_free"]) if args.sim else None
            game.send(cmd="greedy", cap=cap, chunk=args.greedy_chunk_mib * MIB,
                      max_s=args.greedy_max_s, hold_s=args.greedy_hold_s,
                      retry_s=args.greedy_retry_ms / 1000, free_at=free_at)
            g0 = game.wait("greedy_start", 30)
            times["greedy_start"] = g0["t"]
            mark("greedy", game=g0.get("game"), cap=cap)
            ge = game.wait("grow_end", args.greedy_max_s + 60)
            times["grow_end"] = ge["t"]
            mark("grow end", reason=ge.get("reason"), grabbed=ge.get("grabbed"),
                 failed=ge.get("failed_allocations"), stall_s=round(ge["longest_stall_s"], 3))
            hold_left = (free_at - time.time()) if free_at else args.greedy_hold_s
            fs = game.wait("free_start", hold_left + 60)
            times["free_start"] = fs["t"]
            res["plan_end_greedy"] = end = plan_snapshot(client, sampler)
            mark("game frees", plan=end["plan"], plan_vram=end["plan_vram"], model=end["model"])
            fr = game.wait("freed", 60)
            times["freed"] = fr["t"]
            res["game_result"] = game.wait("result", 30)
            # the model grows back: its plan as large as before the greedy phase
            want = before.get("plan_vram") or 0
            end_t = time.monotonic() + args.greedy_regrow_s
            grown = None
            while time.monotonic() < end_t:
                row = sampler.sample(client)
                if (row.get("plan_vram") is not None and row["plan_vram"] >= want
                        and row.get("plan") == row.get("arb_plan")):
                    grown = row["t"]
                    break
                time.sleep(0.05)
            res["grow_back_s"] = None if grown is None else grown - fr["t"]
            res["plan_after"] = after = plan_snapshot(client, sampler)
            mark("grown back" if grown else "not grown back in time", plan=after["plan"],
                 plan_vram=after["plan_vram"], model=after["model"], after_s=res["grow_back_s"])
            times["grown"] = grown
            time.sleep(args.greedy_tail_s)  # the NPCs chat on the grown plan for a while
        finally:
            res["chats"] = stop_npcs(npcs, npc_out, timeout=60)
            res["probe"] = stop_probe(probe, probe_out)
            sampler.stop()
            res["decisions"] = sorted(sampler.decisions.values(), key=lambda d: d.get("at") or 0)
        try:
            res["stats"] = client.stats()
        except BridgeError as e:
            res["stats_error"] = str(e)
        for d in ((res.get("stats") or {}).get("arbiter") or {}).get("decisions") or []:
            sampler.decisions[(d.get("at"), d.get("action"), d.get("plan"))] = d
        res["decisions"] = sorted(sampler.decisions.values(), key=lambda d: d.get("at") or 0)
        stop_sidecar(client, side)
    finally:
        game.close()


def latency_table(rows: list[list], t0: float | None = None, t1: float | None = None) -> dict:
    """p50/p99/max round trip (ms) of each control message type, in [t0, t1)."""
    out: dict[str, dict] = {}
    for typ in sorted({r[1] for r in rows}):
        rs = [r for r in rows if r[1] == typ and (t0 is None or r[0] >= t0)
              and (t1 is None or r[0] < t1)]
        lat = [r[2] * 1000 for r in rs if r[3] is None]
        out[typ] = {"n": len(rs), "errors": sum(1 for r in rs if r[3] is not None),
                    "p50_ms": round(pct(lat, 0.5), 2), "p99_ms": round(pct(lat, 0.99), 2),
                    "max_ms": round(max(lat), 2) if lat else None}
    return out


def stream_lost(c: dict) -> bool:
    """A stream lost tokens: no ``done``, a gap or repeat in the numbering, or a final text that
    is not the streamed pieces."""
    return ("error" in c or c["seq"] != list(range(1, len(c["seq"]) + 1))
            or ("streamed" in c and c.get("text") != c["streamed"]))


def analyse_greedy(res: dict) -> dict:
    """The greedy run's figures, from whatever it got to (a run cut short gives fewer)."""
    out: dict = {"config": res.get("config"), "error": res.get("error")}
    gr = res.get("game_result") or next((e for e in reversed(res.get("game_events") or [])
                                         if e.get("ev") == "grow_end"), None) or {}
    times = res.get("times") or {}
    t0 = times.get("greedy_start") or next((e["t"] for e in res.get("game_events") or []
                                            if e.get("ev") == "greedy_start"), None)
    out["game"] = {k: gr.get(k) for k in ("reason", "time_to_cap_s", "grow_s", "grabbed",
                                          "ok_allocations", "failed_allocations",
                                          "alloc_errors", "longest_stall_s",
                                          "longest_iteration_s")}
    out["plan_before_greedy"] = res.get("plan_before")
    out["plan_end_of_greedy"] = res.get("plan_end_greedy")
    out["plan_after_grow_back"] = res.get("plan_after")
    out["time_to_grow_back_s"] = res.get("grow_back_s")
    samples = res.get("samples") or []
    before = (res.get("plan_before") or {}).get("model")
    freed = times.get("freed")
    if freed and before:  # the model's VRAM (by the sampler's best measure) back within 256 MiB
        back = next((r["t"] for r in samples if r["t"] >= freed and r.get("model") is not None
                     and r["model"] >= before - 256 * MIB), None)
        out["time_to_vram_back_s"] = None if back is None else back - freed
    ref = t0 or (samples[0]["t"] if samples else 0)
    ballast = next((e.get("ballast") or 0 for e in res.get("game_events") or []
                    if e.get("ev") == "setup_done"), 0)
    out["model_vram_source"] = next((r.get("model_src") for r in samples if r.get("model_src")),
                                    None)
    out["model_vram_timeline"] = [
        [round(r["t"] - ref, 3), r.get("model"), r.get("plan"), r.get("plan_vram"),
         r["game"] - ballast if r.get("game") else None] for r in samples]
    out["timeline_columns"] = ["t_s (from the greedy start)", "model_vram", "plan", "plan_vram",
                               "game_vram (in the pool: its allocations less the ballast)"]
    out["marks_s"] = {k: round(v - ref, 3) for k, v in times.items() if v}
    if t0 and times.get("free_start"):
        during = [r["model"] for r in samples if t0 <= r["t"] <= times["free_start"]
                  and r.get("model") is not None]
        out["model_vram_min_during_greedy"] = min(during) if during else None
    out["reshards"] = [
        {"t_s": round(d["at"] - ref, 3) if d.get("at") else None,
         **{k: d.get(k) for k in ("action", "plan", "vram", "budget", "seconds", "released_s",
                                  "reason", "ok", "source")}}
        for d in res.get("decisions") or []]
    # a decision is recorded when its reshard ends: it began ``seconds`` earlier, and the old
    # plan's memory was free ``released_s`` after that
    shrinks = [d for d in res.get("decisions") or [] if t0 and d.get("at") and d["at"] >= t0
               and d.get("action") in ("shrink", "fast_shrink", "yield")]
    if shrinks:
        first = shrinks[0]
        began = first["at"] - (first.get("seconds") or 0.0)
        out["reaction_s"] = round(began - t0, 3)
        if first.get("released_s") is not None:
            out["released_after_s"] = round(began + first["released_s"] - t0, 3)
    out["failed_loads"] = sum(len(d.get("failures") or []) for d in res.get("decisions") or [])
    out["failed_loads_per_shrink"] = max(
        [len(d.get("failures") or []) for d in shrinks] or [0])
    arb = (res.get("stats") or {}).get("arbiter") or {}
    out["reshard_count"] = arb.get("reshards")
    out["reshard_seconds"] = arb.get("reshard_seconds")
    probe = res.get("probe") or []
    out["control_latency_ms"] = latency_table(probe)
    if t0:
        out["control_latency_ms_greedy_to_grown"] = latency_table(
            probe, t0, times.get("grown") or times.get("freed") or None)
    chats = res.get("chats") or []
    lost = [c["k"] for c in chats if stream_lost(c)]
    out["chats"] = len(chats)
    out["tokens"] = sum(len(c["seq"]) for c in chats)
    out["tokens_lost"] = len(lost)  # streams, see stream_lost
    out["lost_streams"] = lost
    out["chat_errors"] = [c.get("error") for c in chats if "error" in c]
    win = {}
    if t0:
        start = res.get("npcs_started") or t0
        win["before greedy"] = (start, t0)
        if times.get("free_start"):
            win["greedy (grow + hold)"] = (t0, times["free_start"])
        if times.get("freed") and times.get("grown"):
            win["growing back"] = (times["freed"], times["grown"])
            tail = max((c.get("t1") or 0) for c in chats) if chats else 0
            if tail > times["grown"]:
                win["after grow back"] = (times["grown"], tail)
    out["tokens_per_s"] = {k: round(tokens_per_s(chats, *v), 2) for k, v in win.items()}
    return out


def print_greedy(a: dict) -> None:
    gib = lambda x: "?" if x is None else f"{x / GIB:.2f} GiB"  # noqa: E731
    cfg = a.get("config") or {}
    g = a.get("game") or {}
    print("\n== greedy game ==")
    print(f"  pool {gib(cfg.get('pool'))}; the game starts at {gib(cfg.get('game_start'))}, "
          f"grows to {gib(cfg.get('game_cap'))} in {gib(cfg.get('chunk'))} pieces "
          f"(limit {cfg.get('max_s')} s), holds {cfg.get('hold_s')} s")
    print(f"  game: took {gib(g.get('grabbed'))} in {g.get('ok_allocations')} allocations, "
          f"{g.get('failed_allocations')} failed; stopped at {g.get('reason')} after "
          f"{g.get('grow_s') and round(g['grow_s'], 2)} s; longest stall "
          f"{g.get('longest_stall_s') and round(g['longest_stall_s'], 3)} s, longest loop "
          f"iteration {g.get('longest_iteration_s') and round(g['longest_iteration_s'], 4)} s")
    for label, key in (("before greedy", "plan_before_greedy"),
                       ("end of greedy", "plan_end_of_greedy"),
                       ("after grow-back", "plan_after_grow_back")):
        p = a.get(key) or {}
        print(f"  model {label:16s}: {p.get('plan')} (plan {gib(p.get('plan_vram'))}, measured "
              f"{gib(p.get('model'))} by {p.get('model_src')})")
    back, vram_back = a.get("time_to_grow_back_s"), a.get("time_to_vram_back_s")
    print(f"  lowest model VRAM while greedy: {gib(a.get('model_vram_min_during_greedy'))}; "
          f"grew back {back and round(back, 2)} s after the game freed (VRAM back: "
          f"{vram_back and round(vram_back, 2)} s)")
    print(f"  reshards ({a.get('reshard_count')}):")
    for d in a.get("reshards") or []:
        print(f"    t={d['t_s']:+8.2f}s {d['action']:12s} -> {d['plan']:22s} {gib(d['vram'])} "
              f"in {d['seconds'] and round(d['seconds'], 3)} s (released after "
              f"{d['released_s'] and round(d['released_s'], 3)} s) ok={d['ok']}")
    print("  control latency (whole run, ms):")
    for typ, x in (a.get("control_latency_ms") or {}).items():
        print(f"    {typ:6s} n={x['n']:5d} p50={x['p50_ms']} p99={x['p99_ms']} max={x['max_ms']} "
              f"errors={x['errors']}")
    print(f"  NPC chats: {a.get('chats')}, tokens: {a.get('tokens')}, streams that lost tokens: "
          f"{a.get('tokens_lost')} {a.get('lost_streams') or ''}")
    print(f"  NPC tokens/s: {a.get('tokens_per_s')}")
    if a.get("error"):
        print(f"  run failed: {a['error'].strip().splitlines()[-1]}")


# ------------------------------------------------------------------------------ analysis


def tokens_per_s(chats: list[dict], t0: float, t1: float) -> float:
    times = [x for c in chats for x in c["times"] if t0 <= x < t1]
    return len(times) / max(1e-9, t1 - t0)


def steady_tps(chats: list[dict]) -> float:
    times = sorted(x for c in chats for x in c["times"])
    if len(times) < 2:
        return 0.0
    return (len(times) - 1) / (times[-1] - times[0])


FRAME_PHASES = ("frames: idle", "frames: chatting, unpaced", "frames: chatting, paced")
TRACE_PHASES = ("menu", "level load", "gameplay", "reserved")


def frame_stats(frames: list[dict], phases, chats: list[dict]) -> dict[str, dict]:
    """Frame-time percentiles per phase, and the NPCs' tokens/s over each phase's span."""
    out = {}
    for ph in phases:
        fs = [f for f in frames if f["phase"] == ph]
        if not fs:
            continue
        span = (min(f["t"] for f in fs), max(f["t"] for f in fs))
        out[ph] = {"n": len(fs),
                   "frame_p50_ms": pct([f["frame_ms"] for f in fs], 0.5),
                   "frame_p99_ms": pct([f["frame_ms"] for f in fs], 0.99),
                   "gpu_p50_ms": pct([f["gpu_ms"] for f in fs], 0.5),
                   "gpu_p99_ms": pct([f["gpu_ms"] for f in fs], 0.99),
                   "over_16_7_ms": sum(f["frame_ms"] > 1000 / FPS for f in fs) / len(fs),
                   "npc_tokens_per_s": tokens_per_s(chats, *span)}
    return out


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def analyse(trace: dict, statics: dict[str, dict], reference: dict) -> dict:
    ev = trace["events"]
    samples = trace["samples"]
    base = trace["base_used"]

    def model_at(i: int) -> int:
        _, used, alloc = samples[i]
        return used - base - alloc

    def first_time(after: float, pred) -> float | None:
        for i, (t, _, _) in enumerate(samples):
            if t >= after and pred(model_at(i)):
                return t - after
        return None

    reshards = [d for d in trace["stats"]["arbiter"]["decisions"]]
    out: dict = {"phases": {}, "oom": trace["oom"]}
    for name, (t0, t1) in trace["phases"].items():
        out["phases"][name] = {"tokens_per_s": tokens_per_s(trace["chats"], t0, t1)}
    # freeing times: level load (the game's report) and the reservation (the request)
    for name, budget_key in (("level load", "level load: game grows"),
                             ("reserved", "reserve_vram")):
        e = next(x for x in ev if x["event"] == budget_key)
        t0 = e["t"]
        need = e.get("budget")
        if name == "reserved":
            menu = next(x for x in ev if x["event"] == "menu")["budget"]
            need = menu - e["bytes"]
        freed = first_time(t0, lambda m, need=need: m <= need)
        later = [d for d in reshards if d["at"] >= t0 and d["at"] <= trace["phases"][name][1]]
        out["phases"][name].update({
            "budget": need,
            "time_to_free_s": freed,
            "time_to_best_s": (max(d["at"] for d in later) - t0) if later else None,
            "reshards": [(d["action"], d["plan"], d["vram"], round(d["seconds"], 3),
                          d.get("released_s") and round(d["released_s"], 3)) for d in later],
        })
    ack = next((x for x in ev if x["event"] == "reserve acknowledged"), None)
    out["phases"]["reserved"]["ack_wait_ms"] = ack and ack.get("wait_ms")
    out["phases"]["reserved"]["reserve_outcome"] = ack and ack.get("outcome")
    out["phases"]["reserved"]["reserve_error_code"] = ack and ack.get("code")
    freed = out["phases"]["reserved"].get("time_to_free_s")
    out["reserve_targets"] = {
        "freed_ms": freed if freed is None else round(freed * 1000, 1),
        "freed_met": freed is not None and freed <= 0.1,
        "answered_ms": ack and ack.get("wait_ms"),
        "answered_met": bool(ack and ack.get("wait_ms") is not None and ack["wait_ms"] <= 100
                             and ack.get("outcome") in ("granted", "acknowledged", "ok")),
        "outcome": ack and ack.get("outcome"),
    }
    gp = next(x for x in ev if x["event"] == "gameplay: game frees")
    later = [d for d in reshards if gp["t"] <= d["at"] <= trace["phases"]["gameplay"][1]]
    out["phases"]["gameplay"]["time_to_regrow_s"] = (max(d["at"] for d in later) - gp["t"]
                                                     if later else None)
    # the pool never over capacity
    pool = trace["pool"]
    # what the game's working set and the model held together, against the pool
    out["pool"] = pool
    out["pool_peak"] = max(used - base - trace["ballast"] for _, used, _ in samples)
    # tokens lost and text identity
    lost = 0
    for c in trace["chats"] + trace["frame_chats"]:
        if "error" in c:
            lost += 1
            continue
        if c["seq"] != list(range(1, len(c["seq"]) + 1)):
            lost += 1
    out["chats"] = len(trace["chats"])
    out["chats_with_errors_or_gaps"] = lost
    ref = {c["k"]: c["text"] for c in reference["chats"]}
    same = [c["k"] for c in trace["chats"] if c["k"] in ref and c["text"] == ref[c["k"]]]
    compared = [c["k"] for c in trace["chats"] if c["k"] in ref]
    out["text_identical"] = f"{len(same)}/{len(compared)}"
    out["text_differs_at"] = sorted(set(compared) - set(same))
    out["static"] = {k: {"budget": v["budget"], "plan": v["plan"],
                         "tokens_per_s": steady_tps(v["chats"])} for k, v in statics.items()}
    frames = frame_stats(trace["frames"], (*FRAME_PHASES, *TRACE_PHASES), trace["frame_chats"])
    out["frame_chat_tps"] = {ph: f.pop("npc_tokens_per_s") for ph, f in frames.items()
                             if ph in FRAME_PHASES[1:]}
    for f in frames.values():
        f.pop("npc_tokens_per_s", None)
    out["frames"] = frames
    return out


def print_summary(a: dict) -> None:
    print("\n== arbiter: phases ==")
    for name, p in a["phases"].items():
        print(f"  {name:12s} " + " ".join(f"{k}={v}" for k, v in p.items()))
    rt = a.get("reserve_targets") or {}
    print(f"  reserve_vram: VRAM freed after {rt.get('freed_ms')} ms (target <= 100: "
          f"{'met' if rt.get('freed_met') else 'missed'}); answered after "
          f"{rt.get('answered_ms')} ms, outcome {rt.get('outcome')} (target <= 100 ms, granted: "
          f"{'met' if rt.get('answered_met') else 'missed'})")
    print(f"  static plans: {a['static']}")
    print(f"  game OOMs: {a['oom']}; chats: {a['chats']}, with errors or gaps: "
          f"{a['chats_with_errors_or_gaps']}; text identical to no-reshard run: "
          f"{a['text_identical']} (differs at {a['text_differs_at']})")
    print("== frames ==")
    for ph, f in a["frames"].items():
        print(f"  {ph:28s} " + " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in f.items()))
    print(f"  NPC tokens/s while measuring frames: {a['frame_chat_tps']}")


def _exit_on_signal(signum, _frame) -> None:
    raise SystemExit(128 + signum)  # unwinds through every finally: children ended, JSON written


def default_sim_model(work: Path) -> str:
    """The simulation's small model: the default model if installed (copied into the work
    directory, which the sidecar may read), else the synthetic ``tiny-llama``."""
    try:
        from igi_sdk.model.default import default_model_path

        src = default_model_path()
        dst = work / src.name
        if not dst.exists() or dst.stat().st_size != src.stat().st_size:
            tmp = work / f"{src.name}.part"
            tmp.write_bytes(src.read_bytes())
            os.replace(tmp, dst)
        return str(dst)
    except Exception:  # noqa: BLE001 - not installed: the synthetic model will do
        from igi_sdk.model import write_synthetic_gguf

        dst = work / "tiny-llama.gguf"
        if not dst.exists():
            write_synthetic_gguf(str(dst), "tiny-llama")
        return str(dst)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--role", default="game", choices=["game", "npcs", "probe", "greedy-game"])
    ap.add_argument("--workdir", default="/tmp/igi-bench")
    ap.add_argument("--model", help="GGUF (default: the llama3-8b Q4_0 synthetic in --workdir; "
                                    "with --sim a small model)")
    ap.add_argument("--profile", help="profile JSON (default: this machine's, --fast; with --sim "
                                      "benchmarks/results/h200-profile-12t.json)")
    ap.add_argument("--pool-gb", type=float, default=8.0, help="VRAM the game and model share")
    ap.add_argument("--high-gb", type=float, default=6.0, help="model budget in menus/gameplay")
    ap.add_argument("--low-gb", type=float, default=2.0, help="model budget during level load")
    ap.add_argument("--reserve-gb", type=float, default=3.0)
    ap.add_argument("--render-ms", type=float, default=12.0, help="GPU time of a frame, idle")
    ap.add_argument("--phase-s", type=float, default=8.0)
    ap.add_argument("--frame-s", type=float, default=10.0)
    ap.add_argument("--grow-hold", type=float, default=2.0)
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--threads", type=int, default=max(1, (os.cpu_count() or 4) * 3 // 4))
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--reference-chats", type=int, default=30,
                    help="chats replayed on the static plan for the text comparison")
    ap.add_argument("--json")
    ap.add_argument("--sim", action="store_true", help="no GPU: a simulated device")
    ap.add_argument("--only", choices=["frames", "trace", "greedy", "prepare"],
                    help="frames: the frame-pacing part alone; trace: the trace run alone (no "
                         "static runs): the reserve_vram figures; greedy: the greedy game; "
                         "prepare: only write the model and measure the profile")
    gg = ap.add_argument_group("the greedy game (--only greedy)")
    gg.add_argument("--greedy-free-gib", type=float, default=3.0,
                    help="of the pool, what the game leaves the model at the start")
    gg.add_argument("--greedy-leave-gib", type=float, default=0.75,
                    help="the game stops growing when it leaves only this much of the pool "
                         "(the model's CPU plan keeps ~0.55 GiB on the GPU)")
    gg.add_argument("--greedy-chunk-mib", type=int, default=64, help="allocation size")
    gg.add_argument("--greedy-max-s", type=float, default=30.0, help="time limit of the growth")
    gg.add_argument("--greedy-hold-s", type=float, default=10.0, help="how long it holds it")
    gg.add_argument("--greedy-retry-ms", type=float, default=5.0,
                    help="pause after a failed allocation")
    gg.add_argument("--greedy-settle-s", type=float, default=60.0,
                    help="the most to wait after the load for the model to settle "
                         "(with --sim: the trace's schedule, so always this long)")
    gg.add_argument("--greedy-warm-s", type=float, default=5.0,
                    help="the NPCs chat this long before the game turns greedy")
    gg.add_argument("--greedy-regrow-s", type=float, default=60.0,
                    help="the most to wait for the model to grow back")
    gg.add_argument("--greedy-tail-s", type=float, default=3.0,
                    help="the NPCs go on chatting this long after the model grew back")
    gg.add_argument("--probe-ms", type=float, default=20.0, help="control probe period")
    gg.add_argument("--probe-types", default="ping,stats,frame",
                    help="control messages the probe times (frame: with no VRAM fields)")
    gg.add_argument("--sample-ms", type=float, default=100.0, help="model VRAM sampling period")
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--shm", help=argparse.SUPPRESS)
    ap.add_argument("--chats", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "npcs":
        return npc_role(args)
    if args.role == "probe":
        return probe_role(args)
    if args.role == "greedy-game":
        return greedy_game_role(args)
    signal.signal(signal.SIGTERM, _exit_on_signal)
    try:
        return bench(args)
    finally:
        end_children()


def bench(args: argparse.Namespace) -> int:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if args.model is None and args.sim:
        args.model = default_sim_model(work)
    if args.model is None:
        from igi_sdk.model import write_synthetic_gguf

        args.model = str(work / "llama3-8b.gguf")
        if not Path(args.model).exists():
            write_synthetic_gguf(args.model, "llama3-8b")
    if args.profile is None and args.sim:  # the simulation needs a GPU's profile
        args.profile = str(Path(__file__).parent / "results" / "h200-profile-12t.json")
    if args.profile is None:  # measured in its own process: it runs llama.cpp
        args.profile = str(work / "profile.json")
        subprocess.run([sys.executable, "-m", "igi_sdk.cli", "profile", "--fast", "--threads",
                        str(args.threads), "--json", args.profile], check=True, env=native_env(),
                       stdout=subprocess.DEVNULL, timeout=600)

    if args.only == "prepare":
        print(f"model {args.model}, profile {args.profile}", flush=True)
        return 0
    if args.only == "greedy":
        return bench_greedy(args)
    try:
        return bench_trace(args)
    except BaseException:
        if args.json:  # what the run got to, and why it stopped
            data = dict(PARTIAL.get("written") or {})
            data["error"] = traceback.format_exc()
            data.setdefault("events", PARTIAL.get("events"))
            write_json(args.json, data)
        raise


def bench_greedy(args: argparse.Namespace) -> int:
    print("== greedy game (arbiter on, the game never talks to the sidecar) ==", flush=True)
    res: dict = {"mode": "greedy"}
    with tempfile.TemporaryDirectory(prefix="igi-arb-") as tmpd:
        try:
            greedy_run(args, Path(tmpd), res)
        except BaseException as e:
            res["error"] = traceback.format_exc()
            print(f"the greedy run failed: {e!r}", flush=True)
            if not isinstance(e, Exception):
                raise
        finally:
            try:
                a = analyse_greedy(res)
                print_greedy(a)
            except Exception:  # noqa: BLE001 - the raw data is still written
                a = {"analysis_error": traceback.format_exc()}
                print(a["analysis_error"], flush=True)
            if args.json:
                write_json(args.json, {"summary": a, "raw": res})
    return 1 if res.get("error") else 0


def bench_trace(args: argparse.Namespace) -> int:
    model_vram = [0]
    dev = SimDevice(int(args.pool_gb * GB), lambda: model_vram[0]) if args.sim else CudaDevice()
    idle_gpu = calibrate(dev, args.render_ms)
    print(f"render stand-in: {dev.iters} products, {idle_gpu:.2f} ms of GPU time idle",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="igi-arb-") as tmpd:
        tmp = Path(tmpd)
        if args.sim:  # the simulated device sees the model's plan, polled from stats
            poll_stop = threading.Event()
            ep = f"ipc://{tmp / ('frames.sock' if args.only == 'frames' else 'trace.sock')}"

            def poll() -> None:
                c = None
                while not poll_stop.is_set():
                    try:
                        c = c or Client(ep, timeout=5, engine="sim-poll")
                        arb = c.stats().get("arbiter") or {}
                        model_vram[0] = int(arb.get("plan_vram") or 0)
                    except Exception:  # noqa: BLE001 - the sidecar may not be up yet
                        c = None
                    time.sleep(0.02)

            threading.Thread(target=poll, daemon=True).start()
        if args.only == "frames":
            print("== frames run (arbiter on, VRAM plenty) ==", flush=True)
            res = frames_run(args, dev, tmp)
            res["render_idle_gpu_ms"] = idle_gpu
            for ph, f in res["frames"].items():
                print(f"  {ph:28s} " + " ".join(f"{k}={v:.2f}" if isinstance(v, float)
                                                else f"{k}={v}" for k, v in f.items()))
            if args.json:
                write_json(args.json, res)
            return 0
        print("== trace run (arbiter on) ==", flush=True)
        trace = trace_run(args, dev, tmp)
        if args.sim:
            poll_stop.set()
        n = min(len(trace["chats"]), args.reference_chats)
        statics: dict[str, dict] = {}
        reference: dict = {"chats": []}
        a = analyse(trace, statics, reference)
        if args.json:  # what the trace gave, in case the static runs do not finish
            PARTIAL["written"] = {"summary": a, "events": trace["events"],
                                  "stats": trace["stats"]}
            write_json(args.json, PARTIAL["written"])
        if args.only == "trace":
            a["render_idle_gpu_ms"] = idle_gpu
            a["threads"] = args.threads
            print_summary(a)
            return 0
        for name, b in (("menu", args.high_gb), ("level load", args.low_gb),
                        ("reserved", args.high_gb - args.reserve_gb)):
            budget = int(b * GB)
            if name == "menu":  # the no-reshard reference: the same chats in the same order
                print(f"== static {b} GB: {n} chats (reference text) ==", flush=True)
                statics[name] = static_run(args, dev, tmp, budget, n, 0)
                reference = statics[name]
            else:
                print(f"== static {b} GB ==", flush=True)
                statics[name] = static_run(args, dev, tmp, budget, 0, args.phase_s)
    a = analyse(trace, statics, reference)
    a["render_idle_gpu_ms"] = idle_gpu
    a["threads"] = args.threads
    print_summary(a)
    if args.json:
        write_json(args.json, {"summary": a, "events": trace["events"], "stats": trace["stats"]})
    return 0


if __name__ == "__main__":
    sys.exit(main())
