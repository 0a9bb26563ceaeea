"""Frame pacing: space decode steps so inference does not push the game past its frame time.

The game states its target in ``frame`` ticks (``target_frame_time_ms``) along with the frame
time it achieved. When frames run over the target, the pause between decode steps doubles
(back off fast); when they run well under it (menus, cutscenes, an idle game), it shrinks step
by step (take the time back slowly). Player-facing sessions keep their pace; others are decoded
every other step while pacing is in force.
"""

from __future__ import annotations

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
