"""The many-NPC benchmark (benchmarks/many_npcs.py): its prompts, its figures, its -ngl search
and its table as pure functions; then the script end to end on the CPU — the real sidecar on a
tiny synthetic model, and a stand-in ``llama-server`` that streams as llama-server does (the
real one is built only on the GPU machine), so both sides' plumbing runs here."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import llama_cpp
import pytest

from benchmarks.npc_scenes import (
    Reply,
    best_ngl,
    markdown,
    nearest_rank,
    next_ngl,
    npc_prompts,
    summarize,
)

ROOT = Path(__file__).resolve().parents[1]


def test_each_npc_has_its_own_prompt_spread_over_the_range(tiny_llama: Path) -> None:
    vocab = llama_cpp.Llama(str(tiny_llama), vocab_only=True, verbose=False)
    for n in (4, 16):
        npcs = npc_prompts(n)
        assert npcs == npc_prompts(n)  # the same prompts for both servers, every run
        assert len({(p.card, p.line) for p in npcs}) == n
        lengths = [len(vocab.tokenize(f"{p.card}\n{p.line}".encode(), add_bos=False))
                   for p in npcs]
        # the synthetic models' tokenizer (the tiny one's merges are the 8B's)
        assert 250 <= min(lengths) and max(lengths) <= 1000, lengths
        assert max(lengths) >= 850 and lengths[-1] > lengths[0]
    with pytest.raises(ValueError):
        npc_prompts(0)


def test_a_row_counts_every_token_over_the_wall_from_first_request_to_last_token() -> None:
    replies = [Reply(0, sent=10.0, first=10.5, end=14.0, tokens=128, prompt_tokens=300,
                     finish="length", max_gap_s=0.1),
               Reply(1, sent=10.1, first=11.1, end=15.0, tokens=128, prompt_tokens=900,
                     finish="length", max_gap_s=2.5),
               Reply(2, sent=10.2, first=12.2, end=14.5, tokens=100, prompt_tokens=600,
                     finish="stop", max_gap_s=0.3),
               Reply(3, sent=10.2, first=None, end=None, tokens=0, error="busy")]
    s = summarize(replies, 128)
    assert s["tokens"] == 356 and s["wall_s"] == pytest.approx(5.0)
    assert s["aggregate_tps"] == pytest.approx(356 / 5.0, abs=0.01)
    assert (s["ttft_median_s"], s["ttft_p90_s"], s["ttft_max_s"]) == (1.0, 2.0, 2.0)
    assert s["completed"] == 3 and s["short_replies"] == 1 and s["errors"] == ["NPC 3: busy"]
    assert s["prompt_tokens"] == 1800 and s["finish"] == ["length", "stop"]
    assert (s["gap_max_median_s"], s["gap_max_s"]) == (0.3, 2.5)  # each NPC's longest gap
    assert summarize([Reply(0, 1.0, None, None, 0, error="x")], 8)["completed"] == 0
    assert nearest_rank([4.0, 1.0, 3.0, 2.0], 0.9) == 4.0
    assert nearest_rank(list(map(float, range(1, 21))), 0.9) == 18.0


@pytest.mark.parametrize("limit_layers", [0.5, 7.3, 15.9, 20.0, 33.5, 40.0])
def test_the_ngl_search_finds_the_largest_that_fits_in_a_few_probes(limit_layers: float) -> None:
    # peaks as a partial offload shows them: a fixed part, then each layer's weights and KV;
    # the output layer (ngl 33) costs more
    def peak(k: int) -> int:
        return 900 + 230 * min(k, 32) + (500 if k == 33 else 0)

    limit = int(900 + 230 * limit_layers)
    want = max((k for k in range(34) if peak(k) <= limit), default=None)
    probes: dict[int, int] = {}
    k: int | None = 16
    for _ in range(6):
        if k is None:
            break
        probes[k] = peak(k)
        k = next_ngl(probes, limit, 33)
    assert k is None, probes  # the search ended
    assert best_ngl(probes, limit) == want, probes


def test_the_table_sets_ours_beside_the_fastest_llama_server_row() -> None:
    rows = [{"side": "ours", "budget": "4", "n": 4, "aggregate_tps": 60.0, "wall_s": 9.0,
             "ttft_median_s": 0.5, "ttft_p90_s": 0.9, "ttft_max_s": 0.9,
             "vram": {"peak": 3_900_000_000}},
            {"side": "upstream", "budget": "4", "n": 4, "aggregate_tps": 40.0, "wall_s": 13.0,
             "ttft_median_s": 0.7, "ttft_p90_s": 1.2, "ttft_max_s": 1.2, "placement": "-ngl 14",
             "vram": {"peak": 3_800_000_000}},
            {"side": "upstream", "budget": "4", "n": 4, "aggregate_tps": 48.0, "wall_s": 11.0,
             "ttft_median_s": 0.6, "ttft_p90_s": 1.0, "ttft_max_s": 1.0,
             "placement": "--fit on --fit-target 75000", "vram": {"peak": 3_950_000_000},
             "fits_budget": False},
            {"side": "ours", "budget": "4", "n": 16, "status": "failed: x"}]
    md = markdown(rows, 128)
    assert "| 4 | 4 | 60.0 | 48.0 | 1.25× | 0.50 / 0.90 / 0.90 | 0.60 / 1.00 / 1.00 |" in md
    assert "| 3.90 / 3.95 | --fit on --fit-target 75000 |" in md
    assert "(over the budget)" in md and "| 4 | 16 | – | – | – |" in md


STANDIN = r'''
"""llama-server's command line, /health and streamed /v1/chat/completions (SSE, usage at the
end, ignore_eos honoured) over the standard library; every request is logged."""
import json, os, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
if "--help" in sys.argv:
    print("-ngl, --n-gpu-layers N\n--no-webui\n-np, --parallel N"); sys.exit(0)
argv = sys.argv[1:]
port = int(argv[argv.index("--port") + 1])
log = open(__file__ + ".log", "a")
log.write(json.dumps({"argv": argv, "min_batch": os.environ.get("GGML_OP_OFFLOAD_MIN_BATCH")})
          + "\n"); log.flush()
class H(BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b'{"status":"ok"}')
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        log.write(json.dumps({"body": body}) + "\n"); log.flush()
        n = body["max_tokens"] if body.get("ignore_eos") else min(2, body["max_tokens"])
        self.send_response(200); self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for i in range(n):
            time.sleep(0.01)
            c = {"choices": [{"index": 0, "delta": {"content": f" w{i}"}}]}
            self.wfile.write(f"data: {json.dumps(c)}\n\n".encode()); self.wfile.flush()
        u = {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": n}}
        self.wfile.write(f"data: {json.dumps(u)}\n\ndata: [DONE]\n\n".encode())
ThreadingHTTPServer(("127.0.0.1", port), H).serve_forever()
'''


def test_the_script_runs_both_sides_on_the_cpu(tiny_llama: Path, tmp_path: Path) -> None:
    stub = tmp_path / "standin.py"
    stub.write_text(STANDIN)
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {stub} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "IGI_SDK_CLIENT_ONLY"}
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "many_npcs.py"), "--model", str(tiny_llama),
         "--budgets", "full", "--npcs", "2", "--tokens", "8", "--ctx-per-npc", "1024",
         "--threads", "2", "--settle-s", "0.3", "--row-timeout", "60", "--talking-all",
         "--llama-server", str(exe), "--out", str(out)],
        capture_output=True, text=True, timeout=150, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads((out / "npcs.json").read_text())
    ours, up = res["rows"]
    assert ours["side"] == "ours" and ours["status"] == "ok", ours
    assert ours["completed"] == 2 and not ours["errors"] and ours["plan"] == "all-cpu"
    assert ours["tokens"] <= 16 and ours["aggregate_tps"] > 0
    assert ours["prompt_tokens"] > 400  # both NPCs' cards and scenes reached the model
    assert all(set(x) >= {"t", "replies", "step_s", "chunk", "threads"}
               for x in ours["engine_samples"]), ours["engine_samples"]
    assert "--max-sessions 2 --ctx 2048" in ours["cmd"] and "--vram" not in ours["cmd"]
    assert "--talking 2" in ours["cmd"]  # both NPCs talk at once, and ours is told so
    assert up["status"] == "ok" and up["placement"] == "-ngl 0", up  # no NVML: the CPU
    assert (up["tokens"], up["short_replies"], up["completed"]) == (16, 0, 2)
    seen = [json.loads(x) for x in Path(f"{stub}.log").read_text().splitlines()]
    argv = seen[0]["argv"]
    for flag, value in (("--parallel", "2"), ("-c", "2048"), ("-fa", "on"), ("-ub", "2048"),
                        ("-b", "2048"), ("-t", "2")):
        assert argv[argv.index(flag) + 1] == value, argv
    assert "--no-webui" in argv and "--fit" not in argv
    turns = [s["body"] for s in seen if "body" in s][1:]  # after the warm-up reply
    assert len(turns) == 2 and all(b["ignore_eos"] and b["max_tokens"] == 8 for b in turns)
    assert {b["messages"][0]["content"] for b in turns} == {p.card for p in npc_prompts(2)}
    md = (out / "npcs.md").read_text()
    assert "| full | 2 |" in md and "-ngl 0" in md


def _standin(tmp_path: Path, help_text: str) -> Path:
    stub = tmp_path / "standin.py"
    stub.write_text(STANDIN.replace('"-ngl, --n-gpu-layers N\\n--no-webui\\n-np, --parallel N"',
                                    repr(help_text)))
    exe = tmp_path / "llama-server"
    exe.write_text(f"#!/bin/sh\nexec {sys.executable} {stub} \"$@\"\n")
    exe.chmod(exe.stat().st_mode | stat.S_IXUSR)
    return exe


class _FakeVram:
    """NVML as a GPU machine shows it: a server's peak from its -ngl (or its --fit-target)."""

    def __init__(self, pid: int, period_s: float = 0.02) -> None:
        self.baseline, self.pid, self.last = 1, pid, 0

    @property
    def value(self) -> int:  # read once the server runs (the fork's first moments show ours)
        try:
            args = Path(f"/proc/{self.pid}/cmdline").read_bytes().decode().split("\0")
        except OSError:  # it exited: its peak stays
            return self.last
        if "-ngl" in args:
            k = int(args[args.index("-ngl") + 1])
            self.last = 900 + 230 * min(k, 32) + (500 if k == 33 else 0)
        elif "--fit-target" in args:  # llama.cpp's fit lands 40 over what it was asked
            self.last = 10_000 - int(args[args.index("--fit-target") + 1]) + 40
        return self.last

    def free_bytes(self) -> int:
        return 10_000 * 1024**2

    def mark(self) -> dict[str, int | None]:
        return {"proc_peak": self.value, "dev_peak": self.value, "peak": self.value}

    def stop(self) -> dict[str, int | None]:
        return self.mark()


