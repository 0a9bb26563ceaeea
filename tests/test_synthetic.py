"""Synthetic GGUF writer: shapes and types round-trip, determinism, and real llama.cpp loading."""

from __future__ import annotations

import llama_cpp  # before numpy/gguf: with the CUDA build, numpy first crashes model loading

# isort: split
import ctypes
import hashlib
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.quants import dequantize

from igi_sdk.model import (
    PRESETS,
    SyntheticSpec,
    read_inventory,
    spec_with,
    write_synthetic_gguf,
)
from igi_sdk.model.synthetic import (
    CHATML_TEMPLATE,
    MIN_VOCAB,
    SPECIAL_TOKENS,
    _plan_tensors,
)

TINY = ("tiny-llama", "tiny-mixtral", "tiny-qwen3moe", "tiny-qwen2moe")


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# --- round trip ----------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", ["F32", "F16", "Q8_0", "Q4_0"])
def test_round_trip_shapes_and_types(tmp_path: Path, dtype: str) -> None:
    spec = spec_with("tiny-qwen2moe", dtype=dtype)
    inv = read_inventory(write_synthetic_gguf(tmp_path / "m.gguf", spec))
    a = inv.arch
    assert (a.architecture, a.n_layers, a.n_embd, a.n_head, a.n_head_kv) == (
        spec.arch, spec.n_layers, spec.n_embd, spec.n_head, spec.n_head_kv,
    )  # fmt: skip
    assert (a.n_vocab, a.n_ctx_train, a.n_expert, a.n_expert_used) == (
        spec.n_vocab, spec.n_ctx_train, spec.n_expert, spec.n_expert_used,
    )  # fmt: skip
    assert (a.expert_ff, a.shared_expert_ff, a.head_dim_k) == (128, 512, 64)
    block, size = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[dtype]]
    for t in inv.tensors:
        # Matrices take the model's dtype; vectors and the router stay F32 like llama.cpp's.
        keep_f32 = len(t.shape) == 1 or t.group == "ffn_router"
        assert t.ggml_type == ("F32" if keep_f32 else dtype), t.name
        if not keep_f32:
            assert t.n_bytes == t.n_elements // block * size
    assert inv.tensor("blk.1.ffn_up_exps.weight").shape == (256, 128, 4)
    assert inv.tensor("blk.1.ffn_down_shexp.weight").shape == (512, 256)
    assert inv.tensor("token_embd.weight").shape == (256, spec.n_vocab)
    planned = {t.name: (t.shape, t.n_bytes) for t in _plan_tensors(spec)}
    assert {t.name: (t.shape, t.n_bytes) for t in inv.tensors} == planned


def test_deterministic_per_seed(tmp_path: Path) -> None:
    a = write_synthetic_gguf(tmp_path / "a.gguf", "tiny-qwen3moe", seed=7)
    b = write_synthetic_gguf(tmp_path / "b.gguf", "tiny-qwen3moe", seed=7)
    c = write_synthetic_gguf(tmp_path / "c.gguf", "tiny-qwen3moe", seed=8)
    assert _sha(a) == _sha(b)
    assert _sha(a) != _sha(c)
    assert a.stat().st_size == c.stat().st_size
    assert not list(tmp_path.glob("*.part"))


def test_progress_reaches_one(tmp_path: Path) -> None:
    seen: list[float] = []
    write_synthetic_gguf(tmp_path / "m.gguf", "tiny-llama", progress=seen.append)
    assert seen == sorted(seen)
    assert seen[-1] == pytest.approx(1.0)
    assert len(seen) == len(_plan_tensors(PRESETS["tiny-llama"]))


@pytest.mark.parametrize("dtype", ["F16", "Q8_0", "Q4_0"])
def test_weights_are_well_scaled(tmp_path: Path, dtype: str) -> None:
    path = write_synthetic_gguf(tmp_path / "m.gguf", spec_with("tiny-llama", dtype=dtype))
    tensors = {t.name: t for t in gguf.GGUFReader(path).tensors}
    for name, fan_in in (("blk.0.attn_q.weight", 256), ("blk.1.ffn_down.weight", 768)):
        t = tensors[name]
        values = dequantize(t.data, t.tensor_type).astype(np.float64)
        assert np.isfinite(values).all()
        assert values.std() == pytest.approx(1 / np.sqrt(fan_in), rel=0.1), name
        assert abs(values.mean()) < 0.05 / np.sqrt(fan_in), name  # random-sign scales: no bias
    assert (np.asarray(tensors["blk.0.attn_norm.weight"].data) == 1.0).all()


