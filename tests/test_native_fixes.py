"""NVML device matching, the CUDA context's size, the copy-compute threshold in effect, ctypes
lifetimes in the loader and plan fields the loader cannot map. CPU-only: NVML and llama.cpp's
GPU are faked through small seams (``nvml_lib``, ``measure_start``'s start callback, the
backend state)."""

from __future__ import annotations

import ctypes
import dataclasses
import json
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any, get_args

import pytest
from pydantic import ValidationError

from igi_sdk.arbiter import NvmlSource
from igi_sdk.errors import PlanError
from igi_sdk.model import read_inventory, spec_with, write_synthetic_gguf
from igi_sdk.planner import (
    FlashAttn,
    KvType,
    Plan,
    Workload,
    batch_threshold,
    copy_threshold,
    plan_for,
)
from igi_sdk.planner.planner import evaluate
from igi_sdk.profile import Profile
from igi_sdk.runtime import _native, loader, nvml
from igi_sdk.runtime.devices import Device, list_devices
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.tuning import autoplan
from igi_sdk.tuning.measure import cached_before_backend

GIB = 1024**3
MIB = 1024**2
H200 = Path(__file__).resolve().parent.parent / "benchmarks" / "results" / "h200-profile-16t.json"
ENV = "GGML_OP_OFFLOAD_MIN_BATCH"


# --- fakes ----------------------------------------------------------------------------------------


class NVMLError(Exception):
    pass


class FakeNvml:
    """pynvml's calls the SDK makes, over GPUs given as {bus id, total, used, procs}."""

    def __init__(self, gpus: list[dict[str, Any]]) -> None:
        self.gpus = gpus
        self.shutdowns = 0

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, Any]:
        return self.gpus[i]

    def nvmlDeviceGetPciInfo(self, h: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(busId=h["bus"])

    def nvmlDeviceGetMemoryInfo(self, h: dict[str, Any]) -> SimpleNamespace:
        return SimpleNamespace(total=h["total"], used=h["used"], free=h["total"] - h["used"])

    def nvmlDeviceGetComputeRunningProcesses(self, h: dict[str, Any]) -> list[SimpleNamespace]:
        if h.get("procs") is None:  # WDDM: no per-process figures
            raise NVMLError("Not Supported")
        return [SimpleNamespace(pid=pid, usedGpuMemory=b) for pid, b in h["procs"].items()]

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1


def _gpu(bus: str, total_gib: int, used_gib: float, procs: dict[int, int] | None = None
         ) -> dict[str, Any]:
    return {"bus": bus, "total": total_gib * GIB, "used": int(used_gib * GIB), "procs": procs}


def _device(bus: str | None) -> Device:
    return Device(index=1, name="CUDA0", description="fake", kind="gpu", free_bytes=GIB,
                  total_bytes=8 * GIB, buffer_type="CUDA0", pci_bus_id=bus)


@pytest.fixture
def fresh_backend(monkeypatch: pytest.MonkeyPatch) -> _native.BackendState:
    """A backend that has not started yet (llama.cpp itself is never restarted), with no user
    threshold in the environment."""
    state = _native.BackendState()
    monkeypatch.setattr(_native, "_state", state)
    monkeypatch.delenv(ENV, raising=False)
    return state


def _fake_start(state: _native.BackendState, env: dict[str, str]) -> None:
    """What init_backend does to the state, with ``env`` standing in for the process's."""
    state.threshold = state.threshold_at_start(env)
    state.started = True


# --- 1. the NVML device is llama.cpp's GPU --------------------------------------------------------


def test_bus_ids_are_normalised_across_nvml_and_cuda_spellings() -> None:
    want = "0000:c1:00.0"
    assert nvml.normalise_bus_id("00000000:C1:00.0") == want  # NVML
    assert nvml.normalise_bus_id(b"00000000:C1:00.0") == want  # older pynvml: bytes
    assert nvml.normalise_bus_id("0000:c1:00.0") == want  # llama.cpp / CUDA
    assert nvml.normalise_bus_id("0000:c1:00.0-v1") == want  # llama.cpp's virtual device
    assert nvml.normalise_bus_id("C1:00.0") == want  # no domain
    assert nvml.normalise_bus_id("not a bus id") is None
    assert nvml.normalise_bus_id(None) is None


def test_nvml_source_reads_the_gpu_llama_cpp_runs_on_not_nvml_index_0() -> None:
    # NVML (PCI order) lists the 24 GB card first; CUDA (fastest first) runs on the 80 GB one
    nv = FakeNvml([_gpu("00000000:01:00.0", 24, 20), _gpu("00000000:C1:00.0", 80, 3)])
    for device in ("0000:c1:00.0", _device("0000:c1:00.0")):
        r = NvmlSource(own_fallback=lambda: 0, device=device, nvml_lib=nv,
                       context_bytes=lambda: 0).read()
        assert r is not None
        assert (r.total, r.used) == (80 * GIB, 3 * GIB)


def test_nvml_source_defaults_to_llama_cpps_first_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import igi_sdk.runtime.devices as devices

    monkeypatch.setattr(devices, "first_gpu", lambda: _device("0000:c1:00.0"))
    nv = FakeNvml([_gpu("00000000:01:00.0", 24, 20), _gpu("00000000:C1:00.0", 80, 3)])
    r = NvmlSource(nvml_lib=nv, context_bytes=lambda: 0).read()
    assert r is not None and r.total == 80 * GIB
    # the old positional form still picks an NVML index directly
    r = NvmlSource(0, lambda: 0, nvml_lib=nv, context_bytes=lambda: 0).read()
    assert r is not None and r.total == 24 * GIB


def test_nvml_falls_back_to_index_0_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="igi_sdk.nvml")
    assert nvml.select_index(["00000000:01:00.0"], None) == 0  # one GPU: it is llama.cpp's
    assert not caplog.records
    assert nvml.select_index(["00000000:01:00.0"], "0000:02:00.0") == 0
    assert len(caplog.records) == 1
    assert nvml.select_index(["00000000:01:00.0", "00000000:02:00.0"], "0000:03:00.0") == 0
    assert nvml.select_index(["00000000:01:00.0", "00000000:02:00.0"], None) == 0
    assert len(caplog.records) == 3
    assert nvml.select_index([], "0000:03:00.0") is None


