"""A conversation too long for its session's share of the context is refused before the chat
template or the tokenizer reads it (both run on the engine thread, which every NPC shares: a
7.9 MB history held every reply for 15 s before its refusal)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from igi_sdk.client import BridgeError, Client
from igi_sdk.errors import PromptTooLongError
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, SamplingParams
from igi_sdk.runtime.text import Vocab
from tests.sidecars import stop

GREEDY = SamplingParams(temperature=0.0)
TURN = "Tell me of the old war, the siege, and the smith who forged the gate. " * 440


@pytest.fixture(scope="module")
def engine(tiny_llama: Path) -> Iterator[Engine]:
    with Engine(tiny_llama, Plan.all_cpu(),
                EngineConfig(n_ctx=2048, max_sessions=2, n_threads=2)) as eng:
        yield eng


def test_a_history_past_the_share_is_refused_untokenized(
        engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    history = [(("user", "assistant")[i % 2], TURN) for i in range(64)]  # 2 MB
    sid = engine.open_session("You are Brom.", sampling=GREEDY, history=history, memory="off")
    calls = []
    for name in ("tokenize", "prompt_parts", "tokenize_parts"):
        real = getattr(Vocab, name)
        monkeypatch.setattr(Vocab, name, lambda self, *a, _real=real, _n=name, **k: (
            calls.append(_n), _real(self, *a, **k))[1])
    with pytest.raises(PromptTooLongError) as e:
        engine.chat(sid, "And then?", max_tokens=4).result(60)
    assert calls == []  # neither templated nor tokenized
    assert "at least" in str(e.value)
    engine.close_session(sid)


def test_a_history_that_fits_is_still_read(engine: Engine) -> None:
    history = [("user", "Hello, smith."), ("assistant", "Well met, traveller.")]
    sid = engine.open_session("You are Brom.", sampling=GREEDY, history=history)
    res = engine.chat(sid, "What do you sell?", max_tokens=4).result(60)
    assert res.prompt_tokens > 15 and res.completion_tokens >= 1
    engine.close_session(sid)


def test_the_longest_piece_bounds_every_token(engine: Engine, tiny_llama: Path) -> None:
    import llama_cpp

    params = llama_cpp.llama_model_default_params()
    params.vocab_only = True
    model = llama_cpp.llama_model_load_from_file(str(tiny_llama).encode(), params)
    try:
        vocab = Vocab(model)
        longest = vocab.longest_piece()
        assert longest == max(len(vocab.piece(t)) for t in range(vocab.n_tokens))
    finally:
        llama_cpp.llama_model_free(model)


def test_over_the_wire_the_refusal_is_typed(tmp_path: Path, tiny_llama: Path) -> None:
    shutil.copy(tiny_llama, tmp_path / "tiny.gguf")
    endpoint = f"ipc://{tmp_path / 's.sock'}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint, "--model-dir",
         str(tmp_path), "--model", "tiny.gguf", "--ctx", "1024", "--threads", "1",
         "--no-arbiter", "--max-sessions", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    c = Client(endpoint, timeout=60)
    try:
        c.wait_ready(60)
        turn = "x" * 31_990  # 200 turns: 6.4 MB of history
        history = [{"role": ("user", "assistant")[i % 2], "content": turn} for i in range(200)]
        sid = c.open_session("You are Brom.", history=history, memory="off")
        with pytest.raises(BridgeError) as e:
            c.chat(sid, "And then?", max_tokens=4).result()
        assert e.value.code == "prompt_too_long"
        # the sidecar serves on
        other = c.open_session("You are Brom.")
        assert c.chat(other, "Hello.", max_tokens=2).result()["usage"]["completion_tokens"] >= 1
    finally:
        c.close()
        stop(proc)
