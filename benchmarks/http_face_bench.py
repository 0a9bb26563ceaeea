"""What the OpenAI-compatible HTTP face costs, beside the ZeroMQ face and upstream llama-server.

One run, in phases, each with its own timeout inside an overall deadline, each printing progress
and adding its results to the JSON as soon as it ends (a run cut short keeps what it got):

1. ``start``      — ``igi-sdk serve --http`` on the model; under the VRAM arbiter the model
   climbs its plan ladder first, so the run waits for a settled plan.
2. ``faces``      — the same NPC turn alternately through both faces of the sidecar: a one-token
   reply (the per-request cost: time to the reply's end) and long streamed replies (decode
   tokens/s, time to first token). Each face keeps one conversation, so both prefill only the
   new line.
3. ``kv-ours``    — a 10-turn NPC conversation through the HTTP face as OpenAI clients send it
   (the whole transcript each turn, ``prompt_cache_key``): per turn the prompt tokens, the
   cached tokens reported (``usage.prompt_tokens_details.cached_tokens``), the tokens prefilled
   and TTFT. The sidecar then stops; its NVML peak is the peer's VRAM budget.
4. ``peer-start`` — upstream ``llama-server`` (``--llama-server PATH``; skipped when absent) on
   the same model and context, one slot (``--parallel 1``), flash attention on, fitted by
   llama.cpp's own ``--fit`` to the sidecar's NVML peak (re-fitted once if it overshoots); on a
   machine without NVML every layer on the CPU.
5. ``peer-faces`` and ``peer-kv`` — phases 2 (HTTP only) and 3 against it, ``cache_prompt`` on.

    python benchmarks/http_face_bench.py --model-dir DIR --model M.gguf [--llama-server PATH]
        [--rounds 20] [--tokens 128] [--threads N] [--ctx 4096] [--deadline EPOCH]
        [--logs DIR] [--json out.json] [-- extra serve arguments]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from http_peer import MIB, LlamaServer, Turn, VramSampler, gpu_free_bytes, stream_chat

# this process only talks to the servers: no llama.cpp (nor its CUDA context) in it, and no
# thread-wait policy of the SDK's in the environment that llama-server inherits
os.environ["IGI_SDK_CLIENT_ONLY"] = "1"
from igi_sdk.client import Client

NPC = "You are Brom, the village blacksmith."
LINES = ["What do you sell?", "How much for a sword?", "Is it sharp?", "Any armour?",
         "Who made it?", "Thanks."]
# the KV-reuse conversation: a game's NPC card, then the player's lines, one per turn
NPC_CARD = (
    "You are Brom Ironhand, the blacksmith of Millbrook, a farming village at the edge of the "
    "Greywood. You are fifty-two, broad-shouldered, gruff but fair, and proud of your craft. "
    "You learned smithing from your father, who served as armourer to the old baron. You sell "
    "swords, axes, spearheads, horseshoes, nails, hinges and simple mail shirts; you repair "
    "tools and armour; you do not sell bows or magic. Prices: a short sword is 12 silver, a "
    "long sword 25 silver, a woodcutter's axe 6 silver, a mail shirt 40 silver. You distrust "
    "the new steward at the manor, you worry about wolves taken to raiding the sheepfolds, and "
    "your daughter Elsa wants to travel to the city to study. Speak in short, plain sentences, "
    "stay in character, never mention that you are an AI, and answer in at most three sentences.")
PLAYER = ["Good morning! Are you the smith?", "What do you have for sale today?",
          "How much would a long sword cost me?", "That's steep. Could you do twenty silver?",
          "Fine. Have you heard anything about the wolves?", "Who is the new steward?",
          "Your daughter wants to leave? Why?", "Could you repair my dented helmet too?",
          "How long will the repairs take?", "Thank you, Brom. I'll be back tomorrow."]

T0 = time.monotonic()
# a reply that ended (end of text) within this many tokens times no decode rate: its few tokens
# are mostly the first one's latency
MIN_DECODE_TOKENS = 8


def say(msg: str) -> None:
    print(f"[{time.monotonic() - T0:7.1f} s] {msg}", flush=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _med(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


@dataclass(frozen=True)
class Phase:
    name: str
    timeout_s: float  # the most this phase may take
    reserve_s: float  # what the phases after it need at least, kept out of its time


# timeouts and reserves sized for the synthetic 8B at ~28 tok/s (a GPU call's ~200 s after the
# build): loads ~20 s, a 128-token reply ~5 s, a 32-token KV turn ~1.5 s
PHASES = [Phase("start", 120, 110), Phase("faces", 100, 80), Phase("kv-ours", 45, 70),
          Phase("peer-start", 80, 35), Phase("peer-faces", 60, 15), Phase("peer-kv", 45, 0)]


class Run:
    """The run's deadline, phase bookkeeping and the JSON written after every phase."""

    def __init__(self, deadline: float, json_path: str | None, out: dict[str, Any]) -> None:
        self.deadline = deadline  # monotonic
        self.json_path = json_path
        self.out = out
        out.setdefault("phases", {})

    def write(self) -> None:
        if self.json_path:
            Path(self.json_path).write_text(json.dumps(self.out, indent=1))

    def run(self, phase: Phase, fn: Callable[[float], None]) -> bool:
        """Run ``fn(phase_end)``; record its status; False when it failed or had no time."""
        left = self.deadline - time.monotonic() - phase.reserve_s
        end = time.monotonic() + min(phase.timeout_s, left)
        rec: dict[str, Any] = {"timeout_s": round(min(phase.timeout_s, left), 1)}
        self.out["phases"][phase.name] = rec
        if left < 10:
            rec["status"] = "skipped: no time left"
            say(f"phase {phase.name}: skipped, no time left")
            self.write()
            return False
        say(f"phase {phase.name}: begins ({rec['timeout_s']} s at most)")
        t0 = time.monotonic()
        try:
            fn(end)
            rec["status"] = "cut at its timeout" if time.monotonic() > end else "ok"
        except Exception as e:  # noqa: BLE001 - the next phases still run
            rec["status"] = "failed"
            rec["error"] = traceback.format_exc()[-1500:]
            say(f"phase {phase.name}: FAILED: {e!r}")
        except BaseException:  # the run's own timeout (SIGTERM): what it got is kept
            rec["status"] = "interrupted"
            rec["wall_s"] = round(time.monotonic() - t0, 1)
            say(f"phase {phase.name}: interrupted")
            raise
        rec["wall_s"] = round(time.monotonic() - t0, 1)
        say(f"phase {phase.name}: {rec['status']} after {rec['wall_s']} s")
        self.write()
        return rec["status"] != "failed"


