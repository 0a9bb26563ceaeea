"""The one-folder sidecar bundle: what it records and decides (unit tests), and the real CPU
bundle built once, moved to a folder whose path has spaces and non-ASCII characters, run with an
empty environment: every command of its command line from it, and the demo scene played against
it."""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from igi_sdk.bundle import gpu
from igi_sdk.bundle.build import build_bundle, link_duplicates
from igi_sdk.bundle.buildinfo import (
    BUILD_INFO_FILE,
    BuildInfo,
    cpu_features,
    cuda_archs,
    parse_system_info,
)
from igi_sdk.bundle.spec import plan_bundle, spec_text
from igi_sdk.cli import default_save_dir, machine_lacks, preload_env
from igi_sdk.errors import UsageError

CPU_INFO = ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 0 "
            "| LLAMAFILE = 1 | OPENMP = 1 | REPACK = 1 |")
CUDA_INFO = ("CUDA : ARCHS = 890,900 | USE_GRAPHS = 1 | PEER_MAX_BATCH_SIZE = 128 | " + CPU_INFO)


# --- what the build says about itself --------------------------------------------------------


def test_system_info_is_read_per_backend() -> None:
    info = parse_system_info(CUDA_INFO)
    assert cuda_archs(info) == (890, 900)
    assert info["CUDA"]["USE_GRAPHS"] == "1"
    assert cpu_features(info) == ("SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "LLAMAFILE",
                                  "OPENMP", "REPACK")  # AVX512 = 0 is off
    assert cuda_archs(parse_system_info(CPU_INFO)) == ()


def test_build_info_round_trips() -> None:
    info = BuildInfo(backend="cuda", llama_cpp_python="0.3.36", igi_sdk="0.1.0",
                     cuda_archs=(900,), cuda_runtime=12040, cpu_fallback=True,
                     model="models/m.gguf")
    assert BuildInfo.from_json(info.to_json()) == info


# --- the GPU decision -----------------------------------------------------------------------


def _build(archs: tuple[int, ...] = (900,), fallback: bool = True, runtime: int = 12040
           ) -> BuildInfo:
    return BuildInfo(backend="cuda", llama_cpp_python="x", igi_sdk="x", cuda_archs=archs,
                     cuda_runtime=runtime, cpu_fallback=fallback)


def _driver(*computes: int, cuda: int = 12080) -> gpu.Driver:
    return gpu.Driver("570.1", cuda, tuple(gpu.Gpu(i, f"GPU{i}", c)
                                           for i, c in enumerate(computes)))


def test_a_cpu_build_decides_nothing() -> None:
    cpu = BuildInfo(backend="cpu", llama_cpp_python="x", igi_sdk="x")
    assert gpu.choose(cpu, None) == gpu.GpuChoice("gpu", None, (), "")


def test_a_gpu_it_was_built_for_is_used() -> None:
    c = gpu.choose(_build(), _driver(900))
    assert (c.libs, c.visible, c.message) == ("gpu", None, "")
    assert [g.index for g in c.gpus] == [0]


def test_no_driver_falls_back_to_the_cpu_build() -> None:
    c = gpu.choose(_build(), None)
    assert c.libs == "cpu" and "no NVIDIA driver" in c.message
    # without a CPU build to fall back to, the refusal says what to do instead
    c = gpu.choose(_build(fallback=False), None)
    assert c.libs == "gpu" and "CPU bundle" in c.message


def test_a_gpu_it_was_not_built_for_is_refused_with_the_reason() -> None:
    c = gpu.choose(_build(archs=(900,)), _driver(750))  # a Turing card, sm_90 build
    assert c.libs == "cpu" and c.gpus == ()
    assert "compute 7.5" in c.message and "sm_90" in c.message and "CPU" in c.message
    # no CPU build: every GPU hidden from CUDA, so the CUDA build runs on the CPU
    c = gpu.choose(_build(archs=(900,), fallback=False), _driver(750))
    assert (c.libs, c.visible) == ("gpu", "")


