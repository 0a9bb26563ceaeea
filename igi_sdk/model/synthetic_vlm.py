"""Synthetic Qwen2.5-VL pairs: a language model and its vision projector (mmproj), random weights.

llama.cpp runs a VLM as two GGUFs: the language model (architecture ``qwen2vl``, M-RoPE) and an
mmproj file (architecture ``clip``) that its mtmd library loads beside it. The mmproj here has
exactly what ``tools/mtmd/clip.cpp`` reads for projector ``qwen2.5vl_merger``, named and shaped
as ``convert_hf_to_gguf.py`` writes them from a Qwen2.5-VL checkpoint:

* ``v.patch_embd.weight`` and ``v.patch_embd.weight.1``: the two time slices of the Conv3D patch
  embedding, as two Conv2D kernels (ggml shape ``[patch, patch, 3, n_embd]``, no bias);
* per block ``v.blk.N.{ln1, ln2}.weight`` (RMS norms), ``attn_{q,k,v,out}`` and
  ``ffn_{gate,up,down}`` with weights and biases (SiLU-gated MLP);
* ``v.post_ln.weight`` (the merger's RMS norm) and the merger MLP ``mm.0`` (4·n_embd → 4·n_embd)
  and ``mm.2`` (4·n_embd → the language model's width), both with biases.

Window attention is ``clip.vision.n_wa_pattern``: the converter turns ``fullatt_block_indexes``
(7, 15, 23, 31) into a period (8) and llama.cpp makes block ``i`` global when ``(i + 1) % 8 == 0``.
Writing reuses ``synthetic``'s streamed writer, random pools and tokenizer.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from gguf import GGMLQuantizationType, GGUFType, GGUFWriter, LlamaFileType

from igi_sdk.model.synthetic import (
    MIN_VOCAB,
    SyntheticSpec,
    _add_hparams,
    _add_tokenizer,
    _plan_tensors,
    _Planned,
    write_gguf,
)

PROJECTOR_TYPE = "qwen2.5vl_merger"
# Qwen2-VL's added tokens that llama.cpp's mtmd writes around (and inside) an image's embeddings
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")
# OpenAI CLIP's normalisation, which Qwen2.5-VL's preprocessor_config.json uses
IMAGE_MEAN = (0.48145466, 0.4578275, 0.40821073)
IMAGE_STD = (0.26862954, 0.26130258, 0.27577711)
SPATIAL_MERGE = 2  # llama.cpp's qwen2vl graph merges 2x2 patches, whatever the metadata says
VISION_DTYPES = ("F32", "F16")
_VISION_EPS = 1e-6
_FILE_TYPES = {"F32": LlamaFileType.ALL_F32, "F16": LlamaFileType.MOSTLY_F16}


@dataclass(frozen=True)
class VisionSpec:
    """Shape of a Qwen2.5-VL vision tower and merger.

    ``fullatt_block_indexes`` are the blocks with global attention (the rest attend within
    windows); they must be evenly spaced, ending a period each, as the converter requires.
    ``image_size`` is metadata only (the converter's default); Qwen2.5-VL takes any size.
    """

    n_layers: int
    n_embd: int
    n_head: int
    n_ff: int
    fullatt_block_indexes: tuple[int, ...]
    patch_size: int = 14
    image_size: int = 560
    dtype: str = "F16"

    def __post_init__(self) -> None:
        problems = list(_vision_problems(self))
        if problems:
            raise ValueError("invalid VisionSpec: " + "; ".join(problems))

    @property
    def n_wa_pattern(self) -> int:
        return self.fullatt_block_indexes[0] + 1

    @property
    def merged_width(self) -> int:
        return self.n_embd * SPATIAL_MERGE * SPATIAL_MERGE


@dataclass(frozen=True)
class SyntheticVLMSpec:
    """A language model (``text``, arch qwen2vl) and the vision tower that feeds it."""

    name: str
    text: SyntheticSpec
    vision: VisionSpec

    def __post_init__(self) -> None:
        if self.text.arch != "qwen2vl":
            raise ValueError(f"invalid SyntheticVLMSpec {self.name!r}: text.arch must be qwen2vl")
        if self.text.n_vocab < MIN_VOCAB + len(VISION_TOKENS):
            raise ValueError(f"invalid SyntheticVLMSpec {self.name!r}: n_vocab must be >= "
                             f"{MIN_VOCAB + len(VISION_TOKENS)} to hold the image tokens")


def _vision_problems(v: VisionSpec) -> Iterable[str]:
    if min(v.n_layers, v.n_embd, v.n_head, v.n_ff, v.patch_size, v.image_size) <= 0:
        yield "n_layers, n_embd, n_head, n_ff, patch_size and image_size must be > 0"
        return
    if v.dtype not in VISION_DTYPES:
        yield f"dtype must be one of {VISION_DTYPES} (the real mmproj files are F16)"
    if v.n_embd % v.n_head or (v.n_embd // v.n_head) % 4:
        # M-RoPE in the vision tower splits each head into four equal sections
        yield "n_embd must be n_head * a multiple of 4"
    if v.n_ff == v.n_embd:
        # clip.cpp takes an ffn_down whose rows are n_embd long for an old, swapped export
        yield "n_ff must differ from n_embd (clip.cpp would swap ffn_up and ffn_down)"
    idx = v.fullatt_block_indexes
    period = idx[0] + 1 if idx else 0
    if not idx or any(b - a != period for a, b in itertools.pairwise(idx)):
        yield "fullatt_block_indexes must be evenly spaced: p-1, 2p-1, ..."
    elif idx[-1] >= v.n_layers:
        yield "fullatt_block_indexes must be < n_layers"


def _text(name: str, **kw: object) -> SyntheticSpec:
    return SyntheticSpec("qwen2vl", name=name, **kw)  # type: ignore[arg-type]


VLM_PRESETS: dict[str, SyntheticVLMSpec] = {
    # Encodes a 64x64 image in milliseconds on one core: 4 vision blocks of 64, windows every 2.
    "tiny": SyntheticVLMSpec(
        "tiny-qwen2.5-vl",
        _text("tiny-qwen2.5-vl", n_layers=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=768,
              n_vocab=2048, n_ctx_train=4096, rope_theta=1e6, rope_sections=(8, 12, 12, 0)),
        VisionSpec(n_layers=4, n_embd=64, n_head=4, n_ff=160, fullatt_block_indexes=(1, 3),
                   dtype="F32"),
    ),
    # Qwen2.5-VL-7B-Instruct (config.json): text 28 layers, 3584 wide, 28/4 heads of 128,
    # FFN 18944, 152064 tokens, mrope_section [16, 24, 24]; vision depth 32, hidden 1280,
    # 16 heads, intermediate 3420, patch 14, spatial merge 2, window 112,
    # fullatt_block_indexes [7, 15, 23, 31], out_hidden_size 3584.
    "qwen2.5-vl-7b": SyntheticVLMSpec(
        "qwen2.5-vl-7b",
        _text("qwen2.5-vl-7b", n_layers=28, n_embd=3584, n_head=28, n_head_kv=4, n_ff=18944,
              n_vocab=152064, n_ctx_train=128000, rope_theta=1e6, rope_sections=(16, 24, 24, 0)),
        VisionSpec(n_layers=32, n_embd=1280, n_head=16, n_ff=3420,
                   fullatt_block_indexes=(7, 15, 23, 31)),
    ),
}  # fmt: skip


@dataclass(frozen=True)
class VLMFiles:
    model: Path
    mmproj: Path


def write_synthetic_vlm(
    directory: str | Path,
    spec: SyntheticVLMSpec | str,
    *,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
    data: bool = True,
) -> VLMFiles:
    """Write ``<name>.gguf`` and ``mmproj-<name>.gguf`` into ``directory`` (created if needed).

    ``spec`` is a SyntheticVLMSpec or the name of a VLM_PRESET; the same spec and seed give
    byte-identical files. ``progress`` gets the fraction of both files' tensor bytes written.
    ``data=False`` writes headers only, leaving the tensor data as a hole (see ``write_gguf``).
    """
    spec = _resolve(spec)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    text_plan, vision_plan = _plan_tensors(spec.text), plan_vision(spec)
    text_bytes = sum(t.n_bytes for t in text_plan)
    total = text_bytes + sum(t.n_bytes for t in vision_plan) or 1

    def part(offset: int, size: int) -> Callable[[float], None] | None:
        if progress is None:
            return None
        report = progress
        return lambda f: report((offset + f * size) / total)

    model = write_gguf(
        directory / f"{spec.name}.gguf", "qwen2vl", text_plan, lambda w: _text_metadata(w, spec),
        seed=seed, progress=part(0, text_bytes), data=data,
    )
    mmproj = write_gguf(
        directory / f"mmproj-{spec.name}.gguf", "clip", vision_plan,
        lambda w: _vision_metadata(w, spec), seed=seed + 1,
        progress=part(text_bytes, total - text_bytes), data=data,
    )
    return VLMFiles(model, mmproj)


def _resolve(spec: SyntheticVLMSpec | str) -> SyntheticVLMSpec:
    if isinstance(spec, SyntheticVLMSpec):
        return spec
    if spec not in VLM_PRESETS:
        raise ValueError(f"unknown VLM preset {spec!r}; presets: {', '.join(sorted(VLM_PRESETS))}")
    return VLM_PRESETS[spec]


# --- language model ------------------------------------------------------------------------------


def _text_metadata(w: GGUFWriter, spec: SyntheticVLMSpec) -> None:
    _add_hparams(w, spec.text)
    _add_tokenizer(w, spec.text.n_vocab, VISION_TOKENS)


# --- vision tower --------------------------------------------------------------------------------


def plan_vision(spec: SyntheticVLMSpec | str) -> list[_Planned]:
    """The mmproj's tensors, in file order (ggml shapes: shape[0] is the fan-in)."""
    spec = _resolve(spec)
    v, f32 = spec.vision, GGMLQuantizationType.F32
    wtype = GGMLQuantizationType[v.dtype]
    kernel = (v.patch_size, v.patch_size, 3, v.n_embd)
    fan_in = v.patch_size * v.patch_size * 3
    # ggml's conv_2d kernels are F16 or F32; the converter keeps them F16 in an F16 file
    plan = [
        _Planned("v.patch_embd.weight", kernel, wtype, "random", fan_in),
        _Planned("v.patch_embd.weight.1", kernel, wtype, "random", fan_in),
    ]
    for i in range(v.n_layers):
        plan += _vision_block(v, i, wtype)
    merged, out = v.merged_width, spec.text.n_embd
    return [
        *plan,
        _Planned("v.post_ln.weight", (v.n_embd,), f32, "ones"),
        _Planned("mm.0.weight", (merged, merged), wtype, "random"),
        _Planned("mm.0.bias", (merged,), f32, "zeros"),
        _Planned("mm.2.weight", (merged, out), wtype, "random"),
        _Planned("mm.2.bias", (out,), f32, "zeros"),
    ]


def _vision_block(v: VisionSpec, i: int, wtype: GGMLQuantizationType) -> list[_Planned]:
    f32, p, d = GGMLQuantizationType.F32, f"v.blk.{i}.", v.n_embd

    def linear(name: str, fan_in: int, width: int) -> list[_Planned]:
        return [
            _Planned(f"{p}{name}.weight", (fan_in, width), wtype, "random"),
            _Planned(f"{p}{name}.bias", (width,), f32, "zeros"),
        ]

    return [
        _Planned(p + "ln1.weight", (d,), f32, "ones"),
        *linear("attn_q", d, d),
        *linear("attn_k", d, d),
        *linear("attn_v", d, d),
        *linear("attn_out", d, d),
        _Planned(p + "ln2.weight", (d,), f32, "ones"),
        *linear("ffn_gate", d, v.n_ff),
        *linear("ffn_up", d, v.n_ff),
        *linear("ffn_down", v.n_ff, d),
    ]


def _vision_metadata(w: GGUFWriter, spec: SyntheticVLMSpec) -> None:
    """The keys convert_hf_to_gguf.py writes for a Qwen2.5-VL mmproj (clip-impl.h names them)."""
    v = spec.vision
    w.add_type(GGUFType.MMPROJ)
    w.add_name(f"{spec.name} (vision)")
    w.add_file_type(_FILE_TYPES[v.dtype])
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(PROJECTOR_TYPE)
    w.add_vision_projection_dim(spec.text.n_embd)
    w.add_vision_image_size(v.image_size)
    w.add_vision_patch_size(v.patch_size)
    w.add_vision_embedding_length(v.n_embd)
    w.add_vision_feed_forward_length(v.n_ff)
    w.add_vision_block_count(v.n_layers)
    w.add_vision_head_count(v.n_head)
    w.add_vision_image_mean(list(IMAGE_MEAN))
    w.add_vision_image_std(list(IMAGE_STD))
    w.add_vision_use_silu(True)
    w.add_vision_n_wa_pattern(v.n_wa_pattern)
    w.add_vision_attention_layernorm_eps(_VISION_EPS)
