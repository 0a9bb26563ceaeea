"""The game dies: the sidecar exits as fast with HTTP requests in flight as without any (their
worker threads no longer wait out the face's 5 s of silence)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

from tests.sidecars import free_port, stop, wait_http

LINE = {"model": "smol", "max_tokens": 1500,
        "messages": [{"role": "user", "content": "Tell a very long story about a dragon."}]}



def _exit_after_game_dies(model_dir: Path, tmp_path: Path, in_flight: int) -> float:
    """Seconds from the game's death to the sidecar's exit, with ``in_flight`` streamed and
    ``in_flight`` plain requests being answered at that moment."""
    game = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint",
         f"ipc://{tmp_path / f's{in_flight}.sock'}", "--model-dir", str(model_dir), "--model",
         "smol.gguf", "--threads", "2", "--ctx", "2048", "--game-pid", str(game.pid),
         "--http", f"127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http(base, 90)
        streaming = threading.Event()

        def streamed() -> None:
            try:
                with httpx.stream("POST", f"{base}/v1/chat/completions",
                                  json={**LINE, "stream": True}, timeout=60) as r:
                    for _ in r.iter_lines():
                        streaming.set()
            except httpx.HTTPError:
                pass

        def plain(i: int) -> None:
            try:
                httpx.post(f"{base}/v1/chat/completions",
                           json={**LINE, "prompt_cache_key": f"plain-{i}"}, timeout=60)
            except httpx.HTTPError:
                pass

        for i in range(in_flight):
            threading.Thread(target=streamed, daemon=True).start()
            threading.Thread(target=plain, args=(i,), daemon=True).start()
        if in_flight:
            assert streaming.wait(60)
            time.sleep(0.5)  # every request reached the sidecar (some queue for a slot)
        game.kill()
        game.wait()
        t0 = time.monotonic()
        proc.wait(30)
        return time.monotonic() - t0
    finally:
        game.kill()
        stop(proc)


def test_open_http_requests_do_not_hold_the_sidecar_after_the_game(default_model,
                                                                   tmp_path) -> None:
    shutil.copy(default_model, tmp_path / "smol.gguf")
    idle = _exit_after_game_dies(tmp_path, tmp_path, 0)
    busy = _exit_after_game_dies(tmp_path, tmp_path, 3)
    # before: 5.5 s with requests in flight against 0.7 s without (2-core machine)
    assert busy < idle + 2.0, (idle, busy)
