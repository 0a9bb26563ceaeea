"""Whether a bundle's GPU build may use this machine's GPU, decided before llama.cpp loads.

A CUDA build runs kernels only for the compute capabilities it was compiled for: on another GPU
the first kernel aborts the process ("no kernel image is available"). Without a driver the CUDA
build cannot be loaded at all (its libraries need ``libcuda``). So a bundle checks the GPUs
against what it carries (:mod:`igi_sdk.bundle.buildinfo`) through NVML, which needs only the
driver, and then either lets CUDA see the GPUs it can run on, hides the others, or loads its
CPU build instead, saying why.
"""

from __future__ import annotations

from dataclasses import dataclass

from igi_sdk.bundle.buildinfo import BuildInfo


@dataclass(frozen=True)
class Gpu:
    """One GPU as NVML numbers it (PCI bus order) with its compute capability (major*100 +
    minor*10, ggml's unit: 890 for 8.9)."""

    index: int
    name: str
    compute: int


@dataclass(frozen=True)
class Driver:
    """The NVIDIA driver: ``cuda``, the newest CUDA version it runs (12040 for 12.4; 0 when
    unknown), and its GPUs."""

    version: str
    cuda: int
    gpus: tuple[Gpu, ...]


@dataclass(frozen=True)
class GpuChoice:
    """What the bundle does: ``libs``: "gpu" (its CUDA build) or "cpu" (its CPU build);
    ``visible``: the CUDA_VISIBLE_DEVICES to set (None: leave it), ``gpus``: those GPUs;
    ``message``: why a GPU is refused ('' when nothing is)."""

    libs: str
    visible: str | None
    gpus: tuple[Gpu, ...]
    message: str


def _cc(v: int) -> str:
    return f"{v // 100}.{v % 100 // 10}"


def _ver(v: int) -> str:
    return f"{v // 1000}.{v % 1000 // 10}"


def arch_runs(compute: int, archs: tuple[int, ...]) -> bool:
    """A GPU of ``compute`` runs a build of ``archs``: one of them is at most its capability.
    The same major's code runs as it is; an older major's runs as PTX, compiled by the driver
    at first start (CMake's plain ``90`` carries both, as ggml's default list does)."""
    return any(a <= compute for a in archs)


def choose(build: BuildInfo, driver: Driver | None, *, user_visible: str | None = None
           ) -> GpuChoice:
    """The decision, as a plain function of the build, the driver (None: no driver) and a
    CUDA_VISIBLE_DEVICES the user set (respected: only a refusal of every GPU overrides it)."""
    if build.backend != "cuda":
        return GpuChoice("gpu", None, (), "")
    fallback = "cpu" if build.cpu_fallback else "gpu"
    # hiding every GPU keeps a CUDA build on the CPU where it can load (a driver is there)
    hide = "" if fallback == "gpu" else None
    built = ", ".join(f"sm_{a // 10}" for a in build.cuda_archs) or "unknown architectures"
    if driver is None:
        if not build.cpu_fallback:
            return GpuChoice("gpu", None, (), (
                "no NVIDIA driver found: this bundle's CUDA build needs one and carries no CPU "
                "build to fall back to; install the NVIDIA driver or use a CPU bundle"))
        return GpuChoice("cpu", None, (), (
            "no NVIDIA driver found: the GPU is not used; running on the CPU "
            "(install the NVIDIA driver to use the GPU)"))
    if not driver.gpus:
        return GpuChoice(fallback, hide, (), "no NVIDIA GPU found: running on the CPU")
    if build.cuda_runtime and driver.cuda and driver.cuda < build.cuda_runtime:
        return GpuChoice(fallback, hide, (), (
            f"the NVIDIA driver {driver.version} runs CUDA up to {_ver(driver.cuda)}, this "
            f"bundle's GPU build needs CUDA {_ver(build.cuda_runtime)}: the GPU is not used; "
            "running on the CPU (update the NVIDIA driver to use the GPU)"))
    ok = tuple(g for g in driver.gpus if not build.cuda_archs or arch_runs(g.compute,
                                                                          build.cuda_archs))
    refused = [g for g in driver.gpus if g not in ok]
    why = "; ".join(f"GPU {g.index} ({g.name}, compute {_cc(g.compute)}) is not one this "
                    f"bundle was built for ({built})" for g in refused)
    if not ok:
        return GpuChoice(fallback, hide, (), (
            f"{why}: running on the CPU (a bundle built with its architecture, e.g. "
            f"CMAKE_CUDA_ARCHITECTURES={refused[0].compute // 10}, uses it)"))
    if not refused:
        return GpuChoice("gpu", None, ok, "")
    if user_visible is not None:  # the user chose the GPUs: theirs to get right
        return GpuChoice("gpu", None, ok, f"{why} (CUDA_VISIBLE_DEVICES={user_visible} kept)")
    return GpuChoice("gpu", ",".join(str(g.index) for g in ok), ok,
                     f"{why}: only GPU {', '.join(str(g.index) for g in ok)} is used")


def probe_driver() -> Driver | None:
    """The driver and its GPUs through NVML (None: no driver, or NVML cannot be read)."""
    from igi_sdk.nvml_lib import nvml  # not igi_sdk.runtime: its package loads llama.cpp

    pynvml = nvml()
    if pynvml is None:
        return None
    try:
        gpus = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(h)
            name = pynvml.nvmlDeviceGetName(h)
            gpus.append(Gpu(i, name.decode() if isinstance(name, bytes) else str(name),
                            major * 100 + minor * 10))
        try:
            cuda = int(pynvml.nvmlSystemGetCudaDriverVersion())
        except pynvml.NVMLError:
            cuda = 0
        version = pynvml.nvmlSystemGetDriverVersion()
        return Driver(version.decode() if isinstance(version, bytes) else str(version), cuda,
                      tuple(gpus))
    except pynvml.NVMLError:
        return None
    finally:
        try:
            pynvml.nvmlShutdown()
        except pynvml.NVMLError:
            pass