def turn_row(k: int, t: Turn) -> dict[str, Any]:
    return {"turn": k, "prompt_tokens": t.prompt_tokens, "cached_tokens": t.cached_tokens,
            "prefilled_tokens": t.prefilled_tokens, "completion_tokens": t.completion_tokens,
            "ttft_s": round(t.ttft_s, 4), "turn_s": round(t.turn_s, 4),
            "decode_tps": round(t.decode_tps, 2), "cut": t.cut,
            **({"server_prompt_ms": t.timings.get("prompt_ms")} if t.timings else {})}


class Chat:
    """One OpenAI client's conversation: the whole transcript sent each turn."""

    def __init__(self, http: httpx.Client, url: str, system: str, extra: dict[str, Any]) -> None:
        self.http, self.url, self.extra = http, url, extra
        self.messages: list[dict[str, str]] = [{"role": "system", "content": system}]

    def turn(self, text: str, max_tokens: int, end: float) -> Turn:
        self.messages.append({"role": "user", "content": text})
        body = {"model": "m", "messages": self.messages, "max_tokens": max_tokens,
                "temperature": 0, **self.extra}
        t = stream_chat(self.http, self.url, body, end)
        self.messages.append({"role": "assistant", "content": t.text})
        return t


def kv_conversation(chat: Chat, turns: int, tokens: int, end: float, rows: list) -> None:
    for k in range(turns):
        if time.monotonic() > end:
            break
        t = chat.turn(PLAYER[k % len(PLAYER)], tokens, end)
        rows.append(turn_row(k + 1, t))
        say(f"  turn {k + 1}: prompt {t.prompt_tokens}, cached {t.cached_tokens}, prefilled "
            f"{t.prefilled_tokens}, TTFT {t.ttft_s * 1000:.1f} ms, {t.completion_tokens} tokens")


