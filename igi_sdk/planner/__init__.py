"""Pipelined-sharding planner: which tensors live in VRAM and how each token tier runs."""

from igi_sdk.planner.plan import Plan, Role

__all__ = ["Plan", "Role"]
