"""`igi-sdk demo`: a sidecar in a child process and a short NPC scene played over the bridge."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from igi_sdk.bundle.frozen import cli_command
from igi_sdk.client import Client, SidecarUnavailable

SMITH = ("You are Brom, the blacksmith of Oakvale: gruff but kind, proud of your swords. "
         "Answer in one or two short sentences, in character.")
INNKEEPER = ("You are Mira, the cheerful innkeeper of the Sleeping Fox in Oakvale. "
             "Answer in one or two short sentences, in character.")
SCENE = [
    ("Brom", "Greetings, smith! I need a blade for the road north. What can you offer me?"),
    ("Mira", "Good evening! Is there a warm room free tonight?"),
    ("Brom", "How much for that one with the silver hilt?"),
    ("Mira", "Tell me everything you know about the old ruins, every rumour, in detail."),
]
CANCEL_LINE = 3  # the player walks away mid-answer: that reply is cancelled
# how long the sidecar may take to load the model (minutes on a busy 2-core machine); a sidecar
# that exits is reported at once
START_TIMEOUT_S = 300.0


def run_demo(endpoint: str = "", max_tokens: int = 48, sidecar: str | None = None) -> int:
    """Start a sidecar (``sidecar``: its executable, e.g. a bundle's; default: this Python's
    ``igi-sdk``) and play the scene over it."""
    with tempfile.TemporaryDirectory(prefix="igi-demo-") as tmp:
        endpoint = endpoint or f"ipc://{Path(tmp) / 'sidecar.sock'}"
        start = [sidecar] if sidecar else cli_command()
        cmd = [*start, "serve", "--endpoint", endpoint,
               "--game-pid", str(os.getpid()), "--ctx", "4096", "--max-sessions", "4",
               "--save-dir", tmp]
        print(f"[demo] starting the sidecar: {sidecar or 'igi-sdk'} serve --endpoint {endpoint}",
              flush=True)
        # the launch token makes this process the game (pacing, PID watch, shutdown); it goes
        # through the environment, which other users' processes cannot read
        token = secrets.token_urlsafe(24)
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "IGI_SDK_TOKEN": token})
        try:
            return _scene(endpoint, max_tokens, proc, token)
        finally:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(5)
                except subprocess.TimeoutExpired:
                    proc.kill()


def _wait_ready(client: Client, proc: subprocess.Popen, timeout: float) -> dict:
    """The sidecar's stats once its model is loaded; gives up at once when it has exited (its
    error is then on its stderr) rather than at the end of ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return client.wait_ready(timeout=1.0)
        except SidecarUnavailable:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise


def _scene(endpoint: str, max_tokens: int, proc: subprocess.Popen, token: str) -> int:
    client = Client(endpoint, timeout=120.0, engine="igi-demo", game_pid=os.getpid(),
                    token=token)
    t0 = time.monotonic()
    try:
        stats = _wait_ready(client, proc, START_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - whatever went wrong, show the sidecar's own words
        code = proc.poll()
        err = proc.stderr.read() if code is not None and proc.stderr else ""
        why = (f"it exited with {code}" if code is not None
               else f"not ready within {START_TIMEOUT_S:.0f} s")
        print(f"[demo] the sidecar did not start ({why}):\n{err[-2000:]}", file=sys.stderr)
        return 1
    ready_s = time.monotonic() - t0
    print(f"[demo] sidecar ready with {stats['model']} in {ready_s:.1f} s", flush=True)
    npcs = {
        "Brom": client.open_session(SMITH, sampling={"temperature": 0.7, "seed": 7}, priority=1),
        "Mira": client.open_session(INNKEEPER, sampling={"temperature": 0.7, "seed": 11}),
    }
    for i, (npc, line) in enumerate(SCENE):
        print(f"\nplayer -> {npc}: {line}")
        print(f"{npc}: ", end="", flush=True)
        stream = client.chat(npcs[npc], line, max_tokens=max_tokens)
        for n, piece in enumerate(stream):
            print(piece, end="", flush=True)
            if i == CANCEL_LINE and n == 5:
                stream.cancel()
        done = stream.done or {}
        note = " [cancelled: the player walked away]" if done.get("finish_reason") == \
            "cancelled" else ""
        t = done.get("timings", {})
        print(f"{note}\n  ({done.get('usage', {}).get('completion_tokens', 0)} tokens, first after "
              f"{t.get('ttft_s', 0) * 1000:.0f} ms)", flush=True)
    saved = client.save_session(npcs["Brom"], "brom")
    print(f"\n[demo] saved Brom's conversation ({saved['bytes']} bytes); stats: "
          f"{client.stats()['requests']} requests served")
    client.shutdown()
    client.close()
    proc.wait(60)  # it saves nothing more; a busy machine can take a while to end it
    print(f"[demo] sidecar shut down cleanly (exit {proc.returncode})")
    return 0 if proc.returncode == 0 else 1
