"""VRAM arbiter: the game's live VRAM use → a budget → the plan to run, resharded between frames."""

from igi_sdk.arbiter.arbiter import Arbiter, ReshardRecord
from igi_sdk.arbiter.ladder import PlanLadder, Rung
from igi_sdk.arbiter.policy import BudgetPolicy, Decision, PolicyConfig, Reservation
from igi_sdk.arbiter.sources import (
    EngineReportSource,
    NvmlSource,
    ScriptedTrace,
    VramReading,
    VramSource,
)

__all__ = [
    "Arbiter",
    "BudgetPolicy",
    "Decision",
    "EngineReportSource",
    "NvmlSource",
    "PlanLadder",
    "PolicyConfig",
    "Reservation",
    "ReshardRecord",
    "Rung",
    "ScriptedTrace",
    "VramReading",
    "VramSource",
]
