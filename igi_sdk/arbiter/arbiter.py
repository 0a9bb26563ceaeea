"""The arbiter loop: read VRAM sources, ask the policy, run the reshard state machine.

It runs on its own thread so that neither the game's frame (the socket thread answering
``frame``) nor the decode loop waits for a decision. The reshard itself
(:class:`~igi_sdk.arbiter.reshard.ReshardMachine`) runs here too and moves the model with the
engine's two commands (``Release``, ``LoadFirstFitting``), which the engine runs between
decode steps, so a stream only pauses for their duration; VRAM sources are read and
reservations settled on this thread, never on the engine's. Every reservation ends with a
typed outcome: granted once the VRAM is free, :class:`CannotFreeError` when the model is on its
CPU plan and the memory is still held by others, :class:`DeadlineMissedError` past its time
limit.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from igi_sdk import threads
from igi_sdk.arbiter.ladder import PlanLadder, Rung
from igi_sdk.arbiter.policy import BudgetPolicy, Decision, PolicyConfig, Reservation
from igi_sdk.arbiter.reshard import LoadResult, ReshardMachine, ReshardOutcome
from igi_sdk.arbiter.sources import EngineReportSource, NvmlSource, VramReading, VramSource
from igi_sdk.errors import CannotFreeError, DeadlineMissedError, IgiError
from igi_sdk.planner import Plan

if TYPE_CHECKING:  # the engine's outcome type, for the type checker (no llama.cpp at import)
    from igi_sdk.runtime.engine_ops import LoadOutcome

log = logging.getLogger("igi_sdk.arbiter")

# what a reservation's waiter is told: None = granted, else the error that ended it
ReservationDone = Callable[[Reservation, IgiError | None], None]
# decisions that give VRAM back: a speculative draft model is dropped before the model moves
_GIVES_BACK = frozenset({"shrink", "fast_shrink", "yield"})


class ReshardableEngine(Protocol):
    """What the arbiter needs of the engine (``igi_sdk.runtime.Engine``)."""

    @property
    def plan(self) -> Plan: ...

    @property
    def state(self) -> str:
        """"ready" | "moving" | "unavailable" | "closed"."""
        ...

    @property
    def loaded(self) -> bool: ...

    @property
    def last_load_s(self) -> float | None:
        """Seconds the last placement took to load (None: not measured)."""
        ...

    @property
    def standby_ready(self) -> bool:
        """Whether the engine's CPU placement is open beside a GPU one."""
        ...

    def cancel_load(self) -> bool:
        """Give up the placement loading behind the decode (any thread)."""
        ...

    def release_async(self) -> Future[None]: ...

    def load_first_fitting_async(self, candidates: Sequence[Plan]) -> Future[LoadOutcome]: ...

    def drop_draft_async(self) -> Future[bool]:
        """Free the speculative draft model, if one is loaded (True: it was)."""
        ...

    def restore_draft_async(self) -> Future[bool]:
        """Load the draft model dropped under pressure again (True: it was)."""
        ...


class EngineSteps:
    """The engine's two reshard commands as the state machine's blocking steps (arbiter
    thread: it waits while the engine thread runs them)."""

    def __init__(self, engine: ReshardableEngine, poll_s: float = 0.025,
                 between: Callable[[], None] | None = None,
                 while_releasing: Callable[[], None] | None = None,
                 release_poll_s: float = 0.002) -> None:
        """``poll_s``: how often a load behind the decode is checked; ``between``: run at
        each check (the arbiter settles reservations meanwhile); ``while_releasing``: run
        every ``release_poll_s`` while a release is in flight (the arbiter grants what the
        driver already shows free)."""
        self._engine, self._poll_s, self._between = engine, poll_s, between
        self._while_releasing, self._release_poll_s = while_releasing, release_poll_s

    @property
    def loaded(self) -> bool:
        return self._engine.loaded

    @property
    def standby(self) -> bool:
        return self._engine.standby_ready

    def release(self) -> None:
        fut = self._engine.release_async()
        if self._while_releasing is None:
            fut.result()
            return
        while True:
            try:
                fut.result(timeout=self._release_poll_s)
                return
            except FutureTimeout:
                self._while_releasing()

    def load_first_fitting(self, plans: Sequence[Plan],
                           give_up: Callable[[], bool] | None = None) -> LoadResult:
        fut = self._engine.load_first_fitting_async(plans)
        cancelled = False
        while True:
            try:
                return fut.result(timeout=self._poll_s)
            except FutureTimeout:
                pass
            if self._between is not None:
                self._between()
            if not cancelled and give_up is not None and give_up():
                cancelled = self._engine.cancel_load()
                if cancelled:
                    log.info("gave up the placement loading behind the decode: the game "
                             "grew into its memory")


