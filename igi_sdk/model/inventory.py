"""Tensor inventory of a GGUF model, read from its metadata alone.

The planner needs to know, before anything is loaded, how many bytes each tensor takes, which
layer it belongs to and what role it plays (attention, dense FFN, routed experts, ...), plus the
architecture facts that size the KV cache. All of that is in the GGUF header, so this module parses
the header (key/values and tensor infos) and never touches weight data.

Why not ``gguf.GGUFReader``: it builds a numpy view for every element of every metadata array, so
the tokenizer arrays alone take ~3 s for SmolLM2-135M (49k tokens + 49k merges) and ~10 s for a
150k-token vocabulary. The header format is small and stable (GGUF v2/v3), so a direct parse is
used; the ``gguf`` package still supplies the enums and ``GGML_QUANT_SIZES``.
"""

from __future__ import annotations

import mmap
import re
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from igi_sdk.errors import (
    ModelError,
    ModelFileNotFoundError,
    NotAGGUFError,
    TruncatedModelError,
    UnsupportedArchitectureError,
)

GROUPS = (
    "attn",
    "attn_norm",
    "ffn_dense",
    "ffn_shexp",
    "ffn_router",
    "ffn_exps",
    "output",
    "token_embd",
    "norm",
    "other",
)

# Text-generating architectures of the llama.cpp vendored in llama-cpp-python 0.3.36
# (LLM_ARCH_NAMES in src/llama-arch.cpp). Left out on purpose: the "clip" dummy, encoder-only and
# embedding models (bert family, eurobert, t5encoder, gemma-embedding, llama-embed), audio models
# (wavtokenizer-dec, qwen3tts, pockettts) and speculative-decoding heads (eagle3, dflash,
# gemma4-assistant), none of which can drive a chat session on their own.
SUPPORTED_ARCHITECTURES = frozenset({
    "llama", "llama4", "deci", "falcon", "grok", "gpt2", "gptj", "gptneox", "mpt", "baichuan",
    "starcoder", "refact", "bloom", "stablelm", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3",
    "qwen3moe", "qwen3next", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp", "phi2",
    "phi3", "phimoe", "plamo", "plamo2", "plamo3", "codeshell", "orion", "internlm2", "minicpm",
    "minicpm3", "gemma", "gemma2", "gemma3", "gemma3n", "gemma4", "starcoder2", "mamba", "mamba2",
    "maple", "jamba", "falcon-h1", "xverse", "command-r", "cohere2", "cohere2moe", "dbrx", "olmo",
    "olmo2", "olmoe", "muse-glimmer", "openelm", "arctic", "deepseek", "deepseek2",
    "deepseek2-ocr", "deepseek32", "deepseek4", "chatglm", "glm4", "glm4moe", "glm-dsa", "bitnet",
    "t5", "jais", "jais2", "nemotron", "nemotron_h", "nemotron_h_moe", "exaone", "exaone4",
    "exaone-moe", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7", "granite", "granitemoe",
    "granitehybrid", "graniteswitch", "granite_swa", "chameleon", "plm", "bailingmoe",
    "bailingmoe2", "bailingmoe3", "dots1", "dots3note", "arcee", "afmoe", "laguna", "ernie4_5",
    "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "hunyuan_vl", "hy_v3", "hy_v4", "smollm3",
    "gpt-oss", "lfm2", "lfm2moe", "dream", "smallthinker", "llada", "llada-moe", "seed_oss",
    "grovemoe", "apertus", "minimax-01", "hrm_text", "minimax-m2", "minimax-m3", "cogvlm", "rnd1",
    "pangu-embedded", "mistral3", "mistral4", "paddleocr", "mimo2", "step35", "spark2_5",
    "maincoder", "kimi-linear", "kimi-k3", "glm5-next", "talkie", "mellum", "nanbeige",
})  # fmt: skip

