"""The frame-based game benchmark: a 60 Hz game loads and unloads levels beside the sidecar.

    python3 benchmarks/frame_game.py --mode nvml,reserve,greedy --json OUT/frame-game.json

This process is the *game*: a 60 Hz frame loop (one frame every 16.7 ms) on the GPU the sidecar
shares, holding real device memory (``cudaMalloc``/``cudaFree`` through CuPy). As in
``arbiter_bench.py``, it first fills the card with a ballast so that the game and the model share
exactly ``--pool-gib`` of VRAM: an allocation past that fails for real. Each mode runs with a
fresh sidecar (``igi-sdk serve --game-pid`` this process), in this scenario (all durations are
flags):

    settle (the model climbs to its best plan; the NPCs start near its end)
    → menu (the game holds --menu-gib) → level load → gameplay → unload → hold
    → level load → gameplay → unload → tail (the model grows back)

A **level load** allocates ``--level-gib`` as ``--texture-mib`` textures, ``--allocs-per-frame``
of them per frame. An allocation that fails (out of memory) is retried next frame; a frame in
which an allocation failed is a **starved frame**; each allocation's wait runs from its first
attempt to its success. Modes:

- ``nvml``: the game never speaks the protocol: the arbiter sees it only through NVML;
- ``reserve``: before each load the game sends ``reserve_vram(level bytes)`` (``Client``) and
  allocates once the reply came (granted or not); the grant's wait is recorded;
- ``greedy``: each load grabs ``--greedy-gib`` at once, in as few allocations as it can (the
  whole, else halves down to a texture), never speaking the protocol: the longest stall.

NPCs (``--npcs``) chat back to back through all of it from a child process, each on its own
connection, logging every token's arrival. A sampler polls ``stats`` every ``--sample-ms``: the
model's VRAM (NVML's figure for the sidecar's process where the driver gives it, else the
device's use less the game's, else the arbiter's plan), its plan, the budget, and every reshard
decision (with ``released_s``: the old placement freed that long after the decision began).

``--sim`` runs it anywhere: ``arbiter_bench.SimDevice`` (the game's allocations counted, the
model's VRAM from its plan), a small model (the default model if installed) and the stored H200
profile; the sidecar reads the game's VRAM from a scripted ``--vram-trace`` of the same
schedule (the loads at one allocation step per frame: a starved game is behind the trace). The
pool sizes must then be scaled to the small model's ladder (SmolLM2-135M on the H200 profile);
``--sim`` alone sets scaled defaults, e.g.

    python3 benchmarks/frame_game.py --sim --mode nvml --json /tmp/frame-game-sim.json

(``--ctx 8192``: CPU plan 0.57 GiB, GPU plans 0.90 and 0.92 GiB; pool 1.45 GiB, menu 0.1 GiB,
levels of 0.5 GiB in 16 MiB textures, greedy 0.7 GiB: a level does not fit beside the top plan,
it does beside the CPU plan with the arbiter's headroom, so a reservation can be granted). In
``reserve`` mode the trace's loads start ``--sim-grant-s`` after the reservation is sent (the
reservation covers the game until then). Times in
the JSON are seconds from the menu's start; ``benchmarks/plot_frame_game.py`` draws it.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
# sets IGI_SDK_CLIENT_ONLY before igi_sdk is imported: no llama.cpp in the game's process
import arbiter_bench as ab
from ping_watch import PingWatch

Client = ab.Client
BridgeError = ab.BridgeError
GIB, MIB, FRAME_S = ab.GIB, ab.MIB, ab.FRAME_S

MODES = ("nvml", "reserve", "greedy")
# full-size defaults (an 8B Q4_0 on the GPU) and the simulation's (SmolLM2-135M's ladder)
GPU_DEFAULTS = {"pool_gib": 12.0, "menu_gib": 1.0, "level_gib": 6.0, "texture_mib": 64,
                "greedy_gib": 10.0, "settle_s": 25.0, "menu_s": 5.0, "hold_s": 8.0,
                "between_s": 8.0, "tail_s": 10.0, "render_ms": 4.0, "grow_hold": 2.0,
                "threads": max(1, (os.cpu_count() or 4) * 3 // 4), "max_tokens": 48,
                "ctx": 4096}
SIM_DEFAULTS = {"pool_gib": 1.45, "menu_gib": 0.1, "level_gib": 0.5, "texture_mib": 16,
                "greedy_gib": 0.7, "ctx": 8192, "settle_s": 9.0, "menu_s": 3.0, "hold_s": 5.0,
                "between_s": 6.0, "tail_s": 6.0, "render_ms": 0.0, "grow_hold": 1.0,
                "threads": 2, "max_tokens": 24}
PERSONAS = ["You are Brom, the village smith. Answer in one or two sentences.",
            "You are Mira, who keeps the inn. Answer in one or two sentences.",
            "You are Tamsin, a guard at the gate. Answer in one or two sentences.",
            "You are Odo, a travelling merchant. Answer in one or two sentences."]
SYNC_S, SYNC_BYTES = 3.0, 4096  # the simulation's clock mark in the trace (trace_points)
BACK_TO_BACK_S = 0.25  # a request sent within this of the previous reply's end is back to back


# ------------------------------------------------------------------------------ the schedule


def schedule(args: argparse.Namespace, mode: str) -> list[dict[str, Any]]:
    """The scenario's phases, seconds from the menu's start: ``{"name", "kind", "load", "t0",
    "t1"}``. A load phase lasts as long as its allocations take at one step per frame."""
    level = level_bytes(args, mode)
    if mode == "greedy":
        ramp = FRAME_S
    else:
        textures = math.ceil(level / (args.texture_mib * MIB))
        ramp = math.ceil(textures / args.allocs_per_frame) * FRAME_S
    phases: list[dict[str, Any]] = []
    t = 0.0

    def add(name: str, kind: str, seconds: float, load: int | None = None) -> None:
        nonlocal t
        phases.append({"name": name, "kind": kind, "load": load, "t0": round(t, 4),
                       "t1": round(t + seconds, 4)})
        t += seconds

    add("menu", "menu", args.menu_s)
    for i in range(args.loads):
        add(f"load {i + 1}", "load", ramp, i)
        add(f"gameplay {i + 1}", "hold", args.hold_s, i)
        last = i == args.loads - 1
        add(f"unloaded {i + 1}", "unloaded", args.tail_s if last else args.between_s, i)
    return phases


def level_bytes(args: argparse.Namespace, mode: str) -> int:
    return int((args.greedy_gib if mode == "greedy" else args.level_gib) * GIB)


def textures(args: argparse.Namespace, mode: str) -> list[int]:
    """A level's allocations, in order: textures, or the greedy game's one block."""
    level = level_bytes(args, mode)
    if mode == "greedy":
        return [level]
    size = args.texture_mib * MIB
    n = math.ceil(level / size)
    return [size] * (n - 1) + [level - size * (n - 1)]


def trace_points(args: argparse.Namespace, mode: str, phases: list[dict[str, Any]],
                 offset: float) -> list[dict[str, float]]:
    """The simulation's stand-in for NVML: the game's VRAM on the schedule (the menu's memory,
    each load's allocations one step per frame, freed at the unload), ``offset`` seconds after
    the trace's clock starts (the model's load)."""
    menu = int(args.menu_gib * GIB)
    # a step of a few bytes at SYNC_S, too small to move the model, tells the game when the
    # trace's clock started: the arbiter's budget moves by as much (sim_sync)
    pts = [{"t": 0.0, "game": menu - SYNC_BYTES}, {"t": SYNC_S, "game": menu}]
    for ph in phases:
        if ph["kind"] == "load":
            held = 0
            step = args.allocs_per_frame if mode != "greedy" else 1
            sizes = textures(args, mode)
            lag = getattr(args, "sim_grant_s", 0.0) if mode == "reserve" else 0.0
            for j in range(0, len(sizes), step):
                held += sum(sizes[j:j + step])
                pts.append({"t": round(offset + ph["t0"] + lag + (j // step) * FRAME_S, 4),
                            "game": menu + held})
        elif ph["kind"] == "unloaded":
            pts.append({"t": round(offset + ph["t0"], 4), "game": menu})
    return pts


# ------------------------------------------------------------------------------ the game


class Reservation:
    """One ``reserve_vram`` on the game's connection, in a thread: the frame loop goes on."""

    def __init__(self, client: Client, nbytes: int, deadline_frames: int) -> None:
        self.result: dict[str, Any] = {"bytes": nbytes, "t_sent": time.time()}
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._ask, args=(client, nbytes, deadline_frames),
                                        daemon=True)
        self._thread.start()

    def _ask(self, client: Client, nbytes: int, deadline_frames: int) -> None:
        try:
            self.result.update(ab.reserve_outcome(client.reserve_vram(nbytes, deadline_frames)))
        except BridgeError as e:  # cannot_free, deadline_missed: typed outcomes
            self.result.update(outcome=e.code, code=e.code, error=str(e))
        except Exception as e:  # noqa: BLE001 - recorded, never left to kill the thread silently
            self.result.update(outcome="exception", error=repr(e))
        self.result["t_answer"] = time.time()
        self.result["wait_s"] = self.result["t_answer"] - self.result["t_sent"]
        self.done.set()


