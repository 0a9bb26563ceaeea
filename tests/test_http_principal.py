"""A mod is not the game: the HTTP face's conversations may take every session slot, and the
game's own sessions open whatever the face holds, idle or replying (the real sidecar, the official
``openai`` client, the game's protocol client with the launch token)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from igi_sdk.client import Client
from tests.sidecars import free_port, stop, wait_http

TOKEN = "launch-token-of-the-test-game-03"



@pytest.fixture()
def sidecar(tmp_path, default_model, request):
    shutil.copy(default_model, tmp_path / "smol.gguf")
    endpoint, port = f"ipc://{tmp_path / 's.sock'}", free_port()
    env = {**os.environ, "IGI_SDK_TOKEN": TOKEN}
    orphan_ttl = getattr(request, "param", 300.0)
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint, "--model-dir",
         str(tmp_path), "--model", "smol.gguf", "--ctx", "2048", "--threads", "2",
         "--max-sessions", "4", "--orphan-ttl", str(orphan_ttl),
         "--http", f"127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    base = f"http://127.0.0.1:{port}"
    wait_http(base, 90)
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
        assert st["sessions"] <= 4  # the face may hold every slot (its conversations)
        for j in range(4):  # every slot: the face's idle conversations make way
            game.open_session("You are an NPC.", name=f"npc{j}")
        # now the face's request waits in its line while the game holds every slot (it
        # takes none of the game's), and is served once the game gives one back
        with ThreadPoolExecutor(1) as pool:
            late = pool.submit(_line, api, "mod-late")
            time.sleep(1.0)  # refused at once before the line: now it is still waiting
            assert not late.done()
            game.close_session("npc3")
            assert late.result(timeout=60) is not None
    finally:
        game.close()


@pytest.mark.parametrize("sidecar", [1.0], indirect=True)
def test_a_conversation_closed_while_idle_goes_on_from_its_transcript(sidecar) -> None:
    _, base = sidecar
    api = openai.OpenAI(base_url=f"{base}/v1", api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "Hello there."}]
    first = _line(api, "brom")
    again = api.chat.completions.create(
        model="smol", max_tokens=2, extra_body={"prompt_cache_key": "brom"},
        messages=[*messages, {"role": "assistant", "content": first},
                  {"role": "user", "content": "And then?"}])
    assert again.usage.prompt_tokens_details.cached_tokens > 0  # its session held it
    time.sleep(3.0)  # idle past the orphan timeout: the sidecar closes its session
    later = api.chat.completions.create(
        model="smol", max_tokens=2, extra_body={"prompt_cache_key": "brom"},
        messages=[*messages, {"role": "assistant", "content": first},
                  {"role": "user", "content": "And then?"},
                  {"role": "assistant", "content": again.choices[0].message.content},
                  {"role": "user", "content": "Goodbye."}])
    assert later.choices[0].message.content is not None
    # opened anew from the transcript: nothing of it was cached
    assert later.usage.prompt_tokens_details.cached_tokens == 0
    assert later.usage.prompt_tokens > again.usage.prompt_tokens