def ours(args: argparse.Namespace, run: Run) -> int | None:
    """Phases 1-3 on the sidecar; returns its NVML peak (bytes; None without NVML)."""
    out = run.out
    ep = f"ipc://{tempfile.mkdtemp()}/s.sock"
    port = _free_port()
    cmd = [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", ep, "--model-dir",
           args.model_dir, "--model", args.model, "--http", f"127.0.0.1:{port}", "--ctx",
           str(args.ctx), "--prefill-chunk", "512",
           *(["--threads", str(args.threads)] if args.threads else []), *args.extra]
    out["ours_cmd"] = " ".join(cmd)
    log = Path(args.logs) / "http-sidecar.log"
    logf = log.open("w")
    env = {k: v for k, v in os.environ.items() if k != "IGI_SDK_CLIENT_ONLY"}
    proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env)
    sampler = VramSampler(proc.pid)
    base = f"http://127.0.0.1:{port}/v1"
    http = httpx.Client(timeout=120)
    zc = Client(ep, timeout=120)
    state: dict[str, Any] = {}
    try:
        def start(end: float) -> None:
            zc.wait_ready(max(1.0, end - time.monotonic()))
            say("  sidecar ready; waiting for the HTTP face")
            while time.monotonic() < end:
                try:
                    if http.get(f"{base}/models").status_code == 200:
                        break
                except httpx.HTTPError:
                    time.sleep(0.1)
            # under the VRAM arbiter the model climbs its ladder first: measure on a settled plan
            seen, settled_at = None, time.monotonic()
            while time.monotonic() - settled_at < args.settle_s and time.monotonic() < end:
                st = zc.stats()
                now = (st.get("plan"), (st.get("arbiter") or {}).get("reshards"))
                if now != seen:
                    say(f"  plan {now[0]} (reshards {now[1]})")
                    seen, settled_at = now, time.monotonic()
                time.sleep(0.5)
            out["plan"] = zc.stats().get("plan")
            out["vram_after_start"] = sampler.mark()
            say(f"  settled on plan {out['plan']}; VRAM so far {out['vram_after_start']}")
            state["sid"] = zc.open_session(NPC, sampling={"temperature": 0})

        if not run.run(PHASES[0], start):
            return None
        rows: dict[str, list[float]] = {k: [] for k in (
            "zmq_turn_s", "http_turn_s", "zmq_ttft_s", "http_ttft_s", "zmq_tps", "http_tps")}
        out["raw"] = rows
        chat = Chat(http, f"{base}/chat/completions", NPC, {"prompt_cache_key": "bench"})

        def zmq_turn(text: str, n: int) -> tuple[float, float, float]:
            t0 = time.perf_counter()
            first = None
            stream = zc.chat(state["sid"], text, max_tokens=n)
            count = 0
            for _ in stream:
                count += 1
                first = first or time.perf_counter()
            end = time.perf_counter()
            toks = stream.done["usage"]["completion_tokens"] if stream.done else count
            gen_s = end - (first or end)
            rate = (toks - 1) / gen_s if toks >= MIN_DECODE_TOKENS and gen_s else 0.0
            return end - t0, (first or end) - t0, rate

        def faces(end: float) -> None:
            nonlocal chat
            for k in range(args.rounds):
                if time.monotonic() > end:
                    return
                line = LINES[k % len(LINES)]
                rows["zmq_turn_s"].append(zmq_turn(line, 1)[0])
                rows["http_turn_s"].append(chat.turn(line, 1, end).turn_s)
                if (k + 1) % 5 == 0:
                    say(f"  one-token turns {k + 1}/{args.rounds}: zmq "
                        f"{_med(rows['zmq_turn_s']) * 1000:.2f} ms, http "
                        f"{_med(rows['http_turn_s']) * 1000:.2f} ms (medians)")
            # the long replies in new conversations on both faces: the one-token turns filled
            # the first ones' share of the context (context_full after four long rounds)
            zc.close_session(state["sid"])
            state["sid"] = zc.open_session(NPC, sampling={"temperature": 0})
            chat = Chat(http, f"{base}/chat/completions", NPC, {"prompt_cache_key": "bench-long"})
            for k in range(args.long_rounds):
                if time.monotonic() > end:
                    return
                line = LINES[k % len(LINES)]
                _, ttft, tps = zmq_turn(line, args.tokens)
                rows["zmq_ttft_s"].append(ttft)
                if tps:
                    rows["zmq_tps"].append(tps)
                t = chat.turn(line, args.tokens, end)
                rows["http_ttft_s"].append(t.ttft_s)
                if t.completion_tokens >= MIN_DECODE_TOKENS:
                    rows["http_tps"].append(t.decode_tps)
                say(f"  long reply {k + 1}/{args.long_rounds}: zmq {tps:.1f} tok/s "
                    f"TTFT {ttft * 1000:.1f} ms; http {t.decode_tps:.1f} tok/s TTFT "
                    f"{t.ttft_s * 1000:.1f} ms ({t.completion_tokens} tokens)")

        run.run(PHASES[1], faces)
        summarize(out)
        kv: list[dict[str, Any]] = []
        out.setdefault("kv", {})["ours"] = kv
        run.run(PHASES[2], lambda end: kv_conversation(
            Chat(http, f"{base}/chat/completions", NPC_CARD, {"prompt_cache_key": "npc-kv"}),
            args.kv_turns, args.kv_tokens, end, kv))
        out["ours_measured_peak"] = sampler.window_peak()
    finally:
        zc.close()
        http.close()
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        logf.close()
        out["ours_vram"] = sampler.stop()
        run.write()
    return out["ours_vram"]["peak"]


