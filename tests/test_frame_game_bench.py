"""The frame-game benchmark (benchmarks/frame_game.py): its figures as pure functions on
synthetic series, then one short ``--sim`` run end to end (a real sidecar on the default model,
the simulated device and a scripted VRAM trace): the JSON carries every figure and series, and
the NPCs finished replies. No times and no arbiter targets are asserted: it measures, it does
not judge."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

_client_only = os.environ.get("IGI_SDK_CLIENT_ONLY")
from benchmarks import frame_game as fg  # noqa: E402

# importing arbiter_bench sets IGI_SDK_CLIENT_ONLY for its own processes: not for other tests'
if _client_only is None:
    os.environ.pop("IGI_SDK_CLIENT_ONLY", None)

ROOT = Path(__file__).resolve().parents[1]
MIB = 1024**2


def _frame(t: float, starved: int = 0, late_ms: float = 0.0, game: int = 0,
           waiting: int = 0) -> list:
    return [t, late_ms, starved, game, "x", waiting]


def test_starved_frames_and_the_longest_wait_per_load() -> None:
    frames = [_frame(10 + i / 60, starved=int(3 <= i < 9)) for i in range(60)]
    frames += [_frame(20 + i / 60, starved=int(i == 5)) for i in range(60)]
    allocs = [{"load": 0, "bytes": 64 * MIB, "first": 10.0, "ok": 10.02, "tries": 1},
              {"load": 0, "bytes": 64 * MIB, "first": 10.05, "ok": 10.15, "tries": 7},
              {"load": 1, "bytes": 64 * MIB, "first": 20.0, "ok": 20.1, "tries": 2},
              # never made: the level was unloaded first; its wait counts to then
              {"load": 1, "bytes": 64 * MIB, "first": 20.1, "ok": None, "abandoned": 20.6,
               "tries": 30}]
    loads = [{"index": 0, "bytes": 128 * MIB, "t_start": 10.0, "t_done": 10.15,
              "t_unload": 11.0},
             {"index": 1, "bytes": 128 * MIB, "t_start": 20.0, "t_done": None,
              "t_unload": 20.6,
              "reservation": {"outcome": "granted", "wait_s": 0.09, "code": None}}]
    assert fg.starved_frames(frames, 10.0, 11.0) == 6
    assert fg.starved_frames(frames, 0.0) == 7
    one = fg.load_figures(loads[0], allocs, frames)
    assert one["starved_frames"] == 6 and one["allocations"] == 2
    assert one["longest_alloc_wait_s"] == pytest.approx(0.1)
    assert one["failed_attempts"] == 6 and one["complete"]
    assert one["load_s"] == pytest.approx(0.15) and "grant" not in one
    two = fg.load_figures(loads[1], allocs, frames)
    assert two["longest_alloc_wait_s"] == pytest.approx(0.5) and not two["complete"]
    assert two["load_s"] is None and two["starved_frames"] == 1
    assert two["grant"] == {"outcome": "granted", "code": None, "wait_s": 0.09}
    assert fg.longest_wait([]) is None


def test_silences_within_and_between_back_to_back_replies() -> None:
    replies = [{"npc": 0, "k": 0, "t0": 0.0, "times": [0.5, 0.6, 0.7, 2.0], "t1": 2.01},
               # back to back: the gap from the last token before to its first token counts
               {"npc": 0, "k": 1, "t0": 2.05, "times": [3.5, 3.6], "t1": 3.61},
               {"npc": 0, "k": 2, "t0": 3.62, "t1": 4.0, "times": [3.9],
                "code": "engine_unavailable", "error": "x"},
               # not back to back (sent 2 s later): no "between" gap
               {"npc": 0, "k": 3, "t0": 6.0, "times": [6.3, 6.4], "t1": 6.41}]
    gaps = fg.token_gaps(replies)
    assert (2.0, pytest.approx(1.3), "within") in [(t, g, k) for t, g, k in gaps]
    assert (3.5, pytest.approx(1.5), "between") in [(t, g, k) for t, g, k in gaps]
    assert not any(t == 6.3 for t, _, _ in gaps)
    s = fg.npc_figures(replies)
    assert s["longest_silence_s"] == pytest.approx(1.5)
    assert s["longest_silence_kind"] == "between" and s["longest_silence_at"] == 3.5
    assert s["gaps_over_1s"] == 2
    assert s["replies_completed"] == 3 and s["tokens"] == 9
    assert s["stream_errors"] == {"engine_unavailable": 1}
    assert s["median_gap_s"] == pytest.approx(0.1)
    # a window keeps the gaps that end in it
    assert fg.npc_figures(replies, t_from=3.0)["longest_silence_s"] == pytest.approx(1.5)
    assert fg.npc_figures(replies, t_from=3.55)["gaps_over_1s"] == 0
    assert fg.npc_figures([])["longest_silence_s"] is None


def test_reshards_per_load_unload_cycle() -> None:
    loads = [{"index": 0, "t_start": 10.0, "t_unload": 15.0},
             {"index": 1, "t_start": 20.0, "t_unload": 25.0}]
    dec = [{"at": 5.0, "seconds": 1.0, "action": "grow", "plan": "top"},  # before: no cycle
           {"at": 10.6, "seconds": 0.5, "action": "fast_shrink", "plan": "cpu",
            "released_s": 0.04, "failures": []},
           {"at": 11.5, "seconds": 0.8, "action": "grow", "plan": "mid",
            "failures": [{"plan": "top", "error": "oom"}]},
           {"at": 18.0, "seconds": 1.2, "action": "grow", "plan": "top"},
           {"at": 21.0, "seconds": 0.6, "action": "shrink", "plan": "mid",
            "released_s": 0.05}]
    cycles = fg.cycle_reshards(dec, loads, t_end=30.0)
    assert [c["reshards"] for c in cycles] == [3, 1]
    assert (cycles[0]["while_loaded"], cycles[0]["after_unload"]) == (2, 1)
    assert cycles[0]["failures"] == 1 and cycles[1]["failures"] == 0
    assert cycles[0]["actions"][0] == "fast_shrink->cpu"
    rel = fg.release_figures(dec, t0=10.0)
    assert [d["t"] for d in rel] == sorted(d["t"] for d in rel)
    assert rel[1]["released_s"] == 0.04 and rel[1]["t"] == pytest.approx(0.1)


def test_the_schedule_and_the_sim_trace_describe_the_same_loads() -> None:
    args = SimpleNamespace(level_gib=0.25, greedy_gib=0.5, texture_mib=16, allocs_per_frame=4,
                           menu_s=2.0, hold_s=3.0, between_s=4.0, tail_s=5.0, loads=2,
                           menu_gib=0.1)
    ph = fg.schedule(args, "nvml")
    assert [p["kind"] for p in ph] == ["menu", *["load", "hold", "unloaded"] * 2]
    assert ph[1]["t1"] - ph[1]["t0"] == pytest.approx(4 * fg.FRAME_S, abs=1e-3)  # 16 / 4
    pts = fg.trace_points(args, "nvml", ph, offset=10.0)
    menu = int(0.1 * fg.GIB)
    # the clock mark: a step of a few bytes, then the menu
    assert pts[:2] == [{"t": 0.0, "game": menu - fg.SYNC_BYTES}, {"t": fg.SYNC_S, "game": menu}]
    assert max(p["game"] for p in pts) == menu + int(0.25 * fg.GIB)
    assert [p["t"] for p in pts] == sorted(p["t"] for p in pts)
    assert pts[-1] == {"t": pytest.approx(10.0 + ph[-1]["t0"]), "game": menu}
    greedy = fg.trace_points(args, "greedy", fg.schedule(args, "greedy"), offset=0.0)
    assert len(greedy) == 2 + 2 * 2  # at once, then freed, twice
    assert fg.textures(args, "greedy") == [int(0.5 * fg.GIB)]
    assert sum(fg.textures(args, "nvml")) == int(0.25 * fg.GIB)


@pytest.mark.slow
def test_a_short_sim_run_measures_and_reports(tmp_path: Path) -> None:
    out, png = tmp_path / "frames.json", tmp_path / "frames.png"
    env = {k: v for k, v in os.environ.items() if k != "IGI_SDK_CLIENT_ONLY"}
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "frame_game.py"), "--sim", "--mode", "reserve",
         "--workdir", str(tmp_path), "--settle-s", "4", "--menu-s", "2", "--hold-s", "2",
         "--between-s", "3", "--tail-s", "2", "--max-tokens", "12", "--npcs", "2",
         "--json", str(out)],
        capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "== frame game ==" in r.stdout
    data = json.loads(out.read_text())
    (run,) = data["runs"]
    assert run["mode"] == "reserve" and run["error"] is None
    s = run["summary"]
    for key in ("loads", "starved_frames", "longest_alloc_wait_s", "failed_loads", "cycles",
                "reshards", "decisions", "npcs", "frames", "grant_s", "model_vram_source",
                "ping_ms"):
        assert key in s, key
    assert len(s["loads"]) == 2 and len(s["cycles"]) == 2
    assert all("grant" in ld for ld in s["loads"])
    assert set(s["npcs"]) == {"0", "1"}
    assert s["ping_ms"]["n"] > 0 and s["ping_ms"]["max"] >= s["ping_ms"]["p50"] > 0
    for npc in s["npcs"].values():
        assert npc["replies_completed"] >= 1
        assert {"longest_silence_s", "gaps_over_1s", "median_gap_s", "stream_errors"} <= set(npc)
    series = run["series"]
    assert series["game_vram"] and series["model_vram"]["rows"]
    assert max(g for _, g in series["game_vram"]) > min(g for _, g in series["game_vram"])
    assert all(series["npc_tokens"][n] for n in ("0", "1"))
    # each phase's decode rate counts the tokens that arrived within it, whichever NPC's
    assert [p["name"] for p in s["phases"]] == [p["name"] for p in run["phases"]]
    end = run["phases"][-1]["t1"]
    assert sum(p["tokens"] for p in s["phases"]) == sum(
        1 for ts in series["npc_tokens"].values() for t in ts if 0 <= t < end)
    assert any(p["tokens_per_s"] and p["plans"] for p in s["phases"])
    assert run["sim_trace"]["points"]
    from benchmarks import plot_frame_game

    assert plot_frame_game.main([str(png), str(out)]) == 0
    assert png.stat().st_size > 10_000
