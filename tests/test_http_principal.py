"""A mod is not the game: the HTTP face's conversations have a mod's share of the session slots,
and the game's own sessions open whatever the face holds (the real sidecar, the official
``openai`` client, the game's protocol client with the launch token)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import openai
import pytest

from igi_sdk.client import Client
from tests.test_bridge import stop
from tests.test_http_face import _free_port, _wait_http

TOKEN = "launch-token-of-the-test-game-03"



@pytest.fixture()
def sidecar(tmp_path, default_model):
    shutil.copy(default_model, tmp_path / "smol.gguf")
    endpoint, port = f"ipc://{tmp_path / 's.sock'}", _free_port()
    env = {**os.environ, "IGI_SDK_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint, "--model-dir",
         str(tmp_path), "--model", "smol.gguf", "--ctx", "2048", "--threads", "2",
         "--max-sessions", "4", "--http", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{port}"
    _wait_http(base, 90)
    yield endpoint, base
    stop(proc)


def _line(api: openai.OpenAI, key: str) -> str | None:
    reply = api.chat.completions.create(
        model="smol", max_tokens=2, messages=[{"role": "user", "content": "Hello there."}],
        extra_body={"prompt_cache_key": key})
    return reply.choices[0].message.content


def test_the_game_opens_its_sessions_whatever_the_mods_hold(sidecar) -> None:
    endpoint, base = sidecar
    api = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    for k in range(10):  # ten conversations: the face keeps its share, the least recent go
        assert _line(api, f"mod-{k}") is not None
    game = Client(endpoint, timeout=30, token=TOKEN)
    try:
        assert game.hello()["game"] is True
        st = game.stats()
        assert st["sessions"] <= 2  # a mod's share of four slots
        for j in range(4):  # every slot: the face's idle conversations make way
            game.open_session("You are an NPC.", name=f"npc{j}")
        # now the face is refused, typed, while the game holds every slot
        with pytest.raises(openai.RateLimitError) as e:
            _line(api, "mod-late")
        assert e.value.body["code"] in ("too_many_sessions", "context_full")
        game.close_session("npc3")
        assert _line(api, "mod-late") is not None  # and served again once one is free
    finally:
        game.close()
