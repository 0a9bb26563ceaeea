"""The `Plan`: a complete, serialisable description of where a model's tensors live.

A plan is data. The planner produces it, the runtime applies it, and tests compare what llama.cpp
reports back against it. Everything not listed in ``gpu_tensors`` stays in host memory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from igi_sdk.model import ModelInventory

Role = Literal["gpu", "cpu"]
# What the runtime can apply (runtime.loader maps exactly these to llama.cpp's enums; a test keeps
# the two in step), so that a plan it cannot load is rejected when it is made or read, not after
# the model is already loaded.
KvType = Literal["f32", "f16", "q8_0", "q4_0"]
FlashAttn = Literal["auto", "on", "off"]

# Groups that a "weights on GPU for attention only" plan keeps in VRAM: attention projections and
# the per-layer norms that sit beside them (tiny; moving them would cost a transfer per layer).
ATTENTION_GROUPS = frozenset({"attn", "attn_norm"})
GLOBAL_SMALL_GROUPS = frozenset({"norm"})


class Plan(BaseModel):
    """Tensor placement and context settings for one model on one machine."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    gpu_tensors: tuple[str, ...] = ()
    # Layers whose KV cache and compute llama.cpp assigns to the GPU (counted from the last layer,
    # llama.cpp's `n_gpu_layers`; -1 = all layers plus the output layer).
    gpu_layers: int = -1
    kv_on_gpu: bool = True
    flash_attn: FlashAttn = "auto"
    n_ubatch: int = Field(512, ge=1, le=8192)
    # Copy-compute threshold: batches of at least this many tokens run CPU-resident weights on the
    # GPU by streaming them over PCIe (llama.cpp's GGML_OP_OFFLOAD_MIN_BATCH); smaller batches
    # (decode) compute them on the CPU.
    op_offload: bool = True
    copy_compute_min_batch: int = Field(32, ge=1)
    # Host weights: pinned (llama.cpp load_mode 0, CUDA_Host buffers, fast H2D copies) or mmap
    # (pageable, shares the page cache, loads faster).
    pinned_host: bool = False
    type_k: KvType = "f16"
    type_v: KvType = "f16"
    # Pipelined decode: CPU-resident weights the GPU computes at every batch, copied from pinned
    # host memory while the CPU computes the layers before them, so that the copy and the CPU's
    # work overlap (a llama.cpp built with igi_sdk/bundle/patches/ggml-stream-prefetch.patch;
    # the runtime names them to ggml's scheduler). Empty: every CPU-resident weight of a batch
    # under the copy-compute threshold is computed on the CPU.
    decode_streamed: tuple[str, ...] = ()
    # Filled by the planner: predicted TTFT/TPS per token tier and VRAM bytes by category.
    predicted: dict[str, float] = Field(default_factory=dict)
    vram_bytes: dict[str, int] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _streamed_from_pinned_host(self) -> Plan:
        if self.decode_streamed:
            if not (self.op_offload and self.pinned_host):
                # from pageable memory a copy cannot run beside the CPU's work
                raise ValueError("decode_streamed needs op_offload and pinned_host")
            if set(self.decode_streamed) & set(self.gpu_tensors):
                raise ValueError("a decode_streamed weight is already in gpu_tensors")
        return self

    # --- placement queries ------------------------------------------------------------------

    def role_of(self, tensor_name: str) -> Role:
        """Where one tensor goes (for many tensors, take :attr:`gpu_set` once)."""
        return "gpu" if tensor_name in self.gpu_tensors else "cpu"

    @property
    def gpu_set(self) -> frozenset[str]:
        # not cached: model_copy(update=...) would carry a stale cache into the copy
        return frozenset(self.gpu_tensors)

    @property
    def streamed_set(self) -> frozenset[str]:
        return frozenset(self.decode_streamed)

    def uses_gpu(self) -> bool:
        return (bool(self.gpu_tensors) or (self.kv_on_gpu and self.gpu_layers != 0)
                or self.op_offload)

    # --- serialisation ------------------------------------------------------------------------

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str) -> Plan:
        return cls.model_validate(json.loads(text))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        return cls.from_json(Path(path).read_text())

    # --- hand-made plans ------------------------------------------------------------------------

    @classmethod
    def all_cpu(cls) -> Plan:
        """Weights, KV and compute on the CPU: the GPU is left entirely to the game."""
        return cls(name="all-cpu", gpu_layers=0, kv_on_gpu=False, op_offload=False)

    @classmethod
    def all_gpu(cls, inventory: ModelInventory) -> Plan:
        """Every tensor in VRAM except the token embedding (llama.cpp reads it on the CPU;
        nothing streams from the host, so it stays memory-mapped rather than pinned)."""
        names = tuple(t.name for t in inventory.tensors if t.group != "token_embd")
        return cls(name="all-gpu", gpu_tensors=names)

    @classmethod
    def attention_on_gpu(cls, inventory: ModelInventory, *, with_output: bool = False) -> Plan:
        """Attention weights, norms and the whole KV cache in VRAM; FFNs/experts on the CPU.

        Decode then runs attention (the part that grows with context) on the GPU, while prefill
        streams the CPU-resident FFN weights to the GPU (copy-compute)."""
        groups = ATTENTION_GROUPS | GLOBAL_SMALL_GROUPS | ({"output"} if with_output else set())
        names = tuple(t.name for t in inventory.tensors if t.group in groups)
        return cls(
            name="attn-gpu" + ("+output" if with_output else ""),
            gpu_tensors=names,
            flash_attn="on",
            n_ubatch=2048,
            pinned_host=True,
        )


# RAM left to the rest of the machine (a game, the OS) beyond any page-locked host weights:
# locked pages cannot be swapped out, so a game growing its own memory would be pushed out first
PIN_RAM_HEADROOM = 2 * 1024**3


def pinned_host_bytes(plan: Plan, inventory: ModelInventory) -> int:
    """Host memory ``plan`` page-locks: its weights outside VRAM (0 for a mapped plan)."""
    if not plan.pinned_host:
        return 0
    gpu = plan.gpu_set
    return sum(t.n_bytes for t in inventory.tensors if t.name not in gpu)


def mapped_where_ram_is_short(plan: Plan, inventory: ModelInventory,
                              available: int | None) -> Plan:
    """``plan``, or the same placement with its host weights mapped when the RAM available now
    cannot page-lock them with :data:`PIN_RAM_HEADROOM` to spare (``available`` None: unknown,
    the plan as it is). The mapped one streams nothing at decode (a copy from pageable memory
    cannot run beside the CPU), and keeps the name: it is the same rung, slower."""
    need = pinned_host_bytes(plan, inventory)
    if not need or available is None or available >= need + PIN_RAM_HEADROOM:
        return plan
    return plan.model_copy(update={"pinned_host": False, "decode_streamed": ()})
