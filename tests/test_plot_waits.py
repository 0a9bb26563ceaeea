"""benchmarks/plot_waits.py reads the wait rows as the engine reported them and draws them."""

from __future__ import annotations

from pathlib import Path

from benchmarks import plot_waits as pw

REPO = Path(__file__).resolve().parents[1]


def test_a_rows_wait_is_what_its_engine_reported() -> None:
    row = {"tag": "shipped", "threads": {"mechanism": "openmp", "setting": "15xspin300000"}}
    assert pw._wait(row) == "spin300000"
    assert pw._wait({**row, "threads": {"mechanism": "openmp", "setting": "13xpassive"}}) == \
        "passive"
    assert pw._wait({**row, "tag": "busy-fixed-2t-active"}) is None  # the reference, not a bar
    assert pw._wait({**row, "threads": {"mechanism": "threadpool", "setting": "1xspin"}}) is None


def test_the_plot_draws_the_stored_rows(tmp_path: Path) -> None:
    results = REPO / "benchmarks" / "results"
    idle = pw.idle_ratios(results, "2026-11-28")
    assert {w for _, w, _ in idle} == {"passive", "spin20000", "spin300000"}
    assert all(0.3 < r < 2.0 for _, _, r in idle)
    out = tmp_path / "w.png"
    assert pw.main(["--out", str(out), "--results", str(results)]) == 0
    assert out.stat().st_size > 10_000
