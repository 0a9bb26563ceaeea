"""Pipelined-sharding planner: which tensors live in VRAM and how each token tier runs."""

from igi_sdk.planner.cost import decode_tps, ttft_seconds, ubatch_cost
from igi_sdk.planner.plan import FlashAttn, KvType, Plan, Role
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
    "minimum_budget",
    "plan_for",
    "planned_talkers",
    "ttft_seconds",
    "typical_prompt",
    "ubatch_cost",
    "vram_by_category",
]
