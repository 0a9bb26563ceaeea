"""Pricing a vision encoder against a VRAM budget (planner/vision.py): image tokens as mtmd makes
them, compute buffers and encode times that grow with the resolution, and the GPU/CPU decision
that never exceeds the budget."""

from __future__ import annotations

import llama_cpp  # before numpy: with the CUDA build, numpy first crashes model loading

# isort: split
from pathlib import Path

import pytest

from igi_sdk.model import read_inventory
from igi_sdk.model.mmproj import EncoderInventory, read_encoder
from igi_sdk.model.synthetic_vlm import VLMFiles, write_synthetic_vlm
from igi_sdk.planner import Plan, Workload, plan_for
from igi_sdk.planner import vision as V
from tests.test_planner import GPU_PROFILE

MIB = 1 << 20
GIB = 1 << 30
WL = Workload(n_ctx=8192, prompt_tokens=64, gen_tokens=32)
ORDER = ("480p", "720p", "1080p", "1440p")


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> VLMFiles:
    """The Qwen2.5-VL-7B-shaped pair, headers only (the data is a hole)."""
    return write_synthetic_vlm(tmp_path_factory.mktemp("vlm7"), "qwen2.5-vl-7b", data=False)


@pytest.fixture(scope="module")
def enc(big: VLMFiles) -> EncoderInventory:
    return read_encoder(big.mmproj)


def test_reads_the_encoder_of_an_mmproj(enc: EncoderInventory, big: VLMFiles) -> None:
    assert (enc.n_layers, enc.n_embd, enc.n_head, enc.n_ff) == (32, 1280, 16, 3420)
    assert (enc.patch_size, enc.n_merge, enc.n_wa_pattern) == (14, 2, 8)
    # the 1291 MiB that mtmd put in VRAM on the H100
    assert round(enc.weight_bytes / MIB) == 1291
    with pytest.raises(ValueError, match="not a Qwen-VL vision projector"):
        read_encoder(big.model)


def test_token_counts_of_common_resolutions(enc: EncoderInventory) -> None:
    counts = {k: V.grid_for(enc, k).n_tokens for k in ORDER}
    # 854x480 -> 868x476 (30.5 rounds up, as std::round does): 31x17
    assert counts == {"480p": 31 * 17, "720p": 46 * 26, "1080p": 69 * 39, "1440p": 85 * 48}
    # 1440p is over 4096 tokens at its rounded size: scaled down (floor) to fit
    g = V.grid_for(enc, "1440p")
    assert (g.width, g.height) == (2380, 1344) and g.n_patches == 4 * 4080
    # the documented small cases: 64x64 -> 84x84 (3x3), and the token limits
    assert V.image_grid(enc, 64, 64).n_tokens == 9
    assert V.image_grid(enc, 448, 448).n_tokens == 256
    assert V.image_grid(enc, 1920, 1080, max_tokens=1024).n_tokens <= 1024


def test_token_counts_match_mtmd(tmp_path: Path) -> None:
    """The same arithmetic as mtmd's own preprocessor (the tiny pair: patch 14, merge 2)."""
    from igi_sdk.runtime.vision import VisionContext

    files = write_synthetic_vlm(tmp_path, "tiny")
    tiny = read_encoder(files.mmproj)
    params = llama_cpp.llama_model_default_params()
    params.n_gpu_layers = 0
    model = llama_cpp.llama_model_load_from_file(str(files.model).encode(), params)
    assert model
    try:
        with VisionContext(model, files.mmproj) as vision:
            for w, h in [*(V.RESOLUTIONS[k] for k in ORDER), (64, 64), (100, 3000)]:
                with vision.image_from_pixels(bytes(w * h * 3), w, h) as img:
                    chunks = vision.tokenize(vision.options.media_marker, [img])
                    info = next(c for c in chunks.info if c.kind == "image")
                    g = V.image_grid(tiny, w, h)
                    assert (info.nx, info.ny) == (g.nx, g.ny), (w, h)
                    chunks.close()
    finally:
        llama_cpp.llama_model_free(model)


