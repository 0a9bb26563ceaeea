"""The game's VRAM trend: the rules that let the arbiter act at frame scale without fighting it.

Pure: no threads, no clock reads, no I/O; every time is passed in (monotonic seconds). Fed the
game's use (``others = used − own``) at every reading, it answers three questions:

* **Act ahead** (:meth:`GameTrend.ahead_of_growth`): a game that grows fast (a level load at
  one or more 64 MiB allocations per frame) eats the budget's slack between two readings; acting
  only once the budget is crossed leaves it failing allocations while the model releases. So
  shrink *now* when, at the game's growth rate, the slack lasts less than a release takes plus
  one poll period.
* **Settled** (:meth:`GameTrend.settled`): a GPU placement is loaded only into memory the game
  has stopped claiming — its use moved by less than ``settle_tolerance`` for ``settle_s``.
* **Grow payback** (:func:`grow_pays`): grow back to a larger rung only when the turns gained
  over the time the game is expected to stay as it is outweigh those lost while the new
  placement loads (:class:`ReshardCost` measures what a reshard costs).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from statistics import median

MIB = 1 << 20


@dataclass(frozen=True)
class TrendConfig:
    # samples kept: enough for the settle band to be re-derived after a break (80 at 25 ms)
    window_s: float = 2.0
    # the growth rate compares the newer and the older half of the readings this recent (6 at
    # 25 ms, 7.5 frames at 60 FPS: a level load shows within two readings of its start), and
    # of at least ``rate_min_samples`` readings (6 or more: halves of three, whose medians a
    # single outlier cannot move; a 100 ms scripted trace spans 0.5 s)
    rate_window_s: float = 0.125
    rate_min_samples: int = 6
    # a rise (or fall) between the halves smaller than this is NVML page rounding and the
    # driver's own allocations, not the game: the rate is 0 (below ~200 MiB/s at 25 ms). Slower
    # growth is left to the budget's ``headroom`` (256 MiB last over a second at that rate)
    noise_bytes: int = 16 * MIB
    # settled: the use stayed within ``settle_tolerance`` (NVML rounding and the driver, the
    # same 64 MiB as ``ReshardMachine.GROWTH_TOLERANCE``; one 64 MiB allocation is the game) for
    # ``settle_s``. 0.4 s is 16 readings, 24 frames: longer than the pauses between a level
    # load's bursts of reads, and little against a load into memory the game still claims
    # (measured before these rules: 7 loads in 5.5 s, 126 failed game allocations)
    settle_s: float = 0.4
    settle_tolerance: int = 64 * MIB
    # act-ahead lead: a release takes about two frames (the engine runs it between decode
    # steps), and a decision waits for the next reading
    release_s: float = 2 / 60
    poll_s: float = 0.025
    # readings older than this do not extend the stability (a source that stopped answering
    # says nothing about the game)
    stale_s: float = 0.25
    # plateaus (stable stretches of at least ``settle_s``) remembered for ``expected_hold_s``
    plateau_memory: int = 8

    @property
    def lead_s(self) -> float:
        """How long after a reading the model's memory can be free at the earliest."""
        return self.release_s + self.poll_s


