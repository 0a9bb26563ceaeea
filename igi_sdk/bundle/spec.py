"""What goes into a bundle, as data, and the PyInstaller spec file written from it.

Plain functions of the installed packages' folders: nothing here imports PyInstaller or loads
llama.cpp, so the choice of files is testable by itself.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from igi_sdk.errors import UsageError

# imported by name at run time (lazily, or by a framework), so PyInstaller's scan of import
# statements alone would miss them
HIDDEN_IMPORTS = (
    "igi_sdk", "llama_cpp", "llama_cpp.mtmd_cpp", "zmq", "msgpack", "pydantic", "numpy", "gguf",
    "llguidance", "PIL.Image", "PIL.PngImagePlugin", "PIL.JpegImagePlugin", "pynvml",
    "fastapi", "uvicorn", "httpx", "psutil", "httptools", "uvloop",
)
# packages whose every module is collected (the SDK imports its own lazily, inside functions)
SUBMODULE_PACKAGES = ("igi_sdk", "uvicorn", "llguidance")
# distributions whose metadata is read at run time (importlib.metadata.version)
METADATA = ("llguidance", "numpy", "pydantic", "pydantic-core", "fastapi", "uvicorn", "httpx",
            "pyzmq", "gguf", "Pillow", "msgpack", "llama_cpp_python", "igi-sdk")
# installed beside the SDK in a development environment but never used by the sidecar: left
# out for size and build time
EXCLUDES = (
    "tkinter", "matplotlib", "IPython", "pytest", "_pytest", "openai", "setuptools",
    "pip", "PyInstaller", "sse_starlette", "starlette_context", "pydantic_settings",
    "llama_cpp.server", "jupyter", "notebook", "pandas", "scipy", "torch",
    # machine-learning stacks a build machine may have: optional imports of our dependencies
    # reach them (a CUDA bundle built beside jax and cupy was 2.9 GiB, their CUDA libraries
    # included)
    "jax", "jaxlib", "cupy", "cupyx", "cupy_backends", "pyarrow", "cv2", "torchvision",
    "tensorflow", "keras", "triton", "mlx", "numba", "llvmlite", "sklearn", "transformers",
    "datasets", "sympy", "h5py", "onnx", "onnxruntime", "nvidia", "polars", "tensorrt",
    "huggingface_hub", "hf_xet", "aiohttp", "lxml",
)
# run-time libraries that belong to the player's machine, never the bundle: the NVIDIA driver's
# own (bundling them breaks every other driver version)
SYSTEM_LIBS = ("libcuda.so", "libnvidia-ml.so", "libnvidia-ptxjitcompiler.so", "nvcuda.dll",
               "nvml.dll")
# llama.cpp's libraries as llama-cpp-python loads them (by these names, from llama_cpp/lib)
LLAMA_LIBS = ("llama", "ggml", "ggml-base", "ggml-cpu", "ggml-cuda", "mtmd")


@dataclass(frozen=True)
class BundlePlan:
    """The inputs of one bundle: everything the spec says, as data."""

    name: str
    entry: Path
    binaries: tuple[tuple[str, str], ...]
    datas: tuple[tuple[str, str], ...]
    hidden_imports: tuple[str, ...] = HIDDEN_IMPORTS
    submodule_packages: tuple[str, ...] = SUBMODULE_PACKAGES
    metadata: tuple[str, ...] = METADATA
    excludes: tuple[str, ...] = EXCLUDES
    system_libs: tuple[str, ...] = SYSTEM_LIBS
    # stripping breaks manylinux libraries patched by auditwheel (numpy's OpenBLAS: "ELF load
    # command address/offset not page-aligned")
    strip: bool = False
    extra: dict[str, str] = field(default_factory=dict)


def package_dir(name: str) -> Path:
    """An installed package's folder, found without importing it (importing llama_cpp here
    would load the very libraries being collected)."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise UsageError(f"the package {name} is not installed: the bundle needs it")
    return Path(next(iter(spec.submodule_search_locations)))


def llama_libs(lib_dir: Path) -> list[Path]:
    """The libraries of ``lib_dir`` that llama-cpp-python loads, each once (wheels carry every
    library three times: .so, .so.0 and .so.0.x.y; the others are found by soname)."""
    found = []
    for stem in LLAMA_LIBS:
        for name in (f"lib{stem}.so", f"lib{stem}.dylib", f"{stem}.dll", f"lib{stem}.dll"):
            if (lib_dir / name).is_file():
                found.append(lib_dir / name)
                break
    return found


def plan_bundle(name: str) -> BundlePlan:
    """The bundle of this environment: the SDK, llama.cpp's libraries from llama_cpp/lib, the
    image decoder's script. (A CUDA bundle's CPU fallback is copied in after PyInstaller, not
    analysed by it: its libraries have the same names as the CUDA build's, and PyInstaller
    links every library's name once at the top of the bundle.)"""
    sdk = package_dir("igi_sdk")
    lib = package_dir("llama_cpp") / "lib"
    libs = llama_libs(lib)
    if not any(p.name.startswith(("libllama", "llama")) for p in libs):
        raise UsageError(f"no llama.cpp library in {lib}: is llama-cpp-python installed?")
    binaries = [(str(p), "llama_cpp/lib") for p in libs]
    # the image decoder runs as a script of its own (sys.executable -I WORKER): its source is
    # shipped as a file, not only as a module of the archive
    datas = [(str(sdk / "runtime" / "_image_worker.py"), "igi_sdk/runtime")]
    return BundlePlan(name=name, entry=Path(__file__).parents[1] / "bundled_main.py",
                      binaries=tuple(binaries), datas=tuple(datas))


SPEC_TEMPLATE = '''\
# PyInstaller spec of the igi-sdk sidecar bundle (written by `igi-sdk bundle`)
from PyInstaller.utils.hooks import collect_submodules, copy_metadata

hidden = {hidden!r}
for package in {submodules!r}:
    hidden += collect_submodules(package)
datas = {datas!r}
for dist in {metadata!r}:
    try:
        datas += copy_metadata(dist)
    except Exception:  # not installed as a distribution (e.g. a llama_cpp folder of its own)
        pass
a = Analysis(
    [{entry!r}],
    binaries={binaries!r},
    datas=datas,
    hiddenimports=hidden,
    excludes={excludes!r},
    noarchive=False,
)
# the NVIDIA driver's libraries come from the player's machine
system = {system!r}
a.binaries = [b for b in a.binaries if not any(b[0].split("/")[-1].startswith(s) for s in system)]
pyz = PYZ(a.pure)
exe = EXE(pyz, a.scripts, [], exclude_binaries=True, name={name!r}, console=True,
          strip={strip!r}, upx=False)
coll = COLLECT(exe, a.binaries, a.datas, strip={strip!r}, upx=False, name={name!r})
'''


def spec_text(plan: BundlePlan) -> str:
    """The PyInstaller spec file of ``plan``."""
    return SPEC_TEMPLATE.format(
        hidden=list(plan.hidden_imports), submodules=list(plan.submodule_packages),
        metadata=list(plan.metadata),
        entry=str(plan.entry), binaries=[list(b) for b in plan.binaries],
        datas=[list(d) for d in plan.datas], excludes=list(plan.excludes),
        system=list(plan.system_libs), name=plan.name, strip=plan.strip)
