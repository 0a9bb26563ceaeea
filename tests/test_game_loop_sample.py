"""samples/game_loop runs from one command and the model follows the game's VRAM phases."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_game_loop_sample(tmp_path) -> None:
    out, png = tmp_path / "timeline.json", tmp_path / "timeline.png"
    r = subprocess.run([sys.executable, str(ROOT / "samples/game_loop/game_loop.py"),
                        "--seconds", "8", "--threads", "2", "--json", str(out), "--png", str(png)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    rows = json.loads(out.read_text())
    acks = [x for x in rows if x.get("event") == "reserve_vram acknowledged"]
    assert len(acks) == 1
    samples = [x for x in rows if "event" not in x]
    assert max(x["reshards"] or 0 for x in samples) >= 2  # grew in the menu, shrank for the load
    plans = {x["plan"] for x in samples}
    assert "all-cpu" in plans and len(plans) >= 2
    assert sum(x["tokens_per_s"] for x in samples) > 0  # the NPCs kept talking
    assert png.stat().st_size > 10_000
