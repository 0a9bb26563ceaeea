"""A headless "game" at 60 FPS talking to the sidecar: VRAM phases, NPC chatter, a timeline.

    python samples/game_loop/game_loop.py [--seconds 12] [--png timeline.png]

Phases of the game's VRAM use (a scripted trace the sidecar reads, as it would read NVML):
menu (little) → level load (a spike, announced with ``reserve_vram``) → gameplay → cutscene
(heavy) → back to gameplay. Each frame sends a ``frame`` tick with the frame time against a
16.7 ms target; two NPCs chat the whole time. Prints a timeline (budget, model VRAM, game VRAM,
tokens/s) and plots it to a PNG.

On a machine without a GPU the plans are simulated from the machine profile in this folder
(the placements and budgets are real planner output; inference runs on the CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import igi_sdk  # noqa: F401
from igi_sdk.client import BridgeError, Client

HERE = Path(__file__).resolve().parent
MIB = 1024**2
FPS = 60
TARGET_MS = 1000 / FPS


def phases(seconds: float, total: int, ladder) -> list[tuple[float, str, int]]:
    """(start time, name, game VRAM) — sized from the plan ladder so the model moves each time."""
    top, cpu = ladder.rungs[-1].vram, ladder.cpu.vram
    mid = ladder.rungs[len(ladder.rungs) // 2].vram
    s = seconds
    return [
        (0.0, "menu", total - top - 512 * MIB),  # room for the whole model
        (0.2 * s, "level load", total - cpu - 64 * MIB),  # only the CPU plan fits
        (0.4 * s, "gameplay", total - mid - 512 * MIB),  # room for part of it
        (0.65 * s, "cutscene", total - cpu - 128 * MIB),
        (0.85 * s, "gameplay", total - mid - 512 * MIB),
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--seconds", type=float, default=12.0)
    ap.add_argument("--png", default="game_loop.png")
    ap.add_argument("--json", help="write the timeline here")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()

    from igi_sdk.arbiter import PlanLadder
    from igi_sdk.arbiter.ladder import arbiter_workload
    from igi_sdk.model import read_inventory, spec_with, write_synthetic_gguf
    from igi_sdk.profile import Profile

    with tempfile.TemporaryDirectory(prefix="igi-game-") as tmp:
        d = Path(tmp)
        # a small synthetic NPC model, so the sample runs anywhere in seconds
        model = write_synthetic_gguf(d / "npc.gguf", spec_with(
            "tiny-llama", n_layers=8, n_embd=512, n_ff=2048, n_vocab=4096))
        profile = HERE / "profile.json"
        ladder = PlanLadder.build(read_inventory(model), Profile.load(profile),
                                  arbiter_workload(2048))
        top = ladder.rungs[-1].vram
        total = top + 1024 * MIB
        timeline = phases(args.seconds, total, ladder)
        trace = d / "trace.json"
        # the game allocates a little after each phase starts (after its reservation is
        # acknowledged); the trace is what the device would show
        trace.write_text(json.dumps({"total": total, "points": [
            {"t": t + (0.5 if i else 0.0), "game": g} for i, (t, _, g) in enumerate(timeline)]}))
        endpoint = f"ipc://{d / 'sidecar.sock'}"
        proc = subprocess.Popen(
            [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint,
             "--model-dir", str(d), "--model", "npc.gguf", "--ctx", "2048", "--vram-trace",
             str(trace), "--profile", str(profile), "--grow-hold", "0.5", "--threads",
             str(args.threads), "--game-pid", str(os.getpid())],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            rows = run_game(endpoint, args.seconds, timeline, ladder)
        finally:
            proc.terminate()
            proc.wait(10)
    print_timeline(rows)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    plot(rows, timeline, Path(args.png))
    print(f"\nplot: {args.png}")
    return 0


def run_game(endpoint: str, seconds: float, timeline, ladder) -> list[dict]:
    game = Client(endpoint, timeout=60, engine="game-loop", game_pid=os.getpid())
    game.wait_ready(60)
    tokens = [0]
    stop = threading.Event()

    def npcs() -> None:  # two NPCs chatting the whole time, on their own connection
        c = Client(endpoint, timeout=60, engine="game-loop-npcs")
        personas = [("You are Brom the smith.", 1), ("You are Mira the innkeeper.", 0)]
        sids = [c.open_session(p, sampling={"seed": i}, priority=prio)
                for i, (p, prio) in enumerate(personas)]
        k = 0
        while not stop.is_set():
            who = k % 2
            if k and k % 12 in (0, 1):  # a fresh conversation now and then: bounded context
                c.close_session(sids[who])
                sids[who] = c.open_session(personas[who][0], sampling={"seed": k},
                                           priority=personas[who][1])
            try:
                for _ in c.chat(sids[who], f"Line {k}: what now?", max_tokens=24):
                    tokens[0] += 1
            except BridgeError as e:  # keep the scene going; the timeline shows the gap
                print(f"npc: {e}", file=sys.stderr)
            k += 1
        c.close()

    talker = threading.Thread(target=npcs, daemon=True)
    talker.start()
    rows: list[dict] = []
    # the scripted trace (what the "device" shows) runs from the sidecar's start: run the game's
    # timeline on the same clock, so it announces the level load before the trace allocates it
    start = time.monotonic() - game.stats()["uptime_s"]
    frame = 0
    announced = False
    last_tokens, last_t = 0, start
    while (now := time.monotonic()) - start < seconds:
        t = now - start
        phase = next(name for ts, name, _ in reversed(timeline) if t >= ts)
        if phase == "level load" and not announced:
            announced = True  # the game asks before allocating: answered once the VRAM is free
            spike = timeline[1][2] - timeline[0][2]
            t0 = time.monotonic()
            try:
                game.reserve_vram(spike, 6)
                event = "reserve_vram acknowledged"
            except BridgeError as e:  # cannot_free / deadline_missed: load the level anyway
                event = f"reserve_vram {e.code}"
            rows.append({"t": round(t, 3), "event": event,
                         "wait_ms": round((time.monotonic() - t0) * 1000, 1)})
        frame_start = time.monotonic()
        game.frame(frame, TARGET_MS, target_frame_time_ms=TARGET_MS)
        if frame % 15 == 0:  # four timeline samples per second
            st = game.stats()
            arb = st.get("arbiter") or {}
            tps = (tokens[0] - last_tokens) / max(1e-3, now - last_t)
            last_tokens, last_t = tokens[0], now
            rows.append({"t": round(t, 3), "phase": phase, "budget": arb.get("budget"),
                         "model_vram": arb.get("plan_vram"), "plan": arb.get("plan"),
                         "game_vram": next(g for ts, _, g in reversed(timeline) if t >= ts),
                         "tokens_per_s": round(tps, 1), "reshards": arb.get("reshards")})
        spent = time.monotonic() - frame_start
        time.sleep(max(0.0, 1 / FPS - spent))
        frame += 1
    stop.set()
    talker.join(timeout=30)
    game.close()
    return rows


def print_timeline(rows: list[dict]) -> None:
    print("   t s  phase        budget MiB  model MiB  game MiB  tok/s  plan")
    for r in rows:
        if "event" in r:
            print(f"{r['t']:6.2f}  ** {r['event']} after {r['wait_ms']} ms")
            continue
        b = "-" if r["budget"] is None else r["budget"] >> 20
        m = "-" if r["model_vram"] is None else r["model_vram"] >> 20
        print(f"{r['t']:6.2f}  {r['phase']:<12} {b!s:>10} {m!s:>10} {r['game_vram'] >> 20:>9} "
              f"{r['tokens_per_s']:6.1f}  {r['plan']}")


def plot(rows: list[dict], timeline, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pts = [r for r in rows if "event" not in r]
    t = [r["t"] for r in pts]
    fig, ax = plt.subplots(figsize=(10, 4.2))
    mib = [(r["budget"] or 0) / MIB for r in pts]
    ax.step(t, mib, where="post", label="model budget (MiB)")
    ax.step(t, [(r["model_vram"] or 0) / MIB for r in pts], where="post",
            label="model VRAM (MiB)")
    ax.step(t, [r["game_vram"] / MIB for r in pts], where="post", label="game VRAM (MiB)")
    for ts, name, _ in timeline:
        ax.axvline(ts, color="grey", alpha=0.2)
        ax.text(ts + 0.05, ax.get_ylim()[1] * 0.95, name, fontsize=8, va="top")
    ax.set(xlabel="seconds", ylabel="MiB")
    ax2 = ax.twinx()
    ax2.plot(t, [r["tokens_per_s"] for r in pts], color="black", alpha=0.5, lw=1,
             label="NPC tokens/s")
    ax2.set_ylabel("tokens/s")
    ax.legend(loc="upper left", fontsize=8)
    ax2.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