def test_only_the_gpus_it_was_built_for_stay_visible() -> None:
    c = gpu.choose(_build(archs=(860,)), _driver(750, 890))
    assert (c.libs, c.visible) == ("gpu", "1")
    assert "GPU 0" in c.message
    # a choice the user made is kept
    c = gpu.choose(_build(archs=(860,)), _driver(750, 890), user_visible="0")
    assert c.visible is None and "kept" in c.message


def test_a_driver_older_than_the_runtime_is_refused() -> None:
    c = gpu.choose(_build(runtime=12080), _driver(900, cuda=12020))
    assert c.libs == "cpu" and "12.2" in c.message and "12.8" in c.message


def test_no_gpu_runs_on_the_cpu() -> None:
    assert gpu.choose(_build(), _driver()).libs == "cpu"


def test_arch_runs_on_its_own_and_newer_capabilities() -> None:
    assert gpu.arch_runs(900, (900,))
    assert gpu.arch_runs(1000, (900,))  # PTX, compiled by the driver
    assert gpu.arch_runs(890, (860, 900))
    assert not gpu.arch_runs(750, (860, 900))


# --- the start of a bundle ------------------------------------------------------------------


def test_the_cpu_fallback_loads_its_own_build_in_place_of_the_gpu_one(tmp_path: Path) -> None:
    from igi_sdk.bundle import frozen
    from igi_sdk.bundle.spec import package_dir

    real = package_dir("llama_cpp") / "lib" / "libggml-base.so"
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "libggml-base.so").write_bytes(b"not a library")  # the GPU build
    (tmp_path / "lib-cpu").mkdir()
    shutil.copy(real, tmp_path / "lib-cpu" / "libggml-base.so")
    cls = frozen._RedirectedCDLL
    old = (cls.source, cls.target)
    cls.source, cls.target = str(tmp_path / "lib"), str(tmp_path / "lib-cpu")
    try:
        lib = cls(str(tmp_path / "lib" / "libggml-base.so"))
        assert lib._name == str(tmp_path / "lib-cpu" / "libggml-base.so")
        assert cls("libc.so.6")._name == "libc.so.6"  # anything else as asked
    finally:
        cls.source, cls.target = old


def test_preload_by_name_where_the_path_has_spaces() -> None:
    # ld.so splits LD_PRELOAD at spaces: '/games/Mein Spiel/…' preloaded nothing
    env = preload_env(["/games/Mein Spiel ü/_internal/pyzmq.libs/libzmq-1.so.5",
                       "/opt/x/libsodium.so"], {"LD_PRELOAD": "/p/libfoo.so"})
    assert env["LD_PRELOAD"] == "libzmq-1.so.5:/opt/x/libsodium.so:/p/libfoo.so"
    assert env["LD_LIBRARY_PATH"] == "/games/Mein Spiel ü/_internal/pyzmq.libs"
    assert env["IGI_SDK_PRELOADED"] == "1"
    plain = preload_env(["/opt/x/libzmq.so"], {})
    assert plain["LD_PRELOAD"] == "/opt/x/libzmq.so" and "LD_LIBRARY_PATH" not in plain


def test_saves_go_to_a_per_user_folder_without_home(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "igi_sdk.guest.paths", None)  # the OS folder unknown
    monkeypatch.delenv("HOME", raising=False)
    monkeypatch.delenv("XDG_DATA_HOME", raising=False)
    import tempfile

    assert default_save_dir().is_relative_to(tempfile.gettempdir())
    monkeypatch.setenv("HOME", "/home/player")
    assert default_save_dir() == Path("/home/player/.local/share/igi-sdk/sessions")


def test_doctor_says_what_the_machine_lacks() -> None:
    dev = machine_lacks(frozen=False, cuda_build=False, driver=False, model=True,
                        compiler=None, pyinstaller=False)
    assert any("compiler" in line and "prebuilt" in line for line in dev)
    assert any("NVIDIA driver" in line for line in dev)
    assert any("PyInstaller" in line for line in dev)
    # a bundle needs neither a compiler nor Python
    bundle = machine_lacks(frozen=True, cuda_build=True, driver=True, model=True,
                           compiler=None, pyinstaller=False)
    assert bundle == []


