"""The engine's vision encoder (an mtmd context over the model): whether it stays open between
image turns, where it goes when it opens, and the VRAM it may borrow from the LM meanwhile.

The engine owns one :class:`Encoder` and calls it on its thread (``status`` reads from any
thread). Opening the context is the engine's (``Engine._open_vision``): it needs the model, and
looks ``VisionContext`` up in engine.py at call time. Moving the LM goes through the ``move``
callable the engine passes (a reshard on the engine thread, engine_ops.move).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from igi_sdk.errors import IgiError
from igi_sdk.planner import Plan
from igi_sdk.runtime.config import EngineConfig
from igi_sdk.runtime.session import Turn
from igi_sdk.runtime.vision import VisionContext, VisionOptions

log = logging.getLogger("igi_sdk.runtime")

Move = Callable[[Plan], None]


class Encoder:
    """The vision context of one engine and its placement bookkeeping (engine thread)."""

    def __init__(self, config: EngineConfig,
                 vision_plan: Callable[[Plan], Plan | None] | None) -> None:
        self.config = config
        self.vision_plan = vision_plan  # see Engine.__init__
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
        return self.config.keeps_vision and self.vision_plan is None

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
        to ``vision_plan``'s placement first where that is smaller. A placement that fails to
        load puts the old one back and raises its typed error (``move``)."""
        if not self.config.vision_gpu:
            return False
        if self.vision_plan is None or self.lent_from is not None:
            return True
        target = self.vision_plan(plan)
        if target is None:
            return False
        if target != plan:
            move(target)
            self.lent_from = plan
            self.borrows += 1
        return True

    def give_back(self, move: Move) -> None:
        """Once the encoder is closed, move the LM back to the placement it lent from. If that
        fails the LM stays on the smaller one, which fits (loaded a moment ago)."""
        if self.lent_from is None or self.context is not None:
            return
        main, self.lent_from = self.lent_from, None
        try:
            move(main)
        except IgiError as e:
            log.warning("could not move the model back after an image turn (%s); it stays on "
                        "the placement used for the encoder", e)

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
