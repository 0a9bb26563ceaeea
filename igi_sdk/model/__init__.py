"""Model files: tensor inventory from GGUF metadata, synthetic models, the default model."""

from igi_sdk.model.default import default_model_path
from igi_sdk.model.inventory import (
    GROUPS,
    SUPPORTED_ARCHITECTURES,
    ArchInfo,
    ArraySummary,
    ModelInventory,
    TensorInfo,
    classify,
    kv_type_bytes,
    read_inventory,
)
from igi_sdk.model.synthetic import PRESETS, SyntheticSpec, spec_with, write_synthetic_gguf

__all__ = [
    "GROUPS",
    "PRESETS",
    "SUPPORTED_ARCHITECTURES",
    "ArchInfo",
    "ArraySummary",
    "ModelInventory",
    "SyntheticSpec",
    "TensorInfo",
    "classify",
    "default_model_path",
    "kv_type_bytes",
    "read_inventory",
    "spec_with",
    "write_synthetic_gguf",
]
