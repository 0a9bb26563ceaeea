"""The sidecar as a frozen one-folder bundle: where its parts are, and its start.

Layout (``igi-sdk bundle OUT``)::

    OUT/igi-sdk[.exe]                 the executable (the ``igi-sdk`` command line)
    OUT/models/MODEL.gguf             the default model, when one was bundled
    OUT/_internal/                    Python, igi-sdk and the native libraries
    OUT/_internal/igi_sdk_build.json  what its llama.cpp was built with

Nothing is ever written inside it: installs are often read-only.
"""

from __future__ import annotations

import ctypes
import importlib
import os
import sys
from pathlib import Path

from igi_sdk.bundle.buildinfo import BUILD_INFO_FILE, BuildInfo

# beside llama_cpp/lib in a CUDA bundle: the CPU build of the same llama.cpp
CPU_LIB_DIR = "lib-cpu"
_CDLL = ctypes.CDLL  # ctypes' own, before the CPU fallback redirects it


def is_frozen() -> bool:
    return bool(getattr(sys, "frozen", False)) and hasattr(sys, "_MEIPASS")


def cli_command() -> list[str]:
    """The start of the command line that runs this ``igi-sdk`` again in a new process, the
    subcommand and its arguments to follow: from a bundle, its executable (whose entry is the
    command line; it has no ``-m``), otherwise this Python with ``-m igi_sdk.cli`` (no
    ``igi-sdk`` script on PATH needed). Every process the SDK starts as itself starts so."""
    if is_frozen():
        return [sys.executable]
    return [sys.executable, "-m", "igi_sdk.cli"]


def internal_dir() -> Path:
    """The bundle's ``_internal`` folder (PyInstaller's ``sys._MEIPASS``)."""
    return Path(sys._MEIPASS)  # type: ignore[attr-defined]


def bundle_dir() -> Path:
    """The folder the executable is in."""
    return Path(sys.executable).resolve().parent


def build_info() -> BuildInfo | None:
    """This bundle's build record (None outside a bundle, or when it is unreadable)."""
    if not is_frozen():
        return None
    try:
        return BuildInfo.load(internal_dir() / BUILD_INFO_FILE)
    except (OSError, ValueError, TypeError):
        return None


def bundled_model() -> Path | None:
    """The model bundled as the default, when there is one."""
    info = build_info()
    if info is None or not info.model:
        return None
    path = bundle_dir() / info.model
    return path if path.is_file() else None


class _RedirectedCDLL(ctypes.CDLL):
    """ctypes.CDLL loading llama.cpp's CPU build in place of its CUDA build: llama-cpp-python
    loads ggml from ``llama_cpp/lib`` by a fixed path (only libllama honours
    LLAMA_CPP_LIB_PATH), and the CUDA build cannot be loaded without a driver."""

    source = ""
    target = ""

    def __init__(self, name: str | None, *args: object, **kwargs: object) -> None:
        if name and os.path.dirname(os.path.abspath(name)) == self.source:
            name = os.path.join(self.target, os.path.basename(name))
        super().__init__(name, *args, **kwargs)  # type: ignore[arg-type]


def _use_cpu_libs() -> None:
    lib = internal_dir() / "llama_cpp"
    _RedirectedCDLL.source = os.path.abspath(lib / "lib")
    _RedirectedCDLL.target = os.path.abspath(lib / CPU_LIB_DIR)
    ctypes.CDLL = _RedirectedCDLL  # type: ignore[misc]
    os.environ["LLAMA_CPP_LIB_PATH"] = _RedirectedCDLL.target
    # the libraries' own dependencies (libggml.so.0, ...) are found through LD_LIBRARY_PATH,
    # which the bundle's launcher points at _internal, where the GPU build's are: the CPU
    # build's folder goes first (read by the loader at process start: the preload's new
    # process below takes it)
    paths = os.environ.get("LD_LIBRARY_PATH", "").split(":")
    if _RedirectedCDLL.target not in paths:
        os.environ["LD_LIBRARY_PATH"] = ":".join([_RedirectedCDLL.target, *filter(None, paths)])
    _preload_cpu_ggml(Path(_RedirectedCDLL.target))


