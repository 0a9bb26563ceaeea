"""Prompt tokens the HTTP face reads per turn for clients that change their transcripts.

Three clients talk to ``serve --http`` through the official ``openai`` package, without a
conversation name (as the package's own examples do), 8 turns each, greedy:

* ``exact``: sends every reply back as it came (the baseline);
* ``trim``: keeps only the first 6 words of each reply;
* ``instruct``: adds an instruction to its newest line only (later turns carry the plain line);
* ``system``: sends the instruction as a system message before its newest line only;
* ``stop``: every other turn streams and stops reading after 8 chunks, then sends what it
  read (the turn after each stop is the one measured).

``read`` is ``prompt_tokens - cached_tokens`` of each request. ``--code DIR`` runs the sidecar
from another checkout of the repository (for a before/after on one machine):

    python benchmarks/http_transcripts.py --model smol.gguf-path [--code /path/to/checkout]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import openai

NPC = "You are Brom, the village blacksmith of Oakvale. Answer in one or two short sentences."
LINES = ["Good morning! What do you make here?", "How much for a steel sword?",
         "Can you make it lighter?", "What about a shield to go with it?",
         "Have you heard any news from the capital?", "Who taught you your trade?",
         "Do you ever travel?", "Thank you, I will be back tomorrow."]
INSTRUCTION = "(Stay in character; do not mention being an AI.) "


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(code: Path, model: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], str]:
    d = tmp / "models"
    d.mkdir()
    shutil.copy(model, d / "smol.gguf")
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(code)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", f"ipc://{tmp / 's.sock'}",
         "--model-dir", str(d), "--model", "smol.gguf", "--ctx", "4096", "--threads", "2",
         "--http", f"127.0.0.1:{port}"], env=env, cwd=code,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    proc.kill()
    raise SystemExit("the sidecar did not come up")


def _streamed(base: str, msgs: list[dict[str, str]]) -> tuple[str, int, int]:
    """(text read, 0, 0) of a reply whose reader stops after 8 chunks (a stopped stream sends
    no usage: its cost shows in the next request's)."""
    said: list[str] = []
    with httpx.stream("POST", f"{base}/v1/chat/completions", timeout=120, json={
            "model": "smol", "max_tokens": 48, "temperature": 0, "stream": True,
            "messages": msgs}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                said.append(choices[0].get("delta", {}).get("content") or "")
            if len(said) > 8:
                break
    return "".join(said), 0, 0


def run(base: str, mode: str) -> list[dict[str, int]]:
    api = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)
    kept: list[dict[str, str]] = [{"role": "system", "content": NPC}]
    out = []
    for i, line in enumerate(LINES):
        # distinct per mode: the face would otherwise find another mode's conversation
        text = f"{line} [{mode}]" if i == 0 else line
        sent = [*kept, {"role": "user", "content": (INSTRUCTION + text) if mode == "instruct"
                        else text}]
        if mode == "system":
            sent.insert(-1, {"role": "system", "content": INSTRUCTION.strip()})
        if mode == "stop" and i % 2 == 0:
            reply, _, _ = _streamed(base, sent)
            usage = None
        else:
            r = api.chat.completions.create(model="smol", max_tokens=48, temperature=0,
                                            messages=sent)
            reply, usage = r.choices[0].message.content or "", r.usage
        if usage is not None:
            cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details \
                else 0
            out.append({"turn": i + 1, "prompt": usage.prompt_tokens, "cached": cached,
                        "read": usage.prompt_tokens - cached})
        if mode == "trim":
            reply = " ".join(reply.split()[:6])
        kept += [{"role": "user", "content": text}, {"role": "assistant", "content": reply}]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--code", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--modes", default="exact,trim,instruct,system,stop")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, base = _start(args.code.resolve(), args.model.resolve(), Path(tmp))
        try:
            results = {}
            for mode in args.modes.split(","):
                try:
                    results[mode] = run(base, mode)
                except openai.APIStatusError as e:
                    results[mode] = [{"error": e.status_code}]
        finally:
            proc.kill()
            proc.wait(10)
    for mode, rows in results.items():
        if rows and "error" in rows[0]:
            print(f"{mode:9s} refused: HTTP {rows[0]['error']}")
            continue
        reads = [r["read"] for r in rows if "read" in r]
        later = reads[1:] or reads
        print(f"{mode:9s} read per turn: {reads}  turns 2+: mean "
              f"{statistics.mean(later) if later else float('nan'):.1f}, "
              f"max {max(later) if later else 'n/a'}  (prompt {[r.get('prompt') for r in rows]})")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