class GameTrend:
    """The game's use over the last ``window_s``, fed one reading at a time (``note``)."""

    def __init__(self, config: TrendConfig | None = None) -> None:
        self.config = config or TrendConfig()
        self._samples: deque[tuple[float, int]] = deque()
        self._band_lo = self._band_hi = 0
        self._band_since: float | None = None  # the oldest reading of the current stable run
        self._plateaus: deque[float] = deque(maxlen=self.config.plateau_memory)

    def note(self, t: float, others: int) -> None:
        """A reading at monotonic time ``t``: the game's (and every other process's) bytes.
        A reading not newer than the last is ignored (two sources, a repeated decision)."""
        c = self.config
        if self._samples and t <= self._samples[-1][0]:
            return
        prev_t = self._samples[-1][0] if self._samples else t
        self._samples.append((t, others))
        while self._samples[0][0] < t - c.window_s:
            self._samples.popleft()
        if self._band_since is None:
            self._band_lo = self._band_hi = others
            self._band_since = t
            return
        lo, hi = min(self._band_lo, others), max(self._band_hi, others)
        if hi - lo < c.settle_tolerance:
            self._band_lo, self._band_hi = lo, hi
            return
        # the band broke: remember the plateau it ended, and start the new one at the oldest
        # reading that is still within the tolerance of the newest ones (a slow drift or an
        # outlier does not throw away the readings around it)
        if prev_t - self._band_since >= c.settle_s:
            self._plateaus.append(prev_t - self._band_since)
        lo = hi = others
        since = t
        for ts, v in reversed(list(self._samples)[:-1]):
            nlo, nhi = min(lo, v), max(hi, v)
            if nhi - nlo >= c.settle_tolerance:
                break
            lo, hi, since = nlo, nhi, ts
        self._band_lo, self._band_hi, self._band_since = lo, hi, since

    def last(self) -> int | None:
        """The newest reading's bytes (None before any)."""
        return self._samples[-1][1] if self._samples else None

    def rate(self) -> float:
        """The game's growth in bytes/s (negative: it frees), 0.0 when it is flat or unknown.

        The median of the newest half of the recent readings against the median of the older
        half, over the time between them: one outlying reading cannot move a median of three
        or more beyond the readings around it, so a single noisy sample never reads as growth;
        and a rise smaller than ``noise_bytes`` is page rounding (``±noise/2`` of jitter moves
        the two medians apart by less than ``noise``)."""
        c = self.config
        n = max(6, c.rate_min_samples)
        if len(self._samples) < n:
            return 0.0
        newest = self._samples[-1][0]
        pts = [p for p in self._samples if p[0] >= newest - c.rate_window_s]
        if len(pts) < n:
            pts = list(self._samples)[-n:]
        k = len(pts) // 2
        old, new = pts[:k], pts[-k:]
        rise = median(v for _, v in new) - median(v for _, v in old)
        dt = median(t for t, _ in new) - median(t for t, _ in old)
        return 0.0 if abs(rise) < c.noise_bytes or dt <= 0 else rise / dt

    def seconds_to_exhaustion(self, headroom: int) -> float:
        """How long the game takes, at its current rate, to use ``headroom`` more bytes
        (``math.inf`` when it is not growing)."""
        r = self.rate()
        if r <= 0:
            return math.inf
        return max(0.0, headroom / r)

    def ahead_of_growth(self, headroom: int, lead_s: float | None = None) -> bool:
        """Shrink now? ``headroom``: bytes between what the model holds and what the budget
        allows (``budget − current.vram``; the budget already keeps the policy's headroom for
        spikes). True when the game grows and will have used them before a release decided at
        the *next* reading could complete (``lead_s``, default ``release_s + poll_s``): acting
        then would be too late. A flat or falling game never triggers it."""
        lead = self.config.lead_s if lead_s is None else lead_s
        return self.seconds_to_exhaustion(headroom) < lead

    def stable_for(self, now: float) -> float:
        """How long the game's use has stayed within ``settle_tolerance``, up to ``now`` (but
        not more than ``stale_s`` past the newest reading)."""
        if self._band_since is None or not self._samples:
            return 0.0
        end = min(now, self._samples[-1][0] + self.config.stale_s)
        return max(0.0, end - self._band_since)

    def settled(self, now: float) -> bool:
        """The game has stopped claiming memory: loading a GPU placement will not fight it."""
        return self.stable_for(now) >= self.config.settle_s

    def expected_hold_s(self, now: float) -> float:
        """How much longer the game is expected to stay as it is (the horizon a grow must pay
        back over), from how long it has been stable (``s``) and its recent plateaus.

        * Plateaus that lasted longer than ``s``: the median of what they had left (``L − s``).
          A streaming world that swaps textures every 2–3 s has shown what its plateaus last.
        * None did: this one is something new, and has been for ``s − longest``; expect that
          much again (with nothing else known, a state that has lasted ``x`` is as likely to
          end before as after another ``x``). With no plateau remembered that is ``s``.

        A plateau is a stable stretch of at least ``settle_s``; the last ``plateau_memory`` are
        kept, so a game's old habits fade."""
        s = self.stable_for(now)
        left = [p - s for p in self._plateaus if p > s]
        if left:
            return median(left)
        return s - max(self._plateaus, default=0.0)


