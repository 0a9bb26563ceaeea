"""The Unity package `unity_plugin/` is well-formed as Unity's Package Manager reads it, and its
Unity layer works against a real sidecar.

No Unity here: these are the checks a broken package fails at import time in the Editor
(manifest fields, assembly definitions, `.meta` files with unique GUIDs), plus the package's own
rules: source only (no native binaries) and an engine-agnostic core (no `UnityEngine` in
`Runtime/Core`). With mono installed, the Unity layer, the Editor code and the sample are
compiled against `tests/csharp/UnityEngineStub.cs` (Unity's C# subset, warnings as errors), and
`tests/csharp/UnityLayerSmoke.cs` drives the components against a sidecar they start themselves:
a streamed reply, save/restore, cancel, a play-mode restart that adopts the NPC's session, a
killed sidecar that is started again, one that refuses its settings and is not. The core's own
NUnit suite is `tests/csharp/run.sh`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "unity_plugin"
sys.path.insert(0, str(ROOT / "tests" / "csharp"))
import make_unity_meta  # noqa: E402

NUM = r"(0|[1-9]\d*)"
SEMVER = re.compile(rf"^{NUM}\.{NUM}\.{NUM}(-[0-9A-Za-z.-]+)?(\+[0-9A-Za-z.-]+)?$")
GUID = re.compile(r"^guid: ([0-9a-f]{32})$", re.M)
BINARY_SUFFIXES = {".dll", ".so", ".dylib", ".bundle", ".exe", ".a", ".lib", ".pdb"}

pytestmark = pytest.mark.skipif(not PKG.is_dir(), reason="no unity_plugin/")
MCS_FLAGS = ["-langversion:7.2", "-warnaserror+", "-nologo"]
needs_mono = pytest.mark.skipif(not (shutil.which("mcs") and shutil.which("mono")),
                                reason="mono (mcs) is not installed")


def manifest() -> dict:
    return json.loads((PKG / "package.json").read_text(encoding="utf-8"))


def asmdef(rel: str) -> dict:
    return json.loads((PKG / rel).read_text(encoding="utf-8"))


def test_manifest_fields():
    m = manifest()
    # Unity: lowercase reverse-DNS, at most 214 characters, starting "com." style
    assert re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+){2,}", m["name"]) and len(m["name"]) <= 214
    assert m["name"] == "com.igi.sdk"
    assert SEMVER.match(m["version"]), m["version"]
    assert re.fullmatch(r"\d{4}\.\d+", m["unity"]), m["unity"]
    assert m["displayName"].strip() and m["description"].strip()
    assert isinstance(m["author"], dict) and m["author"]["name"]
    assert all(isinstance(k, str) and k for k in m["keywords"])


def test_manifest_license_matches_the_repository():
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    license_ = re.search(r'^license\s*=\s*\{\s*text\s*=\s*"([^"]+)"', pyproject, re.M).group(1)
    assert manifest()["license"] == license_
    assert "Apache License" in (PKG / "LICENSE.md").read_text(encoding="utf-8")


def test_manifest_samples_exist():
    samples = manifest()["samples"]
    assert samples
    for s in samples:
        assert s["displayName"].strip() and s["description"].strip()
        # Unity copies samples from a `~` folder (invisible to its importer) on request
        assert s["path"].startswith("Samples~/"), s["path"]
        folder = PKG / s["path"]
        assert folder.is_dir(), s["path"]
        assert any(folder.glob("*.cs")) and (folder / "README.md").is_file()


def test_package_documents_itself():
    for name in ("README.md", "CHANGELOG.md", "LICENSE.md"):
        assert (PKG / name).is_file(), name
    version = manifest()["version"]
    assert f"## [{version}]" in (PKG / "CHANGELOG.md").read_text(encoding="utf-8")


def test_runtime_asmdef():
    a = asmdef("Runtime/Igi.Sdk.Runtime.asmdef")
    assert a["name"] == "Igi.Sdk.Runtime"
    assert a["autoReferenced"] is True and a["noEngineReferences"] is False
    assert a.get("includePlatforms", []) == []  # every player platform
    assert a.get("allowUnsafeCode", False) is False
    assert a.get("references", []) == []


def test_editor_asmdef():
    a = asmdef("Editor/Igi.Sdk.Editor.asmdef")
    assert a["name"] == "Igi.Sdk.Editor"
    assert a["includePlatforms"] == ["Editor"]
    assert "Igi.Sdk.Runtime" in a["references"]


def test_tests_asmdef():
    a = asmdef("Tests/Runtime/Igi.Sdk.Tests.asmdef")
    assert a["name"] == "Igi.Sdk.Tests"
    assert "Igi.Sdk.Runtime" in a["references"]
    assert a["defineConstraints"] == ["UNITY_INCLUDE_TESTS"]
    assert a["overrideReferences"] is True
    assert "nunit.framework.dll" in a["precompiledReferences"]
    assert "TestAssemblies" in a["optionalUnityReferences"]
    assert a["autoReferenced"] is False  # a game's scripts never see the tests


def test_asmdef_names_are_unique_and_match_their_file():
    found = sorted(PKG.rglob("*.asmdef"))
    assert len(found) == 3
    names = [json.loads(p.read_text(encoding="utf-8"))["name"] for p in found]
    assert len(set(names)) == len(names)
    for p, name in zip(found, names, strict=True):
        assert p.stem == name


def test_every_asset_has_a_meta_with_a_unique_guid():
    assets = make_unity_meta.assets(PKG)
    missing = [str(p.relative_to(PKG)) for p in assets
               if not p.with_name(p.name + ".meta").is_file()]
    assert not missing, f"run: python tests/csharp/make_unity_meta.py ({missing})"
    guids: dict[str, Path] = {}
    for meta in sorted(PKG.rglob("*.meta")):
        asset = meta.with_name(meta.name[: -len(".meta")])
        assert asset.exists(), f"orphaned {meta.relative_to(PKG)}"
        text = meta.read_text(encoding="utf-8")
        assert text.startswith("fileFormatVersion: 2\n"), meta
        m = GUID.search(text)
        assert m, f"no guid in {meta.relative_to(PKG)}"
        assert m.group(1) not in guids, f"{meta} repeats the GUID of {guids[m.group(1)]}"
        guids[m.group(1)] = meta
        assert ("folderAsset: yes" in text) == asset.is_dir(), meta


def test_tilde_folders_have_no_meta():
    for p in PKG.rglob("*~"):
        if p.is_dir():
            assert not p.with_name(p.name + ".meta").exists(), p


def test_meta_generator_is_stable():
    assert make_unity_meta.guid_for("Runtime/Unity") == make_unity_meta.guid_for("Runtime/Unity")
    assert make_unity_meta.guid_for("a/b") != make_unity_meta.guid_for("a/c")
    write, orphans = make_unity_meta.plan(PKG)
    assert not write and not orphans


def test_no_binaries():
    binaries = [str(p.relative_to(PKG)) for p in PKG.rglob("*")
                if p.is_file() and p.suffix.lower() in BINARY_SUFFIXES]
    assert not binaries, "the package ships as source only"
    for p in PKG.rglob("*"):
        if p.is_file() and p.suffix != ".png":
            assert b"\0" not in p.read_bytes()[:8192], f"binary file {p.relative_to(PKG)}"


def test_core_is_engine_agnostic():
    core = sorted((PKG / "Runtime" / "Core").glob("**/*.cs"))
    assert core, "no Runtime/Core sources"
    for p in core:
        text = p.read_text(encoding="utf-8")
        assert not re.search(r"^\s*using\s+(static\s+)?UnityEngine\b", text, re.M), p.name
        assert "UnityEngine." not in text, p.name


def test_unity_layer_avoids_reflection():
    # IL2CPP strips what only reflection reaches; the package needs no link.xml because it uses none
    for p in sorted((PKG / "Runtime").glob("**/*.cs")):
        text = p.read_text(encoding="utf-8")
        assert "System.Reflection" not in text and "GetType().GetMethod" not in text, p.name
        assert "Activator.CreateInstance" not in text, p.name


# ---- the C# (with mono) ---------------------------------------------------------------------


def cs(folder: Path) -> list[str]:
    return sorted(str(p) for p in folder.rglob("*.cs"))


def mcs(*args: str) -> None:
    done = subprocess.run(["mcs", *MCS_FLAGS, *args], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.fixture(scope="module")
def runtime_dll(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("unity") / "Igi.Sdk.Runtime.dll"
    mcs("-target:library", f"-out:{out}", str(ROOT / "tests/csharp/UnityEngineStub.cs"),
        *cs(PKG / "Runtime"))
    return out


@needs_mono
def test_editor_code_and_sample_compile(runtime_dll: Path):
    out = runtime_dll.parent
    mcs("-target:library", f"-r:{runtime_dll}", f"-out:{out / 'editor.dll'}",
        str(ROOT / "tests/csharp/UnityEditorStub.cs"), *cs(PKG / "Editor"))
    mcs("-target:library", f"-r:{runtime_dll}", f"-out:{out / 'sample.dll'}",
        *cs(PKG / "Samples~"))


@pytest.fixture(scope="module")
def smoke_exe(runtime_dll: Path) -> Path:
    out = runtime_dll.parent / "smoke.exe"
    mcs(f"-r:{runtime_dll}", f"-out:{out}", str(ROOT / "tests/csharp/UnityLayerSmoke.cs"))
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def sidecar_pid(port: int) -> int:
    """The sidecar the smoke run started (found by its unique endpoint argument)."""
    found = subprocess.run(["pgrep", "-f", f"endpoint tcp://127.0.0.1:{port}( |$)"],
                           capture_output=True, text=True).stdout.split()
    assert found, f"no sidecar on port {port}"
    return int(found[0])


@needs_mono
@pytest.mark.parametrize("mode", ["units", "basic", "editor", "crash", "refused"])
def test_unity_layer_against_the_sidecar(mode: str, smoke_exe: Path, tmp_path: Path):
    port = free_port()
    env = {**os.environ, "IGI_SDK_EXE": str(Path(sys.executable).parent / "igi-sdk"),
           "IGI_STUB_DATA": str(tmp_path), "SMOKE_PORT": str(port),
           "IGI_STUB_EDITOR": "1" if mode == "editor" else "0"}
    proc = subprocess.Popen(["mono", str(smoke_exe), mode], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env)
    lines = []
    try:
        if mode == "crash":
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                line = proc.stdout.readline()
                if not line:
                    break
                lines.append(line)
                if line.startswith("waiting for the sidecar to be killed"):
                    os.kill(sidecar_pid(port), signal.SIGKILL)
                    break
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(lines) + out
    assert proc.returncode == 0 and "FAIL" not in text and "PASS" in text, text
    if mode == "units":
        return
    log = (tmp_path / "igi-sdk" / "sidecar.log").read_text(encoding="utf-8")
    assert log.count("---- ") == (2 if mode == "crash" else 1), log  # one start per sidecar
    if mode == "refused":
        assert "model_not_found" in log, log