def test_devices_carry_the_pci_bus_id_from_ggml_props() -> None:
    # the props struct must match this build's layout: every field read back agrees with the
    # single-field getters, and the CPU device's caps are what ggml-cpu sets
    devs = list_devices()
    for d in devs:
        h = _native.ggml.ggml_backend_dev_get(d.index)
        props = _native.GgmlBackendDevProps()
        _native.ggml.ggml_backend_dev_get_props(h, ctypes.byref(props))
        assert props.name.decode() == d.name
        assert (props.description or b"").decode() == d.description
        assert props.memory_total == d.total_bytes
        assert props.type == _native.ggml.ggml_backend_dev_type(h)
        assert d.pci_bus_id == (props.device_id.decode() if props.device_id else None)
        if d.kind == "cpu":
            assert d.pci_bus_id is None
            caps = props.caps
            assert (caps.async_, caps.host_buffer, caps.buffer_from_host_ptr, caps.events,
                    caps.mmap_support) == (False, False, True, False, True)


# --- 2. the CUDA context where NVML has no per-process figure ------------------------------------


def test_context_bytes_is_the_drop_in_free_memory() -> None:
    before = nvml.MemoryReading(free=70 * GIB, used=10 * GIB, total=80 * GIB)
    after = nvml.MemoryReading(free=70 * GIB - 500 * MIB, used=10 * GIB + 500 * MIB,
                               total=80 * GIB)
    assert nvml.context_bytes(before, after) == 500 * MIB
    assert nvml.context_bytes(after, before) == 0  # someone else freed memory meanwhile
    assert nvml.context_bytes(None, after) == 0
    assert nvml.context_bytes(before, dataclasses.replace(after, total=24 * GIB)) == 0


def test_backend_start_is_measured_on_llama_cpps_gpu() -> None:
    nv = FakeNvml([_gpu("00000000:01:00.0", 24, 20), _gpu("00000000:C1:00.0", 80, 3)])

    def start() -> tuple[bool, str | None]:  # the CUDA context lands on llama.cpp's GPU only
        nv.gpus[1]["used"] += 480 * MIB
        nv.gpus[0]["used"] += 7 * MIB  # the game, meanwhile, on the other one
        return True, "0000:c1:00.0"

    assert nvml.measure_start(nv, start) == ("0000:c1:00.0", 480 * MIB)
    assert nvml.measure_start(nv, lambda: (False, None)) == (None, 0)  # no GPU in llama.cpp
    assert nvml.measure_start(None, lambda: (True, "0000:c1:00.0")) == ("0000:c1:00.0", 0)


