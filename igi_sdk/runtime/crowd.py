"""How many replies decode together, against the crowd the plan was made for (pure).

Why the engine watches it: a plan made for one talking NPC computes the CPU-resident weights of
a step that decodes many on the CPU, where a plan made for the crowd (``serve --talking N``)
streams them to the GPU: sixteen NPCs within 4 GB on an H200 host decoded at 102–105 tok/s so
planned against 24.7–28.5 without (docs/benchmarks.md, "Many NPCs at once"). The developer
states the crowd; the engine tells once, in its log and in ``stats``, when the replies it
decodes keep outnumbering it.
"""

from __future__ import annotations

from dataclasses import dataclass

from igi_sdk.errors import UsageError


@dataclass
class CrowdWatch:
    planned: int  # replies the plan expects to decode together (serve --talking)
    steps: int = 50  # decode steps in a row with a larger crowd before it tells
    peak: int = 0  # the most replies one decode step has carried
    told: bool = False
    _run: int = 0
    _run_peak: int = 0  # the largest crowd of the current run of steps

    def __post_init__(self) -> None:
        if self.planned < 1 or self.steps < 1:
            raise UsageError(f"a crowd watch for {self.planned} talkers over {self.steps} steps")

    def larger(self, decoding: int) -> bool:
        """A crowd worth planning for: at least twice the planned one, and two more."""
        return decoding >= max(2 * self.planned, self.planned + 2)

    def observe(self, decoding: int) -> int | None:
        """A decode step carried ``decoding`` replies. Returns the crowd to tell about (the
        largest of the run), once: after ``steps`` decode steps in a row, each with a larger
        crowd than planned."""
        self.peak = max(self.peak, decoding)
        if self.larger(decoding):
            self._run += 1
            self._run_peak = max(self._run_peak, decoding)
        else:
            self._run = self._run_peak = 0
        if self.told or self._run < self.steps:
            return None
        self.told = True
        return self._run_peak

    def status(self) -> dict[str, int]:
        return {"planned": self.planned, "peak": self.peak}