def peer(args: argparse.Namespace, run: Run, budget: int | None) -> None:
    """Phases 4-5 on upstream llama-server."""
    out = run.out
    if not args.llama_server or not Path(args.llama_server).exists():
        msg = f"no llama-server ({args.llama_server or 'none given'}): the peer is skipped"
        say(msg)
        out["peer"] = {"skipped": msg}
        run.write()
        return
    model = str(Path(args.model_dir) / args.model)
    log = Path(args.logs) / "http-llama-server.log"
    log.write_text("")
    res: dict[str, Any] = {"attempts": [], "budget_bytes": budget}
    out["peer"] = res
    state: dict[str, Any] = {}
    extra = args.peer_args.split()

    def start(end: float) -> None:
        time.sleep(1.0)  # the sidecar's memory goes back to the device
        free = gpu_free_bytes()
        margin = None
        nonlocal budget
        if budget is None and free is not None and args.fallback_budget_mib:
            budget = args.fallback_budget_mib * MIB  # the sidecar gave no peak
            res["budget_bytes"] = budget
        if budget is not None and free is not None:
            margin = max(0, (free - budget) // MIB)
            say(f"  VRAM budget {budget / MIB:.0f} MiB (the sidecar's peak), free "
                f"{free / MIB:.0f} MiB: --fit-target {margin}")
        for attempt in range(3):
            srv = LlamaServer(args.llama_server, model, ctx=args.ctx, threads=args.threads,
                              port=_free_port(), log=log, margin_mib=margin, extra=extra)
            state["srv"] = srv
            ready_s = srv.wait_ready(end)
            # one short reply allocates what a turn needs: then the peak is the load's and a turn's
            with httpx.Client() as c:
                warm = stream_chat(c, f"{srv.url}/v1/chat/completions",
                                   {"messages": [{"role": "user", "content": "Hello"}],
                                    "max_tokens": 4, "temperature": 0}, end)
            peak = srv.sampler.peak()
            rec = {"cmd": " ".join(srv.cmd), "ready_s": round(ready_s, 1), "peak_bytes": peak,
                   "warm_ttft_s": round(warm.ttft_s, 4), "offload": srv.offload()}
            res["attempts"].append(rec)
            say(f"  llama-server ready in {ready_s:.1f} s, VRAM peak "
                f"{'n/a' if peak is None else f'{peak / MIB:.0f} MiB'}: {rec['offload'][:300]}")
            over = 0 if peak is None or budget is None else peak - budget
            if over <= args.peer_tolerance_mib * MIB or margin is None or attempt == 2:
                rec["fits_budget"] = over <= args.peer_tolerance_mib * MIB
                return
            say(f"  {over / MIB:.0f} MiB over the budget: fitted again with that much more margin")
            srv.stop()
            state.pop("srv")
            margin += -(-over // MIB)

    try:
        if not run.run(PHASES[3], start) or "srv" not in state:
            return
        srv: LlamaServer = state["srv"]
        http = httpx.Client(timeout=120)
        url = f"{srv.url}/v1/chat/completions"
        rows: dict[str, list[float]] = {"turn_s": [], "ttft_s": [], "tps": [],
                                        "server_tps": []}
        res["raw"] = rows

        def faces(end: float) -> None:
            chat = Chat(http, url, NPC, {"cache_prompt": True})
            for k in range(args.rounds):
                if time.monotonic() > end:
                    return
                rows["turn_s"].append(chat.turn(LINES[k % len(LINES)], 1, end).turn_s)
                if (k + 1) % 5 == 0:
                    say(f"  one-token turns {k + 1}/{args.rounds}: "
                        f"{_med(rows['turn_s']) * 1000:.2f} ms (median)")
            for k in range(args.long_rounds):
                if time.monotonic() > end:
                    return
                t = chat.turn(LINES[k % len(LINES)], args.tokens, end)
                rows["ttft_s"].append(t.ttft_s)
                if t.completion_tokens >= MIN_DECODE_TOKENS:
                    rows["tps"].append(t.decode_tps)
                if "predicted_per_second" in t.timings and \
                        t.completion_tokens >= MIN_DECODE_TOKENS:
                    rows["server_tps"].append(float(t.timings["predicted_per_second"]))
                say(f"  long reply {k + 1}/{args.long_rounds}: {t.decode_tps:.1f} tok/s TTFT "
                    f"{t.ttft_s * 1000:.1f} ms ({t.completion_tokens} tokens)")

        run.run(PHASES[4], faces)
        summarize(out)
        kv: list[dict[str, Any]] = []
        out.setdefault("kv", {})["peer"] = kv
        run.run(PHASES[5], lambda end: kv_conversation(
            Chat(http, url, NPC_CARD, {"cache_prompt": True}), args.kv_turns, args.kv_tokens,
            end, kv))
        http.close()
    finally:
        if "srv" in state:
            res["vram"] = state["srv"].stop()
        run.write()


def summarize(out: dict[str, Any]) -> None:
    """Medians of the rows so far, and the HTTP face's cost over the ZeroMQ face."""
    med = {k: _med(v) for k, v in (out.get("raw") or {}).items() if v}
    out["median"] = med
    if "zmq_turn_s" in med and "http_turn_s" in med:
        out["http_added_ms_per_request"] = (med["http_turn_s"] - med["zmq_turn_s"]) * 1000
    if med.get("zmq_tps") and med.get("http_tps"):
        out["http_decode_ratio"] = med["http_tps"] / med["zmq_tps"]
    res = out.get("peer") or {}
    if res.get("raw"):
        res["median"] = {k: _med(v) for k, v in res["raw"].items() if v}


def table(out: dict[str, Any]) -> str:
    """The short text summary."""
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{x * 1000:8.2f} ms"

    def tps(x: float | None) -> str:
        return "-" if x is None else f"{x:7.1f}"

    def gib(x: int | None) -> str:
        return "-" if x is None else f"{x / 2**30:.2f} GiB"

    med = out.get("median") or {}
    pm = (out.get("peer") or {}).get("median") or {}
    peer_vram = ((out.get("peer") or {}).get("vram") or {}).get("peak")
    ours_vram = (out.get("ours_vram") or {}).get("peak")
    lines = [f"{'face (medians)':24} {'one-token turn':>15} {'TTFT':>11} {'decode tok/s':>13} "
             f"{'VRAM peak':>10}",
             f"{'ours, ZeroMQ':24} {ms(med.get('zmq_turn_s')):>15} {ms(med.get('zmq_ttft_s')):>11}"
             f" {tps(med.get('zmq_tps')):>13} {gib(ours_vram):>10}",
             f"{'ours, HTTP':24} {ms(med.get('http_turn_s')):>15} "
             f"{ms(med.get('http_ttft_s')):>11} {tps(med.get('http_tps')):>13} {'(same)':>10}",
             f"{'llama-server, HTTP':24} {ms(pm.get('turn_s')):>15} {ms(pm.get('ttft_s')):>11} "
             f"{tps(pm.get('tps')):>13} {gib(peer_vram):>10}"]
    if "http_added_ms_per_request" in out:
        ratio = out.get("http_decode_ratio")
        lines.append(f"HTTP face: {out['http_added_ms_per_request']:+.2f} ms per request"
                     + (f", decode {ratio:.3f}x the ZeroMQ face" if ratio else ""))
    kv = out.get("kv") or {}
    a, b = kv.get("ours") or [], kv.get("peer") or []
    if a or b:
        lines.append(f"KV reuse, {out.get('kv_turns')}-turn NPC conversation (prompt / cached / "
                     "prefilled tokens, TTFT)")
        lines.append(f"{'turn':>4}  {'ours (HTTP face)':>34}  {'llama-server cache_prompt':>34}")

        def cell(r: dict[str, Any] | None) -> str:
            if r is None:
                return "-"
            return (f"{r['prompt_tokens']:5} / {r['cached_tokens']!s:>5} / "
                    f"{r['prefilled_tokens']!s:>5}, {r['ttft_s'] * 1000:8.1f} ms")

        for k in range(max(len(a), len(b))):
            lines.append(f"{k + 1:>4}  {cell(a[k] if k < len(a) else None):>34}  "
                         f"{cell(b[k] if k < len(b) else None):>34}")

        def rate(rows: list[dict[str, Any]]) -> str:
            return tps(_med([r["decode_tps"] for r in rows
                             if r["completion_tokens"] >= MIN_DECODE_TOKENS]))

        lines.append(f"{'tok/s':>5} {rate(a):>34}  {rate(b):>34}   (median decode of its turns)")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--rounds", type=int, default=20, help="one-token turns per face")
    ap.add_argument("--long-rounds", type=int, default=0,
                    help="long streamed replies per face (default: rounds / 5, at least 2)")
    ap.add_argument("--tokens", type=int, default=128, help="tokens of a long reply")
    ap.add_argument("--kv-turns", type=int, default=10)
    ap.add_argument("--kv-tokens", type=int, default=32, help="tokens of a reply in the KV "
                                                              "conversation")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--ctx", type=int, default=4096, help="KV cells (both servers)")
    ap.add_argument("--settle-s", type=float, default=4.0,
                    help="the plan must hold this long before measuring")
    ap.add_argument("--llama-server", help="upstream llama-server binary (the peer; skipped "
                                           "when absent)")
    ap.add_argument("--peer-args", default="", help="more llama-server arguments")
    ap.add_argument("--peer-tolerance-mib", type=int, default=32,
                    help="how far the peer's VRAM peak may exceed ours before it is re-fitted")
    ap.add_argument("--fallback-budget-mib", type=int, default=0,
                    help="the peer's VRAM budget when the sidecar gave no peak (it failed)")
    ap.add_argument("--deadline", type=float, help="epoch seconds by which the run must end")
    ap.add_argument("--budget-s", type=float, default=900, help="without --deadline: the most "
                                                                "the run may take")
    ap.add_argument("--logs", default=".", help="where the servers' logs go")
    ap.add_argument("--json")
    ap.add_argument("extra", nargs="*", help="more `igi-sdk serve` arguments (after --)")
    args = ap.parse_args()
    args.long_rounds = args.long_rounds or max(2, args.rounds // 5)
    left = (args.deadline - time.time()) if args.deadline else args.budget_s
    Path(args.logs).mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"model": args.model, "rounds": args.rounds, "tokens": args.tokens,
                           "long_rounds": args.long_rounds, "ctx": args.ctx,
                           "threads": args.threads, "kv_turns": args.kv_turns,
                           "kv_tokens": args.kv_tokens, "serve_extra": args.extra,
                           "peer_binary": args.llama_server}
    run = Run(time.monotonic() + left - 5, args.json, out)
    # the run's own timeout (SIGTERM) still writes what it has and stops both servers
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    say(f"http_face_bench: {args.model}, {left:.0f} s")
    try:
        budget = ours(args, run)
        peer(args, run, budget)
    finally:
        summarize(out)
        run.write()
        print(table(out), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