def test_nvml_source_counts_the_cuda_context_without_per_process_figures() -> None:
    import os

    own_buffers = 2 * GIB
    wddm = FakeNvml([_gpu("00000000:C1:00.0", 8, 5)])  # no per-process figures
    r = NvmlSource(own_fallback=lambda: own_buffers, device="0000:c1:00.0", nvml_lib=wddm,
                   context_bytes=lambda: 400 * MIB).read()
    assert r is not None
    assert r.own == own_buffers + 400 * MIB
    assert r.others == 5 * GIB - own_buffers - 400 * MIB  # the context is not the game's
    linux = FakeNvml([_gpu("00000000:C1:00.0", 8, 5, procs={os.getpid(): 3 * GIB})])
    r = NvmlSource(own_fallback=lambda: own_buffers, device="0000:c1:00.0", nvml_lib=linux,
                   context_bytes=lambda: 400 * MIB).read()
    assert r is not None and r.own == 3 * GIB  # the driver's figure includes the context


def test_cuda_context_bytes_is_zero_without_a_gpu() -> None:
    _native.init_backend()
    assert _native.backend_started()
    if not any(d.is_gpu for d in list_devices()):
        assert _native.cuda_context_bytes() == 0


# --- 3. the copy-compute threshold ---------------------------------------------------------------


def test_threshold_from_env_reads_like_ggml_cuda() -> None:
    assert _native.threshold_from_env(None) == 32
    assert _native.threshold_from_env("8") == 8
    assert _native.threshold_from_env(" 16 tokens") == 16  # atoi
    assert _native.threshold_from_env("many") == 0
    assert _native.threshold_from_env("") == 0