class FrameGame:
    """The game's frames and memory. Everything is logged with wall-clock times."""

    def __init__(self, args: argparse.Namespace, mode: str, dev: Any, shm: ab.Shared,
                 phases: list[dict[str, Any]], client: Client | None) -> None:
        self.args, self.mode, self.dev, self.shm = args, mode, dev, shm
        self.phases, self.client = phases, client
        self.ballast: list[Any] = []
        self.menu: list[Any] = []
        self.level: list[Any] = []
        self.frames: list[list[Any]] = []  # [t, late_ms, starved, game bytes, phase]
        self.allocs: list[dict[str, Any]] = []  # {load, bytes, first, ok, tries}
        self.loads: list[dict[str, Any]] = []
        self.dropped = 0
        self.pending: list[dict[str, Any]] = []
        self.reservation: Reservation | None = None
        self.t0 = 0.0

    # --- memory ---------------------------------------------------------------------------------

    @staticmethod
    def held(blocks: list[Any]) -> int:
        return sum(int(getattr(b, "size", 0)) for b in blocks)

    def game_bytes(self) -> int:
        """The game's VRAM in the pool: its menu and level memory (not the ballast)."""
        return self.held(self.menu) + self.held(self.level)

    def publish(self) -> None:
        self.shm.set(ab.Shared.GAME, self.held(self.ballast) + self.game_bytes())

    def fill_ballast(self, model_now: int) -> None:
        """Allocate everything but the pool (the model holds ``model_now`` of it now)."""
        want = self.dev.free() - (int(self.args.pool_gib * GIB) - model_now)
        piece = 4 * GIB
        while want > 0 and piece >= 64 * MIB:
            n = min(want, piece)
            try:
                self.ballast.append(self.dev.alloc(n))
                want -= n
            except Exception:  # noqa: BLE001 - the model grew meanwhile: smaller pieces
                piece //= 2
        self.publish()

    def take_menu(self) -> None:
        want = int(self.args.menu_gib * GIB)
        end = time.monotonic() + 30
        while self.held(self.menu) < want and time.monotonic() < end:
            try:
                self.menu.append(self.dev.alloc(min(256 * MIB, want - self.held(self.menu))))
            except Exception:  # noqa: BLE001 - cupy's OutOfMemoryError, or the simulation's
                time.sleep(0.05)
        self.publish()

    def try_alloc(self, a: dict[str, Any], now: float) -> bool:
        a["tries"] += 1
        if a["first"] is None:
            a["first"] = now
        try:
            self.level.append(self.dev.alloc(a["bytes"]))
        except Exception:  # noqa: BLE001 - cupy's OutOfMemoryError, or the simulation's
            return False
        a["ok"] = time.time()
        return True

    def alloc_step(self, now: float) -> bool:
        """This frame's allocations; True when one failed (a starved frame)."""
        if not self.pending:
            return False
        if self.reservation is not None and not self.reservation.done.is_set():
            return False  # waiting for the grant: counted apart
        if self.mode == "greedy":
            return self.greedy_step(now)
        for _ in range(self.args.allocs_per_frame):
            if not self.pending:
                break
            if not self.try_alloc(self.pending[0], now):
                return True
            self.pending.pop(0)
        return False

    def greedy_step(self, now: float) -> bool:
        """The whole of what is missing at once; on failure halves, down to one texture."""
        a = self.pending[0]
        floor = self.args.texture_mib * MIB
        piece = a["bytes"]
        starved = False
        for _ in range(12):
            if not self.pending:
                break
            if a["first"] is None:
                a["first"] = now
            n = min(piece, a["bytes"])
            a["tries"] += 1
            try:
                self.level.append(self.dev.alloc(n))
            except Exception:  # noqa: BLE001 - cupy's OutOfMemoryError, or the simulation's
                starved = True
                if n <= floor:
                    break
                piece = max(floor, n // 2)
                continue
            a["pieces"].append(n)
            a["bytes"] -= n
            if a["bytes"] <= 0:
                a["bytes"] = sum(a["pieces"])
                a["ok"] = time.time()
                self.pending.pop(0)
        return starved

    # --- phases ---------------------------------------------------------------------------------

    def enter(self, ph: dict[str, Any], now: float) -> None:
        ph["t_actual"] = now
        if ph["kind"] == "load":
            load = {"index": ph["load"], "bytes": level_bytes(self.args, self.mode),
                    "t_start": now, "t_done": None, "t_unload": None}
            self.loads.append(load)
            sizes = textures(self.args, self.mode)
            self.pending = [{"load": ph["load"], "bytes": n, "first": None, "ok": None,
                             "tries": 0, "pieces": []} for n in sizes]
            self.allocs += self.pending
            if self.mode == "reserve" and self.client is not None:
                self.reservation = Reservation(self.client, load["bytes"],
                                               self.args.deadline_frames)
                load["reservation"] = self.reservation.result
        elif ph["kind"] == "unloaded":
            load = self.loads[ph["load"]]
            load["t_unload"] = now
            load["left_pending"] = sum(a["bytes"] for a in self.pending)
            for a in self.pending:
                a["abandoned"] = now
            self.pending = []
            self.level.clear()  # cudaFree, texture by texture
            self.publish()
            self.reservation = None
        print(f"  {time.strftime('%H:%M:%S')} {ph['name']} (game {self.game_bytes() / GIB:.2f} "
              f"GiB)", flush=True)

    def run(self, t0: float, end: float | None = None, phase: str = "") -> None:
        """Frames at 60 Hz from ``t0`` (the menu's start) to the schedule's end (or ``end``,
        with ``phase`` as the frames' phase: the settle before the menu)."""
        stop = end if end is not None else t0 + self.phases[-1]["t1"]
        i = -1 if end is None else len(self.phases)
        next_t = time.monotonic()
        wall_off = time.time() - time.monotonic()
        while True:
            now = time.time()
            if now >= stop:
                break
            while i + 1 < len(self.phases) and now >= t0 + self.phases[i + 1]["t0"]:
                i += 1
                self.enter(self.phases[i], now)
            late = max(0.0, now - (next_t + wall_off))
            starved = self.alloc_step(now)
            if self.loads and self.loads[-1]["t_done"] is None and not self.pending \
                    and self.loads[-1]["t_unload"] is None:
                self.loads[-1]["t_done"] = time.time()
            self.publish()
            if self.args.render_ms > 0:
                self.dev.render()
            waiting = self.reservation is not None and not self.reservation.done.is_set()
            name = phase or self.phases[i]["name"]
            self.frames.append([round(now, 4), round(late * 1000, 2), int(starved),
                                self.game_bytes(), name, int(waiting)])
            next_t += FRAME_S
            mono = time.monotonic()
            if next_t < mono:  # behind: drop the missed frames rather than rush them
                self.dropped += int((mono - next_t) / FRAME_S)
                next_t = mono
            time.sleep(max(0.0, next_t - time.monotonic()))


# ------------------------------------------------------------------------------ the NPCs


def npc_role(args: argparse.Namespace) -> int:
    """Child process: ``--npcs`` NPCs, each on its own connection, chat back to back until
    SIGTERM (the reply under way finishes); every token's arrival is logged. The log is
    rewritten after every reply, so a run cut short keeps every finished one."""
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    parent = os.getppid()
    replies: list[dict[str, Any]] = []
    lock = threading.Lock()

    def save() -> None:
        with lock:
            ab.write_json(args.out, replies)

    def one(n: int) -> None:
        c = Client(args.endpoint, timeout=120, engine=f"frame-game-npc{n}")
        sid: str | None = None
        k = 0
        try:
            while not stop.is_set() and not ab.parent_gone(parent):
                row: dict[str, Any] = {"npc": n, "k": k, "t0": time.time(), "times": []}
                try:
                    if sid is None or k % 8 == 0:  # fresh conversations: a bounded context
                        if sid is not None:
                            c.close_session(sid)
                        sid = c.open_session(PERSONAS[n % len(PERSONAS)],
                                             sampling={"seed": 100 * n + k})
                    stream = c.chat(sid, f"Traveller {k} asks: what news from the road?",
                                    max_tokens=args.max_tokens)
                    times = row["times"]
                    ab.follow(c, stream, lambda _body, times=times: times.append(time.time()))
                    row["completion_tokens"] = stream.done["usage"]["completion_tokens"]
                    row["finish"] = stream.done.get("finish_reason")
                except BridgeError as e:
                    row.update(error=str(e), code=e.code)
                    sid = None if e.code in ("unknown_session", "session_closed") else sid
                except Exception as e:  # noqa: BLE001 - a lost connection is data too
                    row.update(error=repr(e), code=type(e).__name__)
                    time.sleep(0.2)
                row["t1"] = time.time()
                with lock:
                    replies.append(row)
                save()
                k += 1
        finally:
            c.close()

    threads = [threading.Thread(target=one, args=(n,), daemon=True) for n in range(args.npcs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    save()
    return 0


def start_npcs(args: argparse.Namespace, endpoint: str, out: Path) -> Any:
    cmd = [sys.executable, __file__, "--role", "npcs", "--endpoint", endpoint, "--out", str(out),
           "--npcs", str(args.npcs), "--max-tokens", str(args.max_tokens)]
    return ab.spawn(cmd)


# ------------------------------------------------------------------------------ the figures


def starved_frames(frames: list[list[Any]], t0: float, t1: float | None = None) -> int:
    """Frames in ``[t0, t1)`` whose allocation had to wait (one failed)."""
    return sum(1 for f in frames if f[0] >= t0 and (t1 is None or f[0] < t1) and f[2])


def longest_wait(allocs: list[dict[str, Any]]) -> float | None:
    """The longest wait from an allocation's first attempt to its success; one never made (the
    level was unloaded first) counts up to its abandonment."""
    waits = [(a.get("ok") or a.get("abandoned")) - a["first"] for a in allocs
             if a.get("first") is not None and (a.get("ok") or a.get("abandoned"))]
    return max(waits) if waits else None


def load_figures(load: dict[str, Any], allocs: list[dict[str, Any]],
                 frames: list[list[Any]]) -> dict[str, Any]:
    """One level load: starved frames from its start to its unload, longest allocation wait,
    how long until it held everything, and the reservation's grant (reserve mode)."""
    mine = [a for a in allocs if a["load"] == load["index"]]
    t0, t1 = load["t_start"], load.get("t_unload")
    out: dict[str, Any] = {
        "load": load["index"] + 1,
        "bytes": load["bytes"],
        "allocations": len(mine),
        "failed_attempts": sum(max(0, a["tries"] - (1 if a.get("ok") else 0)) for a in mine),
        "starved_frames": starved_frames(frames, t0, t1),
        "longest_alloc_wait_s": longest_wait(mine),
        "load_s": None if load.get("t_done") is None else load["t_done"] - t0,
        "complete": load.get("t_done") is not None,
        "waiting_for_grant_frames": sum(1 for f in frames if f[0] >= t0 and
                                        (t1 is None or f[0] < t1) and len(f) > 5 and f[5]),
    }
    res = load.get("reservation")
    if res:
        out["grant"] = {"outcome": res.get("outcome"), "code": res.get("code"),
                        "wait_s": res.get("wait_s")}
    return out


def frame_lateness(frames: list[list[Any]]) -> dict[str, Any]:
    late = sorted(f[1] for f in frames)
    if not late:
        return {"frames": 0}
    return {"frames": len(late), "late_p50_ms": ab.pct(late, 0.5),
            "late_p99_ms": ab.pct(late, 0.99), "late_max_ms": late[-1],
            "late_over_frame": sum(1 for x in late if x > FRAME_S * 1000)}


def token_gaps(replies: list[dict[str, Any]], back_to_back_s: float = BACK_TO_BACK_S,
               ) -> list[tuple[float, float, str]]:
    """One NPC's silences, ``(time of the token that ended it, gap s, kind)``: between the
    tokens of one reply (``"within"``), and from the last token of a reply to the first of the
    next when that request went out right after (``"between"``)."""
    gaps: list[tuple[float, float, str]] = []
    prev: dict[str, Any] | None = None
    for r in sorted(replies, key=lambda r: r["t0"]):
        times = r.get("times") or []
        if prev is not None and times and prev.get("times") and \
                r["t0"] - prev.get("t1", prev["times"][-1]) <= back_to_back_s:
            gaps.append((times[0], times[0] - prev["times"][-1], "between"))
        gaps += [(b, b - a, "within") for a, b in itertools.pairwise(times)]
        prev = r
    return gaps


def npc_figures(replies: list[dict[str, Any]], t_from: float | None = None,
                t_to: float | None = None) -> dict[str, Any]:
    """One NPC: its longest silence, silences over 1 s, the median gap (over the gaps that end
    in ``[t_from, t_to]``), stream errors by code, replies completed."""
    gaps = [g for g in token_gaps(replies) if (t_from is None or g[0] >= t_from)
            and (t_to is None or g[0] <= t_to)]
    errors: dict[str, int] = {}
    for r in replies:
        if r.get("code"):
            errors[r["code"]] = errors.get(r["code"], 0) + 1
    longest = max(gaps, key=lambda g: g[1]) if gaps else None
    return {"replies_completed": sum(1 for r in replies if "code" not in r and "t1" in r),
            "tokens": sum(len(r.get("times") or []) for r in replies),
            "longest_silence_s": longest[1] if longest else None,
            "longest_silence_at": longest[0] if longest else None,
            "longest_silence_kind": longest[2] if longest else None,
            "gaps_over_1s": sum(1 for g in gaps if g[1] > 1.0),
            "median_gap_s": statistics.median(g[1] for g in gaps) if gaps else None,
            "stream_errors": errors}


def phase_figures(phases: list[dict[str, Any]], npc_tokens: dict[str, list[float]],
                  model_rows: list[list[Any]]) -> list[dict[str, Any]]:
    """Per phase of the scenario: the NPCs' tokens a second (all NPCs together, tokens that
    arrived within it) and the plans the model was sampled on, in order (times from the
    menu's start; ``model_rows``: the ``model_vram`` series, the plan in column 5)."""
    out = []
    for ph in phases:
        t0, t1 = float(ph["t0"]), float(ph["t1"])
        n = sum(1 for ts in npc_tokens.values() for t in ts if t is not None and t0 <= t < t1)
        plans: list[str] = []
        for row in model_rows:
            if row[0] is not None and t0 <= row[0] < t1 and row[5] and row[5] not in plans:
                plans.append(row[5])
        out.append({"name": ph["name"], "seconds": round(t1 - t0, 3), "tokens": n,
                    "tokens_per_s": round(n / (t1 - t0), 2) if t1 > t0 else None,
                    "plans": plans})
    return out


def decision_start(d: dict[str, Any]) -> float:
    """A decision is recorded when its reshard ends (``at``); it began ``seconds`` before."""
    return float(d["at"]) - float(d.get("seconds") or 0.0)


def cycle_reshards(decisions: list[dict[str, Any]], loads: list[dict[str, Any]],
                   t_end: float) -> list[dict[str, Any]]:
    """Reshards per load/unload cycle: the decisions that began from one load's start to the
    next's (the last to ``t_end``); split into those before and after the unload."""
    out = []
    for i, load in enumerate(loads):
        t1 = loads[i + 1]["t_start"] if i + 1 < len(loads) else t_end
        mine = [d for d in decisions if d.get("at") is not None
                and load["t_start"] <= decision_start(d) < t1]
        unload = load.get("t_unload") or t1
        out.append({"load": i + 1, "reshards": len(mine),
                    "while_loaded": sum(1 for d in mine if decision_start(d) < unload),
                    "after_unload": sum(1 for d in mine if decision_start(d) >= unload),
                    "actions": [f"{d.get('action')}->{d.get('plan')}" for d in mine],
                    "failures": sum(len(d.get("failures") or []) for d in mine)})
    return out


def release_figures(decisions: list[dict[str, Any]], t0: float = 0.0) -> list[dict[str, Any]]:
    """Each decision: when it began (from ``t0``), what it did, and ``released_s``: from the
    decision to the old placement's release."""
    return [{"t": round(decision_start(d) - t0, 3), "action": d.get("action"),
             "plan": d.get("plan"), "vram": d.get("vram"), "seconds": d.get("seconds"),
             "released_s": d.get("released_s"), "ok": d.get("ok"),
             "failures": len(d.get("failures") or [])}
            for d in sorted(decisions, key=decision_start) if d.get("at") is not None]


def summarize(run: dict[str, Any]) -> dict[str, Any]:
    """The run's figures, from whatever it got to (times are seconds from the menu's start)."""
    frames, allocs = run.get("frames") or [], run.get("allocs") or []
    loads, decisions = run.get("loads") or [], run.get("decisions") or []
    t0 = run.get("t0") or 0.0
    t_end = run.get("t_end") or (frames[-1][0] if frames else t0)
    scen = [f for f in frames if f[0] >= t0]
    out: dict[str, Any] = {"mode": run.get("mode"), "error": run.get("error")}
    out["loads"] = [load_figures(ld, allocs, frames) for ld in loads]
    out["starved_frames"] = sum(x["starved_frames"] for x in out["loads"])
    waits = [x["longest_alloc_wait_s"] for x in out["loads"] if x["longest_alloc_wait_s"]]
    out["longest_alloc_wait_s"] = max(waits) if waits else None
    out["frames"] = {**frame_lateness(scen), "dropped": run.get("dropped", 0)}
    failed = [d for d in decisions if d.get("failures")]
    out["failed_loads"] = sum(len(d.get("failures") or []) for d in decisions)
    out["decisions_with_failures"] = len(failed)
    out["cycles"] = cycle_reshards(decisions, loads, t_end)
    arb = ((run.get("stats") or {}).get("arbiter") or {})
    out["reshards"] = arb.get("reshards", len(decisions))
    out["decisions"] = release_figures(decisions, t0)
    released = [d["released_s"] for d in out["decisions"] if d["released_s"] is not None]
    out["released_s_max"] = max(released) if released else None
    grants = [x["grant"]["wait_s"] for x in out["loads"] if x.get("grant")
              and x["grant"].get("wait_s") is not None]
    out["grant_s"] = grants or None
    by_npc: dict[int, list[dict[str, Any]]] = {}
    for r in run.get("replies") or []:
        by_npc.setdefault(int(r["npc"]), []).append(r)
    out["npcs"] = {str(n): npc_figures(rs, t0, t_end) for n, rs in sorted(by_npc.items())}
    rows = run.get("samples") or []
    out["model_vram_source"] = next((r.get("model_src") for r in rows if r.get("model_src")),
                                    None)
    out["serve_args"] = run.get("serve_args", "")
    out["sidecar_rss_peak"] = run.get("sidecar_rss_peak")
    out["ping_ms"] = run.get("ping_ms")
    return out


# ------------------------------------------------------------------------------ one run


def prepare(args: argparse.Namespace, work: Path) -> None:
    """The model and the GPU profile, as arbiter_bench finds or makes them."""
    if args.model is None and args.sim:
        args.model = ab.default_sim_model(work)
    if args.model is None:
        from igi_sdk.model import write_synthetic_gguf

        args.model = str(work / "llama3-8b.gguf")
        if not Path(args.model).exists():
            write_synthetic_gguf(args.model, "llama3-8b")
    if args.profile is None and args.sim:
        args.profile = str(Path(__file__).parent / "results" / "h200-profile-12t.json")
    if args.profile is None:  # measured in its own process: it runs llama.cpp
        args.profile = str(work / "profile.json")
        if not Path(args.profile).exists():
            subprocess.run([sys.executable, "-m", "igi_sdk.cli", "profile", "--fast",
                            "--threads", str(args.threads), "--json", args.profile], check=True,
                           env=ab.native_env(), stdout=subprocess.DEVNULL, timeout=600)


def one_run(args: argparse.Namespace, mode: str, dev: Any, tmp: Path,
            run: dict[str, Any]) -> None:
    """One mode with a fresh sidecar; fills ``run`` as it goes (a run cut short keeps what it
    measured)."""
    phases = schedule(args, mode)
    run.update(mode=mode, phases=phases)
    shm = ab.Shared(tmp / f"{mode}.shm", create=True)
    if args.sim:
        dev.model_vram = lambda: shm.get(ab.Shared.MODEL)
        dev.allocated = 0
    nv = None if args.sim else ab.Nvml()
    base = nv.used() if nv else 0  # everything on the device before the sidecar
    endpoint = f"ipc://{tmp / f'{mode}.sock'}"
    trace = None
    if args.sim:
        trace = tmp / f"{mode}-trace.json"
        pts = trace_points(args, mode, phases, args.settle_s)
        trace.write_text(json.dumps({"total": int(args.pool_gib * GIB), "points": pts}))
        run["sim_trace"] = {"offset_s": args.settle_s, "total": int(args.pool_gib * GIB),
                            "points": pts}
    side = ab.start_sidecar(args, endpoint, arbiter=True, trace=trace,
                            extra=shlex.split(args.serve_args))
    run["serve_args"] = args.serve_args
    rss = RssPeak(side.pid)
    client = Client(endpoint, timeout=120, engine="frame-game-control")
    game_client = None
    sampler = None
    npcs = None
    watch: PingWatch | None = None
    npc_out = tmp / f"npcs-{mode}.json"
    game = None
    try:
        ab.greet(client, side)
        t_sent = time.time()
        client.load_model(Path(args.model).name, n_ctx=args.ctx, max_sessions=max(4, args.npcs))
        t_loaded = time.time()
        run["clock_uncertainty_s"] = t_loaded - t_sent  # the trace's clock starts in the load
        sampler = ab.Sampler(endpoint, side.pid, args.sample_ms / 1000, nv, base, shm, args.sim)
        run["samples"] = sampler.rows
        snap = sampler.sample(client)
        if "error" in snap or snap.get("plan_vram") is None:
            raise RuntimeError(f"the sidecar runs no VRAM arbiter (no NVML, no GPU profile?): "
                               f"{snap}")
        sampler.start()
        t_trace = sim_sync(sampler, t_loaded, run) if args.sim else t_loaded
        if mode == "reserve":  # the game's own connection, for its reservations only
            game_client = Client(endpoint, timeout=120, engine="frame-game",
                                 game_pid=os.getpid())
            game_client.hello()
        game = FrameGame(args, mode, dev, shm, phases, game_client)
        run["game"] = game
        if not args.sim:
            game.fill_ballast(snap.get("model") or 0)
        game.take_menu()
        run["ballast"] = game.held(game.ballast)
        t0 = t_trace + args.settle_s
        run["t0"] = t0
        print(f"  {time.strftime('%H:%M:%S')} loaded ({snap.get('plan')}); ballast "
              f"{run['ballast'] / GIB:.2f} GiB, menu {game.game_bytes() / GIB:.2f} GiB; "
              f"settling {args.settle_s:.0f} s", flush=True)
        npc_at = t0 - args.npc_lead_s
        game.run(t0, end=npc_at, phase="settle")
        npcs = start_npcs(args, endpoint, npc_out)
        # the control plane as another client sees it through every reshard (a ping each 10 ms)
        watch = PingWatch(endpoint)
        watch.start()
        game.run(t0, end=t0, phase="settle")
        game.run(t0)
        run["t_end"] = time.time()
    finally:
        run["sidecar_rss_peak"] = rss.stop()
        if watch is not None:
            watch.stop()
            run["ping_ms"] = watch.summary()
        if npcs is not None:
            run["replies"] = ab.stop_npcs(npcs, npc_out, timeout=60)
        if sampler is not None:
            sampler.stop()
            run["decisions"] = list(sampler.decisions.values())
        try:
            run["stats"] = client.stats()
            for d in (run["stats"].get("arbiter") or {}).get("decisions") or []:
                if sampler is not None:
                    sampler.decisions[(d.get("at"), d.get("action"), d.get("plan"))] = d
            if sampler is not None:
                run["decisions"] = sorted(sampler.decisions.values(),
                                          key=lambda d: d.get("at") or 0)
        except Exception as e:  # noqa: BLE001 - the sidecar may be gone: recorded
            run["stats_error"] = repr(e)
        if game_client is not None:
            game_client.close()
        ab.stop_sidecar(client, side)
        if game is not None:
            game.level.clear()
            game.menu.clear()
            game.ballast.clear()


class RssPeak:
    """The sidecar's resident memory, its peak over the run (a standby placement's host
    memory shows here), sampled every 100 ms on a thread of its own."""

    def __init__(self, pid: int) -> None:
        import psutil

        self._proc = psutil.Process(pid)
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self.peak = max(self.peak, self._proc.memory_info().rss)
            except Exception:  # noqa: BLE001 - the sidecar ended
                return

    def stop(self) -> int:
        self._stop.set()
        self._thread.join(1)
        return self.peak


def sim_sync(sampler: ab.Sampler, t_loaded: float, run: dict[str, Any]) -> float:
    """When the trace's clock started (it starts inside the model's load): the arbiter's budget
    moves at the trace's SYNC_S mark; the sampler sees it within a trace tick (0.1 s) and a
    sample. Falls back on the load's end (the trace then leads the game by up to the load)."""
    end = time.time() + SYNC_S + 3.0
    first = None
    while time.time() < end:
        for r in list(sampler.rows):
            if r.get("budget") is None:
                continue
            if first is None:
                first = r["budget"]
            elif r["budget"] != first:
                t = r["t"] - SYNC_S - 0.075  # half of a trace tick and a sample, on average
                run["sim_sync"] = {"trace_start": t, "after_load_s": t_loaded - t}
                return t
        time.sleep(0.02)
    run["sim_sync"] = {"trace_start": None, "fallback": "the model's load"}
    return t_loaded


def export(run: dict[str, Any]) -> dict[str, Any]:
    """A run as written: its summary and every series, times from the menu's start."""
    t0 = run.get("t0") or 0.0
    game: FrameGame | None = run.get("game")
    frames = game.frames if game else []
    allocs = game.allocs if game else []
    loads = game.loads if game else []
    raw = {**run, "frames": frames, "allocs": allocs, "loads": loads,
           "dropped": game.dropped if game else 0}
    raw.pop("game", None)
    summary = summarize(raw)

    def rel(t: float | None) -> float | None:
        return None if t is None else round(t - t0, 4)

    npc_tokens: dict[str, list[float]] = {}
    replies = []
    for r in raw.get("replies") or []:
        npc_tokens.setdefault(str(r["npc"]), []).extend(rel(t) for t in r.get("times") or [])
        replies.append({"npc": r["npc"], "k": r["k"], "t0": rel(r["t0"]), "t1": rel(r.get("t1")),
                        "tokens": len(r.get("times") or []), "code": r.get("code"),
                        "finish": r.get("finish")})
    for s in summary["npcs"].values():
        s["longest_silence_at"] = rel(s["longest_silence_at"])
    series = {
        "game_vram": [[rel(f[0]), f[3]] for f in frames],
        "frames": {"columns": ["t", "late_ms", "starved", "game_vram", "phase",
                               "waiting_for_grant"],
                   "rows": [[rel(f[0]), *f[1:]] for f in frames]},
        "model_vram": {"columns": ["t", "model", "source", "plan_vram", "budget", "plan",
                                   "reshards"],
                       "rows": [[rel(r["t"]), r.get("model"), r.get("model_src"),
                                 r.get("plan_vram"), r.get("budget"), r.get("plan"),
                                 r.get("reshards")] for r in raw.get("samples") or []]},
        "npc_tokens": npc_tokens,
        "decisions": summary["decisions"],
        "allocations": [{"load": a["load"] + 1, "bytes": a["bytes"], "first": rel(a["first"]),
                         "ok": rel(a["ok"]), "abandoned": rel(a.get("abandoned")),
                         "tries": a["tries"]} for a in allocs],
    }
    phases = [{**p, "t_actual": rel(p.get("t_actual"))} for p in run.get("phases") or []]
    summary["phases"] = phase_figures(phases, npc_tokens, series["model_vram"]["rows"])
    loads_out = [{k: (rel(v) if k.startswith("t_") else v) for k, v in ld.items()
                  if k != "reservation"} for ld in loads]
    arb = (raw.get("stats") or {}).get("arbiter") or {}
    return {"mode": run.get("mode"), "summary": summary, "series": series, "phases": phases,
            "loads": loads_out, "replies": replies, "ballast": run.get("ballast"),
            "sim_trace": run.get("sim_trace"), "sim_sync": run.get("sim_sync"),
            "clock_uncertainty_s":
            run.get("clock_uncertainty_s"), "arbiter": arb, "t0_wall": t0,
            "error": run.get("error")}


# ------------------------------------------------------------------------------ output


def fmt(x: Any, digits: int = 3) -> str:
    if x is None:
        return "–"
    if isinstance(x, float):
        return f"{x:.{digits}f}"
    return str(x)


def print_summary(runs: list[dict[str, Any]]) -> None:
    print("\n== frame game ==")
    print(f"  {'mode':8s} {'load':>4s} {'starved':>7s} {'wait s':>7s} {'load s':>7s} "
          f"{'grant s':>8s} {'reshards':>8s} {'failed':>6s}  actions")
    for r in runs:
        s = r["summary"]
        cycles = {c["load"]: c for c in s["cycles"]}
        for ld in s["loads"]:
            c = cycles.get(ld["load"], {})
            g = (ld.get("grant") or {})
            grant = fmt(g.get("wait_s")) + ("" if g.get("outcome") in (None, "granted")
                                            else f" {g.get('outcome')}")
            print(f"  {r['mode']:8s} {ld['load']:4d} {ld['starved_frames']:7d} "
                  f"{fmt(ld['longest_alloc_wait_s']):>7s} {fmt(ld['load_s']):>7s} "
                  f"{grant:>8s} {c.get('reshards', 0):8d} {c.get('failures', 0):6d}  "
                  f"{', '.join(c.get('actions') or [])}")
    print(f"\n  {'mode':8s} {'npc':>3s} {'replies':>7s} {'tokens':>6s} {'longest':>8s} "
          f"{'>1 s':>4s} {'median':>7s}  errors")
    for r in runs:
        for n, x in r["summary"]["npcs"].items():
            print(f"  {r['mode']:8s} {n:>3s} {x['replies_completed']:7d} {x['tokens']:6d} "
                  f"{fmt(x['longest_silence_s']):>8s} {x['gaps_over_1s']:4d} "
                  f"{fmt(x['median_gap_s']):>7s}  {x['stream_errors'] or ''}")
    for r in runs:
        s = r["summary"]
        print(f"\n  {r['mode']} {s.get('serve_args') or ''}: frames {s['frames']}; reshards "
              f"{s['reshards']}, failed loads {s['failed_loads']}; model VRAM by "
              f"{s['model_vram_source']}; sidecar RSS peak "
              f"{fmt((s.get('sidecar_rss_peak') or 0) / GIB, 2)} GiB; ping ms {s.get('ping_ms')}")
        for ph in s.get("phases") or []:
            print(f"    {ph['name']:12s} {ph['seconds']:6.1f} s: {fmt(ph['tokens_per_s'], 1):>6s} "
                  f"tokens/s on {', '.join(ph['plans']) or '–'}")
        for d in s["decisions"]:
            print(f"    t={d['t']:+8.2f}s {d['action']!s:12s} -> {d['plan']!s:22s} "
                  f"{fmt(d['vram'] and d['vram'] / GIB, 2)} GiB in {fmt(d['seconds'])} s, "
                  f"released after {fmt(d['released_s'])} s, failures {d['failures']}")
        if s.get("error"):
            print(f"    run failed: {s['error'].strip().splitlines()[-1]}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--role", default="game", choices=["game", "npcs"])
    ap.add_argument("--mode", default="nvml",
                    help="nvml, reserve, greedy, or several comma-separated (a sidecar each)")
    ap.add_argument("--workdir", default="/tmp/igi-bench")
    ap.add_argument("--model", help="GGUF (default: the llama3-8b Q4_0 synthetic in --workdir; "
                                    "with --sim the default model)")
    ap.add_argument("--profile", help="profile JSON (default: this machine's, --fast; with --sim "
                                      "benchmarks/results/h200-profile-12t.json)")
    ap.add_argument("--sim", action="store_true", help="no GPU: a simulated device and a trace")
    ap.add_argument("--pool-gib", type=float, help="VRAM the game and the model share")
    ap.add_argument("--menu-gib", type=float, help="the game's VRAM in the menu")
    ap.add_argument("--level-gib", type=float, help="a level load's VRAM")
    ap.add_argument("--texture-mib", type=int, help="one allocation of a level load")
    ap.add_argument("--allocs-per-frame", type=int, default=1)
    ap.add_argument("--greedy-gib", type=float, help="the greedy game's grab at each load")
    ap.add_argument("--loads", type=int, default=2, help="level loads (each then unloaded)")
    ap.add_argument("--deadline-frames", type=int, default=2, help="reserve_vram's deadline")
    ap.add_argument("--sim-grant-s", type=float, default=1.0,
                    help="--sim, reserve mode: the trace's loads start this long after the "
                         "reservation")
    ap.add_argument("--settle-s", type=float, help="from the model's load to the menu")
    ap.add_argument("--menu-s", type=float)
    ap.add_argument("--hold-s", type=float, help="gameplay after each load")
    ap.add_argument("--between-s", type=float, help="after an unload, before the next load")
    ap.add_argument("--tail-s", type=float, help="after the last unload")
    ap.add_argument("--npc-lead-s", type=float, default=2.0,
                    help="the NPCs start this long before the menu")
    ap.add_argument("--render-ms", type=float,
                    help="GPU time of a frame's render stand-in (0: none)")
    ap.add_argument("--grow-hold", type=float)
    ap.add_argument("--ctx", type=int)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--npcs", type=int, default=1)
    ap.add_argument("--max-tokens", type=int)
    ap.add_argument("--sample-ms", type=float, default=50.0, help="model VRAM sampling period")
    ap.add_argument("--serve-args", default="",
                    help="more `igi-sdk serve` flags for every run (e.g. --no-standby)")
    ap.add_argument("--json")
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "npcs":
        return npc_role(args)
    for k, v in (SIM_DEFAULTS if args.sim else GPU_DEFAULTS).items():
        if getattr(args, k) is None:
            setattr(args, k, v)
    modes = [m for m in args.mode.split(",") if m]
    if any(m not in MODES for m in modes):
        ap.error(f"--mode: one or more of {', '.join(MODES)}")
    signal.signal(signal.SIGTERM, ab._exit_on_signal)
    try:
        return bench(args, modes)
    finally:
        ab.end_children()


def bench(args: argparse.Namespace, modes: list[str]) -> int:
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    prepare(args, work)
    dev: Any = ab.SimDevice(int(args.pool_gib * GIB), lambda: 0) if args.sim else ab.CudaDevice()
    if args.render_ms > 0:
        print(f"render stand-in: {ab.calibrate(dev, args.render_ms):.2f} ms", flush=True)
    config = {k: v for k, v in vars(args).items() if k not in ("role", "endpoint", "out")}
    out: list[dict[str, Any]] = []
    failed = False
    with tempfile.TemporaryDirectory(prefix="igi-frames-") as tmpd:
        for mode in modes:
            print(f"== {mode} ==", flush=True)
            run: dict[str, Any] = {}
            try:
                one_run(args, mode, dev, Path(tmpd), run)
            except Exception as e:  # noqa: BLE001 - written with what it got to
                run["error"] = traceback.format_exc()
                print(f"the {mode} run failed: {e!r}", flush=True)
                failed = True
            out.append(export(run))
            if args.json:
                ab.write_json(args.json, {"config": config, "runs": out})
    print_summary(out)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
