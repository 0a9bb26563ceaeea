"""The reshard state machine: the one place that decides how the model moves between plans.

    SNAPSHOT → RELEASED → MEASURED → LOADING(rung) → RESTORED
                                   ↘ (nothing loads) → UNAVAILABLE

It runs on the arbiter's thread and moves the model with the engine's two commands, ``Release``
then ``LoadFirstFitting(candidates)``; the device is read here, between them, never on the
engine thread.

1. *Snapshot and release*: the context's state is parked in host memory and the placement freed
   (model work sent meanwhile waits for the load; reservations are settled at once, so the game
   may take the memory now).
2. *Measure*: the device is read again. A game that allocates greedily (texture streaming) may
   have taken the freed memory already, so the rung to load is chosen from what is free *now*,
   never from the reading that started the reshard.
3. *Load*: the candidates are the largest rung that fits now and is no larger than the target,
   then the CPU rung. A plan larger than the target is never tried, so memory the model gave back
   is never taken again by a fallback. **A growing game is never fought**: if the budget fell
   while the model was released (the budget counts only what others use, so the game took
   memory meanwhile), the rung must fit with a margin of what the game took; and there is one
   GPU candidate only, so a failed load is followed by the CPU rung, not the next GPU rung. A
   failed load is evidence that the game is growing, and every further GPU load takes memory
   the game is reaching for (a frozen frame). The outcome says so (``contended``), and the
   arbiter grows again only after the budget has held.
4. *Restore*: the parked state is put back; sessions and active replies continue.

If even the CPU rung cannot load, the engine is left *unavailable* with its sessions parked (its
active replies end typed); the arbiter runs the machine again (from step 2) until a load
succeeds.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from igi_sdk.arbiter.ladder import PlanLadder, Rung
from igi_sdk.planner import Plan

log = logging.getLogger("igi_sdk.arbiter")


class LoadResult(Protocol):
    """What the engine's ``LoadFirstFitting`` answers (``runtime.engine_ops.LoadOutcome``)."""

    @property
    def landed(self) -> str | None: ...

    @property
    def failures(self) -> tuple[tuple[str, str], ...]: ...