# Interleaved sliding-window layout when the file has no `<arch>.attention.sliding_window_pattern`:
# (n_pattern, dense_first) as passed to load_swa_pattern() in src/models/<arch>.cpp. With
# dense_first=False layer i is SWA when i % n < n - 1 (gemma3: 5 local then 1 global); with
# dense_first=True it is SWA when i % n != 0.
_SWA_DEFAULT_PATTERN: dict[str, tuple[int, bool]] = {
    "gemma2": (2, False), "gemma3": (6, False), "gemma3n": (5, False), "cohere2": (4, False),
    "cohere2moe": (4, True), "gpt-oss": (2, False), "exaone4": (4, False),
    "exaone-moe": (4, False), "olmo2": (4, False), "afmoe": (4, False), "mellum": (4, False),
    "muse-glimmer": (4, False), "plamo3": (8, False), "smallthinker": (4, True),
    "laguna": (4, True),
}  # fmt: skip

# KV cache element types llama.cpp accepts for type_k / type_v.
_KV_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")

_GGUF_MAGIC = b"GGUF"
_DEFAULT_ALIGNMENT = 32
_MAX_DIMS = 4  # GGML_MAX_DIMS
_DECODE_LIMIT = 4096  # longer metadata arrays (vocabularies) are only counted, not decoded
_SPLIT_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")
_LEGACY_EXPERT_RE = re.compile(r"^ffn_(gate|up|down)\.\d+$")  # blk.N.ffn_up.E.weight (old mixtral)
_EXPERT_RE = re.compile(r"^ffn_(gate|up|down|gate_up)_(exps|chexps)$")

_SCALAR_FORMATS: dict[int, str] = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}  # fmt: skip


