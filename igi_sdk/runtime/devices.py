"""Compute devices as llama.cpp's ggml backend registry sees them."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from igi_sdk.runtime import _native
from igi_sdk.runtime._native import ggml

_KIND = {_native.DEV_CPU: "cpu", _native.DEV_GPU: "gpu", _native.DEV_IGPU: "igpu",
         _native.DEV_ACCEL: "accel"}


@dataclass(frozen=True)
class Device:
    index: int
    name: str
    description: str
    kind: str  # "cpu" | "gpu" | "igpu" | "accel"
    free_bytes: int
    total_bytes: int
    buffer_type: str  # name of the device's weight buffer type, e.g. "CUDA0" or "CPU"
    # "0000:c1:00.0" for a PCI device (what matches it to NVML's device), None where unknown
    pci_bus_id: str | None = None

    @property
    def is_gpu(self) -> bool:
        return self.kind in ("gpu", "igpu")


def _handle(index: int) -> int:
    return ggml.ggml_backend_dev_get(index)


def list_devices() -> list[Device]:
    """Every device llama.cpp can run on, with its current free/total memory."""
    _native.init_backend()
    out = []
    for i in range(ggml.ggml_backend_dev_count()):
        dev = _handle(i)
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        ggml.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        buft = ggml.ggml_backend_dev_buffer_type(dev)
        out.append(
            Device(
                index=i,
                name=ggml.ggml_backend_dev_name(dev).decode(),
                description=(ggml.ggml_backend_dev_description(dev) or b"").decode(),
                kind=_KIND.get(ggml.ggml_backend_dev_type(dev), "other"),
                free_bytes=free.value,
                total_bytes=total.value,
                buffer_type=ggml.ggml_backend_buft_name(buft).decode() if buft else "",
                pci_bus_id=_native.device_pci_bus_id(dev),
            )
        )
    return out


def first_gpu() -> Device | None:
    return next((d for d in list_devices() if d.is_gpu), None)


def gpu_buffer_type(device: Device) -> int:
    """The ggml buffer-type handle that places a weight in this device's memory."""
    return ggml.ggml_backend_dev_buffer_type(_handle(device.index))


def cpu_buffer_type() -> int:
    return ggml.ggml_backend_cpu_buffer_type()