class ReshardOps(Protocol):
    """The engine's two reshard commands, waited for (the arbiter's ``EngineSteps``)."""

    @property
    def loaded(self) -> bool: ...

    @property
    def standby(self) -> bool:
        """Whether the engine keeps its CPU placement open beside a GPU one: a release then
        moves the sessions onto it (they keep decoding) and a load runs behind them."""
        ...

    def release(self) -> None: ...

    def load_first_fitting(self, plans: Sequence[Plan],
                           give_up: Callable[[], bool] | None = None) -> LoadResult:
        """``give_up``: asked while a placement loads behind the decode; True cancels it."""
        ...


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
    waited_for_settle: bool = False  # landed on the CPU rung: the game's use was still moving


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
        *,
        current: Rung | None = None,
        settled: Callable[[], bool] | None = None,
        loading: Callable[[Rung | None], None] | None = None,
    ) -> None:
        """``current``: the rung the engine is on (make-before-break needs its VRAM);
        ``settled``: whether the game's use has stopped moving (no GPU placement loads into
        memory the game is still claiming; None: always)."""
        self.ladder, self.target = ladder, target
        self.budget_now, self.on_released, self.clock = budget_now, on_released, clock
        self.current, self.settled = current, settled
        # told the rung loading behind the decode (the arbiter counts its VRAM as its own)
        self.loading = loading or (lambda _rung: None)

    def candidates(self, budget: int | None, game_took: int = 0) -> list[Rung]:
        """What to try, in order: the largest rung no larger than the target or what is free
        now (less a margin of what the game took while the model was released), then the CPU
        rung (it holds only the GPU's fixed share). One GPU rung at most: a failed load says
        the game is growing."""
        ceiling = self.target.vram if budget is None else min(self.target.vram,
                                                              budget - game_took)
        fits = [r for r in self.ladder.rungs if r.vram <= ceiling and r is not self.ladder.cpu]
        return [*fits[-1:], self.ladder.cpu]

    def __call__(self, ops: ReshardOps) -> ReshardOutcome:
        if ops.standby:
            return self._behind(ops)
        return self._stop_the_world(ops)

    def _released(self, out: ReshardOutcome) -> None:
        if self.on_released is not None and out.released_s is not None:
            try:
                self.on_released()
            except Exception:  # a listener must not stop the reshard
                log.exception("on_released failed")

    def make_before_break(self, budget: int | None) -> bool:
        """Whether the target can load beside the current GPU placement (a grow the VRAM
        holds both for: the sessions keep decoding on the GPU). Both rungs count the GPU's
        fixed share, which the process holds once."""
        cur, cpu = self.current, self.ladder.cpu
        if cur is None or cur is cpu or budget is None or self.target.vram <= cur.vram:
            return False
        return cur.vram + self.target.vram - cpu.vram <= budget

    def _behind(self, ops: ReshardOps) -> ReshardOutcome:
        """With a standby: give the GPU placement back first (the sessions move onto the CPU
        placement and keep decoding), then, once the game's use has settled, load the rung
        that fits behind the decode; a load the game grows into is given up."""
        t0 = self.clock()
        out = ReshardOutcome(self.target, None)
        cpu = self.ladder.cpu
        before = self.budget_now()
        if self.current is not cpu and not self.make_before_break(before):
            out.states.append("released")
            ops.release()
            out.released_s = self.clock() - t0
            self._released(out)
        after = out.budget_after_release = self.budget_now()
        out.states.append("measured")
        if out.released_s is not None and before is not None and after is not None:
            took = before - after
            if took > self.GROWTH_TOLERANCE:
                out.game_took, out.contended = took, True
        candidates = [cpu] if self.target is cpu else self.candidates(after, out.game_took)
        if candidates[0] is not cpu and self.settled is not None and not self.settled():
            out.waited_for_settle = True  # the game is still claiming: load nothing now
            candidates = [cpu]
        rung = candidates[0]

        def give_up() -> bool:  # the game grew into the memory this rung is taking
            budget = self.budget_now()
            return budget is not None and budget + self.GROWTH_TOLERANCE < rung.vram

        out.states.append(f"loading:{rung.plan.name}")
        if rung is not cpu:
            self.loading(rung)
        try:
            result = ops.load_first_fitting([r.plan for r in candidates],
                                            None if rung is cpu else give_up)
        finally:
            self.loading(None)
        failed = {name for name, _ in result.failures}
        out.landed = next((r for r in candidates if r.plan.name == result.landed
                           and r.plan.name not in failed), None)
        out.failures = list(result.failures)
        for name, error in result.failures:
            log.warning("loading plan '%s' failed: %s", name, error)
        if out.failures:
            out.contended = True
        out.states.append("restored" if out.landed is not None else "unavailable")
        out.seconds = self.clock() - t0
        return out

    def _stop_the_world(self, ops: ReshardOps) -> ReshardOutcome:
        t0 = self.clock()
        out = ReshardOutcome(self.target, None)
        before = self.budget_now() if ops.loaded else None
        if ops.loaded:
            out.states.append("snapshot")
            ops.release()
            out.states.append("released")
            out.released_s = self.clock() - t0
        try:
            if self.on_released is not None and out.released_s is not None:
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
            candidates = self.candidates(after, out.game_took)
        except BaseException:  # the engine holds model work until a load: never leave it so
            ops.load_first_fitting([self.ladder.cpu.plan])
            raise
        result = ops.load_first_fitting([r.plan for r in candidates])
        failed = {name for name, _ in result.failures}
        for rung in candidates:
            out.states.append(f"loading:{rung.plan.name}")
            if rung.plan.name == result.landed and rung.plan.name not in failed:
                out.landed = rung
                out.states.append("restored")
                break
        out.failures = list(result.failures)
        for name, error in result.failures:
            log.warning("loading plan '%s' failed: %s", name, error)
        if out.failures:
            out.contended = True
        if out.landed is None:
            out.states.append("unavailable")
        out.seconds = self.clock() - t0
        return out
