"""Synthetic GGUF models: real architectures and shapes, random weights.

They let the planner and the runtime be tested on model shapes we cannot ship (an 8B dense model,
a 30B MoE) and give tests tiny models that llama.cpp loads and generates from in milliseconds.
Weights are random but well scaled (std ~ 1/sqrt(fan_in), norms = 1) so activations stay finite;
the text they produce is noise. A MoE's router spreads a prompt's tokens over its experts about
evenly, as a trained one's does (see ``MOE_ATTN_OUT_GAIN``).

Writing is streamed: the header goes through ``gguf.GGUFWriter``, then tensor data is appended one
tensor at a time from a few small pools of random blocks (reused at random offsets), so a 4.5 GB
model is written at disk speed with ~16 MiB per pool of memory.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType

ARCHITECTURES = ("llama", "qwen3moe", "qwen2moe", "qwen2vl")
_MOE_ARCHITECTURES = ("qwen3moe", "qwen2moe")
DTYPES = ("F32", "F16", "Q8_0", "Q4_0")

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")  # ids 0, 1, 2
BOS_TOKEN = "<|endoftext|>"
EOS_TOKEN = "<|im_end|>"
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_FILE_TYPES = {
    "F32": LlamaFileType.ALL_F32,
    "F16": LlamaFileType.MOSTLY_F16,
    "Q8_0": LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": LlamaFileType.MOSTLY_Q4_0,
}
_POOL_BYTES = 16 << 20  # per (type, scale) pool; large enough for big sequential writes
_MAX_MERGES = 600
# Upper bound of specials + byte tokens + merge results, so specs validate without training BPE.
MIN_VOCAB = len(SPECIAL_TOKENS) + 256 + _MAX_MERGES
_RMS_EPS = 1e-6

# RMS of the integer quants of a random block: Q4_0 nibbles q in [0, 16) stand for q - 8,
# Q8_0 bytes are int8. Dividing the target std by it gives the block scale.
_QUANT_RMS = {
    GGMLQuantizationType.Q4_0: float(np.sqrt(np.mean((np.arange(16) - 8.0) ** 2))),
    GGMLQuantizationType.Q8_0: float(np.sqrt(np.mean(np.arange(-128, 128, dtype=np.float64) ** 2))),
}


@dataclass(frozen=True)
class SyntheticSpec:
    """Shape of a synthetic model.

    ``arch`` "llama" is dense, or mixtral-style MoE when ``n_expert`` > 0 (experts then have width
    ``n_ff``, as llama.cpp's llama loader expects). "qwen3moe" and "qwen2moe" are MoE with experts
    of width ``expert_ff``; "qwen2moe" adds a shared expert of width ``shared_expert_ff``.
    "qwen2vl" is the dense language model of Qwen2-VL/Qwen2.5-VL: q/k/v biases and M-RoPE, whose
    four ``rope_sections`` (rotary pairs per position axis: time, height, width, unused) it needs.
    ``head_dim`` defaults to ``n_embd // n_head``.
    """

    arch: str
    n_layers: int
    n_embd: int
    n_head: int
    n_head_kv: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int = 4096
    dtype: str = "Q4_0"
    n_expert: int = 0
    n_expert_used: int = 0
    expert_ff: int = 0
    shared_expert_ff: int = 0
    head_dim: int | None = None
    rope_theta: float = 10000.0
    rope_sections: tuple[int, ...] = ()
    name: str = "synthetic"

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def d_head(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


def write_synthetic_gguf(
    path: str | Path,
    spec: SyntheticSpec | str,
    *,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
    data: bool = True,
) -> Path:
    """Write a synthetic model to ``path`` and return the path.

    ``spec`` is a SyntheticSpec or the name of a PRESET. The same spec and seed give a
    byte-identical file. ``progress`` is called with the fraction of tensor bytes written.
    The file appears at ``path`` only when complete (it is written to ``<path>.part`` first).
    ``data=False``: the header alone, the data a hole (see :func:`write_gguf`).
    """
    spec = _resolve(spec)

    def metadata(w: GGUFWriter) -> None:
        _add_hparams(w, spec)
        _add_tokenizer(w, spec.n_vocab)

    return write_gguf(path, spec.arch, _plan_tensors(spec), metadata, seed=seed, progress=progress,
                      data=data)


def write_gguf(
    path: str | Path,
    arch: str,
    plan: list[_Planned],
    metadata: Callable[[GGUFWriter], None],
    *,
    seed: int = 0,
    progress: Callable[[float], None] | None = None,
    data: bool = True,
) -> Path:
    """The streamed writer behind every synthetic file: ``metadata`` adds the key/values, ``plan``
    is the tensor list (written in order from the random pools).

    With ``data=False`` the tensor data is left as a hole (the file gets its full size, reads as
    zeros and takes no disk space where the file system supports sparse files): the header and
    inventory of a multi-GB model, for tests that only read headers.
    """
    path = Path(path)
    partial = path.with_name(path.name + ".part")
    try:
        alignment = _write_header(partial, arch, plan, metadata)
        if data:
            _write_data(partial, plan, alignment, np.random.default_rng(seed), progress)
        else:
            _leave_data_out(partial, plan, alignment)
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path


# --- spec ----------------------------------------------------------------------------------------


def _resolve(spec: SyntheticSpec | str) -> SyntheticSpec:
    if isinstance(spec, SyntheticSpec):
        return spec
    if spec not in PRESETS:
        raise ValueError(f"unknown preset {spec!r}; presets: {', '.join(sorted(PRESETS))}")
    return PRESETS[spec]


def _validate(spec: SyntheticSpec) -> None:
    problems = list(_spec_problems(spec))
    if problems:
        raise ValueError(f"invalid SyntheticSpec {spec.name!r}: " + "; ".join(problems))


def _spec_problems(s: SyntheticSpec) -> Iterable[str]:
    if s.arch not in ARCHITECTURES:
        yield f"arch must be one of {ARCHITECTURES}"
    if s.dtype not in DTYPES:
        yield f"dtype must be one of {DTYPES}"
    if min(s.n_layers, s.n_embd, s.n_head, s.n_head_kv, s.n_vocab) <= 0:
        yield "n_layers, n_embd, n_head, n_head_kv and n_vocab must be > 0"
        return
    if s.n_head % s.n_head_kv:
        yield "n_head must be a multiple of n_head_kv"
    moe = s.arch in _MOE_ARCHITECTURES or s.n_expert > 0
    if moe and not 0 < s.n_expert_used <= s.n_expert:
        yield "MoE needs 0 < n_expert_used <= n_expert"
    if s.arch in _MOE_ARCHITECTURES and s.expert_ff <= 0:
        yield f"{s.arch} needs expert_ff > 0"
    if s.arch == "qwen2vl":
        yield from _qwen2vl_problems(s)
    elif s.rope_sections:
        yield "rope_sections belong to qwen2vl (M-RoPE)"
    if s.arch == "llama" and s.n_ff <= 0:
        yield "llama needs n_ff > 0 (the dense width, or the expert width when n_expert > 0)"
    if s.arch == "qwen2moe" and s.shared_expert_ff <= 0:
        yield "qwen2moe needs shared_expert_ff > 0"
    if s.arch == "qwen2moe" and s.head_dim not in (None, s.n_embd // s.n_head):
        yield "qwen2moe's loader fixes head_dim to n_embd // n_head"
    if s.head_dim is None and s.n_embd % s.n_head:
        yield "n_embd must be a multiple of n_head (or give head_dim)"
    if s.n_vocab < MIN_VOCAB:
        yield f"n_vocab must be >= {MIN_VOCAB} to hold the tokenizer"
    block = GGML_QUANT_SIZES[GGMLQuantizationType[s.dtype]][0] if s.dtype in DTYPES else 1
    widths = (s.n_embd, s.n_ff, s.expert_ff, s.shared_expert_ff, s.d_head * s.n_head)
    if any(w % block for w in widths):
        yield f"{s.dtype} needs n_embd, n_ff, expert_ff, shared_expert_ff, q width % {block} == 0"


def _qwen2vl_problems(s: SyntheticSpec) -> Iterable[str]:
    if s.n_expert or s.n_ff <= 0:
        yield "qwen2vl is dense: n_expert = 0 and n_ff > 0"
    if s.head_dim not in (None, s.n_embd // s.n_head):
        yield "qwen2vl's loader fixes head_dim to n_embd // n_head"
    # llama.cpp reads exactly four sections; the rotary pairs they cover fit in half a head
    if len(s.rope_sections) != 4 or min(s.rope_sections) < 0:
        yield "qwen2vl needs four rope_sections >= 0"
    elif not 0 < sum(s.rope_sections) <= s.d_head // 2:
        yield "qwen2vl's rope_sections must sum to 1..head_dim/2 rotary pairs"


# After the validation helpers: building a spec validates it.
PRESETS: dict[str, SyntheticSpec] = {
    "tiny-llama": SyntheticSpec(
        "llama", n_layers=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_vocab=2048,
        n_ctx_train=2048, name="tiny-llama",
    ),
    "tiny-mixtral": SyntheticSpec(
        "llama", n_layers=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=256, n_vocab=2048,
        n_ctx_train=2048, n_expert=4, n_expert_used=2, name="tiny-mixtral",
    ),
    "tiny-qwen3moe": SyntheticSpec(
        "qwen3moe", n_layers=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_vocab=2048,
        n_ctx_train=2048, n_expert=4, n_expert_used=2, expert_ff=256, head_dim=128,
        rope_theta=1e6, name="tiny-qwen3moe",
    ),
    "tiny-qwen2moe": SyntheticSpec(
        "qwen2moe", n_layers=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=768, n_vocab=2048,
        n_ctx_train=2048, n_expert=4, n_expert_used=2, expert_ff=128, shared_expert_ff=512,
        rope_theta=1e6, name="tiny-qwen2moe",
    ),
    # Meta-Llama-3-8B: 32 layers, 4096 wide, GQA 32/8, ffn 14336, 128256 tokens.
    "llama3-8b": SyntheticSpec(
        "llama", n_layers=32, n_embd=4096, n_head=32, n_head_kv=8, n_ff=14336, n_vocab=128256,
        n_ctx_train=8192, rope_theta=500000.0, name="llama3-8b",
    ),
    # nvidia/Mistral-NeMo-Minitron-8B-Base (model card: 4096 wide, 32 heads, MLP 11520,
    # 40 layers; Mistral-NeMo's 8 KV heads of 128 and 131072-token Tekken vocabulary).
    "minitron-8b": SyntheticSpec(
        "llama", n_layers=40, n_embd=4096, n_head=32, n_head_kv=8, n_ff=11520, n_vocab=131072,
        n_ctx_train=8192, dtype="F16", head_dim=128, rope_theta=1e6, name="minitron-8b",
    ),
    # Qwen3-30B-A3B: 48 layers, 2048 wide, 32 query heads of 128 (q is 4096 wide), 4 KV heads,
    # 128 experts of 768, 8 used; intermediate_size 6144 is unused by the MoE layers.
    "qwen3-30b-a3b": SyntheticSpec(
        "qwen3moe", n_layers=48, n_embd=2048, n_head=32, n_head_kv=4, n_ff=6144,
        n_vocab=151936, n_ctx_train=40960, n_expert=128, n_expert_used=8, expert_ff=768,
        head_dim=128, rope_theta=1e6, name="qwen3-30b-a3b",
    ),
}  # fmt: skip


# --- tensor plan ---------------------------------------------------------------------------------


# Random queries and keys attend about evenly, so a random attention block adds the context's
# mean value to every token's residual stream: layer after layer that shared part outgrows what
# is the token's own, and a router reading it sends every token to the same experts (Qwen3-30B-A3B's
# shape at 48 layers: a median of 32 of 128 experts over a 1K-token prompt, 7.2 of a token's 8
# shared with the token before; benchmarks/moe_routing.py). llama.cpp streams only the experts a
# batch uses, so such a model prefills several times faster than a trained MoE, whose load-balanced
# router uses them all. A tenth of the attention output keeps each token's own part ahead: all
# 128 experts at every layer, 0.47 shared with the token before (0.5 for independent picks).
MOE_ATTN_OUT_GAIN = 0.1


@dataclass(frozen=True)
class _Planned:
    name: str
    shape: tuple[int, ...]  # ggml order: shape[0] is the row length (fan-in)
    qtype: GGMLQuantizationType
    fill: str  # "random" (std gain/sqrt(fan-in)), "ones" or "zeros"
    fan_in: int | None = None  # when it is not shape[0] (a conv kernel: kw * kh * channels)
    gain: float = 1.0

    @property
    def n_bytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        return int(np.prod(self.shape)) * size // block

    @property
    def std(self) -> float:
        return self.gain / float(np.sqrt(self.fan_in or self.shape[0]))


def _plan_tensors(s: SyntheticSpec) -> list[_Planned]:
    wtype = GGMLQuantizationType[s.dtype]
    plan = [_Planned("token_embd.weight", (s.n_embd, s.n_vocab), wtype, "random")]
    for i in range(s.n_layers):
        plan += _layer_plan(s, i, wtype)
    plan += [
        _Planned("output_norm.weight", (s.n_embd,), GGMLQuantizationType.F32, "ones"),
        _Planned("output.weight", (s.n_embd, s.n_vocab), wtype, "random"),
    ]
    return plan


def _layer_plan(s: SyntheticSpec, i: int, wtype: GGMLQuantizationType) -> list[_Planned]:
    f32 = GGMLQuantizationType.F32
    q_width, kv_width = s.d_head * s.n_head, s.d_head * s.n_head_kv
    p = f"blk.{i}."
    out = [
        _Planned(p + "attn_norm.weight", (s.n_embd,), f32, "ones"),
        _Planned(p + "attn_q.weight", (s.n_embd, q_width), wtype, "random"),
        _Planned(p + "attn_k.weight", (s.n_embd, kv_width), wtype, "random"),
        _Planned(p + "attn_v.weight", (s.n_embd, kv_width), wtype, "random"),
        _Planned(p + "attn_output.weight", (q_width, s.n_embd), wtype, "random",
                 gain=MOE_ATTN_OUT_GAIN if s.n_expert else 1.0),
    ]
    if s.arch == "qwen3moe":
        out += [
            _Planned(p + "attn_q_norm.weight", (s.d_head,), f32, "ones"),
            _Planned(p + "attn_k_norm.weight", (s.d_head,), f32, "ones"),
        ]
    if s.arch in ("qwen2moe", "qwen2vl"):  # Qwen1.5/2-MoE and Qwen2-VL carry q/k/v biases
        out += [
            _Planned(p + "attn_q.bias", (q_width,), f32, "zeros"),
            _Planned(p + "attn_k.bias", (kv_width,), f32, "zeros"),
            _Planned(p + "attn_v.bias", (kv_width,), f32, "zeros"),
        ]
    out.append(_Planned(p + "ffn_norm.weight", (s.n_embd,), f32, "ones"))
    return out + _ffn_plan(s, p, wtype)


def _ffn_plan(s: SyntheticSpec, p: str, wtype: GGMLQuantizationType) -> list[_Planned]:
    f32 = GGMLQuantizationType.F32
    if s.arch not in _MOE_ARCHITECTURES and s.n_expert == 0:
        return [
            _Planned(p + "ffn_gate.weight", (s.n_embd, s.n_ff), wtype, "random"),
            _Planned(p + "ffn_up.weight", (s.n_embd, s.n_ff), wtype, "random"),
            _Planned(p + "ffn_down.weight", (s.n_ff, s.n_embd), wtype, "random"),
        ]
    eff = s.n_ff if s.arch == "llama" else s.expert_ff
    # llama.cpp never quantizes the router (llama-quant.cpp skips ffn_gate_inp), so neither do we.
    out = [
        _Planned(p + "ffn_gate_inp.weight", (s.n_embd, s.n_expert), f32, "random"),
        _Planned(p + "ffn_gate_exps.weight", (s.n_embd, eff, s.n_expert), wtype, "random"),
        _Planned(p + "ffn_up_exps.weight", (s.n_embd, eff, s.n_expert), wtype, "random"),
        _Planned(p + "ffn_down_exps.weight", (eff, s.n_embd, s.n_expert), wtype, "random"),
    ]
    if s.arch == "qwen2moe":
        sff = s.shared_expert_ff
        out += [
            _Planned(p + "ffn_gate_inp_shexp.weight", (s.n_embd,), f32, "random"),
            _Planned(p + "ffn_gate_shexp.weight", (s.n_embd, sff), wtype, "random"),
            _Planned(p + "ffn_up_shexp.weight", (s.n_embd, sff), wtype, "random"),
            _Planned(p + "ffn_down_shexp.weight", (sff, s.n_embd), wtype, "random"),
        ]
    return out


# --- header --------------------------------------------------------------------------------------


def _write_header(
    path: Path, arch: str, plan: list[_Planned], metadata: Callable[[GGUFWriter], None]
) -> int:
    writer = GGUFWriter(path, arch)
    metadata(writer)
    for t in plan:
        # With raw_dtype set, GGUFWriter only looks at the numpy dtype to decide whether the
        # shape is in bytes (uint8); any other dtype keeps our logical shape.
        np_dtype = np.dtype(np.float16 if t.qtype == GGMLQuantizationType.F16 else np.float32)
        writer.add_tensor_info(t.name, t.shape[::-1], np_dtype, t.n_bytes, raw_dtype=t.qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    return writer.data_alignment


def _add_hparams(w: GGUFWriter, s: SyntheticSpec) -> None:
    w.add_name(s.name)
    w.add_file_type(_FILE_TYPES[s.dtype])
    if s.dtype.startswith("Q"):
        w.add_quantization_version(2)
    w.add_vocab_size(s.n_vocab)
    w.add_context_length(s.n_ctx_train)
    w.add_embedding_length(s.n_embd)
    w.add_block_count(s.n_layers)
    if s.n_ff:
        w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_key_length(s.d_head)
    w.add_value_length(s.d_head)
    w.add_rope_dimension_count(s.d_head)  # llama's loader rejects n_rot != head_dim
    w.add_rope_freq_base(s.rope_theta)
    w.add_layer_norm_rms_eps(_RMS_EPS)
    if s.n_expert:
        w.add_expert_count(s.n_expert)
        w.add_expert_used_count(s.n_expert_used)
    if s.arch in _MOE_ARCHITECTURES:
        w.add_expert_feed_forward_length(s.expert_ff)
    if s.arch == "qwen2moe":
        w.add_expert_shared_feed_forward_length(s.shared_expert_ff)
    if s.rope_sections:
        w.add_rope_dimension_sections(list(s.rope_sections))


def _add_tokenizer(w: GGUFWriter, n_vocab: int, extra_control: Sequence[str] = ()) -> None:
    """The byte-level BPE vocabulary; ``extra_control`` tokens (a VLM's image markers) take the
    last ids, as Qwen's added tokens do, so every other id stays what it is without them."""
    tokens, merges = _vocabulary(n_vocab)
    control = len(SPECIAL_TOKENS)
    if extra_control:
        if n_vocab - len(extra_control) < MIN_VOCAB:
            raise ValueError(f"n_vocab must be >= {MIN_VOCAB + len(extra_control)} to hold them")
        tokens[n_vocab - len(extra_control):] = extra_control
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("gpt-2")  # the classic GPT-2 split regex; our merges assume it
    w.add_token_list(tokens)
    types = [int(TokenType.CONTROL)] * control + [int(TokenType.NORMAL)] * (n_vocab - control)
    types[n_vocab - len(extra_control):n_vocab] = [int(TokenType.CONTROL)] * len(extra_control)
    w.add_token_types(types)
    w.add_token_merges([f"{a} {b}" for a, b in merges])
    w.add_bos_token_id(SPECIAL_TOKENS.index(BOS_TOKEN))
    w.add_eos_token_id(SPECIAL_TOKENS.index(EOS_TOKEN))
    w.add_eot_token_id(SPECIAL_TOKENS.index(EOS_TOKEN))
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)


# --- tokenizer -----------------------------------------------------------------------------------

_WORDS = (
    "the of and to in is was for that on with as by at it from hello world you he his be this are "
    "or an had not but what all were when we there can one your which their said if do will each "
    "about how up out them then she many some so these would other into has more her two like him "
    "see time could no make than first been its who now people my made over did down only way "
    "find use may water long little very after words called just where most know get through back "
    "much before go good new write our used me man too any day same right look think also around "
    "another came come work three word must because does part even place well such here take why "
    "help put different away again off went old number great tell men say small every found still "
    "between name should home big give air line set own under read last never us left end along "
    "while might next sound below saw something thought both few those always looked show large "
    "often together asked house going want school important until form food keep children "
    "feet land side without boy once animal life enough took sometimes four head above kind began "
    "almost live page got earth need far hand high year mother light country father let night "
    "picture being study second soon story since white ever paper hard near sentence better best "
    "across during today however sure knew try told young sun thing whole hear example heard "
    "several change answer room sea against top turned learn point city play toward five himself "
    "usually money seen car morning yes thanks please sorry friend player game quest sword shield "
    "dragon village king queen castle forest gold magic enemy battle level health attack defend "
    "item map inventory travel merchant guard door key"
).split()


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (byte-level BPE alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    mapping = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in mapping:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


@functools.cache
def _trained_merges() -> tuple[tuple[str, str], ...]:
    """A few hundred BPE merges learnt from common English words (Zipf-weighted).

    Plain BPE training, with pair counts updated only for the words a merge touches (a full
    recount per merge takes ~1 s; this takes a fraction of that).
    """
    words, weights = _corpus()
    counts: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = {}
    for i in range(len(words)):
        _count_pairs(words[i], weights[i], i, counts, where)
    merges: list[tuple[str, str]] = []
    while len(merges) < _MAX_MERGES and counts:
        best = max(counts.items(), key=lambda item: (item[1], item[0]))[0]  # ties: by text
        merges.append(best)
        for i in where.pop(best):
            _count_pairs(words[i], -weights[i], i, counts, where)
            words[i] = _apply_merge(words[i], best)
            _count_pairs(words[i], weights[i], i, counts, where)
    return tuple(merges)


def _corpus() -> tuple[list[tuple[str, ...]], list[int]]:
    space = _bytes_to_unicode()[ord(" ")]
    variants = (
        (space, str.lower, 10),
        ("", str.lower, 3),
        (space, str.title, 2),
        ("", str.title, 2),
    )
    corpus: Counter[tuple[str, ...]] = Counter()
    for rank, word in enumerate(_WORDS):
        for prefix, case, share in variants:
            corpus[tuple(prefix + case(word))] += share * 100_000 // (rank + 10)  # integer: exact
    return list(corpus), list(corpus.values())


def _count_pairs(
    word: tuple[str, ...],
    weight: int,
    index: int,
    counts: Counter[tuple[str, str]],
    where: dict[tuple[str, str], set[int]],
) -> None:
    for pair in itertools.pairwise(word):
        counts[pair] += weight
        if counts[pair] <= 0:
            del counts[pair]
        if weight > 0:
            where.setdefault(pair, set()).add(index)


def _apply_merge(word: tuple[str, ...], pair: tuple[str, str]) -> tuple[str, ...]:
    out: list[str] = []
    i = 0
    while i < len(word):
        if i + 1 < len(word) and (word[i], word[i + 1]) == pair:
            out.append(word[i] + word[i + 1])
            i += 2
        else:
            out.append(word[i])
            i += 1
    return tuple(out)


def _base_tokens() -> list[str]:
    byte_chars = _bytes_to_unicode()
    merged = [a + b for a, b in _trained_merges()]
    return [*SPECIAL_TOKENS, *(byte_chars[b] for b in range(256)), *dict.fromkeys(merged)]


def _vocabulary(n_vocab: int) -> tuple[list[str], tuple[tuple[str, str], ...]]:
    """Tokens (specials, 256 bytes, merge results, fillers up to n_vocab) and the merges."""
    tokens = _base_tokens()
    seen = set(tokens)
    fillers = _pseudo_words()
    while len(tokens) < n_vocab:
        # NORMAL tokens no merge produces: they pad the vocabulary and make a random model's
        # output read as made-up words (" bako rumi") rather than markup.
        word = next(fillers)
        if word not in seen:
            seen.add(word)
            tokens.append(word)
    return tokens, _trained_merges()


def _pseudo_words() -> Iterator[str]:
    space = _bytes_to_unicode()[ord(" ")]
    syllables = [c + v for c in "bdfghjklmnprstvwz" for v in "aeiou"]
    for n in itertools.count(2):
        for combo in itertools.product(syllables, repeat=n):
            yield space + "".join(combo)


# --- tensor data ---------------------------------------------------------------------------------


class _NoisePools:
    """Pools of valid random tensor data, one per (type, std), reused at random offsets.

    Writing speed must not depend on the values, so each tensor is a window into a pool (wrapped
    around as needed) instead of freshly drawn numbers.
    """

    def __init__(self, rng: np.random.Generator, pool_bytes: int) -> None:
        self.rng = rng
        self.pool_bytes = pool_bytes
        self.pools: dict[tuple[GGMLQuantizationType, float], memoryview] = {}

    def get(self, qtype: GGMLQuantizationType, std: float) -> memoryview:
        key = (qtype, std)
        if key not in self.pools:
            self.pools[key] = memoryview(self._make(qtype, std).tobytes())
        return self.pools[key]

    def _make(self, qtype: GGMLQuantizationType, std: float) -> np.ndarray:
        size = GGML_QUANT_SIZES[qtype][1]
        n_blocks = max(1, self.pool_bytes // size)
        if qtype in (GGMLQuantizationType.F32, GGMLQuantizationType.F16):
            dtype = np.float32 if qtype == GGMLQuantizationType.F32 else np.float16
            return (self.rng.standard_normal(n_blocks, dtype=np.float32) * std).astype(dtype)
        blocks = self.rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
        # Random-sign f16 scales: Q4_0 quants are biased (-8..7), the signs cancel that bias.
        signs = self.rng.choice(np.array([-1.0, 1.0], dtype=np.float32), size=n_blocks)
        scales = (signs * (std / _QUANT_RMS[qtype])).astype(np.float16)
        blocks[:, :2] = scales.view(np.uint8).reshape(n_blocks, 2)
        return blocks

    def write(self, f: BinaryIO, t: _Planned) -> None:
        pool = self.get(t.qtype, t.std)
        granule = GGML_QUANT_SIZES[t.qtype][1]
        pos = int(self.rng.integers(0, len(pool) // granule)) * granule
        remaining = t.n_bytes
        while remaining:
            chunk = min(remaining, len(pool) - pos)
            f.write(pool[pos : pos + chunk])
            remaining -= chunk
            pos = 0


def _write_data(
    path: Path,
    plan: list[_Planned],
    alignment: int,
    rng: np.random.Generator,
    progress: Callable[[float], None] | None,
) -> None:
    total = sum(t.n_bytes for t in plan) or 1
    largest = max(t.n_bytes for t in plan if t.fill == "random")
    pools = _NoisePools(rng, min(_POOL_BYTES, largest))
    done = 0
    with path.open("r+b") as f:
        f.seek(0, os.SEEK_END)
        _pad(f, alignment)
        for t in plan:
            _write_tensor(f, t, pools)
            _pad(f, alignment)  # GGUFWriter laid out offsets with each tensor padded like this
            done += t.n_bytes
            if progress is not None:
                progress(done / total)


def _leave_data_out(path: Path, plan: list[_Planned], alignment: int) -> None:
    with path.open("r+b") as f:
        f.seek(0, os.SEEK_END)
        end = f.tell() + (-f.tell() % alignment)
        f.truncate(end + sum(t.n_bytes + (-t.n_bytes % alignment) for t in plan))


def _write_tensor(f: BinaryIO, t: _Planned, pools: _NoisePools) -> None:
    if t.fill == "random":
        pools.write(f, t)
        return
    assert t.qtype == GGMLQuantizationType.F32, "constant tensors are small F32 vectors"
    value = 1.0 if t.fill == "ones" else 0.0
    f.write(np.full(int(np.prod(t.shape)), value, dtype=np.float32).tobytes())


def _pad(f: BinaryIO, alignment: int) -> None:
    f.write(b"\0" * (-f.tell() % alignment))


def spec_with(name: str, **changes: Any) -> SyntheticSpec:
    """A PRESET with some fields changed, e.g. ``spec_with("tiny-llama", dtype="F16")``."""
    return replace(_resolve(name), **changes)