@dataclass
class ReshardCost:
    """What a reshard costs, in seconds (release, load, restore): an EWMA of measured ones.

    ``prior_s`` before any measurement: a reload "costs a second or more" on the hosts
    measured (0.53 s on the H200 with weights in the page cache); erring long only delays a
    grow, erring short makes the model thrash. ``alpha`` 0.3 weighs the last few most (the
    page cache warms up, placements differ in size)."""

    prior_s: float = 1.0
    alpha: float = 0.3
    _ewma: float | None = field(default=None, init=False)
    measured: int = field(default=0, init=False)

    def note(self, seconds: float) -> None:
        """A completed reshard's duration (ignored unless finite and not negative)."""
        if not math.isfinite(seconds) or seconds < 0:
            return
        self._ewma = seconds if self._ewma is None else (
            self.alpha * seconds + (1 - self.alpha) * self._ewma)
        self.measured += 1

    @property
    def seconds(self) -> float:
        return self.prior_s if self._ewma is None else self._ewma


def _per_s(turn_s: float) -> float:
    return 0.0 if turn_s <= 0 or not math.isfinite(turn_s) else 1.0 / turn_s


def grow_payback_s(reshard_s: float, current_turn_s: float, target_turn_s: float,
                   standby_turn_s: float = math.inf) -> float:
    """The shortest horizon over which growing pays (``math.inf``: never).

    Counted in turns: while the new placement loads (``reshard_s``) the model decodes on its
    CPU standby (``standby_turn_s``; ``inf`` where nothing decodes during a reshard) instead of
    the current rung, losing ``reshard_s · (1/current − 1/standby)`` turns; for the rest of the
    horizon ``H`` it gains ``(H − reshard_s) · (1/target − 1/current)``. Growing pays when the
    gain exceeds the loss:

        H > reshard_s · (1 + (1/current − 1/standby) / (1/target − 1/current))

    A small speed-up needs a long stable game; from the CPU rung (nothing lost while loading)
    the horizon need only outlast the reshard itself."""
    gain = _per_s(target_turn_s) - _per_s(current_turn_s)
    if gain <= 0:
        return math.inf
    loss = max(0.0, _per_s(current_turn_s) - _per_s(standby_turn_s))
    return reshard_s * (1.0 + loss / gain)


def grow_pays(stable_for_s: float, reshard_s: float, current_turn_s: float,
              target_turn_s: float, *, horizon_s: float | None = None,
              standby_turn_s: float = math.inf, grow_hold_s: float = 2.0) -> bool:
    """Grow from the current rung to the target now?

    The game has been stable for ``stable_for_s``; expect it to stay so for ``horizon_s``
    more (default: as long again — pass :meth:`GameTrend.expected_hold_s`). Grow when the
    horizon outlasts :func:`grow_payback_s` (the turns gained outweigh those lost to the
    reshard, ``reshard_s`` from :class:`ReshardCost`), and never before the game has been
    stable for ``grow_hold_s`` (the policy's floor: growing also takes PCIe bandwidth and
    memory from a game that may move again)."""
    horizon = stable_for_s if horizon_s is None else horizon_s
    if stable_for_s < grow_hold_s:
        return False
    return horizon > grow_payback_s(reshard_s, current_turn_s, target_turn_s, standby_turn_s)
