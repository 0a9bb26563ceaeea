"""Turn a Plan into llama.cpp load parameters (tensor buffer overrides), and read back where
tensors really landed.

llama.cpp chooses a buffer per tensor from ``tensor_buft_overrides`` (regexes, first match wins)
and logs every override decision at debug level. We override *every* tensor (GPU-resident ones
by name, then a catch-all to the CPU), so the log names the buffer of each tensor: that is the
read-back, not an assumption.
"""

from __future__ import annotations

import ctypes
import re
from collections import defaultdict
from dataclasses import dataclass, field

from igi_sdk.model import ModelInventory
from igi_sdk.planner import Plan
from igi_sdk.runtime._native import LlamaModelTensorBuftOverride
from igi_sdk.runtime.devices import Device, cpu_buffer_type, gpu_buffer_type

_MIB = 1024 * 1024
_OVERRIDE_RE = re.compile(r"tensor (\S+) \(\d+ MiB \S+\) buffer type overridden to (\S+)")
_MODEL_BUF_RE = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
_KV_BUF_RE = re.compile(r"(\S+) KV buffer size =\s+([\d.]+) MiB")
_COMPUTE_BUF_RE = re.compile(r"(\S+) compute buffer size =\s+([\d.]+) MiB")
_RS_BUF_RE = re.compile(r"(\S+) RS buffer size =\s+([\d.]+) MiB")


def name_patterns(names: list[str]) -> list[str]:
    """Compact anchored regexes matching exactly ``names``.

    llama.cpp compiles every pattern for every tensor while loading, so one pattern per tensor
    (hundreds) is slow; grouping by the name with its layer number taken out keeps it to a few
    dozen patterns."""
    by_stem: dict[str, list[str]] = defaultdict(list)
    plain: list[str] = []
    for n in names:
        m = re.fullmatch(r"blk\.(\d+)\.(.+)", n)
        if m:
            by_stem[m.group(2)].append(m.group(1))
        else:
            plain.append(n)
    pats = [f"^{re.escape(n)}$" for n in sorted(plain)]
    for stem, layers in sorted(by_stem.items()):
        alt = "|".join(sorted(set(layers), key=int))
        pats.append(rf"^blk\.({alt})\.{re.escape(stem)}$")
    return pats


@dataclass
class Overrides:
    """A NULL-terminated override array plus the pattern bytes it points into (kept alive)."""

    array: ctypes.Array | None
    patterns: list[bytes] = field(default_factory=list)

    @property
    def pointer(self) -> int | None:
        return ctypes.cast(self.array, ctypes.c_void_p).value if self.array is not None else None


def build_overrides(plan: Plan, inventory: ModelInventory, gpu: Device | None) -> Overrides:
    """GPU-resident tensors by name to the GPU buffer type, everything else to the CPU."""
    known = {t.name for t in inventory.tensors}
    gpu_names = sorted(n for n in plan.gpu_tensors if n in known)
    entries: list[tuple[bytes, int]] = []
    if gpu is not None and gpu_names:
        gbuft = gpu_buffer_type(gpu)
        entries += [(p.encode(), gbuft) for p in name_patterns(gpu_names)]
    entries.append((b".*", cpu_buffer_type()))
    arr = (LlamaModelTensorBuftOverride * (len(entries) + 1))()
    keep = []
    for i, (pat, buft) in enumerate(entries):
        keep.append(pat)
        arr[i].pattern = pat
        arr[i].buft = buft
    arr[len(entries)].pattern = None
    arr[len(entries)].buft = None
    return Overrides(array=arr, patterns=keep)


def n_gpu_layers(plan: Plan, inventory: ModelInventory, gpu: Device | None) -> int:
    """llama.cpp's n_gpu_layers for the plan (it counts the output layer as one more layer)."""
    if gpu is None:
        return 0
    if plan.gpu_layers < 0:
        return inventory.arch.n_layers + 1
    return min(plan.gpu_layers, inventory.arch.n_layers + 1)


@dataclass
class LoadReport:
    """What llama.cpp said about a load: each tensor's buffer and the buffer sizes."""

    tensor_buffer: dict[str, str] = field(default_factory=dict)
    model_buffers: dict[str, int] = field(default_factory=dict)
    kv_buffers: dict[str, int] = field(default_factory=dict)
    compute_buffers: dict[str, int] = field(default_factory=dict)
    log_tail: list[str] = field(default_factory=list)

    def parse_model_log(self, lines: list[str]) -> None:
        for line in lines:
            if m := _OVERRIDE_RE.search(line):
                self.tensor_buffer[m.group(1)] = m.group(2)
            elif m := _MODEL_BUF_RE.search(line):
                self._add(self.model_buffers, m)
        self.log_tail = [ln.rstrip() for ln in lines if ln.strip()][-20:]

    def parse_context_log(self, lines: list[str]) -> None:
        for line in lines:
            if m := _KV_BUF_RE.search(line) or _RS_BUF_RE.search(line):
                self._add(self.kv_buffers, m)
            elif m := _COMPUTE_BUF_RE.search(line):
                self._add(self.compute_buffers, m)

    @staticmethod
    def _add(into: dict[str, int], m: re.Match[str]) -> None:
        into[m.group(1)] = into.get(m.group(1), 0) + int(float(m.group(2)) * _MIB)

    def device_of_buffer(self, buffer: str, gpu: Device | None) -> str:
        """'gpu' if a buffer lives in the GPU's memory; host buffers (CUDA_Host, CPU_Mapped,
        CPU_REPACK) are 'cpu'."""
        return "gpu" if gpu is not None and buffer == gpu.buffer_type else "cpu"

    def placement(self, gpu: Device | None) -> dict[str, str]:
        return {n: self.device_of_buffer(b, gpu) for n, b in self.tensor_buffer.items()}

    def bytes_on(self, where: str, gpu: Device | None) -> dict[str, int]:
        """Model/KV/compute bytes reported for buffers on ``where`` ('gpu' or 'cpu')."""
        def total(bufs: dict[str, int]) -> int:
            return sum(v for k, v in bufs.items() if self.device_of_buffer(k, gpu) == where)
        return {
            "weights": total(self.model_buffers),
            "kv": total(self.kv_buffers),
            "compute": total(self.compute_buffers),
        }
