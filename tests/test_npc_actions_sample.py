"""samples/npc_actions.py runs from one command against the default model: each line the player
says ends in calls of the declared actions with valid arguments, the named choice calls exactly
that action, and the NPC answers from what came of its calls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_npc_actions_sample(tmp_path) -> None:
    out = tmp_path / "turns.json"
    r = subprocess.run([sys.executable, str(ROOT / "samples/npc_actions.py"), "--threads", "2",
                        "--json", str(out)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    turns = json.loads(out.read_text())
    assert [t["choice"] for t in turns] == ["required", "trade", "auto"]
    required, trade = turns[0], turns[1]
    for turn in (required, trade):
        assert turn["finish_reason"] == "tool_calls"
        assert turn["calls"], turn
        assert turn["said"] == ""  # a reply that is calls streams no text
    assert [c["name"] for c in trade["calls"]] == ["trade"] * len(trade["calls"])
    for turn in turns:
        for call in turn["calls"]:
            args = call["arguments"]
            if call["name"] == "follow":
                assert set(args) == {"distance"} and 1 <= args["distance"] <= 10
            elif call["name"] == "trade":
                assert set(args) == {"item", "price"} and isinstance(args["item"], str)
                assert 1 <= args["price"] <= 500
            else:
                assert call["name"] == "attack" and args == {"target": args["target"]}
                assert args["target"] in ("wolf", "bandit", "player")
            assert call["id"].startswith("call_")
        # the NPC answered from the results (text only), or it talked without acting
        if turn["calls"]:
            assert turn["reply"], turn
        else:
            assert turn["said"], turn
    assert "Brom does trade" in r.stdout
