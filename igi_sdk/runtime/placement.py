"""The loaded placement: one owner for every native handle of a loaded plan.

A :class:`Placement` holds the model, the context, its memory, the vocabulary and the decode
batch of one plan (as llama-cpp-python's ``_internals`` gives each handle one owner); it is
opened whole or not at all, closed whole, and its context's state can be parked in host memory
and put back. Engine thread only: every method calls llama.cpp.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import llama_cpp

from igi_sdk import threads
from igi_sdk.host_memory import available_ram
from igi_sdk.model import ModelInventory
from igi_sdk.planner import PIN_RAM_HEADROOM, Plan, mapped_where_ram_is_short, pinned_host_bytes
from igi_sdk.runtime import engine_state, loader
from igi_sdk.runtime.devices import Device
from igi_sdk.runtime.grammar import tokenizer_for
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.runtime.overrides import LoadReport
from igi_sdk.runtime.text import Vocab

log = logging.getLogger("igi_sdk.runtime")

# a placement is opened and, until the engine thread takes it over, closed by these threads
_OPENERS = (threads.ENGINE, threads.LOADER)


@dataclass
class Placement:
    plan: Plan
    loaded: loader.Loaded
    vocab: Vocab
    mem: Any  # llama_memory_t of the context
    batch: Any  # llama_batch, reused by every decode step of this placement
    batch_cap: int
    outputs_cap: int

    @classmethod
    def open(cls, path: Path, inventory: ModelInventory, plan: Plan,
             settings: ContextSettings,
             progress: Callable[[float], None] | None = None,
             cancelled: Callable[[], bool] | None = None) -> Placement:
        """Load ``plan``; raises the load's typed error with nothing left allocated.
        ``cancelled``: asked between tensors; True stops the load (a loader thread's). Host
        weights the plan pins are mapped instead when the RAM available now cannot lock them
        (``planner.mapped_where_ram_is_short``): the placement's ``plan`` says which."""
        threads.expect_one_of(_OPENERS, "opening a placement")
        ram = available_ram()
        wanted, plan = plan, mapped_where_ram_is_short(plan, inventory, ram)
        if plan is not wanted:
            log.warning("plan '%s': %d MiB of host weights would be page-locked, but only %d "
                        "MiB of RAM is available (%d MiB kept free): mapped instead, nothing "
                        "streamed", plan.name, pinned_host_bytes(wanted, inventory) >> 20,
                        (ram or 0) >> 20, PIN_RAM_HEADROOM >> 20)
        loaded = loader.load(path, inventory, plan, settings, progress=progress,
                             cancelled=cancelled)
        try:
            vocab = Vocab(loaded.model)
            # llguidance's view of the vocabulary (~0.35 s for 49k tokens), built with the load
            # rather than inside the first grammar reply's step; cached across reshards
            tokenizer_for(vocab.vocab)
            mem = llama_cpp.llama_get_memory(loaded.ctx)
            # one batch per placement: allocating per decode step is waste on the hot path
            cap = max(settings.n_batch, plan.n_ubatch)
            batch = llama_cpp.llama_batch_init(cap, 0, 1)
        except BaseException:
            loader.free(loaded)
            raise
        return cls(plan, loaded, vocab, mem, batch, cap, settings.outputs_max)

    @property
    def model(self) -> Any:
        return self.loaded.model

    @property
    def ctx(self) -> Any:
        return self.loaded.ctx

    @property
    def report(self) -> LoadReport:
        return self.loaded.report

    @property
    def gpu(self) -> Device | None:
        return self.loaded.gpu

    def park(self, into: engine_state.ParkBuffer) -> engine_state.ParkedState:
        """The whole context's state, for :meth:`restore` into the next placement.

        The whole context, not one sequence at a time: llama.cpp puts it back cell for cell in
        the same order, so attention sums over the same layout and replies continue bit for
        bit where the arithmetic is the same (per-sequence restores regroup the cells)."""
        threads.expect(threads.ENGINE, "parking a placement's state")
        return engine_state.ctx_state(self.ctx, into)

    def restore(self, parked: engine_state.ParkedState) -> bool:
        """Put parked state back; False if llama.cpp refused it (the cache is then empty)."""
        threads.expect(threads.ENGINE, "restoring a placement's state")
        return engine_state.set_ctx_state(self.ctx, parked)

    def close(self) -> None:
        """Free every handle; the object must not be used afterwards (the engine thread's, or
        a loader thread's for a placement nobody took over)."""
        threads.expect_one_of(_OPENERS, "closing a placement")
        if self.batch is not None:
            llama_cpp.llama_batch_free(self.batch)
            self.batch = None
        self.mem = None
        loader.free(self.loaded)
