"""The stress sample against a real sidecar: 64 clients x 10 chats, nothing lost or doubled."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_64_clients_x_10_chats(tiny_llama, tmp_path) -> None:
    shutil.copy(tiny_llama, tmp_path / "tiny.gguf")
    out = tmp_path / "stress.json"
    r = subprocess.run([sys.executable, str(ROOT / "samples/stress/stress.py"), "--clients", "64",
                        "--chats", "10", "--max-tokens", "8", "--model-dir", str(tmp_path),
                        "--model", "tiny.gguf", "--threads", "2", "--time-limit", "240",
                        "--json", str(out)], capture_output=True, text=True, timeout=400)
    assert r.returncode == 0, r.stdout + r.stderr
    s = json.loads(out.read_text())
    assert s["completed"] == s["expected"] == 640
    assert s["lost"] == 0 and s["duplicated"] == 0 and not s["errors"]
    assert s["ttft_p50_ms"] is not None and s["tokens_per_s"] > 0
