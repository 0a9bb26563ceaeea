"""A synthetic MoE's router spreads tokens over its experts as a trained one's does
(benchmarks/moe_routing.py reads its choices through llama.cpp's eval callback)."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks import moe_routing
from igi_sdk.model import spec_with, synthetic, write_synthetic_gguf

# deep enough for a random attention's shared part to take over the residual stream
SPEC = spec_with("tiny-qwen3moe", n_layers=12, n_expert=32, n_expert_used=4)


def _route(path: Path) -> dict[str, object]:
    write_synthetic_gguf(path, SPEC)
    return moe_routing.routing(path, prompt_tokens=256, gen=8, threads=1)


def test_a_prompt_reaches_every_expert_and_decode_picks_afresh(tmp_path: Path) -> None:
    r = _route(tmp_path / "moe.gguf")
    assert r["prompt_distinct_min"] >= 0.9 * SPEC.n_expert  # 256 tokens × 4 of 32: all 32
    assert r["prompt_top_k_share_median"] < 2 * r["prompt_top_k_share_even"]
    assert r["decode_shared_with_previous_median"] < 2.0  # of 4 (0.5 for independent picks)


def test_without_the_quieter_attention_the_router_collapses(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # what the synthetic MoE did before: the check above tells the two apart
    monkeypatch.setattr(synthetic, "MOE_ATTN_OUT_GAIN", 1.0)
    r = _route(tmp_path / "moe-collapsed.gguf")
    assert r["prompt_distinct_min"] < 0.9 * SPEC.n_expert


def test_a_dense_model_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dense.gguf"
    write_synthetic_gguf(path, "tiny-llama")
    assert moe_routing.main(["--model", str(path)]) == 2