def test_spec_collects_llama_cpp_and_keeps_the_driver_out() -> None:
    plan = plan_bundle("igi-sdk")
    names = {Path(src).name for src, _ in plan.binaries}
    assert {"libllama.so", "libggml.so", "libggml-base.so", "libmtmd.so"} <= names
    assert all(dest == "llama_cpp/lib" for _, dest in plan.binaries)
    assert any(src.endswith("_image_worker.py") for src, _ in plan.datas)
    text = spec_text(plan)
    compile(text, "igi-sdk.spec", "exec")
    assert "libcuda.so" in text and "'PyInstaller'" in text  # excluded


def test_duplicate_libraries_become_links(tmp_path: Path) -> None:
    (tmp_path / "libllama.so").write_bytes(b"x" * 100)
    (tmp_path / "libllama.so.0").write_bytes(b"x" * 100)
    (tmp_path / "libmtmd.so").write_bytes(b"y" * 10)
    (tmp_path / "libmtmd.so.0").write_bytes(b"z" * 10)  # not the same bytes: kept
    assert link_duplicates(tmp_path) == 100
    assert os.readlink(tmp_path / "libllama.so") == "libllama.so.0"
    assert not (tmp_path / "libmtmd.so").is_symlink()


def test_bundle_refuses_a_folder_in_use_and_the_wrong_backend(tmp_path: Path) -> None:
    (tmp_path / "game.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty"):
        build_bundle(tmp_path, gpu="cpu")
    with pytest.raises(UsageError, match="CPU build"):
        build_bundle(tmp_path / "new", gpu="cuda")


# --- the real bundle ------------------------------------------------------------------------