@pytest.mark.parametrize("mode", ["ngl", "fit", "fit-stream"])
def test_llama_server_is_placed_within_our_peak(tmp_path: Path, mode: str,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse
    import time

    from benchmarks import many_npcs

    monkeypatch.setattr(many_npcs, "VramSampler", _FakeVram)
    monkeypatch.setattr(many_npcs, "gpu_free_bytes", lambda: 10_000)
    monkeypatch.setattr(many_npcs, "MIB", 1)  # the fake's figures are in MiB-sized units
    monkeypatch.setattr(many_npcs.time, "sleep", lambda s: None)
    exe = _standin(tmp_path, "-ngl N\n--fit [on|off]\n--fit-target MiB")
    args = argparse.Namespace(
        llama_server=str(exe), model="m.gguf", ctx_per_npc=256, threads=2, tokens=4,
        server_help="-ngl N\n--fit [on|off]", peer_args="", peer_placement=mode,
        logs=tmp_path, n_layers=32, model_bytes=33 * 230, ngl_probes=6, fit_slack_mib=0,
        tolerance_mib=16, peer_stream_from=2)
    limit = 900 + 230 * 20 + 100
    rows = many_npcs.upstream_rows(args, "4", 2, npc_prompts(2), limit, time.monotonic() + 100)
    (row,) = rows
    assert row["status"] == "ok" and row["completed"] == 2 and row["fits_budget"], row
    if mode == "ngl":
        assert row["placement"] == "--fit off -ngl 20", row["attempts"]
        assert len(row["attempts"]) <= 7
    else:  # fitted again with the overshoot added to its margin
        stream = " -lm none" if mode == "fit-stream" else ""
        env = "GGML_OP_OFFLOAD_MIN_BATCH=2 " if stream else ""
        assert [a["flags"] for a in row["attempts"]] == [
            f"{env}--fit on --fit-target {10_000 - limit}{stream}",
            f"{env}--fit on --fit-target {10_000 - limit + 40 + 32}{stream}"]
        assert row["vram"]["peak"] <= limit
        # the streaming peer got its threshold through its environment
        seen = [json.loads(x) for x in Path(f"{tmp_path}/standin.py.log").read_text().splitlines()]
        assert {s["min_batch"] for s in seen if "argv" in s} == {"2" if stream else None}


def test_a_sidecar_that_does_not_start_leaves_its_last_words_in_the_row(tiny_llama: Path,
                                                                         tmp_path: Path) -> None:
    """A device call brings few files back: why our side failed must be in npcs.json itself."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if k != "IGI_SDK_CLIENT_ONLY"}
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "many_npcs.py"), "--model", str(tiny_llama),
         "--budgets", "full", "--npcs", "2", "--tokens", "4", "--ctx-per-npc", "1024",
         "--threads", "1", "--row-timeout", "36", "--out", str(out), "--",
         "--draft", str(tmp_path / "missing-draft.gguf")],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    ours = json.loads((out / "npcs.json").read_text())["rows"][0]
    # seen as it exits, not at the row's timeout
    assert ours["status"].startswith("failed") and "exited" in ours["status"], ours
    assert any("missing-draft.gguf" in line or "draft" in line
               for line in ours["sidecar_output_tail"]), ours["sidecar_output_tail"]


def test_the_gap_clock_keeps_the_first_piece_and_the_longest_wait_after_it() -> None:
    from benchmarks.http_peer import GapClock

    clock = GapClock()
    for t in (10.0, 10.1, 10.9, 11.0):
        clock.piece(t)
    assert clock.first == 10.0 and clock.last == 11.0
    assert clock.max_gap_s == pytest.approx(0.8)
