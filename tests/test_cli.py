"""The `igi-sdk` command line, run as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from igi_sdk.errors import ModelFileNotFoundError, NotAGGUFError
from igi_sdk.runtime import Engine


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "igi_sdk.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=300)


def test_chat_one_shot_streams_an_npc_reply() -> None:
    r = _cli("chat", "--progress", "--max-tokens", "24", "--temperature", "0",
             "Hello there, smith!")
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "you> Hello there, smith!"
    assert out[1].startswith("npc> ") and len(out[1]) > 10
    assert "tok/s" in r.stderr
    assert "100%" in r.stderr  # load progress bar


def test_chat_reads_the_line_from_a_pipe() -> None:
    r = _cli("chat", "--max-tokens", "8", stdin="What is your name?\n")
    assert r.returncode == 0, r.stderr
    assert "you> What is your name?" in r.stdout


def test_inspect_prints_groups_layers_and_kv(tiny_moe) -> None:
    r = _cli("inspect", str(tiny_moe))
    assert r.returncode == 0, r.stderr
    for word in ("qwen3moe", "ffn_exps", "ffn_router", "per 1K tokens", "bytes per layer"):
        assert word in r.stdout


def test_doctor_reports_devices_and_default_model() -> None:
    r = _cli("doctor")
    assert r.returncode == 0, r.stderr
    assert "CPU" in r.stdout and "default model" in r.stdout and "NVML" in r.stdout
    assert "missing" not in r.stdout


def test_bad_model_path_is_a_clear_error(tmp_path) -> None:
    r = _cli("chat", "--model", str(tmp_path / "nope.gguf"), "hi")
    assert r.returncode == 2
    assert "model_not_found" in r.stderr and "nope.gguf" in r.stderr
    text = tmp_path / "notes.gguf"
    text.write_text("these are not weights")
    r = _cli("inspect", str(text))
    assert r.returncode == 2 and "not_gguf" in r.stderr


def test_engine_rejects_bad_files_with_typed_errors(tmp_path) -> None:
    with pytest.raises(ModelFileNotFoundError):
        Engine(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(NotAGGUFError):
        Engine(bad)


def test_client_only_processes_never_load_llama_cpp() -> None:
    """A game's tools (or a harness running its own CUDA work) talk to the sidecar without
    mapping llama.cpp's native libraries."""
    code = ("import sys, igi_sdk.client; "
            "assert 'llama_cpp' not in sys.modules, 'llama_cpp was imported'; "
            "print(igi_sdk.client.Client.__name__)")
    env = {**os.environ, "IGI_SDK_CLIENT_ONLY": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Client"