def test_buffers_and_times_grow_with_resolution(enc: EncoderInventory) -> None:
    last = (0, 0, 0.0, 0.0)
    for k in ORDER:
        p = V.grid_for(enc, k).n_patches
        fa = V.encoder_compute_bytes(enc, p, flash_attn=True)
        no_fa = V.encoder_compute_bytes(enc, p, flash_attn=False)
        gpu_s = V.encode_seconds(enc, p, GPU_PROFILE, gpu=True)
        cpu_s = V.encode_seconds(enc, p, GPU_PROFILE, gpu=False)
        assert fa < no_fa  # flash attention never materialises the scores
        assert gpu_s < cpu_s
        now = (fa, no_fa, gpu_s, cpu_s)
        assert all(a > b for a, b in zip(now, last, strict=True)), k
        last = now


def test_compute_buffer_matches_the_h100_figures(enc: EncoderInventory) -> None:
    """The fit reproduces what it was fitted to (flash attention on)."""
    for side, mib in ((448, 64), (1008, 402), (1288, 705)):
        p = V.image_grid(enc, side, side).n_patches
        assert V.encoder_compute_bytes(enc, p, flash_attn=True) / MIB == pytest.approx(mib,
                                                                                   rel=0.12)
    p448 = V.image_grid(enc, 448, 448).n_patches
    assert V.encoder_compute_bytes(enc, p448, flash_attn=False) / MIB == pytest.approx(95, rel=0.1)


def test_encoder_vram_covers_the_h100_peaks(enc: EncoderInventory) -> None:
    """What the encoder was priced at, beside the LM plan each row ran, covers the NVML peak the
    process reached (benchmarks/results/h100-vlm.json, 4 GiB rows; at 1440p it went 344 MiB over
    before the pool term)."""
    for res, lm_plan_mib, peak_mib in (("480p", 2544, 3984), ("720p", 2368, 4050),
                                       ("1080p", 1708, 3922), ("1440p", 1146, 4420)):
        need = V.encoder_vram(enc, V.grid_for(enc, res), "on") / MIB
        assert lm_plan_mib + need >= peak_mib, (res, need)


@pytest.mark.parametrize("res", ORDER)
def test_choose_vision_never_exceeds_the_budget(enc: EncoderInventory, res: str) -> None:
    for gb in (1.0, 2.0, 4.0, 6.0, 8.0, 14.5, 24.0):
        budget = int(gb * GIB)
        for resident_gb in (0.5, 2.0, 4.0, 7.0):
            lm = {"total": int(resident_gb * GIB)}
            c = V.choose_vision(budget, lm, enc, res, True, prof=GPU_PROFILE)
            if c.on_gpu:
                assert c.peak <= budget and c.vram >= enc.weight_bytes + c.compute
                assert c.flash_attn == "on"  # 80-wide heads: CUDA has the kernel
            else:
                assert c.vram == 0 and lm["total"] + V.encoder_vram(
                    enc, c.grid, "on") > budget


def test_falls_back_to_the_cpu(enc: EncoderInventory) -> None:
    lm = {"total": 3 * GIB}
    fits = V.choose_vision(8 * GIB, lm, enc, "1080p", True, prof=GPU_PROFILE)
    assert fits.on_gpu and fits.encode_s > 0
    tight = V.choose_vision(4 * GIB, lm, enc, "1080p", True, prof=GPU_PROFILE)
    assert not tight.on_gpu and tight.vram == 0 and "does not fit" in tight.why
    assert tight.encode_s > fits.encode_s  # on the CPU
    assert not V.choose_vision(None, lm, enc, "480p", True).on_gpu  # no budget
    assert not V.choose_vision(64 * GIB, lm, enc, "480p", False).on_gpu  # no GPU
    # a smaller image fits where a larger one does not
    assert V.choose_vision(int(4.6 * GIB), lm, enc, "480p", True).on_gpu
    assert not V.choose_vision(int(4.6 * GIB), lm, enc, "1440p", True).on_gpu