def test_presets_have_real_shapes() -> None:
    def gb(name: str) -> float:
        return sum(t.n_bytes for t in _plan_tensors(PRESETS[name])) / 1e9

    assert gb("llama3-8b") == pytest.approx(4.52, abs=0.01)  # 8.03 B params at 4.5 bits
    assert gb("minitron-8b") == pytest.approx(16.83, abs=0.01)  # 8.41 B params at 16 bits
    assert gb("qwen3-30b-a3b") == pytest.approx(17.2, abs=0.05)  # 30.5 B params at 4.5 bits
    q3 = {t.name: t.shape for t in _plan_tensors(PRESETS["qwen3-30b-a3b"])}
    assert q3["blk.47.attn_q.weight"] == (2048, 4096)
    assert q3["blk.0.ffn_gate_exps.weight"] == (2048, 768, 128)
    for name in ("tiny-llama", "tiny-qwen3moe", "tiny-qwen2moe"):
        assert 0.5 < gb(name) * 1000 < 3.0  # tiny presets: ~1-3 MB


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"arch": "gpt2"}, "arch must be one of"),
        ({"dtype": "Q5_K"}, "dtype must be one of"),
        ({"n_head_kv": 3}, "multiple of n_head_kv"),
        ({"n_vocab": MIN_VOCAB - 1}, "n_vocab must be"),
        ({"n_ff": 100}, "% 32"),
        ({"n_expert_used": 5}, "n_expert_used"),
        ({"head_dim": 32}, "qwen2moe's loader"),
        ({"shared_expert_ff": 0}, "shared_expert_ff > 0"),
    ],
)
def test_invalid_specs(changes: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        spec_with("tiny-qwen2moe", **changes)


def test_unknown_preset(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tiny-llama"):
        write_synthetic_gguf(tmp_path / "m.gguf", "no-such-preset")
    assert not list(tmp_path.iterdir())


def test_spec_defaults() -> None:
    spec = SyntheticSpec("llama", n_layers=1, n_embd=64, n_head=2, n_head_kv=1, n_ff=64,
                         n_vocab=MIN_VOCAB)  # fmt: skip
    assert (spec.dtype, spec.n_ctx_train, spec.d_head) == ("Q4_0", 4096, 32)


# --- llama.cpp -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    models = {name: write_synthetic_gguf(root / f"{name}.gguf", name) for name in TINY}
    for dtype in ("F32", "F16", "Q8_0"):
        spec = spec_with("tiny-llama", dtype=dtype)
        models[f"tiny-llama-{dtype}"] = write_synthetic_gguf(root / f"llama-{dtype}.gguf", spec)
    return models


def _load(path: Path) -> llama_cpp.Llama:
    return llama_cpp.Llama(str(path), n_ctx=256, n_threads=2, verbose=False, logits_all=True)


def _apply_chatml(model: llama_cpp.llama_model_p) -> str:
    template = llama_cpp.llama_model_chat_template(model, None)
    messages = (llama_cpp.llama_chat_message * 1)(llama_cpp.llama_chat_message(b"user", b"Hi"))
    buf = ctypes.create_string_buffer(256)
    n = llama_cpp.llama_chat_apply_template(template, messages, 1, True, buf, len(buf))
    assert 0 < n <= len(buf), "llama.cpp did not recognise the chat template"
    return buf.raw[:n].decode()


@pytest.mark.parametrize(
    "name", [*TINY, "tiny-llama-F32", "tiny-llama-F16", "tiny-llama-Q8_0"]
)  # fmt: skip
def test_llama_cpp_loads_and_generates(tiny_models: dict[str, Path], name: str) -> None:
    llm = _load(tiny_models[name])
    try:
        tokens = llm.tokenize(b"Hello world", add_bos=False)
        assert len(tokens) == 2  # "Hello", " world": the merges cover common words
        assert llm.detokenize(tokens) == b"Hello world"
        llm.eval(tokens)
        logits = np.asarray(llm.scores[llm.n_tokens - 1])
        assert np.isfinite(logits).all() and 0.1 < logits.std() < 10  # activations stay sane
        out = llm("The player", max_tokens=4, temperature=0.8, seed=1)
        assert out["usage"]["completion_tokens"] >= 1
    finally:
        llm.close()


def test_llama_cpp_sees_tokenizer_and_chat_template(tiny_models: dict[str, Path]) -> None:
    llm = _load(tiny_models["tiny-llama"])
    try:
        vocab = llama_cpp.llama_model_get_vocab(llm.model)
        im_end = SPECIAL_TOKENS.index("<|im_end|>")
        assert llm.token_eos() == im_end
        assert llm.token_bos() == SPECIAL_TOKENS.index("<|endoftext|>")
        assert llama_cpp.llama_vocab_is_eog(vocab, im_end)
        for token_id in range(len(SPECIAL_TOKENS)):
            attr = llama_cpp.llama_vocab_get_attr(vocab, token_id)
            assert attr & llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
        assert llm.n_vocab() == 2048
        chat = b"<|im_start|>user\nhello<|im_end|>"
        ids = llm.tokenize(chat, add_bos=False, special=True)
        assert ids[0] == 1 and ids[-1] == im_end
        assert llm.detokenize(ids, special=True) == chat
        assert llama_cpp.llama_model_chat_template(llm.model, None) == CHATML_TEMPLATE.encode()
        assert _apply_chatml(llm.model) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    finally:
        llm.close()
