"""benchmarks/face_overhead.py runs against the current service (its instant model side keeps
up with the reply types): a few rounds, every figure present; no time is judged here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_face_overhead_bench_runs(tmp_path: Path) -> None:
    out = tmp_path / "face.json"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "face_overhead.py"), "--rounds",
                    "4", "--json", str(out)], cwd=ROOT, check=True, timeout=120,
                   capture_output=True)
    figures = json.loads(out.read_text())
    assert figures["rounds"] == 4
    assert figures["zmq_ms"] > 0 and figures["http_ms"] > 0
    assert "overhead_ms" in figures
