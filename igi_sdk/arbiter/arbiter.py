"""The arbiter loop: read VRAM sources, ask the policy, reshard the engine at safe points.

It runs on its own thread so that neither the game's frame (the socket thread answering
``frame``) nor the decode loop waits for a decision; the reshard itself happens on the engine
thread between decode steps (``Engine.reshard``), so a stream only pauses for its duration.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from igi_sdk.arbiter.ladder import PlanLadder
from igi_sdk.arbiter.policy import BudgetPolicy, Decision, PolicyConfig, Reservation
from igi_sdk.arbiter.sources import EngineReportSource, VramReading, VramSource
from igi_sdk.errors import IgiError

log = logging.getLogger("igi_sdk.arbiter")


@dataclass(frozen=True)
class ReshardRecord:
    at: float
    action: str
    plan: str
    vram: int
    seconds: float
    reason: str
    ok: bool
    released_s: float | None = None  # when the old plan's memory was free (from the start)


class Arbiter:
    def __init__(
        self,
        engine: Any,
        ladder: PlanLadder,
        sources: list[VramSource],
        *,
        config: PolicyConfig | None = None,
        period_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.ladder = ladder
        self.sources = sources
        start = ladder.best_within(0)
        for r in ladder.rungs:  # the rung the engine is on now, if the ladder has it
            if r.plan.gpu_tensors == engine.plan.gpu_tensors and r.plan.name == engine.plan.name:
                start = r
        self.policy = BudgetPolicy(ladder, config or PolicyConfig(), current=start)
        self.period_s = period_s
        self.clock = clock
        self.frame = 0
        self.decisions: deque[dict[str, Any]] = deque(maxlen=256)
        self.reshards: deque[ReshardRecord] = deque(maxlen=256)
        self.last_budget: int | None = None
        self._waiters: list[tuple[Reservation, Callable[[Reservation], None]]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None

    # --- inputs (any thread) ------------------------------------------------------------------

    def on_frame(self, frame: int, vram_used: int | None = None,
                 vram_budget: int | None = None, frame_time_ms: float | None = None,
                 target_ms: float | None = None) -> None:
        self.frame = max(self.frame, frame)
        if frame_time_ms is not None:
            with self._lock:
                self.policy.note_frame(frame_time_ms, target_ms, self.clock())
        for s in self.sources:
            if isinstance(s, EngineReportSource):
                s.report(vram_used, vram_budget)
        self._wake.set()

    def reserve(self, nbytes: int, deadline_frames: int,
                on_ack: Callable[[Reservation], None]) -> Reservation:
        """Ask for VRAM for the game; ``on_ack`` runs (on the arbiter thread) once it is free."""
        reading = self._reading()
        with self._lock:
            res = self.policy.reserve(nbytes, deadline_frames, self.frame,
                                      reading or VramReading(0, 0, 0, "none", self.clock()))
            self._waiters.append((res, on_ack))
        self._wake.set()
        return res

    # --- loop ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="igi-arbiter", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("arbiter tick failed")
            self._wake.wait(self.period_s)
            self._wake.clear()

    def _reading(self) -> VramReading | None:
        """The most conservative reading (smallest budget) of all sources that answer: never
        trust one source alone (per-process figures are missing under WDDM, say)."""
        readings = [r for s in self.sources if (r := s.read()) is not None]
        if not readings:
            return None
        return min(readings, key=self.policy.budget)

    def tick(self) -> Decision | None:
        """One decision, executed at once; returns it (None without any reading)."""
        reading = self._reading()
        if reading is None:
            return None
        with self._lock:
            decision = self.policy.decide(reading, self.frame, self.clock())
        self.last_budget = decision.budget
        if decision.action != "stay":
            self._apply(decision)  # acknowledges reservations as soon as the old plan is freed
            if decision.action == "fast_shrink":  # then straight to the best rung that fits
                again = self._reading()
                if again is not None:
                    with self._lock:
                        follow = self.policy.decide(again, self.frame, self.clock())
                    if follow.action != "stay":
                        self._apply(follow)
        self._notify_acks()
        return decision

    def _apply(self, d: Decision) -> None:
        t0 = self.clock()
        ok = True
        released: list[float] = []

        def on_released() -> None:  # the old plan's VRAM is free: the game may take it now
            released.append(self.clock() - t0)
            reading = self._reading()
            if reading is not None:
                with self._lock:
                    self.policy.acknowledge(reading, self.clock())
                self._notify_acks()

        try:
            self.engine.reshard(d.target.plan, on_released=on_released)
            self.policy.applied(d.target)
        except IgiError as e:
            ok = False
            log.warning("reshard to %s failed (%s); falling back to the CPU plan",
                        d.target.plan.name, e)
            self.engine.reshard(self.ladder.cpu.plan)
            self.policy.applied(self.ladder.cpu)
        rec = ReshardRecord(time.time(), d.action, d.target.plan.name, d.target.vram,
                            self.clock() - t0, d.reason, ok,
                            released[0] if released else None)
        self.reshards.append(rec)
        self.decisions.append({"at": rec.at, "action": d.action, "budget": d.budget,
                               "plan": rec.plan, "vram": rec.vram, "reason": d.reason,
                               "source": d.reading.source if d.reading else None,
                               "seconds": rec.seconds, "released_s": rec.released_s,
                               "ok": ok})
        log.info("%s -> %s (%d MiB) in %.3f s: %s", d.action, rec.plan, rec.vram >> 20,
                 rec.seconds, d.reason)

    def _notify_acks(self) -> None:
        with self._lock:
            done = [(r, cb) for r, cb in self._waiters if r.acknowledged]
            self._waiters = [(r, cb) for r, cb in self._waiters if not r.acknowledged]
        for res, cb in done:
            cb(res)

    def stats(self) -> dict[str, Any]:
        cur = self.policy.current
        return {
            "budget": self.last_budget,
            "plan": cur.plan.name if cur else None,
            "plan_vram": cur.vram if cur else None,
            "rungs": len(self.ladder.rungs),
            "reshards": len(self.reshards),
            "reshard_seconds": [round(r.seconds, 4) for r in list(self.reshards)[-16:]],
            "pending_reservations": sum(1 for r in self.policy.reservations
                                        if not r.acknowledged),
            "yielding_gpu": self.policy.yielding(self.clock()),
            "decisions": list(self.decisions)[-8:],
        }
