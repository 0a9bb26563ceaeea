"""Pricing a vision encoder (mmproj) against a VRAM budget (pure functions).

What an image costs, for Qwen2.5-VL-style encoders (patch 14, 2x2 merge, dynamic resolution):

* **tokens**: mtmd resizes every image as ``smart_resize`` does (tools/mtmd/mtmd-image.cpp,
  ``calc_size_preserved_ratio``): sides rounded to multiples of patch·merge (28 px), then
  scaled down (floor) to at most ``max_tokens`` or up (ceil) to at least ``min_tokens`` merged
  tokens, keeping the aspect ratio. :func:`image_grid` repeats that arithmetic in float32.
* **weights**: all of the encoder's tensors, in one buffer of its backend (mtmd has no
  per-tensor placement: on the GPU all of them are in VRAM).
* **compute buffer**: fitted to H100 measurements of the synthetic Qwen2.5-VL-7B tower
  (:func:`encoder_compute_bytes`).
* **time**: FLOPs of the tower over the profile's matmul and attention rates, times factors
  fitted to the same measurements (:func:`encode_seconds`): a rough model.

:func:`choose_vision` puts the encoder on the GPU only where its weights and compute buffer fit
beside everything the language model keeps resident (llama.cpp allocates the LM's compute
buffer with its context and keeps it, so the encoder cannot borrow it between steps), and
:func:`plan_with_vision` weighs that against giving the LM the VRAM instead, as
``speculative.choose`` does for a draft model.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Literal

from igi_sdk.model import ModelInventory
from igi_sdk.model.mmproj import EncoderInventory
from igi_sdk.planner.plan import FlashAttn, Plan
from igi_sdk.planner.planner import Workload, minimum_budget, plan_for
from igi_sdk.profile import Profile

MIB = 1 << 20

# Common screen sizes a game hands over (16:9; 480p as FWVGA).
RESOLUTIONS: dict[str, tuple[int, int]] = {
    "480p": (854, 480),
    "720p": (1280, 720),
    "1080p": (1920, 1080),
    "1440p": (2560, 1440),
}

# --- compute buffer: fitted, not derived ---------------------------------------------------------
# Measured on an H100 (synthetic Qwen2.5-VL-7B tower, F16, flash attention on): 64 MiB at
# 448x448 (1024 patches), 402 MiB at 1008x1008 (5184), 705 MiB reserved by the 1288x1288 warmup
# (8464). A least-squares fit of  LIN · P · 4 · (3·h + ffn)  +  P² · MASK_BYTES  gives LIN 2.43
# with MASK_BYTES 2 (the window-attention mask, an F16 P x P matrix under flash attention): 71,
# 400 and 706 MiB. Without flash attention the KQ scores are materialised, P² · n_head · 4 bytes;
# at 448x448 that is 64 MiB while the buffer grew 31 MiB (95 MiB), so the term is scaled by
# 31/64 (ggml's allocator reuses what the fused kernel needed). One point: a rough constant.
ACT_LIN = 2.43
MASK_BYTES = 2
KQ_SHARE = 31 / 64
# allocator rounding and the encoder's small graph inputs (positions, window indices)
ENCODER_MARGIN = 32 * MIB
# What NVML sees beyond the reported compute buffer while an image is encoded (the CUDA pool's
# temporaries), growing with P²: on an H100 (benchmarks/results/h100-vlm.json) the process
# peaked up to 344 MiB above weights + buffer + margin at 1440p (16320 patches), within noise at
# 480p-1080p; 2 bytes per P² covers 1440p (532 MiB) and costs 221 MiB at 1080p.
POOL_BYTES = 2

# --- encode time: fitted, not derived ------------------------------------------------------------
# FLOPs over the H100 profile's rates (.gpu/profile.json: F16 matmul rate at P tokens, flash
# attention FLOP/s) predict 2.4 + 2.5 ms at 448x448 and 12 + 65 ms at 1008x1008, against 22 and
# 265 ms measured: the encoder's many small ops (norms, ropes, permutes, the masked windows) and
# its unfused attention run well below the LM-shaped probes. Factors that fit both points:
GPU_MATMUL_FACTOR = 5.98
GPU_ATTN_FACTOR = 2.94
# 448x448 took 2.4 s on 16 CPU threads against 1.84 s from the CPU profile's rates
CPU_FACTOR = 1.30
# CUDA's flash attention has kernels for these head sizes only (the tiny tower's 16 has none)
CUDA_FA_HEAD_DIMS = frozenset({64, 80, 96, 112, 128, 256})


def _f32(x: float) -> float:
    """``x`` rounded to float32, as clip.cpp computes the resize."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _round(x: float) -> int:
    return math.floor(x + 0.5)  # std::round: half away from zero (x > 0)


