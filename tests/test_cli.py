"""The `igi-sdk` command line, run as a real subprocess."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import time

import pytest

from igi_sdk.errors import ModelFileNotFoundError, NotAGGUFError
from igi_sdk.profile import DeviceProfile, Profile
from igi_sdk.runtime import Engine


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "igi_sdk.cli", *args], input=stdin,
                          capture_output=True, text=True, timeout=300)


def test_chat_one_shot_streams_an_npc_reply() -> None:
    r = _cli("chat", "--progress", "--max-tokens", "24", "--temperature", "0",
             "Hello there, smith!")
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[0] == "you> Hello there, smith!"
    assert out[1].startswith("npc> ") and len(out[1]) > 10
    assert "tok/s" in r.stderr
    assert "100%" in r.stderr  # load progress bar


def test_chat_reads_the_line_from_a_pipe() -> None:
    r = _cli("chat", "--max-tokens", "8", stdin="What is your name?\n")
    assert r.returncode == 0, r.stderr
    assert "you> What is your name?" in r.stdout


def test_inspect_prints_groups_layers_and_kv(tiny_moe) -> None:
    r = _cli("inspect", str(tiny_moe))
    assert r.returncode == 0, r.stderr
    for word in ("qwen3moe", "ffn_exps", "ffn_router", "per 1K tokens", "bytes per layer"):
        assert word in r.stdout


def test_doctor_reports_devices_and_default_model() -> None:
    r = _cli("doctor")
    assert r.returncode == 0, r.stderr
    assert "CPU" in r.stdout and "default model" in r.stdout and "NVML" in r.stdout
    assert "missing" not in r.stdout


def test_bad_model_path_is_a_clear_error(tmp_path) -> None:
    r = _cli("chat", "--model", str(tmp_path / "nope.gguf"), "hi")
    assert r.returncode == 2
    assert "model_not_found" in r.stderr and "nope.gguf" in r.stderr
    text = tmp_path / "notes.gguf"
    text.write_text("these are not weights")
    r = _cli("inspect", str(text))
    assert r.returncode == 2 and "not_gguf" in r.stderr


def test_engine_rejects_bad_files_with_typed_errors(tmp_path) -> None:
    with pytest.raises(ModelFileNotFoundError):
        Engine(tmp_path / "missing.gguf")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"\x00" * 64)
    with pytest.raises(NotAGGUFError):
        Engine(bad)


def test_client_only_processes_never_load_llama_cpp() -> None:
    """A game's tools (or a harness running its own CUDA work) talk to the sidecar without
    mapping llama.cpp's native libraries."""
    code = ("import sys, igi_sdk.client; "
            "assert 'llama_cpp' not in sys.modules, 'llama_cpp was imported'; "
            "print(igi_sdk.client.Client.__name__)")
    env = {**os.environ, "IGI_SDK_CLIENT_ONLY": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "Client"


# --- what a new user following the README ran into ---------------------------------------------


def _tiny_models_dir(tiny_llama, tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(tiny_llama, models / "npc.gguf")
    return models


def test_chat_pipe_is_one_message_per_line_up_to_quit() -> None:
    r = _cli("chat", "--max-tokens", "4", "--temperature", "0",
             stdin="Hello!\n\nWhat do you sell?\n/quit\nThis line is never sent.\n")
    assert r.returncode == 0, r.stderr
    said = [line for line in r.stdout.splitlines() if line.startswith("you> ")]
    assert said == ["you> Hello!", "you> What do you sell?"], r.stdout
    assert r.stdout.count("npc> ") == 2 and "never sent" not in r.stdout


def test_chat_with_nothing_on_stdin_sends_nothing_and_says_so() -> None:
    for stdin in ("", "\n\n", "/quit\nnot this\n"):
        r = _cli("chat", "--max-tokens", "4", stdin=stdin)
        assert r.returncode == 0, r.stderr
        assert "you> " not in r.stdout and "npc> " not in r.stdout, r.stdout
        assert "nothing sent" in r.stderr


def test_serve_refuses_a_missing_model_before_listening(tmp_path) -> None:
    (tmp_path / "models").mkdir()
    r = _cli("serve", "--endpoint", f"ipc://{tmp_path}/s.sock", "--model-dir",
             str(tmp_path / "models"), "--model", "npc.gguf")
    assert r.returncode == 2
    assert "model_not_found" in r.stderr and "npc.gguf" in r.stderr, r.stderr
    assert "listening" not in r.stderr and "[internal]" not in r.stderr
    r = _cli("serve", "--endpoint", f"ipc://{tmp_path}/s.sock", "--model-dir",
             str(tmp_path / "nowhere"), "--model", "npc.gguf")
    assert r.returncode == 2 and "model_not_found" in r.stderr and "listening" not in r.stderr


@pytest.mark.parametrize("bad", ["-1", "nan", "5000"])
def test_serve_refuses_a_stream_window_past_a_second(tmp_path, bad: str) -> None:
    r = _cli("serve", "--endpoint", f"ipc://{tmp_path}/s.sock", "--stream-every-ms", bad)
    assert r.returncode == 2 and "--stream-every-ms" in r.stderr, r.stderr
    assert "listening" not in r.stderr and "[internal]" not in r.stderr


@pytest.mark.parametrize("bad", ["-1", "nan", "inf"])
def test_serve_refuses_a_reading_pace_that_is_not_a_rate(tmp_path, bad: str) -> None:
    r = _cli("serve", "--endpoint", f"ipc://{tmp_path}/s.sock", "--reading-tps", bad)
    assert r.returncode == 2 and "--reading-tps" in r.stderr, r.stderr
    assert "listening" not in r.stderr and "[internal]" not in r.stderr


def test_serve_refuses_a_missing_model_in_the_default_directory(tmp_path) -> None:
    r = _cli("serve", "--endpoint", f"ipc://{tmp_path}/s.sock", "--model", "npc.gguf")
    assert r.returncode == 2
    assert "model_not_found" in r.stderr and "npc.gguf" in r.stderr, r.stderr
    assert "listening" not in r.stderr and "[internal]" not in r.stderr


def test_serve_refuses_a_game_pid_that_is_not_running(tiny_llama, tmp_path) -> None:
    models = _tiny_models_dir(tiny_llama, tmp_path)
    gone = subprocess.Popen(["true"])
    gone.wait()  # reaped: no process has this id any more (for a while)
    for pid in (str(gone.pid), "0"):
        r = _cli("serve", "--endpoint", f"ipc://{tmp_path}/s.sock", "--model-dir", str(models),
                 "--model", "npc.gguf", "--game-pid", pid)
        assert r.returncode == 2, r.stderr
        assert "game_not_running" in r.stderr and pid in r.stderr, r.stderr
        assert "listening" not in r.stderr


def test_serve_says_listening_then_ready_with_model_and_plan(tiny_llama, tmp_path) -> None:
    models = _tiny_models_dir(tiny_llama, tmp_path)
    game = subprocess.Popen(["sleep", "120"])
    proc = subprocess.Popen([sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint",
                             f"ipc://{tmp_path}/s.sock", "--model-dir", str(models), "--model",
                             "npc.gguf", "--game-pid", str(game.pid)],
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    try:
        lines: list[str] = []
        assert proc.stderr is not None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "ready:" in line:
                break
        text = "".join(lines)
        listening = [i for i, line in enumerate(lines) if "listening on ipc://" in line]
        assert listening and listening[0] < len(lines) - 1, text  # first listening, then ready
        assert "ready: model npc.gguf, plan all-cpu" in lines[-1], text
        game.kill()  # the game ends: the sidecar follows, with status 0
        assert proc.wait(20) == 0
    finally:
        game.kill()
        game.wait()
        if proc.poll() is None:
            proc.kill()
        proc.wait()


@pytest.mark.skipif(os.name != "posix", reason="file modes")
def test_keys_are_private_and_never_overwritten_without_force(tmp_path) -> None:
    keys = tmp_path / "keys"
    r = _cli("keys", str(keys))
    assert r.returncode == 0, r.stderr
    secrets = [keys / "server.key_secret", keys / "game.key_secret"]
    for f in secrets:
        assert stat.S_IMODE(f.stat().st_mode) == 0o600, f
    assert (keys / "server.key").is_file() and (keys / "clients" / "game.key").is_file()
    before = {f: f.read_bytes() for f in secrets}
    r = _cli("keys", str(keys))
    assert r.returncode == 2 and "keys_exist" in r.stderr and "--force" in r.stderr
    assert {f: f.read_bytes() for f in secrets} == before  # kept
    r = _cli("keys", str(keys), "--force")
    assert r.returncode == 0, r.stderr
    for f in secrets:
        assert f.read_bytes() != before[f] and stat.S_IMODE(f.stat().st_mode) == 0o600


# --- the machine profile: cached once, never a noisy measurement -------------------------------


def _plausible_profile(threads: int) -> Profile:
    from igi_sdk.tuning import measure

    rates = {"F16": {1: 20e9, 64: 5e9, 512: 1e9}, "Q4_0": {1: 10e9, 64: 3e9, 512: 0.5e9}}
    cpu = DeviceProfile(name="cpu", kind="cpu", threads=threads, matmul_rate=rates,
                        layer_overhead_s=20e-6, step_overhead_s=50e-6,
                        expert_scale={"gate_up": 0.92, "down": 0.79})
    return Profile(fingerprint=measure.fingerprint(threads), cpu=cpu)


@pytest.fixture
def fake_measure(monkeypatch, tmp_path):
    """measure_profile replaced by a quick fake that reports progress; the cache in tmp_path."""
    from igi_sdk.tuning import measure

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    calls: list[dict] = []
    noisy: dict[str, bool] = {"implausible": False, "busy": False}

    def measure_profile(*, threads=None, fast=False, progress=None, problems=None, **_kw):
        calls.append({"threads": threads, "fast": fast})
        if progress:
            progress(0.5, "cpu F16 x1")
        time.sleep(1.3)  # long enough for progress to show
        prof = _plausible_profile(threads)
        if noisy["implausible"]:
            prof.cpu.step_overhead_s = 0.42  # what a disturbed probe once cached
        if noisy["busy"] and problems is not None:
            problems.append("other processes used 1.6 of the 2 CPU cores while it was measured")
        return prof

    monkeypatch.setattr(measure, "measure_profile", measure_profile)
    return calls, noisy


def test_profile_shows_the_gpus_prefill_terms_apart_from_the_one_token_shares(
        monkeypatch, tmp_path, capsys) -> None:
    """`igi-sdk profile` on a GPU machine: the experts' prefill share is not listed among the
    one-token shares, and the prefill's own work per token is shown."""
    from igi_sdk import cli

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    prof = _plausible_profile(4)
    prof.gpu = DeviceProfile(name="gpu", kind="gpu", matmul_rate={"Q4_0": {1: 2e12}},
                             expert_scale={"gate_up": 0.41, "down": 0.45, "prefill": 0.5},
                             prefill_token_layer_s=0.29e-6, prefill_token_s=3.5e-6)
    monkeypatch.setattr(cli, "_machine_profile", lambda *a, **kw: (prof, "cached"))
    assert cli.main(["profile"]) == 0
    out = capsys.readouterr().out
    assert "routed experts (one token) at down 0.45, gate_up 0.41 of the Q4_0 rate" in out
    assert "routed experts (a prefill batch) at 0.50 of the dense rate" in out
    assert "prefill beyond its matmuls: 0.29 us per token and layer, 3.50 us per token" in out
    assert "one-token matmuls 25% slower beside a pinned copy" in out


def test_profile_is_measured_once_then_cached_and_refresh_measures_again(
        fake_measure, capsys) -> None:
    from igi_sdk import cli

    calls, _ = fake_measure
    assert cli.main(["profile", "--fast"]) == 0
    first = capsys.readouterr()
    assert len(calls) == 1 and "measured now" in first.out
    assert "routed experts (one token) at down 0.79, gate_up 0.92" in first.out
    assert "profiling" in first.err and "50%" in first.err  # progress while it measures
    assert cli.main(["profile", "--fast"]) == 0
    second = capsys.readouterr()
    assert len(calls) == 1, "a second `profile` measured again instead of using the cache"
    assert "cached in" in second.out and "profiling" not in second.err
    assert cli.main(["profile", "--fast", "--refresh"]) == 0
    assert len(calls) == 2 and "measured now" in capsys.readouterr().out


def test_plan_shows_progress_while_it_profiles(fake_measure, tiny_llama, capsys) -> None:
    from igi_sdk import cli

    assert cli.main(["plan", str(tiny_llama), "--vram", "1GiB", "--ctx", "512"]) == 0
    out = capsys.readouterr()
    assert "chosen:" in out.out
    assert "profiling" in out.err and "50%" in out.err and "done after" in out.err, out.err


def test_a_noisy_profile_is_never_cached(fake_measure) -> None:
    from igi_sdk.profile.data import cache_dir
    from igi_sdk.tuning import measure

    calls, noisy = fake_measure
    noisy["implausible"] = True
    with pytest.raises(measure.NoisyProfileError, match="busy"):
        measure.load_or_measure(threads=2)
    assert not list(cache_dir().glob("*.json"))
    # one cached by an older version is measured again, not used
    bad = _plausible_profile(2)
    bad.cpu.step_overhead_s = 0.42
    bad.save()
    noisy["implausible"] = False
    prof = measure.load_or_measure(threads=2)
    assert len(calls) == 2 and prof.cpu.step_overhead_s == 50e-6
    assert measure.load_or_measure(threads=2).cpu.step_overhead_s == 50e-6 and len(calls) == 2


def test_a_profile_measured_on_a_busy_machine_serves_the_run_but_is_not_cached(
        fake_measure, capsys) -> None:
    from igi_sdk import cli
    from igi_sdk.profile.data import cache_dir

    calls, noisy = fake_measure
    noisy["busy"] = True
    assert cli.main(["profile", "--fast"]) == 0
    out = capsys.readouterr()
    assert "not cached" in out.out and "1.6 of the 2 CPU cores" in out.err, out
    assert not list(cache_dir().glob("*.json"))
    noisy["busy"] = False
    assert cli.main(["profile", "--fast"]) == 0 and len(calls) == 2  # measured again
    assert "measured now and cached" in capsys.readouterr().out


def test_other_processes_cpu_time_marks_a_measurement_busy(monkeypatch) -> None:
    from igi_sdk.tuning import measure

    monkeypatch.setattr(measure, "_system_cpus", lambda: 2)
    probe = measure._OthersCpu(threads=2)
    probe.t0, probe.t1, probe.own0, probe.own1 = 0.0, 10.0, 0.0, 8.0
    probe.sys0, probe.sys1 = 100.0, 108.2  # only this process: quiet
    assert probe.cores() == pytest.approx(0.02) and probe.busy() == ""
    probe.sys1 = 118.0  # others took a core's worth of the two
    assert probe.cores() == pytest.approx(1.0) and "1.0 of the 2 CPU cores" in probe.busy()
    monkeypatch.setattr(measure, "_system_cpus", lambda: 16)  # 14 cores left free: no matter
    assert probe.busy() == ""
    with measure._OthersCpu(threads=1) as real:  # reads this machine's counters
        time.sleep(0.05)
    assert real.cores() is None or real.cores() >= 0


def test_step_overhead_probe_is_repeated_until_undisturbed(monkeypatch) -> None:
    from igi_sdk.runtime import step_bench
    from igi_sdk.tuning import measure

    def probe(layer_s: float, step_s: float) -> step_bench.StepOverhead:
        return step_bench.StepOverhead(layer_s=layer_s, step_s=step_s,
                                       layer_weight_bytes={"Q4_0": 55296})

    runs = [probe(0.0, 0.42),  # the cores were taken: far beyond any real step
            probe(0.0, 60e-6),  # the 4-layer model slowed more than the 16-layer one
            probe(18e-6, 30e-6), probe(30e-3, 20e-6), probe(17e-6, 25e-6), probe(19e-6, 90e-6)]
    seen = iter(runs)
    monkeypatch.setattr(step_bench, "step_overhead", lambda **_kw: next(seen))
    o = measure.step_overhead(gpu=False, threads=2)
    assert o.layer_s == pytest.approx(18e-6) and o.step_s == pytest.approx(30e-6)
    assert next(seen, None) is None  # six probes: three kept
    monkeypatch.setattr(step_bench, "step_overhead", lambda **_kw: probe(0.0, 0.42))
    with pytest.raises(measure.NoisyProfileError):
        measure.step_overhead(gpu=False, threads=2)


def test_progress_is_silent_for_a_quick_step_and_shown_after_a_second(capsys) -> None:
    from igi_sdk.cli import _Progress

    with _Progress("quick", bar=False) as p:
        p(0.5, "half")
    assert capsys.readouterr().err == ""
    with _Progress("slow", bar=False) as p:
        time.sleep(1.3)
        p(0.5, "half")
    err = capsys.readouterr().err
    assert "slow ..." in err and "slow: 50% (half)" in err and "slow: done after" in err


@pytest.mark.parametrize("bad", [("--talking", "0"), ("--talking", "9"),
                                 ("--max-sessions", "2", "--talking", "3")])
def test_serve_refuses_more_npcs_talking_than_it_holds(tmp_path, bad: tuple[str, ...]) -> None:
    r = _cli("serve", "--endpoint", f"ipc://{tmp_path}/s.sock", *bad)
    assert r.returncode == 2 and "--talking" in r.stderr, r.stderr
    assert "listening" not in r.stderr and "[internal]" not in r.stderr


def test_the_cpus_slowdown_beside_a_copy_is_measured_against_its_speed_alone() -> None:
    """Profile.stream_cpu_slowdown: the work beside a copy against the mean of the same work
    alone before and after it (a drift cancels), never negative, and a profile whose figure
    no copy could cause is a disturbed one (never cached)."""
    from igi_sdk.tuning import measure

    assert measure.slowdown(1.0, 1.25, 1.0) == pytest.approx(0.25)
    assert measure.slowdown(0.9, 1.25, 1.1) == pytest.approx(0.25)  # the machine sped up
    assert measure.slowdown(1.0, 0.98, 1.0) == 0.0  # noise below the speed alone
    with pytest.raises(ValueError):
        measure.slowdown(0.0, 1.0, 0.0)
    prof = _plausible_profile(2)
    assert not measure.profile_problems(prof)
    prof.stream_cpu_slowdown = measure.MAX_STREAM_CPU_SLOWDOWN + 1
    assert any("slower beside a copy" in p for p in measure.profile_problems(prof))
