"""The vision encoder of an mmproj GGUF (architecture ``clip``), read from its header: the shape
hyperparameters and tensor sizes that pricing an encoder needs (planner/vision.py).

``read_inventory`` reads language models only; an mmproj has no text architecture, so it gets
this small reader over the same header parser.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from igi_sdk.model.inventory import TensorInfo, _read_header, _tensor_info

# Projectors whose image handling (dynamic resolution, 2x2 merge) planner/vision.py models, and
# mtmd's per-image token limits for them (clip.cpp: set_limit_image_tokens(8, 4096)).
QWEN_VL_PROJECTORS = frozenset({"qwen2vl_merger", "qwen2.5vl_merger", "qwen3vl_merger"})
QWEN_VL_TOKENS = (8, 4096)


@dataclass(frozen=True)
class EncoderInventory:
    """A vision tower and its projector: hyperparameters and every tensor's size."""

    path: Path | None
    projector: str
    n_layers: int
    n_embd: int
    n_head: int
    n_ff: int
    patch_size: int
    n_merge: int
    n_wa_pattern: int
    projection_dim: int
    tensors: tuple[TensorInfo, ...]
    min_tokens: int = QWEN_VL_TOKENS[0]
    max_tokens: int = QWEN_VL_TOKENS[1]

    @property
    def weight_bytes(self) -> int:
        """What mtmd puts in the encoder backend's one weight buffer (all of it)."""
        return sum(t.n_bytes for t in self.tensors)

    @property
    def head_dim(self) -> int:
        return self.n_embd // max(1, self.n_head)

    def block_weight_elements(self) -> int:
        """Matrix elements of all transformer blocks (each a matmul over every patch)."""
        return sum(t.n_elements for t in self.tensors
                   if t.name.startswith("v.blk.") and t.name.endswith(".weight")
                   and len(t.shape) == 2)

    def merger_weight_elements(self) -> int:
        """Matrix elements of the projector MLP (a matmul over every merged token)."""
        return sum(t.n_elements for t in self.tensors
                   if t.name.startswith("mm.") and t.name.endswith(".weight") and len(t.shape) == 2)

    def patch_weight_elements(self) -> int:
        """Elements of the patch embedding kernels (a matmul over every patch)."""
        return sum(t.n_elements for t in self.tensors if t.name.startswith("v.patch_embd.weight"))


def read_encoder(path: str | Path) -> EncoderInventory:
    """The encoder of an mmproj GGUF; ``ValueError`` for a file that is not a Qwen-VL-style
    vision projector (the only kind planner/vision.py prices)."""
    path = Path(path).expanduser()
    header = _read_header(path)
    kv = header.kv
    projector = str(kv.get("clip.projector_type") or kv.get("clip.vision.projector_type") or "")
    if not kv.get("clip.has_vision_encoder") or projector not in QWEN_VL_PROJECTORS:
        raise ValueError(f"{path} is not a Qwen-VL vision projector (projector {projector!r})")
    tensors = tuple(_tensor_info(n, t, dims) for n, t, dims, _ in header.tensors)

    def num(key: str, default: Any = None) -> int:
        value = kv.get(f"clip.vision.{key}", default)
        if value is None:
            raise ValueError(f"{path} lacks clip.vision.{key}")
        return int(value)

    return EncoderInventory(
        path=path,
        projector=projector,
        n_layers=num("block_count"),
        n_embd=num("embedding_length"),
        n_head=num("attention.head_count"),
        n_ff=num("feed_forward_length"),
        patch_size=num("patch_size"),
        n_merge=num("spatial_merge_size", 2),  # clip.cpp's default for Qwen 2/2.5
        n_wa_pattern=num("n_wa_pattern", 0),
        projection_dim=num("projection_dim", 0),
        tensors=tensors,
    )
