"""The engine's vision encoder (an mtmd context over the model): whether it stays open between
image turns, where it goes when it opens, and the VRAM it may borrow from the LM meanwhile.

The engine owns one :class:`Encoder` and calls it on its thread (``status`` reads from any
thread). Opening the context is the engine's (``Engine._open_vision``): it needs the model, and
looks ``VisionContext`` up in engine.py at call time. Moving the LM goes through the ``move``
callable the engine passes: the arbiter's two reshard steps (release, then the first candidate
that loads), run by the engine itself. Where the LM goes is :class:`EncoderRoom`, data decided
when the model loads, so no other layer's code runs on the engine thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from igi_sdk.planner import Plan
from igi_sdk.runtime.config import EngineConfig
from igi_sdk.runtime.session import Turn
from igi_sdk.runtime.vision import VisionContext, VisionOptions

log = logging.getLogger("igi_sdk.runtime")

# release, then load the first candidate that loads; the plan it landed on (None: none did)
Move = Callable[[Sequence[Plan]], Plan | None]


@dataclass(frozen=True)
class EncoderRoom:
    """Where the LM stays while the encoder is open on the GPU, per LM plan: the same plan (the
    encoder's VRAM is set aside already), a smaller one (the encoder borrows that VRAM from the
    LM), or None (no room: the encoder runs on the CPU this time). ``otherwise``: the answer for
    a plan not listed. ``fallback``: where the LM lands if the smaller plan does not load (the
    CPU plan under the arbiter: a failed load means the game is growing, so the LM never goes
    back up for it)."""

    by_plan: tuple[tuple[Plan, Plan | None], ...] = ()
    otherwise: Plan | None = None
    fallback: Plan | None = None

    @classmethod
    def always(cls, plan: Plan, fallback: Plan | None = None) -> EncoderRoom:
        """The LM moves to ``plan`` for every image turn (a fixed budget)."""
        return cls(otherwise=plan, fallback=fallback)

    def target(self, current: Plan) -> Plan | None:
        return next((t for p, t in self.by_plan if p == current), self.otherwise)


class Encoder:
    """The vision context of one engine and its placement bookkeeping (engine thread)."""

    def __init__(self, config: EngineConfig, room: EncoderRoom | None) -> None:
        self.config = config
        self.room = room  # see Engine.__init__
        self.context: VisionContext | None = None
        self.checked = False  # the first load checked that the mmproj fits the model
        self.lent_from: Plan | None = None  # the LM's placement while the encoder borrows
        self.borrows = 0  # image turns that moved the LM for the encoder
        self.opens = 0  # mtmd contexts opened by this engine (a reopen per image turn
        # when not resident)

    @property
    def keeps(self) -> bool:
        """Whether the context stays open between image turns."""
        # an encoder that borrows the LM's VRAM must give it back after every image turn
        return self.config.keeps_vision and self.room is None

    def options(self, *, check: bool = False, gpu: bool | None = None) -> VisionOptions:
        c = self.config
        if check:  # the first load's check that the mmproj fits the model: no VRAM for it
            return VisionOptions(n_threads=c.n_threads)
        return VisionOptions(use_gpu=c.vision_gpu if gpu is None else gpu,
                             flash_attn=c.vision_flash_attn,
                             n_threads=c.n_threads, warmup=c.vision_warmup,
                             image_max_tokens=c.vision_max_tokens)

    def place(self, plan: Plan, move: Move) -> bool:
        """Whether the encoder about to open goes on the GPU, moving the LM (now on ``plan``)
        to the room's smaller placement first. If that does not load, the LM lands on the
        fallback and the encoder runs on the CPU this time; if nothing loads, the engine is
        unavailable (the caller checks)."""
        if not self.config.vision_gpu:
            return False
        if self.room is None or self.lent_from is not None:
            return True
        target = self.room.target(plan)
        if target is None:
            return False
        if target == plan:
            return True
        fallback = self.room.fallback or plan
        landed = move([target] if fallback == target else [target, fallback])
        if landed != target:
            log.warning("the placement for the vision encoder did not load; the encoder runs "
                        "on the CPU for this turn")
            return False
        self.lent_from = plan
        self.borrows += 1
        return True

    def give_back(self, move: Move) -> None:
        """Once the encoder is closed, move the LM back to the placement it lent from. If that
        does not load, the game took the memory meanwhile: the LM lands on the fallback (the
        CPU plan under the arbiter: one failed GPU load, then no other), or, with a fixed
        budget, on the smaller placement it was on (loaded a moment ago)."""
        if self.lent_from is None or self.context is not None:
            return
        main, self.lent_from = self.lent_from, None
        fallback = self.room.fallback if self.room is not None else None
        if fallback is None or fallback == main:  # a fixed budget: nothing else to fight
            fallback = self.room.target(main) if self.room is not None else None
        candidates = [p for p in (main, fallback) if p is not None]
        if move(candidates) != main:
            log.warning("could not move the model back after an image turn; it stays on a "
                        "smaller placement until the next reshard")

    def idle(self, active: list[Turn]) -> None:
        """Free a non-resident vision context once no reply (of ``active``) has an image left
        to encode."""
        if self.keeps or self.context is None:
            return
        if any(t.images for t in active):
            return
        self.close()

    def close(self) -> None:
        """Free the context (with the model's placement: its chunks of pending images too,
        they are made again)."""
        vision, self.context = self.context, None
        if vision is not None:
            vision.close()

    def status(self) -> dict[str, Any] | None:
        if not self.config.mmproj:
            return None
        vision = self.context  # one read: the engine thread may close it meanwhile
        return {"open": vision is not None,
                "gpu": vision.options.use_gpu if vision is not None else None,
                "opens": self.opens, "borrows": self.borrows,
                "lent_from": self.lent_from.name if self.lent_from is not None else None}
