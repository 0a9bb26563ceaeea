"""What a bundle's llama.cpp was built with, recorded when the bundle is made.

The record is read back before llama.cpp is loaded: asking ggml about its backends initialises
CUDA, and a CUDA build whose driver is missing cannot even be loaded, so the sidecar must know
what it carries without touching it.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

BUILD_INFO_FILE = "igi_sdk_build.json"


@dataclass(frozen=True)
class BuildInfo:
    """One bundle's llama.cpp build.

    ``backend``: ``"cuda"`` or ``"cpu"``; ``cuda_archs``: compute capabilities compiled in, as
    ggml writes them (``[890, 900]`` for sm_89 and sm_90); ``cuda_runtime``: the CUDA runtime
    version it links (``12040`` for 12.4, 0 unknown); ``cpu_features``: the CPU backend's
    features that are on (AVX2, ...); ``cpu_fallback``: the bundle also holds a CPU build of
    the same llama.cpp (``llama_cpp/lib-cpu``) for machines whose GPU it cannot use;
    ``model``: the default model's path relative to the bundle folder ('' for none).
    """

    backend: str
    llama_cpp_python: str
    igi_sdk: str
    cuda_archs: tuple[int, ...] = ()
    cuda_runtime: int = 0
    cpu_features: tuple[str, ...] = ()
    cpu_fallback: bool = False
    model: str = ""
    system_info: str = ""
    extra: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> BuildInfo:
        raw = json.loads(text)
        raw["cuda_archs"] = tuple(int(a) for a in raw.get("cuda_archs", ()))
        raw["cpu_features"] = tuple(raw.get("cpu_features", ()))
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in raw.items() if k in known})

    @classmethod
    def load(cls, path: Path) -> BuildInfo:
        return cls.from_json(path.read_text(encoding="utf-8"))


def parse_system_info(text: str) -> dict[str, dict[str, str]]:
    """``llama_print_system_info()`` as {backend: {feature: value}}.

    The text is ``"CPU : SSE3 = 1 | AVX2 = 1 | ... | CUDA : ARCHS = 890,900 | USE_GRAPHS = 1 |"``:
    a backend's name then ``" : "`` starts a section, features are ``NAME = VALUE``.
    """
    out: dict[str, dict[str, str]] = {}
    current: dict[str, str] | None = None
    for part in text.split("|"):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\S+)\s*:\s*(.*)", part)
        if m and "=" not in m.group(1):
            current = out.setdefault(m.group(1), {})
            part = m.group(2).strip()
            if not part:
                continue
        if current is None:
            current = out.setdefault("", {})
        name, sep, value = part.partition("=")
        current[name.strip()] = value.strip() if sep else ""
    return out


def cuda_archs(info: dict[str, dict[str, str]]) -> tuple[int, ...]:
    """The compute capabilities of the CUDA section's ``ARCHS`` (``"890,900"`` or ``"890
    900"``, sorted); () when the build has no CUDA backend or does not say."""
    raw = info.get("CUDA", {}).get("ARCHS", "")
    return tuple(sorted({int(a) for a in re.findall(r"\d+", raw)}))


def cpu_features(info: dict[str, dict[str, str]]) -> tuple[str, ...]:
    """The CPU backend's features that are on (value 1), in the order llama.cpp lists them."""
    return tuple(k for k, v in info.get("CPU", {}).items() if v == "1")