def test_plan_with_vision_stays_within_the_budget(big: VLMFiles, enc: EncoderInventory) -> None:
    lm = read_inventory(big.model)
    minimum = plan_for(lm, GPU_PROFILE, 10**12, WL).minimum_bytes
    for gb, res in ((4.0, "1080p"), (14.5, "480p")):
        budget = int(gb * GIB)
        if budget < minimum:
            continue
        vp = V.plan_with_vision(lm, enc, GPU_PROFILE, budget, res, WL)
        assert vp.peak_vram <= budget
        assert vp.lm.vram_bytes["total"] + vp.vision.vram <= budget or vp.mode == "borrowed"
        assert vp.turn_s <= vp.alternative_s
    # plenty of VRAM: the encoder goes to the GPU
    assert V.plan_with_vision(lm, enc, GPU_PROFILE, 24 * GIB, "480p", WL).vision.on_gpu


def test_the_lm_borrows_for_the_encoder_within_the_budget(big: VLMFiles,
                                                          enc: EncoderInventory) -> None:
    """``borrowed``: the LM gets the whole budget between image turns and moves to a smaller
    placement while the encoder is open; both placements fit, memory-mapped, one threshold."""
    lm = read_inventory(big.model)
    budget = 4 * GIB
    vp = V.plan_with_vision(lm, enc, GPU_PROFILE, budget, "1080p", WL, modes=("borrowed",))
    assert vp.mode == "borrowed" and vp.encode_lm is not None and vp.vision.on_gpu
    main, small = vp.lm, vp.encode_lm
    assert main.vram_bytes["total"] <= budget
    assert small.vram_bytes["total"] + vp.vision.vram <= budget and vp.peak_vram <= budget
    assert small.vram_bytes["weights"] < main.vram_bytes["weights"]
    assert not main.pinned_host and not small.pinned_host
    assert main.copy_compute_min_batch == small.copy_compute_min_batch
    # the price: two reshards of the LM on top of the reserved mode's encode
    reserved = V.plan_with_vision(lm, enc, GPU_PROFILE, budget, "1080p", WL, modes=("reserved",))
    assert vp.predicted.keys() == {"cpu", "reserved", "borrowed"}
    assert vp.predicted["reserved"] == reserved.turn_s
    assert V.reshard_seconds(small, GPU_PROFILE) >= V.RESHARD_FIXED_S
    # the chosen mode is the fastest predicted one
    auto = V.plan_with_vision(lm, enc, GPU_PROFILE, budget, "1080p", WL)
    assert auto.turn_s == min(auto.predicted.values())
    assert V.plan_with_vision(lm, enc, GPU_PROFILE, budget, "1080p", WL,
                              modes=("cpu",)).mode == "cpu"


def test_nothing_is_borrowed_where_the_whole_budget_leaves_room(big: VLMFiles,
                                                                enc: EncoderInventory) -> None:
    lm = read_inventory(big.model)
    vp = V.plan_with_vision(lm, enc, GPU_PROFILE, 64 * GIB, "480p", WL)
    assert vp.mode == "reserved" and vp.encode_lm is None and "borrowed" not in vp.predicted


def test_under_the_arbiter_the_encoder_borrows_from_the_rung_it_is_on(
        big: VLMFiles, enc: EncoderInventory) -> None:
    """``encoder_room``: from a GPU rung the model moves to the fastest rung that leaves the
    encoder's VRAM free within the current rung's; from the CPU rung (the game has the GPU), or
    where nothing leaves room, the encoder runs on the CPU; set aside, it stays."""
    from igi_sdk.arbiter import PlanLadder
    from igi_sdk.arbiter.ladder import arbiter_workload
    from igi_sdk.sidecar.host import encoder_room

    lm = read_inventory(big.model)
    ladder = PlanLadder.build(lm, GPU_PROFILE, arbiter_workload(4096))
    need = V.encoder_vram(enc, V.largest_grid(enc, 1024), "on")
    borrow = encoder_room(ladder, need, borrow=True)
    assert borrow.target(ladder.cpu.plan) is None
    moved = 0
    for rung in ladder.rungs[1:]:
        target = borrow.target(rung.plan)
        if target is None:
            assert all(r.vram > rung.vram - need for r in ladder.rungs)
            continue
        landed = next(r for r in ladder.rungs if r.plan == target)
        assert landed.vram + need <= rung.vram and landed.vram < rung.vram
        assert landed == ladder.best_within(rung.vram - need)
        moved += 1
    assert moved >= len(ladder.rungs) // 2  # the big rungs have room to lend
    set_aside = encoder_room(ladder, need, borrow=False)
    assert set_aside.target(ladder.cpu.plan) is None
    assert all(set_aside.target(r.plan) == r.plan for r in ladder.rungs[1:])
    assert borrow.target(Plan(name="not-a-rung")) is None
    assert borrow.fallback == ladder.cpu.plan  # a smaller rung that fails: the CPU rung


