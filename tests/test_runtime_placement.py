"""A Plan applied to real llama.cpp, with each tensor's buffer read back from llama.cpp itself."""

from __future__ import annotations

import re

import pytest

from igi_sdk.model import read_inventory
from igi_sdk.planner import Plan
from igi_sdk.runtime import Engine, EngineConfig, list_devices
from igi_sdk.runtime.overrides import name_patterns

CFG = EngineConfig(n_ctx=256, max_sessions=2, n_threads=2)


def test_devices_include_the_cpu() -> None:
    devs = list_devices()
    cpu = [d for d in devs if d.kind == "cpu"]
    assert cpu, devs
    assert cpu[0].buffer_type == "CPU"


def test_name_patterns_match_exactly_the_given_names(tiny_moe) -> None:
    inv = read_inventory(tiny_moe)
    chosen = [t.name for t in inv.tensors if t.group in ("attn", "ffn_router") or t.layer == 1]
    pats = [re.compile(p) for p in name_patterns(chosen)]
    matched = {t.name for t in inv.tensors if any(p.search(t.name) for p in pats)}
    assert matched == set(chosen)
    assert len(pats) < len(chosen)  # compacted by layer


@pytest.mark.parametrize("make_plan", [
    lambda inv: Plan.all_cpu(),
    lambda inv: Plan.attention_on_gpu(inv),
    lambda inv: Plan.all_gpu(inv),
])
def test_every_tensor_is_placed_where_the_plan_says(tiny_moe, make_plan) -> None:
    inv = read_inventory(tiny_moe)
    plan = make_plan(inv)
    with Engine(tiny_moe, plan, CFG) as eng:
        placed = eng.placement()
        has_gpu = eng.gpu is not None
        # read back from llama.cpp's own load log: every tensor of the file is accounted for
        assert set(placed) == {t.name for t in inv.tensors}
        for t in inv.tensors:
            expected = plan.role_of(t.name) if has_gpu else "cpu"
            assert placed[t.name] == expected, t.name
        mem = eng.memory()
        # llama.cpp's model buffers hold every weight byte (MiB-rounded in its log)
        reported = mem["cpu"]["weights"] + mem["gpu"]["weights"]
        assert abs(reported - inv.total_bytes()) <= 0.02 * inv.total_bytes() + 2**20 * 3
        assert mem["cpu"]["kv"] + mem["gpu"]["kv"] > 0
        if not has_gpu:
            assert mem["gpu"] == {"weights": 0, "kv": 0, "compute": 0}


def test_host_weights_mmap_or_loaded(tiny_llama) -> None:
    """mmap keeps weights in page-cache mappings; pinned/none copies them into a host buffer."""
    with Engine(tiny_llama, Plan(name="mmap", pinned_host=False, gpu_layers=0), CFG) as eng:
        mapped = set(eng.report.model_buffers)
    with Engine(tiny_llama, Plan(name="load", pinned_host=True, gpu_layers=0), CFG) as eng:
        loaded = set(eng.report.model_buffers)
    assert "CPU_Mapped" in mapped
    assert "CPU_Mapped" not in loaded and loaded


def test_plan_json_round_trip(tiny_llama, tmp_path) -> None:
    inv = read_inventory(tiny_llama)
    plan = Plan.attention_on_gpu(inv)
    path = tmp_path / "plan.json"
    plan.save(path)
    assert Plan.load(path) == plan


def test_host_weights_are_mapped_when_the_ram_cannot_lock_them(tiny_llama, monkeypatch) -> None:
    """Page-locked memory cannot be swapped out: a pinned plan whose host weights the RAM
    available now cannot hold (with the headroom kept free) loads them mapped instead, the
    same placement under the same name, and the model still answers."""
    from igi_sdk.planner import PIN_RAM_HEADROOM, pinned_host_bytes
    from igi_sdk.runtime import placement

    inv = read_inventory(tiny_llama)
    plan = Plan(name="load", pinned_host=True, gpu_layers=0)
    need = pinned_host_bytes(plan, inv)
    assert need == inv.total_bytes()
    monkeypatch.setattr(placement, "available_ram", lambda: need + PIN_RAM_HEADROOM - 1)
    with Engine(tiny_llama, plan, CFG) as eng:
        assert eng.plan.name == "load" and not eng.plan.pinned_host
        assert "CPU_Mapped" in eng.report.model_buffers
        sid = eng.open_session("You are terse.")
        assert eng.chat(sid, "Hello", max_tokens=4).result().completion_tokens > 0
    monkeypatch.setattr(placement, "available_ram", lambda: need + PIN_RAM_HEADROOM)
    with Engine(tiny_llama, plan, CFG) as eng:  # enough: locked as planned
        assert eng.plan.pinned_host and "CPU_Mapped" not in eng.report.model_buffers


class _FakeChunkSetter:
    """Stands for libggml's ggml_backend_set_host_alloc_chunk (a patched build's)."""

    def __init__(self) -> None:
        self.calls: list[int] = []

    def ggml_backend_set_host_alloc_chunk(self, n: int) -> None:
        self.calls.append(n)


def test_a_pinned_load_asks_for_its_host_weights_in_pieces(tiny_llama, monkeypatch) -> None:
    """cudaMallocHost of a plan's host weights in one piece held the process's address-space
    lock while it pinned: another thread's 4 MiB map waited 0.52-0.62 s for an 8B at 4.5 GiB,
    0.08-0.13 s in 64 MiB pieces (H200). A pinned load sets the pieces where the build can;
    GGML_HOST_ALLOC_CHUNK_MIB, where set, is left to decide; a mapped load sets nothing."""
    from igi_sdk.runtime import _native, loader

    assert not _native.pins_in_pieces()  # the stock build: nothing to set, and no error
    assert not _native.pin_in_pieces() and not _native.set_host_alloc_chunk(1 << 20)
    fake = _FakeChunkSetter()
    monkeypatch.setattr(_native, "_has_host_chunks", True)
    monkeypatch.setattr(_native, "ggml", fake)
    monkeypatch.delenv("GGML_HOST_ALLOC_CHUNK_MIB", raising=False)
    inv = read_inventory(tiny_llama)
    loader.model_params(Plan(name="mapped", gpu_layers=0), inv, None)
    loader.model_params(Plan(name="load", pinned_host=True, gpu_layers=0), inv, None,
                        dry_run=True)
    assert fake.calls == []
    loader.model_params(Plan(name="load", pinned_host=True, gpu_layers=0), inv, None)
    assert fake.calls == [_native.HOST_ALLOC_CHUNK] and _native.HOST_ALLOC_CHUNK == 64 << 20
    monkeypatch.setenv("GGML_HOST_ALLOC_CHUNK_MIB", "0")  # one piece, as stock llama.cpp
    assert _native.pin_in_pieces() and fake.calls == [_native.HOST_ALLOC_CHUNK]
