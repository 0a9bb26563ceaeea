"""A conversation far past its session's share of the context, over ZeroMQ with the default
model (benchmarks/long_conversation.py at a small context): no line fails, the folds are few
and each reads about its prompt once, the prompt in context still starts with the system
prompt and the memory message, the persona probes are asked (of copies of the conversation
after each fold), the reminder is read but never kept, and the save's transcript holds every
line."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from benchmarks.long_conversation import PINNED, PROBES, REMINDER, run

LINES = 24


@pytest.mark.timeout(1800)  # 24 lines and their folds, on a 2-core machine others share
def test_a_long_conversation_never_errors_and_its_save_keeps_every_line(
        tmp_path: Path, default_model: Path) -> None:
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(default_model, models / "smol.gguf")
    saves = tmp_path / "saves"
    saves.mkdir()
    # a 576-cell share (768 cells, 2 slots): 24 lines of ~70 tokens are 3 shares' worth
    out = run(models, "smol.gguf", lines=LINES, max_tokens=4, ctx=768, sessions=2, threads=2,
              save_dir=saves, endpoint=f"ipc://{tmp_path / 's.sock'}", probe_tokens=8,
              reminder=REMINDER)
    assert out["errors"] == 0, out["error_samples"]
    assert out["share_max_tokens"] == 576  # list_sessions advertises the session's limit
    # folds come in chunks: far fewer than the lines, but the share cannot hold them all
    assert 2 <= out["folds"] <= LINES // 3, out
    assert out["dropped_turns"] >= out["summarised_turns"] > 0
    assert out["engine_folds"] >= out["folds"]
    assert out["prompt_starts_with_system"]
    assert PINNED[0] in out["memory_message"]
    assert "Earlier in this conversation:" in out["memory_message"]
    # a fold reads the summary's request (not the dropped turns again) and its line keeps the
    # cached system prompt: it reads less than its prompt twice over (the summary as data
    # and the whole prompt, as before)
    for f in out["fold_details"]:
        assert f["line_prompt_cached"] > 0, f
        assert f["summary_prompt_read"] < f["prompt_in_context"], f
        assert f["reread_ratio"] < 1.5, f
    # the persona probes: asked after the folds and at the end, and of a fresh session (the
    # 135M model's pass rate against its own baseline is reported by the benchmark, not
    # asserted: what the model reads is asserted above)
    assert out["final_probes"] == len(PROBES)
    assert len(out["probes"]) == len(PROBES) * (1 + out["folds"])  # a copy's after each fold
    assert out["transcript_complete"] and out["transcript_user_lines"] == LINES
    # the reminder was read before every line (the fold plan counted it: no line failed) and
    # is a setting of the session, never a turn of its transcript
    assert out["reminder_saved"] and out["reminder_in_transcript"] is False
    assert out["restored_reply_tokens"] >= 1