# ggml's libraries in the order they need each other
_GGML_ORDER = ("ggml-base", "ggml-cpu", "ggml")


def _preload_cpu_ggml(folder: Path) -> None:
    """Load the CPU build's ggml by path before anything asks for it by name: PyInstaller's
    launcher puts ``_internal`` (the GPU build's libggml.so.0) first on LD_LIBRARY_PATH again
    in every process, where the loader would resolve libllama's ``libggml.so.0`` to the GPU
    build's. A library already loaded is reused for every later request of its name."""
    if sys.platform == "win32":
        return  # Windows resolves a DLL's dependencies beside it first (LOAD_WITH_ALTERED...)
    for name in _GGML_ORDER:
        found = sorted(folder.glob(f"lib{name}.so*"), key=lambda p: len(p.name))
        if found:
            _CDLL(str(found[0]), mode=ctypes.RTLD_GLOBAL)


def run_image_worker(argv: list[str]) -> bool:
    """``EXE -I .../_image_worker.pyc BYTES``: the image decoder's process (started as
    ``sys.executable -I WORKER``), run from the plain source bundled beside the module. False:
    not such a call."""
    if len(argv) < 3 or argv[1] != "-I" or not os.path.basename(argv[2]).startswith(
            "_image_worker."):
        return False
    import runpy

    script = os.path.splitext(argv[2])[0] + ".py"
    sys.argv = [script, *argv[3:]]
    runpy.run_path(script, run_name="__main__")
    return True


# the HTTP face's body parsing process (igi_sdk.http._body_worker.MODULE), named here without
# importing the face: the bundle's entry runs this check before anything else is loaded
BODY_WORKER_MODULE = "igi_sdk.http._body_worker"


def run_body_worker(argv: list[str]) -> bool:
    """``EXE -m igi_sdk.http._body_worker BYTES``: the HTTP face's body parsing process
    (started as ``sys.executable -m MODULE``, as from an installed package). False: not such a
    call."""
    if len(argv) < 3 or argv[1] != "-m" or argv[2] != BODY_WORKER_MODULE:
        return False
    import runpy

    sys.argv = [argv[2], *argv[3:]]
    runpy.run_module(BODY_WORKER_MODULE, run_name="__main__", alter_sys=True)
    return True


def boot(client_only: str | None) -> None:
    """The bundle's start, before llama.cpp is loaded (the entry script imported this package
    with IGI_SDK_CLIENT_ONLY=1 so that it was not): put the user's IGI_SDK_CLIENT_ONLY back,
    preload pyzmq's libraries (as the ``igi-sdk`` command does), choose the GPU or the CPU
    build, then import the package for real."""
    if client_only is None:
        os.environ.pop("IGI_SDK_CLIENT_ONLY", None)
    else:
        os.environ["IGI_SDK_CLIENT_ONLY"] = client_only
    info = build_info()
    if info is not None and info.backend == "cuda" and client_only != "1":
        from igi_sdk.bundle.gpu import choose, probe_driver

        choice = choose(info, probe_driver(),
                        user_visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
        if choice.message and "IGI_SDK_GPU_CHOICE" not in os.environ:  # once, not again
            print(f"igi-sdk: {choice.message}", file=sys.stderr, flush=True)
        if choice.visible is not None:
            os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # NVML's numbering
            os.environ["CUDA_VISIBLE_DEVICES"] = choice.visible
        if choice.libs == "cpu":
            _use_cpu_libs()
        os.environ["IGI_SDK_GPU_CHOICE"] = choice.message or "GPU build in use"
    # after the choice: the new process inherits its environment (made again there, the same)
    from igi_sdk.native_preload import reexec_with_native_preload

    reexec_with_native_preload()
    import igi_sdk

    importlib.reload(igi_sdk)  # now with llama.cpp, before anything imports numpy