@dataclass(frozen=True)
class ReshardRecord:
    at: float
    action: str
    plan: str  # the plan it landed on ("" when none could load)
    vram: int
    seconds: float
    reason: str
    ok: bool  # landed on the target
    released_s: float | None = None  # when the old plan's memory was free (from the start)
    target: str = ""
    failures: tuple[tuple[str, str], ...] = ()
    budget_after_release: int | None = None


class Arbiter:
    def __init__(
        self,
        engine: ReshardableEngine,
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
        if engine.last_load_s is not None:  # the first load prices the first grow
            self.policy.cost.note(engine.last_load_s)
        self.period_s = period_s
        self.clock = clock
        self.frame = 0
        self.decisions: deque[dict[str, Any]] = deque(maxlen=256)
        self.reshards: deque[ReshardRecord] = deque(maxlen=256)
        self.grants: deque[float] = deque(maxlen=64)  # seconds from reserve to granted
        self.last_budget: int | None = None
        self.unavailable = engine.state == "unavailable"
        self.contended = False  # the last reshard found the game growing
        self.loading: Rung | None = None  # the rung loading behind the decode, if any
        self._next_recovery = 0.0
        self._recovery_wait = 0.5
        self._waiters: list[tuple[Reservation, ReservationDone]] = []
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

    def reserve(self, nbytes: int, deadline_frames: int, on_done: ReservationDone) -> Reservation:
        """Ask for VRAM for the game; ``on_done`` runs (on the arbiter thread) exactly once."""
        asked = self.clock()
        reading = self._reading()
        with self._lock:
            res = self.policy.reserve(nbytes, deadline_frames, self.frame,
                                      reading or VramReading(0, 0, 0, "none", asked), asked)
            self._waiters.append((res, on_done))
        self._wake.set()
        return res

    def adopt(self, waiters: list[tuple[Reservation, ReservationDone]]) -> None:
        """Take over reservations a previous arbiter had not settled (a new model loaded)."""
        reading = self._reading()
        with self._lock:
            for res, cb in waiters:
                fresh = self.policy.reserve(res.nbytes, 0, self.frame, reading or VramReading(
                    0, 0, 0, "none", self.clock()), self.clock())
                fresh.expires_at = res.expires_at
                self._waiters.append((fresh, cb))
        self._wake.set()

    # --- loop ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=threads.ARBITER, daemon=True)
        self._thread.start()

    def stop(self) -> list[tuple[Reservation, ReservationDone]]:
        """Stop the loop; returns the reservations still waiting (for :meth:`adopt`)."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=60)
        with self._lock:
            left, self._waiters = self._waiters, []
        return left

    # between two readings, the driver's free memory is watched this often (one cheap NVML
    # call), and a fall of this much ends the wait: a game that grabs its memory at once is
    # seen within a few milliseconds instead of at the next reading (up to 25 ms later)
    WATCH_S = 0.004
    WATCH_DROP = 32 * 1024 * 1024

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:
                log.exception("arbiter tick failed")
            self._wait_for_change()
            self._wake.clear()

    def _device_free(self) -> int | None:
        figures = [f for s in self.sources if isinstance(s, NvmlSource)
                   if (f := s.device_free()) is not None]
        return min(figures) if figures else None

    def _wait_for_change(self) -> None:
        """Until the next reading is due, or sooner: a wake (a reservation, a frame report) or
        memory taken on the device (the driver's figure, where there is one)."""
        base = self._device_free()
        if base is None:
            self._wake.wait(self.period_s)
            return
        end = time.monotonic() + self.period_s
        while not self._wake.wait(min(self.WATCH_S, max(0.0, end - time.monotonic()))):
            if time.monotonic() >= end:
                return
            free = self._device_free()
            if free is not None and free < base - self.WATCH_DROP:
                return  # someone is allocating: read and decide now

    def _reading(self) -> VramReading | None:
        """The most conservative reading (smallest budget) of all sources that answer: never
        trust one source alone (per-process figures are missing under WDDM, say)."""
        threads.refuse(threads.ENGINE, "reading VRAM sources")
        readings = [r for s in self.sources if (r := s.read()) is not None]
        if not readings:
            return None
        return min(readings, key=self.policy.budget)

    def own_vram(self) -> int:
        """This process's VRAM by the arbiter's own accounting (where the OS has no
        per-process figure): the plan it runs, plus the one loading behind the decode (its
        allocations are not the game's). Any thread."""
        cur, loading = self.policy.current, self.loading
        own = cur.vram if cur is not None else 0
        if loading is not None:
            own += loading.vram - self.ladder.cpu.vram  # the GPU's fixed share is held once
        return own

    def _settled(self) -> bool:
        """Whether the game's use has stopped moving (no GPU placement loads before), and no
        reservation is granted that the game has not taken yet (it is about to allocate)."""
        reading = self._reading()
        with self._lock:
            if reading is not None:
                self.policy.trend.note(self.clock(), reading.others)
            return self.policy.trend.settled(self.clock()) and not self.policy.acknowledged()

    def _budget_now(self) -> int | None:
        reading = self._reading()
        return None if reading is None else self.policy.budget(reading)

    def tick(self) -> Decision | None:
        """One decision, executed at once; returns it (None without any reading)."""
        reading = self._reading()
        if reading is None:
            self._settle(None)
            return None
        if self.unavailable or self.engine.state == "unavailable":
            self._recover(reading)
            self._settle(self._reading())
            return None
        with self._lock:
            decision = self.policy.decide(reading, self.frame, self.clock())
        self.last_budget = decision.budget
        if decision.action != "stay":
            self._apply(decision)  # acknowledges reservations as soon as the old plan is freed
            if decision.action == "fast_shrink" and not self.unavailable and not self.contended:
                again = self._reading()  # then straight to the best rung that fits
                if again is not None:
                    with self._lock:
                        follow = self.policy.decide(again, self.frame, self.clock())
                    if follow.action != "stay":
                        self._apply(follow)
        self._settle(self._reading())
        return decision

    def _recover(self, reading: VramReading) -> None:
        """No placement is loaded: try again, from what fits now, with a growing pause."""
        now = self.clock()
        if now < self._next_recovery:
            return
        budget = self.policy.budget(reading)
        target = self.ladder.best_within(budget)
        d = Decision("recover", target, budget, "no placement is loaded", reading)
        self._apply(d)
        if self.unavailable:
            self._recovery_wait = min(15.0, self._recovery_wait * 2)
            self._next_recovery = self.clock() + self._recovery_wait
        else:
            self._recovery_wait = 0.5

    def _apply(self, d: Decision) -> None:
        def on_released() -> None:  # the old plan's VRAM is free: the game may take it now
            with self._lock:  # what the model holds now (the standby's share, or less): the
                # arbiter's own accounting must show the release where the OS cannot
                self.policy.applied(self.ladder.cpu)
            self._settle(self._reading())

        if d.action in _GIVES_BACK:
            self._drop_draft()

        def loading(rung: Rung | None) -> None:
            self.loading = rung

        machine = ReshardMachine(self.ladder, d.target, self._budget_now, on_released,
                                 clock=self.clock, current=self.policy.current,
                                 settled=self._settled, loading=loading)
        steps = EngineSteps(self.engine, min(self.period_s, 0.025),
                            between=lambda: self._settle(self._reading()),
                            while_releasing=self._grant_what_is_free)
        try:
            out: ReshardOutcome = machine(steps)
        finally:
            self.loading = None
        self.contended = out.contended
        if out.landed is not None and out.landed is not self.ladder.cpu and not out.failures:
            self.policy.cost.note(out.seconds)  # what the next grow must pay back
        if out.contended:  # the game is growing: grow back only once the budget has held
            with self._lock:
                self.policy.hold_growth()
        self.unavailable = out.landed is None
        # on no placement the model holds only what the CPU rung holds: the GPU's fixed share
        self.policy.applied(out.landed or self.ladder.cpu)
        if d.action not in _GIVES_BACK and out.landed not in (None, self.ladder.cpu):
            self._restore_draft()  # every GPU rung counts the draft's VRAM
        rec = ReshardRecord(time.time(), d.action, out.landed.plan.name if out.landed else "",
                            out.landed.vram if out.landed else 0, out.seconds, d.reason,
                            out.landed is d.target, out.released_s, d.target.plan.name,
                            tuple(out.failures), out.budget_after_release)
        self.reshards.append(rec)
        self.decisions.append({"at": rec.at, "action": d.action, "budget": d.budget,
                               "target": rec.target, "plan": rec.plan, "vram": rec.vram,
                               "reason": d.reason,
                               "source": d.reading.source if d.reading else None,
                               "seconds": rec.seconds, "released_s": rec.released_s,
                               "ok": rec.ok, "failures": [f[0] for f in rec.failures],
                               "game_took": out.game_took, "contended": out.contended,
                               "waited_for_settle": out.waited_for_settle})
        log.info("%s -> %s (%d MiB; target %s) in %.3f s: %s", d.action, rec.plan or "nothing",
                 rec.vram >> 20, rec.target, rec.seconds, d.reason)

    def _drop_draft(self) -> None:
        """The draft model only speeds decoding up: it is the first thing to go under VRAM
        pressure (and comes back with the VRAM: ``_restore_draft``). Not waited for: the engine
        runs its commands in order, so the draft is gone before the release that follows, and
        waiting would cost the game a whole decode step (the engine starts the next one
        between the two commands)."""
        def told(fut: Future[bool]) -> None:
            if not fut.cancelled() and fut.exception() is None and fut.result():
                log.info("dropped the speculative draft model (VRAM pressure)")

        self.engine.drop_draft_async().add_done_callback(told)

    def _restore_draft(self) -> None:
        """VRAM came back (a grow, a recovery onto a GPU rung): load the draft dropped under
        pressure again. Its sessions' draft caches catch up as they decode."""
        try:
            if self.engine.restore_draft_async().result():
                log.info("loaded the speculative draft model again (VRAM is back)")
        except IgiError as e:  # it did not fit after all: decoding goes on without it
            log.warning("could not load the draft model again: %s", e)

    def _grant_what_is_free(self) -> None:
        """While a placement closes: grant each waiting reservation the driver already shows
        free. llama.cpp frees a placement's VRAM early in closing it and then spends longer
        on host memory (unpinning pages, the vocabulary, unmapping the file: 15-45 ms of an
        8B's close on an H200 host, benchmarks/release_cost.py), so the game hears at the
        moment the memory is free rather than when the close returns. Only a driver figure
        can tell (NVML); the other sources see the release once the engine reports it."""
        if not self._waiters:
            return
        free = self._device_free()
        if free is None:
            return
        now = self.clock()
        with self._lock:
            self.policy.acknowledge_free(free, now)
        self._end_acknowledged()

    def _end_acknowledged(self) -> None:
        with self._lock:
            done = [(res, cb) for res, cb in self._waiters if res.acknowledged]
            self._waiters = [(res, cb) for res, cb in self._waiters if not res.acknowledged]
        for res, cb in done:
            self._note_grant(res)
            try:
                cb(res, None)
            except Exception:
                log.exception("reservation callback failed")

    def _note_grant(self, res: Reservation) -> None:
        if res.asked_at is not None and res.acked_at is not None:
            self.grants.append(round(res.acked_at - res.asked_at, 4))

    def _settle(self, reading: VramReading | None) -> None:
        """End every reservation that can end now: granted, cannot_free or deadline_missed."""
        threads.refuse(threads.ENGINE, "settling reservations")
        now = self.clock()
        done: list[tuple[Reservation, ReservationDone, IgiError | None]] = []
        with self._lock:
            if reading is not None:
                self.policy.acknowledge(reading, now)
            on_cpu = self.policy.current is self.ladder.cpu
            keep = []
            for res, cb in self._waiters:
                if res.acknowledged:
                    done.append((res, cb, None))
                elif on_cpu and reading is not None and reading.total - reading.used < res.nbytes:
                    self.policy.drop(res)
                    done.append((res, cb, CannotFreeError(
                        f"only {(reading.total - reading.used) >> 20} MiB can be free: the model "
                        f"is on its CPU plan and the rest is held by other processes")))
                elif res.expires_at is not None and now >= res.expires_at:
                    self.policy.drop(res)
                    done.append((res, cb, DeadlineMissedError(
                        f"{res.nbytes >> 20} MiB were not free in time; ask again")))
                else:
                    keep.append((res, cb))
            self._waiters = keep
        for res, cb, err in done:
            if err is None:
                self._note_grant(res)
            try:
                cb(res, err)
            except Exception:
                log.exception("reservation callback failed")

    def stats(self) -> dict[str, Any]:
        cur = self.policy.current
        return {
            "budget": self.last_budget,
            "plan": cur.plan.name if cur and not self.unavailable else None,
            "plan_vram": cur.vram if cur else None,
            "unavailable": self.unavailable,
            "rungs": len(self.ladder.rungs),
            # rungs whose host weights are page-locked (serve --host-weights): each reload
            # copies them, and a pipelined decode streams them
            "pinned_rungs": sum(r.plan.pinned_host for r in self.ladder.rungs),
            "reshards": len(self.reshards),
            "reshard_seconds": [round(r.seconds, 4) for r in list(self.reshards)[-16:]],
            "pending_reservations": len(self._waiters),
            "grant_seconds": list(self.grants)[-16:],
            "yielding_gpu": self.policy.yielding(self.clock()),
            "decisions": list(self.decisions)[-8:],
        }

