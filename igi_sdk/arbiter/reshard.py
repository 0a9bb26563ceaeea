"""The reshard state machine: the one place that decides how the model moves between plans.

    SNAPSHOT → RELEASED → MEASURED → LOADING(rung) → RESTORED
                                   ↘ (every rung failed) → UNAVAILABLE

1. *Snapshot and release*: the context's state is parked in host memory and the placement freed.
2. *Measure*: the device is read again. A game that allocates greedily (texture streaming) may
   have taken the freed memory already, so the rung to load is chosen from what is free *now*,
   never from the reading that started the reshard.
3. *Load*: the largest rung that fits now and is no larger than the target. A plan larger than
   the target is never tried, so memory the model gave back is never taken again by a fallback.
   **A growing game is never fought**: if the budget fell while the model was released (the
   budget counts only what others use, so the game took memory meanwhile), the rung must fit
   with a margin of what the game took; and if a load fails, the next try is the CPU rung, not
   the next GPU rung. A failed load is evidence that the game is growing, and every further
   GPU load takes memory the game is reaching for (a frozen frame). The outcome says so
   (``contended``), and the arbiter grows again only after the budget has held.
4. *Restore*: the parked state is put back; sessions and active replies continue.

If even the CPU rung cannot load, the engine is left *unavailable* with its sessions parked; the
arbiter runs the machine again (from step 2) until a load succeeds. The machine runs on the
engine thread (``Engine.exclusive``), so nothing decodes while the model moves.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from igi_sdk.arbiter.ladder import PlanLadder, Rung
from igi_sdk.errors import EngineUnavailableError, IgiError
from igi_sdk.planner import Plan

log = logging.getLogger("igi_sdk.arbiter")


class ReshardOps(Protocol):
    """The engine's low-level steps (``igi_sdk.runtime.engine.EngineOps``)."""

    @property
    def loaded(self) -> bool: ...

    def park_and_release(self) -> None: ...

    def load_and_restore(self, plan: Plan) -> None: ...

    def fail_active(self, error: IgiError) -> None: ...


@dataclass
class ReshardOutcome:
    target: Rung
    landed: Rung | None  # None: nothing loaded, the engine is unavailable
    states: list[str] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)  # (plan, error)
    released_s: float | None = None  # from the start until the old placement was freed
    budget_after_release: int | None = None
    seconds: float = 0.0
    game_took: int = 0  # bytes the game took while the model was released
    contended: bool = False  # the game was growing: a load failed, or it took freed memory


class ReshardMachine:
    """One reshard toward ``target``; call it with the engine's ops on the engine thread."""

    # a budget that fell this much while the model was released is a game that grew (below
    # it: NVML page rounding, the driver's own allocations)
    GROWTH_TOLERANCE = 64 << 20

    def __init__(
        self,
        ladder: PlanLadder,
        target: Rung,
        budget_now: Callable[[], int | None],
        on_released: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ladder, self.target = ladder, target
        self.budget_now, self.on_released, self.clock = budget_now, on_released, clock

    def candidates(self, budget: int | None, game_took: int = 0) -> list[Rung]:
        """Rungs to try, largest first: no larger than the target or what is free now (less a
        margin of what the game took while the model was released); the CPU rung always last
        (it holds only the GPU's fixed share)."""
        ceiling = self.target.vram if budget is None else min(self.target.vram,
                                                              budget - game_took)
        out = [r for r in reversed(self.ladder.rungs)
               if r.vram <= ceiling and r is not self.ladder.cpu]
        return [*out, self.ladder.cpu]

    def __call__(self, ops: ReshardOps) -> ReshardOutcome:
        t0 = self.clock()
        out = ReshardOutcome(self.target, None)
        before = self.budget_now() if ops.loaded else None
        if ops.loaded:
            out.states.append("snapshot")
            ops.park_and_release()
            out.states.append("released")
            out.released_s = self.clock() - t0
            if self.on_released is not None:
                try:
                    self.on_released()
                except Exception:  # a listener must not stop the reshard
                    log.exception("on_released failed")
        after = out.budget_after_release = self.budget_now()
        out.states.append("measured")
        if before is not None and after is not None:
            took = before - after
            if took > self.GROWTH_TOLERANCE:
                out.game_took, out.contended = took, True
        for rung in self.candidates(after, out.game_took):
            if out.failures and rung is not self.ladder.cpu:
                continue  # one failed load says the game is growing: the CPU rung next
            out.states.append(f"loading:{rung.plan.name}")
            try:
                ops.load_and_restore(rung.plan)
            except IgiError as e:
                log.warning("loading plan '%s' (%d MiB) failed: %s", rung.plan.name,
                            rung.vram >> 20, e)
                out.failures.append((rung.plan.name, e.message))
                out.contended = True
                continue
            out.states.append("restored")
            out.landed = rung
            break
        else:
            out.states.append("unavailable")
            ops.fail_active(EngineUnavailableError(
                "no placement of the model fits the memory that is free now; the conversation "
                "is kept — send the line again shortly"))
        out.seconds = self.clock() - t0
        return out
