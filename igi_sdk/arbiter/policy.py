"""Budget policy: from VRAM readings to "stay", "shrink now" or "grow" — pure and testable.

    budget = min(cap, total − others − headroom − reserved)

* **Shrink at once** when the budget falls below the current plan's VRAM: to the best rung that
  fits. When the game needs the VRAM *now* (a reservation due this frame, or nothing but the CPU
  rung fits), go to the CPU rung first — it frees the most, fastest — then climb back to the best
  fitting rung on the next decision.
* **Grow only after the budget has stayed above the next rung + margin for ``grow_hold_s``**, so
  a budget that oscillates does not make the model thrash between plans.
* A reservation is **acknowledged only once the VRAM is actually free** on the device, and keeps
  counting against the budget until the game has taken it (its use rose by the reserved amount)
  or ``reservation_hold_s`` passed — so the model does not grow back into it in between.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from igi_sdk.arbiter.ladder import PlanLadder, Rung
from igi_sdk.arbiter.sources import VramReading
from igi_sdk.arbiter.trend import GameTrend, ReshardCost, TrendConfig, grow_pays


@dataclass(frozen=True)
class PolicyConfig:
    cap: int | None = None  # never take more than this, whatever is free
    headroom: int = 256 * 1024 * 1024  # left free for the game's spikes and the driver
    grow_margin: int = 128 * 1024 * 1024  # the next rung must fit with this much to spare
    grow_hold_s: float = 2.0  # ... continuously for this long
    reservation_hold_s: float = 10.0  # an acknowledged reservation the game never took expires
    # a reservation not granted within this long ends with deadline_missed: the game never
    # waits forever (a reshard to the CPU plan takes well under this)
    reservation_timeout_s: float = 5.0
    # a plan over the budget by less than this stays: NVML and the engine's reports differ by
    # page rounding, and a reload costs seconds (the headroom above covers the difference)
    shrink_tolerance: int = 32 * 1024 * 1024
    # frame pacing by placement: when this many of the last ``pressure_window`` paced frames run
    # over their target while the model computes on the GPU, the model moves to the CPU plan and
    # leaves the GPU to the game for ``yield_hold_s`` (doubling each time it has to yield again
    # soon after, up to ``yield_hold_max_s``)
    # (3 of 60: on the H200 host, decode on the GPU pushed 10% of a 12 ms render's frames past
    # 16.7 ms and its p99 from 12.3 to 23.6 ms; one over-target frame in 20 already costs p99)
    pressure_frames: int = 3
    pressure_window: int = 60
    yield_hold_s: float = 5.0
    yield_hold_max_s: float = 120.0
    # the game's trend: act ahead of its growth, load only once it settled (arbiter/trend.py)
    trend: TrendConfig = field(default_factory=TrendConfig)
    # whether the engine decodes on its CPU standby while a placement loads (a grow from a GPU
    # rung then costs the turns decoded at the CPU's speed meanwhile, not a stop)
    standby: bool = False


@dataclass
class Reservation:
    nbytes: int
    due_frame: int  # the frame by which the game wants the VRAM
    requested_frame: int
    others_before: int  # the others' use when it was requested
    acknowledged: bool = False
    acked_at: float | None = None
    expires_at: float | None = None  # monotonic time after which it is not worth waiting
    asked_at: float | None = None  # monotonic time it was asked for


@dataclass(frozen=True)
class Decision:
    action: str  # "stay" | "shrink" | "fast_shrink" | "grow" | "yield" | "recover"
    target: Rung
    budget: int
    reason: str
    reading: VramReading | None = None


@dataclass
class BudgetPolicy:
    ladder: PlanLadder
    config: PolicyConfig = field(default_factory=PolicyConfig)
    current: Rung | None = None
    reservations: list[Reservation] = field(default_factory=list)
    _grow_since: float | None = None
    _recent: list[bool] = field(default_factory=list)  # paced frames: over their target?
    _yield_until: float | None = None
    _yield_hold: float = 0.0
    # measured reshard durations (what a grow must pay back)
    cost: ReshardCost = field(default_factory=ReshardCost)
    trend: GameTrend = field(init=False)
    _held: bool = False  # a reshard found the game growing: the next grow waits a full hold
    # the model gave its VRAM back to a game that was still claiming: once the game's use
    # settles, it loads the rung that fits at once (the NPCs decode on the CPU meanwhile)
    _refill: bool = False
    _no_grow_before: float = -math.inf

    def __post_init__(self) -> None:
        if self.current is None:
            self.current = self.ladder.cpu
        self._yield_hold = self.config.yield_hold_s
        self.trend = GameTrend(self.config.trend)

    def note_frame(self, frame_time_ms: float, target_ms: float | None, now: float) -> None:
        """A frame the game rendered; frames with a target feed pacing by placement."""
        c = self.config
        if not target_ms:
            return
        self._recent = [*self._recent[-(c.pressure_window - 1):], frame_time_ms > target_ms]
        on_gpu = self.current is not self.ladder.cpu
        if on_gpu and sum(self._recent) >= c.pressure_frames and not self.yielding(now):
            ended = self._yield_until
            if ended is not None and now - ended < 2 * self._yield_hold:
                self._yield_hold = min(c.yield_hold_max_s, self._yield_hold * 2)
            else:
                self._yield_hold = c.yield_hold_s
            self._yield_until = now + self._yield_hold
            self._recent = []

    def yielding(self, now: float) -> bool:
        return self._yield_until is not None and now < self._yield_until

    def budget(self, r: VramReading) -> int:
        reserved = sum(x.nbytes for x in self.reservations)
        b = r.total - r.others - self.config.headroom - reserved
        if self.config.cap is not None:
            b = min(b, self.config.cap)
        return max(0, b)

    def reserve(self, nbytes: int, deadline_frames: int, frame: int,
                r: VramReading, now: float | None = None) -> Reservation:
        res = Reservation(nbytes, frame + deadline_frames, frame, r.others, asked_at=now)
        if now is not None:
            res.expires_at = now + self.config.reservation_timeout_s
        self.reservations.append(res)
        return res

    def drop(self, res: Reservation) -> None:
        """Forget a reservation that ended without being granted."""
        self.reservations = [x for x in self.reservations if x is not res]

    def decide(self, r: VramReading, frame: int, now: float) -> Decision:
        """What to run next, given a fresh reading (``now`` in monotonic seconds)."""
        assert self.current is not None
        self.acknowledge(r, now)
        self.trend.note(now, r.others)
        if self._held:
            self._held, self._no_grow_before = False, now + self.config.grow_hold_s
        budget = self.budget(r)
        best = self.ladder.best_within(budget)
        cur = self.current
        if cur.vram > budget and cur is self.ladder.cpu:
            self._grow_since = None  # nothing left to give back but the GPU's fixed share
            return Decision("stay", cur, budget, "already on the CPU plan", r)
        if self.yielding(now):
            self._grow_since, self._refill = None, False  # a yield is the game's: no refill
            if cur is not self.ladder.cpu:
                return Decision("yield", self.ladder.cpu, budget,
                                f"paced frames over target: the GPU is the game's for "
                                f"{self._yield_hold:.0f} s", r)
            return Decision("stay", cur, budget, "leaving the GPU to the game", r)
        pending = any(not x.acknowledged for x in self.reservations)
        if cur.vram > budget + (0 if pending else self.config.shrink_tolerance):
            self._grow_since = None
            urgent = any(not x.acknowledged and x.due_frame <= frame + 1
                         for x in self.reservations)
            self._refill = True
            if (urgent or best is self.ladder.cpu) and cur is not self.ladder.cpu:
                return Decision("fast_shrink", self.ladder.cpu, budget,
                                f"budget {budget >> 20} MiB below the plan's {cur.vram >> 20} "
                                "MiB and the game needs it now: CPU plan first", r)
            return Decision("shrink", best, budget,
                            f"budget {budget >> 20} MiB below the plan's {cur.vram >> 20} MiB", r)
        if cur is not self.ladder.cpu and self.trend.ahead_of_growth(budget - cur.vram):
            # the game grows into the model's VRAM before a release decided at the next
            # reading could complete: give it all back now, and load what fits once it settled
            self._grow_since = None
            self._refill = True
            return Decision("fast_shrink", self.ladder.cpu, budget,
                            f"the game's use rises {self.trend.rate() / 2**20:.0f} MiB/s: it "
                            f"reaches the plan's {cur.vram >> 20} MiB within "
                            f"{self.trend.seconds_to_exhaustion(budget - cur.vram) * 1e3:.0f} "
                            "ms: ahead of it", r)
        target = self.ladder.best_within(budget - self.config.grow_margin)
        if self._refill and cur is self.ladder.cpu and target is not cur:
            if not self.trend.settled(now) or self.acknowledged():  # (about to allocate)
                return Decision("stay", cur, budget, "waiting for the game's use to settle", r)
            self._refill, self._grow_since = False, None
            return Decision("grow", target, budget,
                            "the game's use settled: loading the rung that fits it", r)
        if target.vram > cur.vram and target.turn_s < cur.turn_s:
            if self._grow_since is None:
                self._grow_since = now
            if now < self._no_grow_before or not self.trend.settled(now):
                return Decision("stay", cur, budget, "waiting for the game's use to settle", r)
            stable = min(self.trend.stable_for(now), now - self._grow_since)
            if grow_pays(stable, self.cost.seconds, cur.turn_s, target.turn_s,
                         horizon_s=self.trend.expected_hold_s(now),
                         standby_turn_s=(self.ladder.cpu.turn_s if self.config.standby
                                         else math.inf),
                         grow_hold_s=self._grow_hold(cur)):
                self._grow_since, self._refill = None, False
                return Decision("grow", target, budget,
                                f"the game's use held for {stable:.1f} s: the gain pays for a "
                                f"reshard ({self.cost.seconds:.2f} s)", r)
            return Decision("stay", cur, budget, "waiting for the gain to pay for a reshard", r)
        self._grow_since = None
        return Decision("stay", cur, budget, "plan fits", r)

    def _grow_hold(self, cur: Rung) -> float:
        """The least time the game must hold before a grow. From the CPU rung with a standby
        nothing is lost while the placement loads (the NPCs decode on the CPU either way), so
        the game need only have settled; otherwise ``grow_hold_s``."""
        if self.config.standby and cur is self.ladder.cpu:
            return min(self.config.grow_hold_s, self.config.trend.settle_s)
        return self.config.grow_hold_s

    def applied(self, rung: Rung) -> None:
        """Call after the runtime has resharded to ``rung``."""
        self.current = rung

    def hold_growth(self) -> None:
        """The game was seen growing (a load failed, or it took what the model freed): growing
        again waits ``grow_hold_s`` from the next decision, and for the game to settle."""
        self._grow_since = None
        self._held = True

    def acknowledge(self, r: VramReading, now: float) -> None:
        """Mark reservations whose VRAM is free now; drop those the game has taken."""
        self.acknowledge_free(r.total - r.used, now)
        # a reservation stops counting once the game has taken the memory (it shows in
        # `others` then) or it was never taken within the hold time
        self.reservations = [
            x for x in self.reservations
            if not (x.acknowledged and (r.others >= x.others_before + 0.9 * x.nbytes
                                        or now - (x.acked_at or now)
                                        > self.config.reservation_hold_s))]

    def acknowledge_free(self, free: int, now: float) -> None:
        """Mark reservations that ``free`` bytes on the device cover (the driver's figure)."""
        for res in self.reservations:
            if not res.acknowledged and free >= res.nbytes:
                res.acknowledged, res.acked_at = True, now

    def acknowledged(self) -> list[Reservation]:
        return [x for x in self.reservations if x.acknowledged]
