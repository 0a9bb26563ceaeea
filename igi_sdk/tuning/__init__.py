"""Tuning to the machine: measuring its profile through llama.cpp and planning a model for it
with a dry-run check. Above ``runtime`` (it drives llama.cpp) and below the sidecar and the
CLI; the profile's data and the planner stay pure below both."""

from igi_sdk.tuning.autoplan import (
    plan_checked,
    plan_for_model,
    prepare_backend,
    with_threshold_in_effect,
)
from igi_sdk.tuning.measure import cached_before_backend, load_or_measure, measure_profile

__all__ = [
    "cached_before_backend",
    "load_or_measure",
    "measure_profile",
    "plan_checked",
    "plan_for_model",
    "prepare_backend",
    "with_threshold_in_effect",
]
