"""Frame pacing: space decode steps so inference does not push the game past its frame time.

The game states its target in ``frame`` ticks (``target_frame_time_ms``) along with the frame
time it achieved. When frames run over the target, the pause between decode steps doubles
(back off fast); when they run well under it (menus, cutscenes, an idle game), it shrinks step
by step (take the time back slowly). Player-facing sessions keep their pace; others are decoded
every other step while pacing is in force.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class PacingConfig:
    step_s: float = 0.002  # smallest pause, and the amount it relaxes by per frame
    max_delay_s: float = 0.1  # never slower than ~10 steps/s
    relax_below: float = 0.85  # frames under 85% of the target count as "room to spare"


class FramePacer:
    def __init__(self, config: PacingConfig | None = None) -> None:
        self.config = config or PacingConfig()
        self.delay_s = 0.0

    def update(self, frame_time_ms: float, target_ms: float | None) -> float:
        """The pause between decode steps after this frame (seconds)."""
        c = self.config
        if target_ms is None or target_ms <= 0:
            self.delay_s = 0.0
        elif frame_time_ms > target_ms:
            self.delay_s = min(c.max_delay_s, max(c.step_s, self.delay_s * 2))
        elif frame_time_ms < target_ms * c.relax_below:
            self.delay_s = max(0.0, self.delay_s - c.step_s)
        return self.delay_s


class ClientPacing:
    """One pacer per client that sends paced frames; the pause is the largest of those heard
    from within ``hold_s``. A client that stops sending frames (it left, or its game paused)
    stops counting, and the engine's pause lapses by itself after ``hold_s`` with no frames."""

    def __init__(self, config: PacingConfig | None = None, hold_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config, self.hold_s, self.clock = config, hold_s, clock
        self._pacers: dict[str, tuple[FramePacer, float]] = {}

    def update(self, client: str, frame_time_ms: float, target_ms: float | None) -> float:
        pacer = self._pacers.get(client, (FramePacer(self.config), 0.0))[0]
        pacer.update(frame_time_ms, target_ms)
        self._pacers[client] = (pacer, self.clock())
        return self.delay_s()

    def delay_s(self) -> float:
        now = self.clock()
        live = {c: v for c, v in self._pacers.items() if now - v[1] <= self.hold_s}
        self._pacers = live
        return max((p.delay_s for p, _ in live.values()), default=0.0)
