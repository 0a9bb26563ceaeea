"""Pipelined-sharding planner: which tensors live in VRAM and how each token tier runs."""

from igi_sdk.planner.cost import decode_tps, ttft_seconds, ubatch_cost
from igi_sdk.planner.plan import (
    PIN_RAM_HEADROOM,
    FlashAttn,
    KvType,
    Plan,
    Role,
    mapped_where_ram_is_short,
    pinned_host_bytes,
)
from igi_sdk.planner.planner import (
    Candidate,
    PlanResult,
    Workload,
    batch_threshold,
    compute_buffer_estimate,
    copy_threshold,
    minimum_budget,
    plan_for,
    planned_talkers,
    typical_prompt,
    vram_by_category,
)

__all__ = [
    "PIN_RAM_HEADROOM",
    "Candidate",
    "FlashAttn",
    "KvType",
    "Plan",
    "PlanResult",
    "Role",
    "Workload",
    "batch_threshold",
    "compute_buffer_estimate",
    "copy_threshold",
    "decode_tps",
    "mapped_where_ram_is_short",
    "minimum_budget",
    "pinned_host_bytes",
    "plan_for",
    "planned_talkers",
    "ttft_seconds",
    "typical_prompt",
    "ubatch_cost",
    "vram_by_category",
]