def _listing(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


# the first test to use the bundle builds it: a few minutes on 2 idle cores, ten and more beside
# other builds
BUILD_TIMEOUT_S = 1800


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The CPU bundle with the default model, built once, then moved to a game's folder whose
    path has spaces and non-ASCII characters (the built folder is removed: nothing may point
    back to it)."""
    root = tmp_path_factory.mktemp("bundle")
    game = root / "Mein Spiel ü" / "StreamingAssets" / "igi-sdk"
    game.parent.mkdir(parents=True)
    prebuilt = os.environ.get("IGI_SDK_TEST_BUNDLE")
    if prebuilt:  # a bundle built before (`igi-sdk bundle --gpu cpu --model default DIR`): copied
        shutil.copytree(prebuilt, game, symlinks=True)
        yield game
        return
    pytest.importorskip("PyInstaller")
    t0 = time.monotonic()
    built = build_bundle(root / "built", gpu="cpu", model="default", log=root / "pyinstaller.log")
    print(f"\nbundle built in {time.monotonic() - t0:.0f} s, {built.bytes / 2**20:.0f} MiB")
    shutil.copytree(built.out, game, symlinks=True)
    shutil.rmtree(built.out)
    yield game


def _empty_env_run(args: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    # env -i: no PATH, no HOME, no Python anywhere the child could find
    return subprocess.run(["env", "-i", *args], capture_output=True, text=True,
                          timeout=timeout, cwd="/")


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_bundle_is_where_the_engines_look(bundle: Path) -> None:
    # Unity's SidecarLocator: StreamingAssets/igi-sdk/igi-sdk; Unreal: .../IgiSdk/igi-sdk
    exe = bundle / "igi-sdk"
    assert exe.is_file() and os.access(exe, os.X_OK)
    info = BuildInfo.load(bundle / "_internal" / BUILD_INFO_FILE)
    assert info.backend == "cpu" and info.model.startswith("models/")
    assert (bundle / info.model).is_file()


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_doctor_runs_from_the_bundle_with_an_empty_environment(bundle: Path) -> None:
    before = _listing(bundle)
    done = _empty_env_run([str(bundle / "igi-sdk"), "doctor"])
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    assert f"bundle            yes: {bundle}" in out
    assert "llama.cpp CPU" in out and "AVX" in out
    assert f"default model     {bundle / 'models'}" in out
    assert "compiler" not in out.split("this machine lacks")[1]  # a bundle needs none
    # the thread controller's view of other processes, and the image decoder's CPU-time cap,
    # read through psutil: a bundle that left it out sampled no load
    assert "host CPU load     read per CPU (psutil" in out
    # whether its llama.cpp pipelines a decode: this bundle's is the stock build
    assert "pipelined decode  no: a stock llama.cpp scheduler" in out
    assert "pinned weights    in one piece" in out
    assert _listing(bundle) == before  # nothing written next to the executable


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_demo_plays_against_the_bundled_sidecar(bundle: Path) -> None:
    before = _listing(bundle)
    done = _empty_env_run([sys.executable, "-m", "igi_sdk.cli", "demo", "--sidecar",
                           str(bundle / "igi-sdk"), "--max-tokens", "8"], timeout=300)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "sidecar ready with SmolLM2" in done.stdout
    assert "saved Brom's conversation" in done.stdout
    assert "shut down cleanly (exit 0)" in done.stdout
    assert _listing(bundle) == before


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_bundled_image_decoder_starts(bundle: Path) -> None:
    # the decoder runs as `sys.executable -I WORKER`: in a bundle, the executable itself
    # the path image_decode passes: the frozen module's __file__, the source shipped beside it
    worker = bundle / "_internal" / "igi_sdk" / "runtime" / "_image_worker.py"
    proc = subprocess.Popen(["env", "-i", str(bundle / "igi-sdk"), "-I", str(worker),
                             str(512 << 20)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        assert proc.stdout is not None
        assert proc.stdout.read(1) == b"R", proc.stderr.read() if proc.stderr else b""
    finally:
        proc.kill()
        proc.wait(10)


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_the_unity_harness_starts_the_bundled_sidecar(bundle: Path) -> None:
    """The Unity package's NUnit harness (tests/csharp/run.sh; `tests/run.sh` installs mono
    before pytest runs) starts the bundle as its sidecar and holds a conversation over it."""
    if shutil.which("mcs") is None or shutil.which("nunit-console") is None:
        pytest.skip("mono and nunit-console are installed by tests/run.sh")
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "IGI_SDK_EXE": str(bundle / "igi-sdk"), "IGI_CSHARP_SKIP_UNITY": "1",
           "NUNIT_ARGS": "-run=Igi.Sdk.Tests.ClientTests.SaveThenRestoreContinuesTheConversation"}
    done = subprocess.run(["bash", str(root / "tests" / "csharp" / "run.sh")], env=env,
                          capture_output=True, text=True, timeout=600, cwd=root)
    assert done.returncode == 0 and "1 passed, 0 failed" in done.stdout, (
        done.stdout[-3000:], done.stderr[-2000:])
    assert f"sidecar: {bundle / 'igi-sdk'}" in done.stdout


# --- every command of the bundle's command line, with an empty environment -----------------

# each command and the test below that runs it from the bundle
COMMANDS = {"chat": "test_chat_from_the_bundle", "inspect": "test_inspect_from_the_bundle",
            "profile": "test_profile_and_plan_from_the_bundle",
            "plan": "test_profile_and_plan_from_the_bundle",
            "serve": "test_serve_from_the_bundle_starts_answers_and_stops",
            "keys": "test_keys_from_the_bundle", "demo": "test_demo_from_the_bundle",
            "bundle": "test_bundle_from_the_bundle_says_where_to_build",
            "doctor": "test_doctor_runs_from_the_bundle_with_an_empty_environment"}


def test_every_command_has_a_bundle_test() -> None:
    from igi_sdk.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert set(sub.choices) == set(COMMANDS)
    assert all(callable(globals().get(name)) for name in COMMANDS.values())


def _model(bundle: Path) -> Path:
    return bundle / BuildInfo.load(bundle / "_internal" / BUILD_INFO_FILE).model


def _ok(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_help_from_the_bundle_lists_every_command(bundle: Path) -> None:
    out = _ok(_empty_env_run([str(bundle / "igi-sdk"), "--help"]))
    listed = re.search(r"\{([a-z,]+)\}", out)
    assert listed and set(listed.group(1).split(",")) == set(COMMANDS), out


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_demo_from_the_bundle(bundle: Path) -> None:
    # the bundle's own demo starts the sidecar as itself: its executable, `serve …`
    before = _listing(bundle)
    out = _ok(_empty_env_run([str(bundle / "igi-sdk"), "demo", "--max-tokens", "8"],
                             timeout=300))
    assert "sidecar ready with SmolLM2" in out
    assert "saved Brom's conversation" in out
    assert "shut down cleanly (exit 0)" in out
    assert _listing(bundle) == before


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_chat_from_the_bundle(bundle: Path) -> None:
    # no --model: the bundled default, found beside the executable
    done = _empty_env_run([str(bundle / "igi-sdk"), "chat", "Greetings, smith!",
                           "--max-tokens", "8", "--seed", "3"])
    assert "npc> " in _ok(done) and re.search(r"\d+ tokens, first after", done.stderr)


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_inspect_from_the_bundle(bundle: Path) -> None:
    out = _ok(_empty_env_run([str(bundle / "igi-sdk"), "inspect", str(_model(bundle))]))
    assert f"({_model(bundle)})" in out
    assert "30 layers" in out and "token_embd" in out


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_profile_and_plan_from_the_bundle(bundle: Path) -> None:
    # this machine's profile: measured once per machine (cached in the user's cache folder,
    # found without HOME), then a plan on it, and a plan on the profile written beside the game
    exe, model = str(bundle / "igi-sdk"), str(_model(bundle))
    written = bundle.parent / "profil ü.json"
    out = _ok(_empty_env_run([exe, "profile", "--fast", "--json", str(written)], timeout=600))
    assert "cpu " in out and "weight GB/s" in out and written.is_file()
    out = _ok(_empty_env_run([exe, "plan", model, "--ctx", "2048"]))
    assert "chosen: all-cpu" in out
    out = _ok(_empty_env_run([exe, "plan", model, "--ctx", "2048", "--vram", "0",
                              "--profile", str(written)]))
    assert f"predicted on {written}'s profile" in out and "chosen: " in out


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_serve_from_the_bundle_starts_answers_and_stops(bundle: Path, tmp_path: Path) -> None:
    from igi_sdk.client import Client

    endpoint = f"ipc://{tmp_path / 'sidecar.sock'}"
    proc = subprocess.Popen(["env", "-i", str(bundle / "igi-sdk"), "serve", "--endpoint",
                             endpoint, "--ctx", "2048"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, cwd="/")
    client = Client(endpoint, timeout=30.0)
    try:
        assert client.wait_ready(timeout=180.0)["model"].startswith("SmolLM2")
        assert "t" in client.request("ping")
        client.shutdown()
        out, err = proc.communicate(timeout=60)
    finally:
        client.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert proc.returncode == 0, err[-3000:]
    assert f"models from {bundle / 'models'}" in out + err


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_keys_from_the_bundle(bundle: Path) -> None:
    keys = bundle.parent / "Schlüssel und so"
    out = _ok(_empty_env_run([str(bundle / "igi-sdk"), "keys", str(keys)]))
    assert (keys / "server.key_secret").is_file() and (keys / "clients" / "game.key").is_file()
    assert "serve with: igi-sdk serve" in out


@pytest.mark.slow
@pytest.mark.timeout(BUILD_TIMEOUT_S)
def test_bundle_from_the_bundle_says_where_to_build(bundle: Path, tmp_path: Path) -> None:
    # a bundle holds no Python or PyInstaller to build with: refused, with where to build
    done = _empty_env_run([str(bundle / "igi-sdk"), "bundle", str(tmp_path / "again")])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "does not build bundles" in done.stderr and "igi-sdk[bundle]" in done.stderr
    assert not (tmp_path / "again").exists()