@dataclass(frozen=True)
class ArraySummary:
    """Stands in the metadata for an array too long to decode (e.g. the token list)."""

    item_type: str
    length: int


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file. ``shape`` is in ggml order: ``shape[0]`` is the row length."""

    name: str
    ggml_type: str
    shape: tuple[int, ...]
    n_elements: int
    n_bytes: int
    layer: int | None
    group: str


@dataclass(frozen=True)
class ArchInfo:
    """Architecture facts from the metadata (with llama.cpp's defaults where a key is absent).

    ``n_ff`` is the dense FFN width and is 0 when the model has no dense FFN tensors (MoE-only),
    even if the file carries a ``feed_forward_length``. Per-layer fields (``swa_layers``,
    ``n_head_kv_layers``) have one entry per layer.
    """

    architecture: str
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim_k: int
    head_dim_v: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    n_expert: int
    n_expert_used: int
    expert_ff: int
    n_expert_shared: int
    sliding_window: int
    shared_expert_ff: int = 0
    head_dim_k_swa: int = 0
    head_dim_v_swa: int = 0
    swa_layers: tuple[bool, ...] = ()
    n_head_kv_layers: tuple[int, ...] = ()

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    def is_swa(self, layer: int) -> bool:
        return self.sliding_window > 0 and layer < len(self.swa_layers) and self.swa_layers[layer]

    def kv_heads(self, layer: int) -> int:
        if layer < len(self.n_head_kv_layers):
            return self.n_head_kv_layers[layer]
        return self.n_head_kv

    def kv_row_elements(self, layer: int) -> tuple[int, int]:
        """(K, V) elements one token adds to the cache of ``layer`` (as llama.cpp sizes them)."""
        swa = self.is_swa(layer)
        head_k = self.head_dim_k_swa if swa and self.head_dim_k_swa else self.head_dim_k
        head_v = self.head_dim_v_swa if swa and self.head_dim_v_swa else self.head_dim_v
        heads = self.kv_heads(layer)
        return head_k * heads, head_v * heads


@dataclass(frozen=True)
class ModelInventory:
    """Every tensor of a GGUF model with its size and role, plus the architecture facts."""

    path: Path
    arch: ArchInfo
    tensors: tuple[TensorInfo, ...]
    file_size: int
    name: str
    data_offset: int = 0
    alignment: int = _DEFAULT_ALIGNMENT
    metadata: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    def total_bytes(self) -> int:
        return sum(t.n_bytes for t in self.tensors)

    def bytes_by_group(self) -> dict[str, int]:
        """Bytes per group; every name of GROUPS is present (0 when unused)."""
        out = dict.fromkeys(GROUPS, 0)
        for t in self.tensors:
            out[t.group] += t.n_bytes
        return out

    def bytes_by_layer(self) -> dict[int, dict[str, int]]:
        """layer -> group -> bytes, for the groups present in each layer (globals excluded)."""
        out: dict[int, dict[str, int]] = {}
        for t in self.tensors:
            if t.layer is not None:
                per = out.setdefault(t.layer, {})
                per[t.group] = per.get(t.group, 0) + t.n_bytes
        return dict(sorted(out.items()))

    def tensor(self, name: str) -> TensorInfo:
        for t in self.tensors:
            if t.name == name:
                return t
        raise KeyError(f"no tensor named {name!r} in {self.path}")

    def layer_tensors(self, layer: int) -> tuple[TensorInfo, ...]:
        return self._by_layer().get(layer, ())

    def _by_layer(self) -> dict[int | None, tuple[TensorInfo, ...]]:
        """Tensors grouped by layer, built once: the planner asks per layer ~100 000 times a
        plan, and a scan of every tensor each time was a fifth of its time."""
        cached = self.__dict__.get("_layers")
        if cached is None:
            groups: dict[int | None, list[TensorInfo]] = {}
            for t in self.tensors:
                groups.setdefault(t.layer, []).append(t)
            cached = {k: tuple(v) for k, v in groups.items()}
            object.__setattr__(self, "_layers", cached)  # frozen: the cache is not a field
        return cached

    def kv_bytes_per_token_per_layer(
        self, type_k: str = "f16", type_v: str = "f16", layer: int | None = None
    ) -> int:
        """KV bytes one token adds to one layer; ``layer=None`` gives the largest over layers."""
        layers = range(self.arch.n_layers) if layer is None else (layer,)
        return max((self._kv_token_bytes(i, type_k, type_v) for i in layers), default=0)

    def kv_bytes(
        self,
        n_ctx: int,
        type_k: str = "f16",
        type_v: str = "f16",
        *,
        swa_full: bool = False,
        n_ubatch: int = 0,
    ) -> int:
        """KV cache bytes for ``n_ctx`` cells over all layers.

        Sliding-window layers hold ``min(n_ctx, sliding_window)`` cells. llama.cpp really keeps
        ``pad256(min(n_ctx, sliding_window + n_ubatch))`` cells there: pass ``n_ubatch`` to get
        that exact figure. Pass ``swa_full=True`` when the context is created with ``swa_full``
        (llama.cpp's *default*), which gives SWA layers a full-size cache. Assumes one sequence
        and standard (GQA/MQA) attention caches; for MLA, recurrent or hybrid architectures the
        head counts in the metadata make this an estimate, not llama.cpp's exact allocation.
        """
        if n_ctx < 0:
            raise ValueError(f"n_ctx must be >= 0, got {n_ctx}")
        total = 0
        for layer in range(self.arch.n_layers):
            cells = self._kv_cells(layer, n_ctx, swa_full=swa_full, n_ubatch=n_ubatch)
            total += cells * self._kv_token_bytes(layer, type_k, type_v)
        return total

    def _kv_cells(self, layer: int, n_ctx: int, *, swa_full: bool, n_ubatch: int) -> int:
        if swa_full or not self.arch.is_swa(layer):
            return n_ctx
        if n_ubatch <= 0:
            return min(n_ctx, self.arch.sliding_window)
        cells = min(n_ctx, self.arch.sliding_window + n_ubatch)
        return -(-cells // 256) * 256  # llama.cpp pads the SWA cache to 256 cells

    def _kv_token_bytes(self, layer: int, type_k: str, type_v: str) -> int:
        k_elems, v_elems = self.arch.kv_row_elements(layer)
        return _row_bytes(type_k, k_elems) + _row_bytes(type_v, v_elems)


# --- public helpers ------------------------------------------------------------------------------


def kv_type_bytes(type_name: str) -> float:
    """Bytes per element of a KV cache type (``q8_0`` is 34 bytes per 32 elements = 1.0625)."""
    block, size = GGML_QUANT_SIZES[_kv_type(type_name)]
    return size / block


def classify(name: str) -> tuple[int | None, str]:
    """(layer, group) of a tensor name; see GROUPS. Global tensors have layer None."""
    match = _LAYER_RE.match(name)
    if match is None:
        return None, _classify_global(name)
    return int(match.group(1)), _classify_layer(match.group(2))


def read_inventory(path: str | Path) -> ModelInventory:
    """Read the tensor inventory of a GGUF file (all shards of a split model) from its header."""
    path = Path(path).expanduser()
    header = _read_header(path)
    arch_name = _architecture(path, header.kv)
    shards = [header, *(_read_header(p) for p in _other_shards(path, header.kv))]
    tensors = tuple(_tensor_info(n, t, dims) for h in shards for n, t, dims, _ in h.tensors)
    arch = _arch_info(path, arch_name, header.kv, tensors)
    return ModelInventory(
        path=path,
        arch=arch,
        tensors=tensors,
        file_size=sum(h.file_size for h in shards),
        name=str(header.kv.get("general.name") or path.stem),
        data_offset=header.data_offset,
        alignment=header.alignment,
        metadata=header.kv,
    )


# --- classification ------------------------------------------------------------------------------


def _classify_global(name: str) -> str:
    base = name.split(".", 1)[0]
    if base == "token_embd":
        return "token_embd"
    if base == "output":
        return "output"
    if "norm" in name or base.startswith("rope_"):
        return "norm"
    return "other"


def _classify_layer(rest: str) -> str:
    if _LEGACY_EXPERT_RE.match(rest.rsplit(".", 1)[0]):
        return "ffn_exps"
    base = rest.split(".", 1)[0]
    if "_shexp" in base:  # before the router check: ffn_gate_inp_shexp is the shared gate
        return "ffn_shexp"
    if base in ("ffn_gate_inp", "exp_probs_b", "exp_probs_b_vl"):
        return "ffn_router"
    if _EXPERT_RE.match(base):
        return "ffn_exps"
    if "norm" in base:
        return "attn_norm"
    if base.startswith("attn_"):
        return "attn"
    if base in ("ffn_gate", "ffn_up", "ffn_down", "ffn_gate_up"):
        return "ffn_dense"
    return "other"


# --- header parsing ------------------------------------------------------------------------------


class _TruncatedError(Exception):
    """A read ran past the end of the file."""


@dataclass
class _Header:
    kv: dict[str, Any]
    tensors: list[tuple[str, int, tuple[int, ...], int]]  # name, ggml type, dims, offset
    data_offset: int
    alignment: int
    file_size: int


class _Cursor:
    """Sequential little-endian reads from a buffer; raises _TruncatedError at the end."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def unpack(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise _TruncatedError
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def skip(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise _TruncatedError
        self.pos += n

    def string(self) -> str:
        n = self.unpack("<Q")
        start = self.pos
        self.skip(n)
        return bytes(self.buf[start : self.pos]).decode("utf-8", errors="replace")

    def value(self, vtype: int) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            return self.array()
        fmt = _SCALAR_FORMATS.get(vtype)
        if fmt is None:
            raise ModelError(f"unknown GGUF value type {vtype}")
        return self.unpack(fmt)

    def array(self) -> Any:
        item_type = self.unpack("<I")
        length = self.unpack("<Q")
        if length > _DECODE_LIMIT:
            self._skip_items(item_type, length)
            return ArraySummary(_type_name(item_type), length)
        return tuple(self.value(item_type) for _ in range(length))

    def _skip_items(self, item_type: int, length: int) -> None:
        fmt = _SCALAR_FORMATS.get(item_type)
        if fmt is not None:
            self.skip(struct.calcsize(fmt) * length)
            return
        for _ in range(length):  # strings (or nested arrays) have to be walked one by one
            if item_type == GGUFValueType.STRING:
                self.skip(self.unpack("<Q"))
            else:
                self.value(item_type)


def _type_name(vtype: int) -> str:
    try:
        return GGUFValueType(vtype).name
    except ValueError:
        return str(vtype)


def _read_header(path: Path) -> _Header:
    try:
        with path.open("rb") as f:
            size = path.stat().st_size
            if size < len(_GGUF_MAGIC):
                raise NotAGGUFError(
                    f"{path} is not a GGUF model (the file has only {size} bytes). "
                    "Pass the path of a .gguf file."
                )
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
                return _parse(path, buf, size)
    except FileNotFoundError:
        raise ModelFileNotFoundError(
            f"model file {path} does not exist. Check the path, or pass --model PATH."
        ) from None
    except IsADirectoryError:
        raise ModelFileNotFoundError(
            f"{path} is a directory, not a model file. Pass the path of the .gguf file itself."
        ) from None
    except PermissionError:
        raise ModelError(f"cannot read {path}: permission denied. Fix its permissions.") from None


def _parse(path: Path, buf: mmap.mmap, size: int) -> _Header:
    if buf[:4] != _GGUF_MAGIC:
        raise NotAGGUFError(
            f"{path} is not a GGUF model (it does not start with the GGUF magic). "
            "Convert the model with llama.cpp's convert_hf_to_gguf.py, or pass a .gguf file."
        )
    cur = _Cursor(buf)
    cur.skip(4)
    try:
        _check_version(path, cur.unpack("<I"))
        n_tensors, n_kv = cur.unpack("<Q"), cur.unpack("<Q")
        kv = {cur.string(): cur.value(cur.unpack("<I")) for _ in range(n_kv)}
        tensors = [_tensor_record(path, cur) for _ in range(n_tensors)]
    except _TruncatedError:
        raise _truncated(path, "its header is cut short") from None
    alignment = kv.get("general.alignment", _DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
        raise ModelError(f"{path} is corrupt: general.alignment is {alignment!r}.")
    data_offset = -(-cur.pos // alignment) * alignment
    header = _Header(kv, tensors, data_offset, alignment, size)
    _check_data_fits(path, header)
    return header


def _check_version(path: Path, version: int) -> None:
    if version in (2, 3):
        return
    detail = "big-endian" if version & 0xFFFF == 0 else f"version {version}"
    raise NotAGGUFError(
        f"{path} is a GGUF file in an unsupported format ({detail}; only little-endian v2/v3 "
        "are read). Re-convert it with a current llama.cpp."
    )


def _tensor_record(path: Path, cur: _Cursor) -> tuple[str, int, tuple[int, ...], int]:
    name = cur.string()
    n_dims = cur.unpack("<I")
    if n_dims > _MAX_DIMS:
        raise ModelError(f"{path} is corrupt: tensor {name!r} claims {n_dims} dimensions.")
    dims = tuple(cur.unpack("<Q") for _ in range(n_dims))
    return name, cur.unpack("<I"), dims, cur.unpack("<Q")


def _check_data_fits(path: Path, header: _Header) -> None:
    for name, ggml_type, dims, offset in header.tensors:
        end = header.data_offset + offset + _n_bytes(path, name, ggml_type, dims)
        if end > header.file_size:
            raise _truncated(
                path,
                f"tensor {name!r} ends at byte {end} but the file has {header.file_size} bytes",
            )


def _truncated(path: Path, detail: str) -> TruncatedModelError:
    return TruncatedModelError(
        f"{path} is truncated ({detail}). The download or copy was probably interrupted: "
        "download the file again."
    )


def _n_bytes(path: Path, name: str, ggml_type: int, dims: tuple[int, ...]) -> int:
    qtype = _quant_type(path, name, ggml_type)
    block, size = GGML_QUANT_SIZES[qtype]
    return _product(dims) * size // block


def _quant_type(path: Path, name: str, ggml_type: int) -> GGMLQuantizationType:
    try:
        return GGMLQuantizationType(ggml_type)
    except ValueError:
        raise ModelError(
            f"{path}: tensor {name!r} uses ggml type {ggml_type}, unknown to the installed `gguf` "
            "package. Upgrade it (pip install -U gguf)."
        ) from None


def _product(dims: tuple[int, ...]) -> int:
    n = 1
    for d in dims:
        n *= d
    return n


def _tensor_info(name: str, ggml_type: int, dims: tuple[int, ...]) -> TensorInfo:
    qtype = GGMLQuantizationType(ggml_type)  # validated by _check_data_fits
    block, size = GGML_QUANT_SIZES[qtype]
    n_elements = _product(dims)
    layer, group = classify(name)
    return TensorInfo(name, qtype.name, dims, n_elements, n_elements * size // block, layer, group)


def _other_shards(path: Path, kv: Mapping[str, Any]) -> Iterator[Path]:
    """The remaining files of a split model (llama.cpp's `<prefix>-0000N-of-0000M.gguf`)."""
    count = int(kv.get("split.count", 1) or 1)
    match = _SPLIT_RE.match(path.name)
    if count <= 1 or match is None or int(match.group("no")) != 1:
        return
    for i in range(2, count + 1):
        yield path.with_name(f"{match.group('prefix')}-{i:05d}-of-{count:05d}.gguf")


# --- architecture facts --------------------------------------------------------------------------


def _architecture(path: Path, kv: Mapping[str, Any]) -> str:
    arch = kv.get("general.architecture")
    if not isinstance(arch, str) or not arch:
        raise UnsupportedArchitectureError(
            f"{path} has no general.architecture metadata, so llama.cpp cannot load it. "
            "Re-convert the model with llama.cpp's convert_hf_to_gguf.py."
        )
    if arch not in SUPPORTED_ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"{path} has architecture {arch!r}, which is not a text-generation architecture "
            "known to the bundled llama.cpp. Use a chat model in a supported architecture "
            "(llama, qwen2/3, qwen3moe, gemma3, phi3, ...)."
        )
    if f"{arch}.block_count" not in kv:
        raise UnsupportedArchitectureError(
            f"{path} lacks {arch}.block_count, so its architecture metadata is incomplete. "
            "Re-convert the model with a current llama.cpp."
        )
    return arch


def _max_int(value: Any, default: int = 0) -> int:
    """Scalar metadata, or the largest entry of a per-layer array."""
    if isinstance(value, tuple):
        return max((int(v) for v in value), default=default)
    if isinstance(value, (int, float)):
        return int(value)
    return default


def _per_layer(value: Any, n_layers: int, default: int) -> tuple[int, ...]:
    if isinstance(value, tuple) and len(value) == n_layers:
        return tuple(int(v) for v in value)
    return (_max_int(value, default),) * n_layers


def _arch_info(
    path: Path, arch: str, kv: Mapping[str, Any], tensors: tuple[TensorInfo, ...]
) -> ArchInfo:
    def get(key: str) -> Any:
        return kv.get(f"{arch}.{key}")

    n_layers = _max_int(get("block_count"))
    n_embd = _max_int(get("embedding_length"))
    n_head = _max_int(get("attention.head_count"))
    kv_layers = _per_layer(get("attention.head_count_kv"), n_layers, n_head)
    head_k = _max_int(get("attention.key_length"), n_embd // n_head if n_head else 0)
    head_v = _max_int(get("attention.value_length"), n_embd // n_head if n_head else 0)
    window = _max_int(get("attention.sliding_window"))
    return ArchInfo(
        architecture=arch,
        n_layers=n_layers,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=max(kv_layers, default=n_head),
        head_dim_k=head_k,
        head_dim_v=head_v,
        n_ff=_dense_ff(get("feed_forward_length"), tensors),
        n_vocab=_n_vocab(kv, get("vocab_size"), tensors),
        n_ctx_train=_max_int(get("context_length")),
        n_expert=_max_int(get("expert_count")),
        n_expert_used=_max_int(get("expert_used_count")),
        expert_ff=_expert_ff(get, tensors),
        n_expert_shared=_n_shared(get("expert_shared_count"), tensors),
        sliding_window=window,
        shared_expert_ff=_shared_ff(get("expert_shared_feed_forward_length"), tensors),
        head_dim_k_swa=_max_int(get("attention.key_length_swa"), head_k),
        head_dim_v_swa=_max_int(get("attention.value_length_swa"), head_v),
        swa_layers=_swa_layers(arch, get("attention.sliding_window_pattern"), n_layers, window),
        n_head_kv_layers=kv_layers,
    )


def _first_dim(tensors: tuple[TensorInfo, ...], bases: tuple[str, ...], axis: int) -> int:
    for t in tensors:
        if t.layer is not None and t.name.split(".")[2] in bases and len(t.shape) > axis:
            return t.shape[axis]
    return 0


def _dense_ff(value: Any, tensors: tuple[TensorInfo, ...]) -> int:
    if not any(t.group == "ffn_dense" for t in tensors):
        return 0  # MoE-only: feed_forward_length, if any, is not a dense width
    return _max_int(value) or _first_dim(tensors, ("ffn_up", "ffn_gate"), 1)


def _expert_ff(get: Any, tensors: tuple[TensorInfo, ...]) -> int:
    if not any(t.group == "ffn_exps" for t in tensors):
        return 0
    # mixtral-style llama files carry no expert_feed_forward_length: the tensor shape tells.
    return (
        _max_int(get("expert_feed_forward_length"))
        or _first_dim(tensors, ("ffn_up_exps", "ffn_gate_exps", "ffn_down_exps"), 1)
        or _max_int(get("feed_forward_length"))
    )


def _shared_ff(value: Any, tensors: tuple[TensorInfo, ...]) -> int:
    if not any(t.group == "ffn_shexp" for t in tensors):
        return 0
    return _max_int(value) or _first_dim(tensors, ("ffn_up_shexp", "ffn_gate_shexp"), 1)


def _n_shared(value: Any, tensors: tuple[TensorInfo, ...]) -> int:
    if value is not None:
        return _max_int(value)
    # qwen2moe has one shared expert but no expert_shared_count key.
    return 1 if any(t.group == "ffn_shexp" and len(t.shape) >= 2 for t in tensors) else 0


def _n_vocab(kv: Mapping[str, Any], value: Any, tensors: tuple[TensorInfo, ...]) -> int:
    if value is not None:
        return _max_int(value)
    tokens = kv.get("tokenizer.ggml.tokens")
    if isinstance(tokens, ArraySummary):
        return tokens.length
    if isinstance(tokens, tuple):
        return len(tokens)
    embd = next((t for t in tensors if t.name == "token_embd.weight"), None)
    return embd.shape[1] if embd is not None and len(embd.shape) > 1 else 0


def _swa_layers(arch: str, pattern: Any, n_layers: int, window: int) -> tuple[bool, ...]:
    """Which layers use the sliding window, following llama.cpp's load_swa_pattern()."""
    if window <= 0:
        return (False,) * n_layers
    if isinstance(pattern, tuple) and len(pattern) == n_layers:
        return tuple(bool(v) for v in pattern)
    default = _SWA_DEFAULT_PATTERN.get(arch)
    if default is None:
        return (False,) * n_layers  # unknown layout: count every layer as full (upper bound)
    n_pattern, dense_first = default
    if isinstance(pattern, int):
        n_pattern = pattern
    return tuple(_is_swa(i, n_pattern, dense_first) for i in range(n_layers))


def _is_swa(layer: int, n_pattern: int, dense_first: bool) -> bool:
    if n_pattern == 0:
        return True
    if dense_first:
        return layer % n_pattern != 0
    return layer % n_pattern < n_pattern - 1


def _kv_type(type_name: str) -> GGMLQuantizationType:
    name = type_name.lower()
    if name not in _KV_TYPES:
        raise ValueError(
            f"unsupported KV cache type {type_name!r}; use one of {', '.join(_KV_TYPES)}"
        )
    return GGMLQuantizationType[name.upper()]


def _row_bytes(type_name: str, n_elements: int) -> int:
    block, size = GGML_QUANT_SIZES[_kv_type(type_name)]
    if n_elements % block:
        raise ValueError(
            f"KV type {type_name} needs rows that are a multiple of {block} elements; this "
            f"model's rows have {n_elements}. Use f16 or q8_0 with a compatible model."
        )
    return n_elements // block * size
