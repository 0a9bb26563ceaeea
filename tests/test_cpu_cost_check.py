"""The cost model's checks: benchmarks/cpu_cost_check.py (CPU decode of a MoE and a dense model
against the prediction, run for real on the tiny presets) and benchmarks/cost_model_check.py
(stored GPU runs priced again)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import cpu_cost_check


def test_a_tiny_run_measures_and_predicts_both_models(tmp_path: Path) -> None:
    out = tmp_path / "cost.json"
    assert cpu_cost_check.main(["--tiny", "--threads", "1", "--tokens", "12", "--workdir",
                                str(tmp_path), "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["model"] for r in rows] == ["tiny-qwen3moe", "tiny-llama"]
    for r in rows:
        assert r["decode_tps"] > 0 and r["pred_decode_tps"] > 0
        assert r["measured_over_predicted"] == pytest.approx(
            r["decode_tps"] / r["pred_decode_tps"], rel=0.01)


def test_unknown_models_are_refused() -> None:
    with pytest.raises(SystemExit):
        cpu_cost_check.main(["--models", "gpt5"])


def test_the_gpu_cost_check_reprices_the_stored_runs(tmp_path: Path) -> None:
    """benchmarks/cost_model_check.py on the H100 runs stored in the repository: its table in
    docs/benchmarks.md ("Cost model: predicted vs measured") comes out as published."""
    from benchmarks import cost_model_check

    res = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
    out = tmp_path / "check.json"
    assert cost_model_check.main([
        "--results", str(res / "h100-peers-planner.json"), "--plans", str(res / "h100-plans"),
        "--profile", str(res / "h100-profile-peers.json"),
        "--stream-probe", str(res / "h100-stream-probe.json"), "--json", str(out)]) == 0
    rows = {(r["run"], r["tag"], r["budget_gb"]): r for r in json.loads(out.read_text())}
    assert len(rows) == 11
    first = rows[("run1", "ctx2048", 4.0)]
    assert first["pred_decode_tps"] == pytest.approx(28.47, abs=0.05)
    assert first["pred_ttft_s"] == pytest.approx(0.1605, abs=0.001)


def test_a_synthetic_inventory_needs_no_weights() -> None:
    from benchmarks.cost_model_check import synthetic_inventory

    inv = synthetic_inventory("qwen3-30b-a3b")
    assert inv.arch.n_layers == 48 and inv.arch.n_expert == 128
    assert sum(t.n_bytes for t in inv.tensors) > 15e9  # the full model's bytes, none written