@dataclass(frozen=True)
class ImageGrid:
    """An image as the encoder sees it: the resized size and its grid of merged tokens."""

    width: int
    height: int
    nx: int
    ny: int
    merge: int = 2

    @property
    def n_tokens(self) -> int:
        return self.nx * self.ny

    @property
    def n_patches(self) -> int:
        return self.n_tokens * self.merge * self.merge


def image_grid(enc: EncoderInventory, width: int, height: int, *, min_tokens: int = 0,
               max_tokens: int = 0) -> ImageGrid:
    """The grid mtmd makes of a ``width`` x ``height`` image (``min_tokens``/``max_tokens`` 0:
    the model's limits, as ``VisionOptions``'s image token limits)."""
    if width <= 0 or height <= 0:
        raise ValueError(f"an image of {width}x{height} has nothing in it")
    align = enc.patch_size * enc.n_merge
    area = align * align
    min_px = (min_tokens or enc.min_tokens) * area
    max_px = (max_tokens or enc.max_tokens) * area
    w = max(align, _round(_f32(width / align)) * align)
    h = max(align, _round(_f32(height / align)) * align)
    if w * h > max_px:
        beta = _f32(math.sqrt(_f32(_f32(float(height) * width) / max_px)))
        h = max(align, math.floor(_f32(_f32(height / beta) / align)) * align)
        w = max(align, math.floor(_f32(_f32(width / beta) / align)) * align)
    elif w * h < min_px:
        beta = _f32(math.sqrt(_f32(min_px / _f32(float(height) * width))))
        h = math.ceil(_f32(_f32(height * beta) / align)) * align
        w = math.ceil(_f32(_f32(width * beta) / align)) * align
    return ImageGrid(w, h, w // align, h // align, enc.n_merge)


def grid_for(enc: EncoderInventory, resolution: str | tuple[int, int] | ImageGrid,
             max_tokens: int = 0) -> ImageGrid:
    if isinstance(resolution, ImageGrid):
        return resolution
    w, h = RESOLUTIONS[resolution] if isinstance(resolution, str) else resolution
    return image_grid(enc, w, h, max_tokens=max_tokens)


# --- memory --------------------------------------------------------------------------------------


def encoder_weight_bytes(enc: EncoderInventory) -> int:
    return enc.weight_bytes


def encoder_compute_bytes(enc: EncoderInventory, n_patches: int, *, flash_attn: bool) -> int:
    """The encoder's compute buffer for one image of ``n_patches`` patches (see the fit above).
    On the encoder's backend: VRAM when it runs on the GPU, host memory otherwise."""
    p = n_patches
    act = ACT_LIN * p * 4 * (3 * enc.n_embd + enc.n_ff) + p * p * MASK_BYTES
    if not flash_attn:
        act += KQ_SHARE * p * p * enc.n_head * 4
    return int(act)


# --- time ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EncoderFlops:
    matmul: float  # weights x activations: blocks and patch embedding per patch, merger per token
    attention: float  # QK^T and AV, every block over all patches (windows are a mask)


def encoder_flops(enc: EncoderInventory, n_patches: int) -> EncoderFlops:
    p = n_patches
    per_patch = enc.block_weight_elements() + enc.patch_weight_elements()
    merged = p / (enc.n_merge * enc.n_merge)
    matmul = 2.0 * p * per_patch + 2.0 * merged * enc.merger_weight_elements()
    attention = 4.0 * p * p * enc.n_embd * enc.n_layers
    return EncoderFlops(matmul, attention)


def encode_seconds(enc: EncoderInventory, n_patches: int, prof: Profile, *, gpu: bool) -> float:
    """Predicted encoder time for one image (a rough model: FLOPs over the profile's rates,
    with the fitted factors above)."""
    f = encoder_flops(enc, n_patches)
    dev = prof.gpu if gpu and prof.gpu is not None else prof.cpu
    # an F16 matmul: weight bytes/s x tokens = FLOP/s (2 FLOP per 2-byte weight per token)
    matmul_rate = dev.rate("F16", n_patches) * n_patches
    t_mm = f.matmul / max(matmul_rate, 1.0)
    t_attn = f.attention / max(dev.attention_flops(), 1.0)
    if gpu and prof.gpu is not None:
        return GPU_MATMUL_FACTOR * t_mm + GPU_ATTN_FACTOR * t_attn
    return CPU_FACTOR * (t_mm + t_attn)


# --- the decision --------------------------------------------------------------------------------


def flash_attn_for(enc: EncoderInventory, *, gpu: bool) -> FlashAttn:
    """Flash attention wherever the backend has it: every head size on the CPU, CUDA's kernel
    sizes on the GPU."""
    if not gpu or enc.head_dim in CUDA_FA_HEAD_DIMS:
        return "on"
    return "off"


@dataclass(frozen=True)
class VisionChoice:
    on_gpu: bool
    flash_attn: FlashAttn
    grid: ImageGrid
    weights: int  # encoder weights, on its backend
    compute: int  # its compute buffer for the grid, on its backend
    vram: int  # what the encoder adds to the GPU while an image is encoded (0 on the CPU)
    lm_resident: int  # the LM plan's VRAM that stays while the encoder runs
    encode_s: float  # predicted encoder time (0 without a profile)
    why: str

    @property
    def peak(self) -> int:
        """VRAM while an image is encoded: the LM's resident total plus the encoder's."""
        return self.lm_resident + self.vram


def encoder_vram(enc: EncoderInventory, grid: ImageGrid, flash_attn: FlashAttn) -> int:
    """VRAM of the encoder on the GPU for one image of ``grid``."""
    return (enc.weight_bytes + encoder_compute_bytes(enc, grid.n_patches,
                                                     flash_attn=flash_attn != "off")
            + grid.n_patches ** 2 * POOL_BYTES + ENCODER_MARGIN)


def largest_grid(enc: EncoderInventory, max_tokens: int = 0) -> ImageGrid:
    """The grid of the largest image the encoder takes (``max_tokens`` 0: the model's limit),
    square: what a budget must hold when any image may come."""
    side = math.isqrt(max_tokens or enc.max_tokens)
    return ImageGrid(side * enc.patch_size * enc.n_merge, side * enc.patch_size * enc.n_merge,
                     side, side, enc.n_merge)


def choose_vision(budget: int | None, lm_plan_vram: Mapping[str, int], encoder: EncoderInventory,
                  resolution: str | tuple[int, int] | ImageGrid, gpu_available: bool, *,
                  prof: Profile | None = None, max_tokens: int = 0) -> VisionChoice:
    """Where the encoder runs for images up to ``resolution``.

    On the GPU only if its weights + compute buffer (+ a margin) fit in ``budget`` beside the
    LM plan's resident VRAM, ``lm_plan_vram["total"]``: fixed share, weights, KV cache *and*
    compute buffer, since llama.cpp reserves the LM's compute buffer with its context and keeps
    it between steps. Encoding happens between LM steps, but the buffers never share memory.
    Otherwise (or without a GPU or budget) on the CPU. Flash attention on wherever supported.
    """
    grid = grid_for(encoder, resolution, max_tokens)
    resident = int(lm_plan_vram.get("total", 0))
    weights = encoder.weight_bytes
    fa_gpu = flash_attn_for(encoder, gpu=True)
    need = encoder_vram(encoder, grid, fa_gpu)

    def seconds(gpu: bool) -> float:
        return encode_seconds(encoder, grid.n_patches, prof, gpu=gpu) if prof else 0.0

    if gpu_available and budget is not None and resident + need <= budget:
        compute = encoder_compute_bytes(encoder, grid.n_patches, flash_attn=fa_gpu != "off")
        return VisionChoice(True, fa_gpu, grid, weights, compute, need, resident, seconds(True),
                            f"encoder {need / MIB:.0f} MiB fits beside the LM's resident "
                            f"{resident / MIB:.0f} MiB in {budget / MIB:.0f} MiB")
    if not gpu_available or budget is None:
        why = "no GPU: the encoder runs on the CPU"
    else:
        why = (f"encoder {need / MIB:.0f} MiB does not fit beside the LM's resident "
               f"{resident / MIB:.0f} MiB in {budget / MIB:.0f} MiB: on the CPU")
    compute = encoder_compute_bytes(encoder, grid.n_patches, flash_attn=True)
    return VisionChoice(False, "on", grid, weights, compute, 0, resident, seconds(False), why)


VisionMode = Literal["cpu", "reserved", "borrowed"]

# A reshard of the LM (park the KV cache, free, reload, restore) beyond copying its VRAM
# weights: context and graph reserve, state copies. On an H100 the synthetic Qwen2.5-VL-7B LM
# (Q4_0, memory-mapped host weights) moved back to its 4 GiB placement in 1.02 and 1.15 s, of
# which copying ~3 GB of weights at the profile's pageable 9.2 GB/s is ~0.35 s
# (benchmarks/results/h100-vlm-borrow.json).
RESHARD_FIXED_S = 0.75


def reshard_seconds(plan: Plan, prof: Profile) -> float:
    """Predicted time to move the LM onto ``plan`` (its VRAM weights copied from the page cache
    at pageable speed; host weights stay memory-mapped, since pinning them takes seconds)."""
    rate = prof.h2d_bps(False) or prof.h2d_bps(True) or 1e10
    return RESHARD_FIXED_S + plan.vram_bytes.get("weights", 0) / rate


@dataclass(frozen=True)
class VisionPlan:
    """Where the LM and the encoder go for image turns within one budget.

    ``mode``: ``cpu`` (encoder on the CPU, the LM has the whole budget), ``reserved`` (encoder
    on the GPU beside the LM, which is planned for what it leaves) or ``borrowed`` (the LM has
    the whole budget between image turns, and moves to ``encode_lm`` while the encoder is open:
    ``Engine(encoder_room=...)``)."""

    lm: Plan
    vision: VisionChoice
    turn_s: float  # predicted: encode + the LM's turn with the image's tokens in the prompt
    alternative_s: float  # the best other mode's prediction (inf where none fits)
    mode: VisionMode = "cpu"
    encode_lm: Plan | None = None  # the LM while the encoder is open (borrowed only)
    predicted: dict[str, float] = field(default_factory=dict)  # seconds by mode

    @property
    def peak_vram(self) -> int:
        """The most VRAM it holds: the LM alone, or the LM beside the encoder."""
        beside = (self.encode_lm or self.lm).vram_bytes.get("total", 0) + self.vision.vram
        return max(self.lm.vram_bytes.get("total", 0), beside)


def _turn_s(plan: Plan) -> float:
    return plan.predicted.get("turn_s", 0.0)


def plan_with_vision(lm: ModelInventory, enc: EncoderInventory, prof: Profile,
                     budget: int | None, resolution: str | tuple[int, int] | ImageGrid,
                     wl: Workload | None = None, *, max_tokens: int = 0,
                     modes: tuple[VisionMode, ...] = ("cpu", "reserved", "borrowed"),
                     ) -> VisionPlan:
    """The mode with the shortest predicted image turn within ``budget`` (see
    :class:`VisionPlan`); every mode stays within the budget at its peak. The image's tokens
    are part of the turn's prompt.

    * ``cpu``: the encoder's time on the CPU + the LM's turn planned at the whole budget;
    * ``reserved``: the GPU encoder's time + the LM's turn planned for what it leaves (or at
      the whole budget where that plan already leaves room);
    * ``borrowed``: the GPU encoder's time + two reshards + the prompt on the smaller
      placement + the reply at the whole budget's decode speed. Host weights stay
      memory-mapped in both placements (a reshard that pins them takes seconds)."""
    wl = wl or Workload()
    grid = grid_for(enc, resolution, max_tokens)
    wl = replace(wl, prompt_tokens=wl.prompt_tokens + grid.n_tokens)
    whole = plan_for(lm, prof, budget, wl).best
    options: dict[VisionMode, VisionPlan] = {}
    cpu_vis = choose_vision(budget, whole.vram_bytes, enc, grid, False, prof=prof)
    options["cpu"] = VisionPlan(whole, cpu_vis, _turn_s(whole) + cpu_vis.encode_s, math.inf)
    if prof.gpu is not None and budget is not None:
        options.update(_gpu_options(lm, enc, prof, budget, grid, wl, whole))
    allowed = {m: o for m, o in options.items() if m in modes} or {"cpu": options["cpu"]}
    ranked = sorted(allowed.values(), key=lambda o: o.turn_s)
    best = ranked[0]
    if best.mode == "cpu" and prof.gpu is not None and budget is not None:
        need = encoder_vram(enc, grid, flash_attn_for(enc, gpu=True))
        why = (f"the GPU is predicted slower ({ranked[1].turn_s:.2f} s)" if len(ranked) > 1
               else f"with the encoder's {need / MIB:.0f} MiB on the GPU, no placement of the "
                    f"LM fits {budget / MIB:.0f} MiB")
        best = replace(best, vision=replace(best.vision, why=f"{why}: on the CPU"))
    return replace(best, alternative_s=ranked[1].turn_s if len(ranked) > 1 else math.inf,
                   predicted={o.mode: o.turn_s for o in options.values()})


def _gpu_options(lm: ModelInventory, enc: EncoderInventory, prof: Profile, budget: int,
                 grid: ImageGrid, wl: Workload, whole: Plan) -> dict[VisionMode, VisionPlan]:
    out: dict[VisionMode, VisionPlan] = {}
    if whole.uses_gpu():  # the whole budget's plan may already leave room
        direct = choose_vision(budget, whole.vram_bytes, enc, grid, True, prof=prof)
        if direct.on_gpu:
            out["reserved"] = VisionPlan(whole, direct, _turn_s(whole) + direct.encode_s,
                                         math.inf, "reserved")
            return out  # nothing to borrow
    left = budget - encoder_vram(enc, grid, flash_attn_for(enc, gpu=True))
    if left < minimum_budget(lm, prof, wl):
        return out
    beside = plan_for(lm, prof, left, wl).best
    vis = choose_vision(budget, beside.vram_bytes, enc, grid, True, prof=prof)
    if not vis.on_gpu:
        return out
    out["reserved"] = VisionPlan(beside, vis, _turn_s(beside) + vis.encode_s, math.inf,
                                 "reserved")
    # borrowed: both placements memory-mapped, one copy-compute threshold (llama.cpp reads it
    # once per process)
    mapped = replace(wl, pin_host=False)
    main = plan_for(lm, prof, budget, mapped).best
    mapped = replace(mapped, copy_min_batch=main.copy_compute_min_batch)
    small = plan_for(lm, prof, left, mapped).best
    vis_b = choose_vision(budget, small.vram_bytes, enc, grid, True, prof=prof)
    tps = main.predicted.get("decode_tps", 0.0)
    if vis_b.on_gpu and tps > 0:
        seconds = (vis_b.encode_s + small.predicted.get("ttft_s", 0.0) + wl.gen_tokens / tps
                   + reshard_seconds(small, prof) + reshard_seconds(main, prof))
        out["borrowed"] = VisionPlan(main, vis_b, seconds, math.inf, "borrowed", small)
    return out


# caps tried for an image too large for the GPU encoder in the budget (tokens per image)
TOKEN_CAPS = (3072, 2048, 1536, 1024, 768, 512, 256)


def gpu_token_cap(lm: ModelInventory, enc: EncoderInventory, prof: Profile, budget: int | None,
                  resolution: str | tuple[int, int] | ImageGrid,
                  wl: Workload | None = None) -> tuple[int, VisionPlan] | None:
    """The largest image-token cap (``vision_max_tokens``; mtmd scales the image down to it)
    at which the encoder runs on the GPU within ``budget``, with that plan; None when the
    image already goes to the GPU, there is no GPU or budget, or no cap of
    :data:`TOKEN_CAPS` fits. A smaller picture for seconds instead of a CPU encode of minutes:
    the caller decides (``igi-sdk plan`` suggests it)."""
    if prof.gpu is None or budget is None:
        return None
    if plan_with_vision(lm, enc, prof, budget, resolution, wl).vision.on_gpu:
        return None
    n_tokens = grid_for(enc, resolution).n_tokens
    for cap in (c for c in TOKEN_CAPS if c < n_tokens):
        vp = plan_with_vision(lm, enc, prof, budget, resolution, wl, max_tokens=cap)
        if vp.vision.on_gpu:
            return cap, vp
    return None