def _plan_cli(big: VLMFiles, tmp_path: Path, capsys: pytest.CaptureFixture[str], vram: str,
              ctx: int, size: str) -> str:
    """What ``igi-sdk plan --mmproj`` prints for the big pair on the test GPU profile."""
    from igi_sdk.cli import build_parser

    (tmp_path / "gpu.json").write_text(GPU_PROFILE.model_dump_json())
    args = build_parser().parse_args([
        "plan", str(big.model), "--vram", vram, "--profile", str(tmp_path / "gpu.json"),
        "--ctx", str(ctx), "--prompt", "32", "--gen", "100", "--mmproj", str(big.mmproj),
        "--image-size", size])
    assert args.fn(args) == 0
    return capsys.readouterr().out


def test_plan_shows_where_the_encoder_goes(big: VLMFiles, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    out = _plan_cli(big, tmp_path, capsys, "4GiB", 3072, "1920x1080")
    lm, enc = read_inventory(big.model), read_encoder(big.mmproj)
    vp = V.plan_with_vision(lm, enc, GPU_PROFILE, 4 * GIB, (1920, 1080),
                            Workload(n_ctx=3072, prompt_tokens=32, gen_tokens=100))
    assert f"image 1920x1080: {vp.vision.grid.n_tokens} tokens" in out
    assert f"vision: {vp.mode} — the LM on {vp.lm.name}" in out
    assert all(f"{m} {s:.2f} s" in out for m, s in vp.predicted.items())


def test_an_image_too_large_for_the_gpu_gets_a_token_cap_that_fits(
        big: VLMFiles, enc: EncoderInventory, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """At 3 GiB a 1440p image's encoder leaves the LM no room (CPU: minutes); the largest cap
    of TOKEN_CAPS at which it fits the GPU is found, within the budget, and a larger one of
    the caps would not fit."""
    lm = read_inventory(big.model)
    wl = Workload(n_ctx=4608, prompt_tokens=32, gen_tokens=100)
    budget = 3 * GIB
    whole = V.plan_with_vision(lm, enc, GPU_PROFILE, budget, "1440p", wl)
    assert whole.mode == "cpu" and "no placement of the LM fits" in whole.vision.why
    found = V.gpu_token_cap(lm, enc, GPU_PROFILE, budget, "1440p", wl)
    assert found is not None
    cap, vp = found
    assert vp.vision.on_gpu and vp.peak_vram <= budget and vp.turn_s < whole.turn_s
    assert vp.vision.grid.n_tokens <= cap
    larger = [c for c in V.TOKEN_CAPS if cap < c < V.grid_for(enc, "1440p").n_tokens]
    assert all(not V.plan_with_vision(lm, enc, GPU_PROFILE, budget, "1440p", wl,
                                      max_tokens=c).vision.on_gpu for c in larger)
    # igi-sdk plan suggests it
    assert f"serve --vision-max-tokens {cap}) the encoder fits the GPU: {vp.mode}" in \
        _plan_cli(big, tmp_path, capsys, "3GiB", 4608, "1440p")
    # nothing to cap where the image already fits, or without a budget
    assert V.gpu_token_cap(lm, enc, GPU_PROFILE, budget, "480p", wl) is None
    assert V.gpu_token_cap(lm, enc, GPU_PROFILE, None, "1440p", wl) is None
