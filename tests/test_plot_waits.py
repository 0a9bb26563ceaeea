"""benchmarks/plot_waits.py reads the wait rows as the engine reported them and draws them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _module():
    spec = importlib.util.spec_from_file_location("plot_waits",
                                                  REPO / "benchmarks" / "plot_waits.py")
    mod = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(mod)
    return mod


def test_a_rows_wait_is_what_its_engine_reported() -> None:
    pw = _module()
    row = {"tag": "shipped", "threads": {"mechanism": "openmp", "setting": "15xspin300000"}}
    assert pw._wait(row) == "spin300000"
    assert pw._wait({**row, "threads": {"mechanism": "openmp", "setting": "13xpassive"}}) == \
        "passive"
    assert pw._wait({**row, "tag": "busy-fixed-2t-active"}) is None  # the reference, not a bar
    assert pw._wait({**row, "threads": {"mechanism": "threadpool", "setting": "1xspin"}}) is None


def test_the_plot_draws_the_stored_rows(tmp_path: Path) -> None:
    pw = _module()
    results = REPO / "benchmarks" / "results"
    idle = pw.idle_ratios(results, "2026-11-28")
    assert {w for _, w, _ in idle} == {"passive", "spin20000", "spin300000"}
    assert all(0.3 < r < 2.0 for _, _, r in idle)
    out = tmp_path / "w.png"
    import sys
    argv, sys.argv = sys.argv, ["plot_waits.py", "--out", str(out), "--results", str(results)]
    try:
        assert pw.main() == 0
    finally:
        sys.argv = argv
    assert out.stat().st_size > 10_000
