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

``--sim`` runs the same script anywhere: a simulated device (the game's allocations counted, the
model's VRAM from its plan), the render on the CPU, a small model and a given GPU profile.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# the game and the NPCs only talk to the sidecar: no llama.cpp in these processes (the game
# runs CuPy, whose CUDA libraries must not meet llama.cpp's in one process)
os.environ["IGI_SDK_CLIENT_ONLY"] = "1"

from igi_sdk.bridge import BridgeError, Client

GB = 10**9
MIB = 1024**2
FPS = 60
FRAME_S = 1 / FPS
HEADROOM = 256 * MIB  # the policy's default headroom
CHUNK = 256 * MIB  # the game allocates its working set in pieces, as a streaming pool would


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


def npc_role(args: argparse.Namespace) -> int:
    """Child process: two NPCs take turns chatting until SIGTERM or ``--chats`` are done.
    One reply at a time, so every decode step holds one sequence and the text does not depend
    on how replies happened to batch together."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    c = Client(args.endpoint, timeout=120, engine="arbiter-bench-npcs")
    chats: list[dict] = []
    sids: list[str] = []
    k = 0
    try:
        while not stop.is_set() and (args.chats <= 0 or k < args.chats):
            who = k % 2
            if k % 8 == 0:  # fresh conversations now and then: bounded context, same for all runs
                for sid in sids:
                    c.close_session(sid)
                sids = [c.open_session(p, sampling={"seed": 100 + k + i}, priority=prio)
                        for i, (p, prio) in enumerate(PERSONAS)]
            row = {"k": k, "npc": who, "t0": time.time(), "times": [], "seq": [], "text": ""}
            stream = c.chat(sids[who], f"Traveller {k} asks: what news from the road?",
                            max_tokens=args.max_tokens)
            try:
                while stream.done is None:
                    rtype, body = c.next_event(stream.id)
                    if rtype == "token":
                        row["times"].append(time.time())
                        row["seq"].append(body["i"])
                        row["text"] += body["text"]
                    elif rtype == "done":
                        stream.done = body
                    elif rtype == "error":
                        raise BridgeError(body.get("code", "error"), body.get("message", ""),
                                          bool(body.get("retryable")))
                row["completion_tokens"] = stream.done["usage"]["completion_tokens"]
                row["finish"] = stream.done.get("finish_reason")
                row["text"] = stream.done["text"]
            except BridgeError as e:
                row["error"] = f"{e}"
            chats.append(row)
            k += 1
    finally:
        Path(args.out).write_text(json.dumps(chats))
        c.close()
    return 0


def start_npcs(args: argparse.Namespace, endpoint: str, out: Path, chats: int = 0):
    cmd = [sys.executable, __file__, "--role", "npcs", "--endpoint", endpoint, "--out", str(out),
           "--chats", str(chats), "--max-tokens", str(args.max_tokens)]
    return subprocess.Popen(cmd)


def stop_npcs(proc, out: Path) -> list[dict]:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=300)
    return json.loads(out.read_text()) if out.exists() else []


# ------------------------------------------------------------------------------ the sidecar


def start_sidecar(args: argparse.Namespace, endpoint: str, *, arbiter: bool):
    cmd = [sys.executable, "-X", "faulthandler", "-m", "igi_sdk.cli", "serve",
           "--endpoint", endpoint,
           "--model-dir", str(Path(args.model).parent), "--threads", str(args.threads),
           "--profile", args.profile, "--grow-hold", str(args.grow_hold),
           "--game-pid", str(os.getpid())]
    if not arbiter:
        cmd.append("--no-arbiter")
    log = open(Path(args.workdir) / "sidecar.log", "a")
    return subprocess.Popen(cmd, stdout=log, stderr=log, env=native_env())


def native_env() -> dict[str, str]:
    """The environment for a process that runs llama.cpp (the sidecar, the profiler)."""
    return {k: v for k, v in os.environ.items() if k != "IGI_SDK_CLIENT_ONLY"}


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
            c.reserve_vram(reserve, 1)
            acked["t"] = time.time()
        except BridgeError as e:
            acked["error"] = str(e)
        acked["wait_s"] = time.time() - t0
        c.close()

    t = time.time()
    g.mark("reserve_vram", bytes=reserve)
    asker = threading.Thread(target=ask)
    asker.start()
    g.phase = "reserved"
    while asker.is_alive():
        g.run_frames(FRAME_S, "reserved")
    g.mark("reserve acknowledged", wait_ms=round(acked.get("wait_s", 0) * 1000, 1))
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
    client.shutdown()
    client.close()
    side.wait(timeout=60)
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
    client.shutdown()
    client.close()
    side.wait(timeout=60)
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
    client.shutdown()
    client.close()
    side.wait(timeout=60)
    return {"budget": budget, "plan": plan, "chats": rows}


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
    print(f"  static plans: {a['static']}")
    print(f"  game OOMs: {a['oom']}; chats: {a['chats']}, with errors or gaps: "
          f"{a['chats_with_errors_or_gaps']}; text identical to no-reshard run: "
          f"{a['text_identical']} (differs at {a['text_differs_at']})")
    print("== frames ==")
    for ph, f in a["frames"].items():
        print(f"  {ph:28s} " + " ".join(f"{k}={v:.2f}" if isinstance(v, float) else f"{k}={v}"
                                        for k, v in f.items()))
    print(f"  NPC tokens/s while measuring frames: {a['frame_chat_tps']}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--role", default="game", choices=["game", "npcs"])
    ap.add_argument("--workdir", default="/tmp/igi-bench")
    ap.add_argument("--model", help="GGUF (default: the llama3-8b Q4_0 synthetic in --workdir)")
    ap.add_argument("--profile", help="profile JSON (default: this machine's, --fast)")
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
    ap.add_argument("--only", choices=["frames"], help="run only the frame-pacing part")
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--chats", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "npcs":
        return npc_role(args)

    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    if args.model is None:
        from igi_sdk.model import write_synthetic_gguf

        args.model = str(work / "llama3-8b.gguf")
        if not Path(args.model).exists():
            write_synthetic_gguf(args.model, "llama3-8b")
    if args.profile is None:  # measured in its own process: it runs llama.cpp
        args.profile = str(work / "profile.json")
        subprocess.run([sys.executable, "-m", "igi_sdk.cli", "profile", "--fast", "--threads",
                        str(args.threads), "--json", args.profile], check=True, env=native_env(),
                       stdout=subprocess.DEVNULL)

    model_vram = [0]
    dev = SimDevice(int(args.pool_gb * GB), lambda: model_vram[0]) if args.sim else CudaDevice()
    idle_gpu = calibrate(dev, args.render_ms)
    print(f"render stand-in: {dev.iters} products, {idle_gpu:.2f} ms of GPU time idle",
          flush=True)
    with tempfile.TemporaryDirectory(prefix="igi-arb-") as tmpd:
        tmp = Path(tmpd)
        if args.sim:  # the simulated device sees the model's plan, polled from stats
            poll_stop = threading.Event()
            ep = f"ipc://{tmp / 'trace.sock'}"

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
                Path(args.json).write_text(json.dumps(res, indent=1, default=str))
            return 0
        print("== trace run (arbiter on) ==", flush=True)
        trace = trace_run(args, dev, tmp)
        if args.sim:
            poll_stop.set()
        n = min(len(trace["chats"]), args.reference_chats)
        statics: dict[str, dict] = {}
        reference: dict = {"chats": []}
        if args.json:  # what the trace gave, in case the static runs do not finish
            a = analyse(trace, statics, reference)
            Path(args.json).write_text(json.dumps({"summary": a, "events": trace["events"],
                                                   "stats": trace["stats"]}, indent=1,
                                                  default=str))
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
        Path(args.json).write_text(json.dumps({"summary": a, "events": trace["events"],
                                               "stats": trace["stats"]}, indent=1,
                                              default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
