"""``igi-sdk bundle``: PyInstaller run over :mod:`igi_sdk.bundle.spec`'s plan, then the build
record and the model put beside it."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import igi_sdk
from igi_sdk.bundle.buildinfo import (
    BUILD_INFO_FILE,
    BuildInfo,
    cpu_features,
    cuda_archs,
    parse_system_info,
)
from igi_sdk.bundle.frozen import CPU_LIB_DIR
from igi_sdk.bundle.spec import llama_libs, plan_bundle, spec_text
from igi_sdk.errors import UsageError

MODELS_DIR = "models"


@dataclass(frozen=True)
class BundleResult:
    out: Path
    executable: Path
    info: BuildInfo
    bytes: int
    build_s: float


def folder_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (links counted once, as the link)."""
    return sum(f.lstat().st_size for f in path.rglob("*") if f.is_file() or f.is_symlink())


def copy_libraries(src: Path, dest: Path) -> None:
    """llama.cpp's shared libraries of ``src`` (links kept as links) into ``dest``."""
    dest.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        if f.name.startswith(("lib", "ggml", "llama", "mtmd")) and (
                ".so" in f.name or f.suffix in (".dll", ".dylib")):
            shutil.copy2(f, dest / f.name, follow_symlinks=False)


def link_duplicates(lib_dir: Path) -> int:
    """Replace each ``libX.so`` that is a byte copy of ``libX.so.N`` with a link to it (wheels
    carry llama.cpp's libraries once per name; the CUDA one is large). Bytes saved."""
    saved = 0
    if not lib_dir.is_dir():
        return 0
    for plain in sorted(lib_dir.glob("*.so")):
        for versioned in sorted(lib_dir.glob(plain.name + ".*")):
            if (plain.is_symlink() or versioned.is_symlink()
                    or plain.stat().st_size != versioned.stat().st_size
                    or plain.read_bytes() != versioned.read_bytes()):
                continue
            saved += plain.stat().st_size
            plain.unlink()
            plain.symlink_to(versioned.name)
            break
    return saved


def _cuda_runtime_version() -> int:
    """The CUDA runtime this process's llama.cpp links (0 when none is loaded)."""
    for name in ("libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name, mode=os.RTLD_NOLOAD if hasattr(os, "RTLD_NOLOAD") else 0)
        except OSError:
            continue
        v = ctypes.c_int(0)
        if lib.cudaRuntimeGetVersion(ctypes.byref(v)) == 0:
            return v.value
    return 0


def this_build(gpu: str) -> BuildInfo:
    """The llama.cpp this environment would bundle, checked against ``--gpu``."""
    import llama_cpp

    text = llama_cpp.llama_print_system_info().decode(errors="replace").strip()
    info = parse_system_info(text)
    has_cuda = "CUDA" in info
    if gpu == "cuda" and not has_cuda:
        raise UsageError(
            "--gpu cuda: this environment's llama-cpp-python is a CPU build; install a CUDA "
            "build first (docs/shipping.md: prebuilt wheels, or CMAKE_ARGS=-DGGML_CUDA=on)")
    if gpu == "cpu" and has_cuda:
        raise UsageError(
            "--gpu cpu: this environment's llama-cpp-python is a CUDA build; bundle it with "
            "--gpu cuda, or bundle from an environment with the CPU build")
    return BuildInfo(backend=gpu, llama_cpp_python=llama_cpp.__version__,
                     igi_sdk=igi_sdk.__version__, cuda_archs=cuda_archs(info),
                     cuda_runtime=_cuda_runtime_version() if has_cuda else 0,
                     cpu_features=cpu_features(info), system_info=text)


def _model_file(model: str | None) -> Path | None:
    if not model:
        return None
    from igi_sdk.model import default_model_path, read_inventory

    path = default_model_path() if model == "default" else Path(model)
    if not path.is_file():
        raise UsageError(f"--model {model}: no such file")
    read_inventory(path)  # a GGUF the sidecar can load, or its typed error now
    return path


def build_bundle(out: Path, *, gpu: str = "cpu", model: str | None = None,
                 name: str = "igi-sdk", cpu_libs: Path | None = None,
                 log: Path | None = None) -> BundleResult:
    """Build the one-folder sidecar into ``out`` (which must not exist, or be empty).

    ``gpu``: the backend of this environment's llama.cpp ("cpu" or "cuda"); ``model``: a GGUF
    copied in as the default model ("default": the embedded SmolLM2); ``cpu_libs``: a CPU build
    of the same llama.cpp that a CUDA bundle falls back to where it cannot use the GPU."""
    if gpu not in ("cpu", "cuda"):
        raise UsageError(f"--gpu {gpu}: cpu or cuda")
    if importlib.util.find_spec("PyInstaller") is None:
        raise UsageError("building a bundle needs PyInstaller: pip install 'igi-sdk[bundle]'")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UsageError(f"{out} exists and is not empty: name a new folder for the bundle")
    model_path = _model_file(model)
    info = this_build(gpu)
    if cpu_libs is not None and (gpu != "cuda" or not llama_libs(cpu_libs)):
        raise UsageError(f"--cpu-libs {cpu_libs}: a folder of llama.cpp's CPU libraries "
                         "(libllama, libggml*), for a --gpu cuda bundle")
    plan = plan_bundle(name)
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="igi-bundle-") as tmp:
        spec = Path(tmp) / f"{name}.spec"
        spec.write_text(spec_text(plan), encoding="utf-8")
        cmd = [sys.executable, "-m", "PyInstaller", "--noconfirm", "--log-level", "WARN",
               "--distpath", str(Path(tmp) / "dist"), "--workpath", str(Path(tmp) / "work"),
               str(spec)]
        with open(log or os.devnull, "w", encoding="utf-8") as sink:
            done = subprocess.run(cmd, stdout=sink, stderr=subprocess.STDOUT if log else None,
                                  text=True, check=False)
        if done.returncode != 0:
            raise UsageError(f"PyInstaller failed (exit {done.returncode})"
                             + (f": see {log}" if log else ""))
        out.parent.mkdir(parents=True, exist_ok=True)
        if out.exists():
            out.rmdir()
        shutil.move(str(Path(tmp) / "dist" / name), str(out))
    if cpu_libs is not None:
        copy_libraries(cpu_libs, out / "_internal" / "llama_cpp" / CPU_LIB_DIR)
    if sys.platform != "win32":
        for lib in (out / "_internal" / "llama_cpp").glob("lib*"):
            link_duplicates(lib)
    rel_model = ""
    if model_path is not None:
        (out / MODELS_DIR).mkdir()
        shutil.copy2(model_path, out / MODELS_DIR / model_path.name)
        rel_model = f"{MODELS_DIR}/{model_path.name}"
    info = BuildInfo(**{**info.__dict__, "cpu_fallback": bool(cpu_libs) and gpu == "cuda",
                        "model": rel_model})
    (out / "_internal" / BUILD_INFO_FILE).write_text(info.to_json(), encoding="utf-8")
    exe = out / (f"{name}.exe" if sys.platform == "win32" else name)
    return BundleResult(out, exe, info, folder_bytes(out), time.monotonic() - t0)