def test_threshold_in_effect_is_what_llama_cpp_read_not_the_live_env(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _native.init_backend()
    read = _native.copy_compute_threshold_in_effect()
    monkeypatch.setenv(ENV, str(read + 5))  # too late: llama.cpp read its value at start-up
    assert _native.copy_compute_threshold_in_effect() == read
    _native.init_backend(read + 7)  # so is a later plan's
    assert _native.copy_compute_threshold_in_effect() == read


def test_prepare_backend_sets_the_threshold_without_starting(
    fresh_backend: _native.BackendState, monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert _native.prepare_backend(8) == 8
    assert not _native.backend_started()
    env: dict[str, str] = {}
    _fake_start(fresh_backend, env)
    assert env[ENV] == "8" and _native.copy_compute_threshold_in_effect() == 8
    assert _native.prepare_backend(4) == 8  # after the start: nothing changes
    # a value the user set wins over the one asked for
    fresh = _native.BackendState()
    monkeypatch.setattr(_native, "_state", fresh)
    monkeypatch.setenv(ENV, "16")
    assert _native.prepare_backend(8) == 16


@pytest.fixture(scope="module")
def inv(tmp_path_factory: pytest.TempPathFactory):
    spec = spec_with("tiny-llama", n_layers=8, n_embd=1024, n_ff=4096, n_vocab=4096)
    return read_inventory(write_synthetic_gguf(tmp_path_factory.mktemp("m") / "m.gguf", spec))


@pytest.fixture(scope="module")
def h200() -> Profile:
    return Profile.load(H200)


WL = Workload(n_ctx=2048, prompt_tokens=512, gen_tokens=64)


def _budget(inv, prof: Profile) -> int:  # room for attention, not for everything
    return plan_for(inv, prof, 10**12, WL).minimum_bytes + inv.total_bytes() // 3


def test_planner_prices_copy_plans_with_a_fixed_threshold(inv, h200: Profile) -> None:
    own = copy_threshold(inv, h200, True)
    assert own != 32  # the case that matters: the planner would pick another threshold
    res = plan_for(inv, h200, _budget(inv, h200), dataclasses.replace(WL, copy_min_batch=32))
    offloading = [c for c in res.candidates if c.plan.op_offload]
    assert any(c.plan.name == "attn-first-copy" for c in offloading)
    for c in offloading:
        assert c.plan.copy_compute_min_batch == 32
        assert evaluate(inv, c.plan, h200, WL, res.budget).score == pytest.approx(c.score)
    free = plan_for(inv, h200, _budget(inv, h200), WL)  # None: the planner chooses, as before
    copy = next(c.plan for c in free.candidates if c.plan.name == "attn-first-copy")
    assert copy.copy_compute_min_batch == own
    with pytest.raises(ValueError):
        Workload(copy_min_batch=0)


def test_threshold_in_effect_equals_the_planned_copy_plans(
    inv, h200: Profile, fresh_backend: _native.BackendState,
) -> None:
    # before the start: ask for the planner's threshold, start, plan with what is in effect
    asked = autoplan.prepare_backend(inv, h200, WL)
    assert asked == copy_threshold(inv, h200, WL.pin_host)
    _fake_start(fresh_backend, {})
    res = plan_for(inv, h200, _budget(inv, h200), autoplan.with_threshold_in_effect(WL))
    assert res.best.name == "attn-first-copy"
    assert res.best.copy_compute_min_batch == _native.copy_compute_threshold_in_effect() == asked


def _fake_plan_for_model_env(monkeypatch: pytest.MonkeyPatch, state: _native.BackendState,
                             env: dict[str, str]) -> list[int]:
    """first_gpu() starts the (fake) backend with ``env``; plan_checked is the planner alone."""
    started_with: list[int] = []

    def first_gpu() -> Device:
        if not state.started:
            _fake_start(state, env)
            started_with.append(int(state.threshold or 0))
        return _device("0000:c1:00.0")

    monkeypatch.setattr(autoplan, "first_gpu", first_gpu)
    monkeypatch.setattr(autoplan, "plan_checked",
                        lambda path, inv, prof, budget, wl, settings, measure=None:
                        plan_for(inv, prof, budget, wl))
    return started_with


def test_plan_for_model_sets_the_threshold_before_the_backend_starts(
    inv, h200: Profile, fresh_backend: _native.BackendState, monkeypatch: pytest.MonkeyPatch,
) -> None:
    started_with = _fake_plan_for_model_env(monkeypatch, fresh_backend, {})
    res = autoplan.plan_for_model(Path("unused.gguf"), inv, budget=_budget(inv, h200),
                                  n_ctx=2048, max_sessions=1, profile=h200)
    want = copy_threshold(inv, h200, True)
    assert started_with == [want]  # asked for before first_gpu() started the backend
    assert res.best.op_offload and res.best.copy_compute_min_batch == want
    assert all(c.plan.copy_compute_min_batch == want for c in res.candidates
               if c.plan.op_offload)


def test_plan_for_model_after_the_start_plans_with_the_threshold_in_effect(
    inv, h200: Profile, fresh_backend: _native.BackendState, monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_start(fresh_backend, {})  # something started the backend already: 32
    _fake_plan_for_model_env(monkeypatch, fresh_backend, {})
    res = autoplan.plan_for_model(Path("unused.gguf"), inv, budget=_budget(inv, h200),
                                  n_ctx=2048, max_sessions=1, profile=h200)
    assert _native.copy_compute_threshold_in_effect() == 32
    assert all(c.plan.copy_compute_min_batch == 32 for c in res.candidates
               if c.plan.op_offload)


def test_cached_profile_is_found_without_starting_the_backend(
    tmp_path: Path, h200: Profile, monkeypatch: pytest.MonkeyPatch,
) -> None:
    import llama_cpp

    from igi_sdk.tuning import measure

    monkeypatch.setattr(measure, "_nvml_facts", lambda: {"driver": "580", "gpu": "NVIDIA H200"})
    monkeypatch.setattr(measure, "_cpu_model", lambda: "Xeon")
    monkeypatch.setenv("GOMP_SPINCOUNT", "300000")
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    fp = {"gpu": "NVIDIA H200", "driver": "580", "cpu": "Xeon", "threads": "16",
          "wait": "spin300000", "llama_cpp": llama_cpp.__version__, "backends": "CPU,CUDA"}
    h200.model_copy(update={"fingerprint": fp}).save(tmp_path)
    other = dict(fp, cpu="Ryzen")
    h200.model_copy(update={"fingerprint": other}).save(tmp_path)
    found = cached_before_backend(16, tmp_path)
    assert found is not None and found.fingerprint == fp
    assert cached_before_backend(8, tmp_path) is None  # other thread count: no profile
    monkeypatch.delenv("GOMP_SPINCOUNT")  # timed while spinning: not for sleeping
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    assert cached_before_backend(16, tmp_path) is None
    monkeypatch.delenv("OMP_WAIT_POLICY")
    monkeypatch.setenv("GOMP_SPINCOUNT", "300000")
    h200.model_copy(update={"fingerprint": dict(fp, backends="CPU,Vulkan")}).save(tmp_path)
    assert cached_before_backend(16, tmp_path) is None  # two could be it: do not guess


# --- 4. ctypes lifetimes in the loader -----------------------------------------------------------


def test_loaded_keeps_what_the_model_params_point_at(default_model: Path) -> None:
    inventory = read_inventory(default_model)
    seen: list[float] = []
    settings = ContextSettings(n_ctx=256, n_seq_max=1, n_batch=64, n_threads=2)
    loaded = loader.load(default_model, inventory, Plan.all_cpu(), settings,
                         progress=seen.append, dry_run=True)
    try:
        assert loaded.overrides is not None and loaded.overrides.array is not None
        assert loaded.overrides.pointer is not None
        assert loaded.progress_cb is not None
    finally:
        loader.free(loaded)
    assert loaded.overrides is None and loaded.progress_cb is None and loaded.model is None
    report = loader.dry_run(default_model, inventory, Plan.all_cpu(), settings)
    assert set(report.placement(None).values()) == {"cpu"}


# --- 5. plan fields the loader cannot map --------------------------------------------------------


def test_plan_rejects_kv_types_and_flash_modes_the_loader_cannot_map() -> None:
    assert set(get_args(KvType)) == set(loader._KV_TYPES)
    assert set(get_args(FlashAttn)) == set(loader._FLASH)
    for bad in ({"type_k": "q5_1"}, {"type_v": "bf16"}, {"flash_attn": "maybe"}):
        with pytest.raises(ValidationError):
            Plan(**bad)
        with pytest.raises(ValidationError):
            Plan.from_json(json.dumps({**Plan().model_dump(), **bad}))
    assert Plan(type_k="q8_0", type_v="q4_0").type_k == "q8_0"


def test_loader_fails_before_loading_and_never_leaks_the_model(
    default_model: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    inventory = read_inventory(default_model)
    settings = ContextSettings(n_ctx=256, n_seq_max=1, n_batch=64, n_threads=2)
    llama_cpp = loader.llama_cpp
    loads: list[Any] = []
    frees: list[Any] = []
    real_load, real_free = llama_cpp.llama_model_load_from_file, llama_cpp.llama_model_free

    def load(*a: Any) -> Any:
        model = real_load(*a)
        loads.append(model)
        return model

    def free(model: Any) -> None:
        frees.append(model)
        real_free(model)

    monkeypatch.setattr(llama_cpp, "llama_model_load_from_file", load)
    monkeypatch.setattr(llama_cpp, "llama_model_free", free)
    # an unvalidated plan (model_construct) with a KV type llama.cpp has no value for
    bad = Plan.model_construct(**{**dict(Plan.all_cpu()), "type_k": "q5_1"})
    with pytest.raises(PlanError):
        loader.load(default_model, inventory, bad, settings, dry_run=True)
    assert loads == []  # refused before the model was loaded

    def broken_context(*_a: Any) -> Any:
        raise RuntimeError("boom")

    monkeypatch.setattr(llama_cpp, "llama_init_from_model", broken_context)
    with pytest.raises(RuntimeError):
        loader.load(default_model, inventory, Plan.all_cpu(), settings, dry_run=True)
    assert len(loads) == 1 and frees == loads  # the model was freed


# --- NPCs talking together: a threshold their decode batch streams from ---------------------------


@pytest.fixture(scope="module")
def llama8b_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The 8B (header only: the data is a hole)."""
    return write_synthetic_gguf(tmp_path_factory.mktemp("8b") / "m.gguf", "llama3-8b",
                                data=False)


@pytest.fixture(scope="module")
def llama8b(llama8b_file: Path):
    return read_inventory(llama8b_file)


NPCS = Workload(n_ctx=16 * 1280, n_seqs=16, n_outputs=16, prompt_tokens=1024, gen_tokens=128)
FOUR_GB = 4_000_000_000


def test_sixteen_npcs_talking_stream_their_decode_batch_where_it_pays(llama8b, h200) -> None:
    """With one more than a step's logits rows as the threshold (17), sixteen NPCs decoding
    together compute the CPU-resident weights on the CPU at every step; the planner now also
    tries the threshold from which streaming them pays, and keeps it where it predicts more."""
    high = copy_threshold(llama8b, h200, True, NPCS.outputs + 1)
    batch = batch_threshold(llama8b, h200, NPCS)
    assert batch is not None and batch <= NPCS.n_seqs < high
    res = plan_for(llama8b, h200, FOUR_GB, NPCS)
    best = res.best
    before = plan_for(llama8b, h200, FOUR_GB, dataclasses.replace(NPCS, copy_min_batch=high)).best
    # a plan the threshold leaves unchanged (nothing offloaded) is listed once
    keys = [(c.plan.name, c.plan.n_ubatch, round(c.score, 9), c.vram["total"])
            for c in res.candidates]
    assert len(keys) == len(set(keys))
    assert best.op_offload and best.copy_compute_min_batch == batch
    assert best.predicted["decode_tps"] > 2 * before.predicted["decode_tps"]
    assert best.vram_bytes["total"] <= FOUR_GB  # the output head's staging copy is counted
    # memory-mapped host weights (the arbiter's) stream at pageable speed: the better of the two
    mapped = dataclasses.replace(NPCS, pin_host=False)
    pick = plan_for(llama8b, h200, FOUR_GB, mapped).best.predicted["turn_s"]
    for threshold in (copy_threshold(llama8b, h200, False, 1), high):
        fixed = plan_for(llama8b, h200, FOUR_GB,
                         dataclasses.replace(mapped, copy_min_batch=threshold)).best
        assert pick <= fixed.predicted["turn_s"]


def test_one_npc_talking_keeps_the_threshold_above_the_logits_rows(llama8b, h200) -> None:
    one = dataclasses.replace(NPCS, n_seqs=1)
    assert batch_threshold(llama8b, h200, one) is None
    best = plan_for(llama8b, h200, FOUR_GB, one).best
    assert not best.op_offload or best.copy_compute_min_batch > one.outputs


def test_the_backend_is_asked_for_the_talking_npcs_threshold(
    llama8b, h200: Profile, fresh_backend: _native.BackendState,
) -> None:
    batch = batch_threshold(llama8b, h200, NPCS)
    asked = autoplan.prepare_backend(llama8b, h200, NPCS, FOUR_GB)
    assert asked == batch == fresh_backend.requested
    _fake_start(fresh_backend, {})
    wl = autoplan.with_threshold_in_effect(NPCS)
    assert plan_for(llama8b, h200, FOUR_GB, wl).best.copy_compute_min_batch == batch


def test_without_npcs_talking_together_the_backend_is_asked_as_before(
    llama8b, h200: Profile, fresh_backend: _native.BackendState,
) -> None:
    one = dataclasses.replace(NPCS, n_seqs=1)
    asked = autoplan.prepare_backend(llama8b, h200, one, FOUR_GB)
    assert asked == copy_threshold(llama8b, h200, True, one.outputs + 1)


@pytest.mark.parametrize("talking", [1, 16])
def test_the_sidecar_plans_its_ladder_for_the_npcs_talking_together(
    llama8b_file: Path, llama8b, h200: Profile, fresh_backend: _native.BackendState,
    monkeypatch: pytest.MonkeyPatch, talking: int,
) -> None:
    """``serve --talking 16``: the arbiter's rungs are planned for sixteen decoding together,
    with host weights pinned (their decode steps stream them) and the threshold asked for
    before the backend starts; 1 (the default) plans as before."""
    from igi_sdk.arbiter.ladder import PlanLadder, Rung
    from igi_sdk.sidecar import host as host_mod
    from igi_sdk.tuning.autoplan import Beside
    from igi_sdk.wire import protocol as P

    built: list[Workload] = []

    def build(inv, prof, wl, step=0, planner=None, cap=None) -> PlanLadder:
        built.append(wl)
        return PlanLadder([Rung(0, Plan.all_cpu())])

    monkeypatch.setattr(host_mod.PlanLadder, "build", staticmethod(build))
    monkeypatch.setattr("igi_sdk.runtime.nvml.nvml", lambda: None)
    cfg = host_mod.HostConfig(profile=H200, talking=talking, vram_cap=FOUR_GB)
    request = P.LoadModel(path="m.gguf", n_ctx=NPCS.n_ctx, max_sessions=16)
    settings = ContextSettings(NPCS.n_ctx, 16, 512, 0, n_outputs=16)
    setup = host_mod.ModelHost(cfg)._arbiter_setup(llama8b_file, llama8b, request, settings,
                                                    Beside())
    assert setup is not None and len(built) == 1
    wl = built[0]
    assert (wl.n_seqs, wl.pin_host) == (talking, talking > 1)
    expect = (batch_threshold(llama8b, h200, dataclasses.replace(wl, copy_min_batch=None))
              if talking > 1 else copy_threshold(llama8b, h200, False, wl.outputs + 1))
    assert wl.copy_min_batch == fresh_backend.requested == expect
