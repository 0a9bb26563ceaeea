"""The low-level steps of a reshard, handed to a procedure that runs on the engine thread
(:meth:`igi_sdk.runtime.Engine.exclusive`). The order of the steps and the fallbacks when a load
fails are the caller's (the arbiter's reshard state machine); these only guarantee that a failed
step leaves no dangling handle and that no session is lost."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import llama_cpp

from igi_sdk.errors import IgiError, InferenceError, InvalidStateError
from igi_sdk.planner import Plan

if TYPE_CHECKING:
    from igi_sdk.runtime.engine import Engine

log = logging.getLogger("igi_sdk.runtime")


class EngineOps:
    """The low-level steps of a reshard, valid only inside :meth:`Engine.exclusive` (on the
    engine thread). The order and the fallbacks are the caller's (the arbiter's state
    machine); these only guarantee that a failed step leaves no dangling handle."""

    def __init__(self, engine: Engine) -> None:
        self._e = engine

    @property
    def plan(self) -> Plan:
        return self._e.plan

    @property
    def loaded(self) -> bool:
        return self._e._ctx is not None

    def park_and_release(self) -> None:
        """Copy the whole context's state to host memory, then free the placement.

        The whole context, not one sequence at a time: llama.cpp puts it back cell for cell in
        the same order, so attention sums over the same layout and replies continue bit for bit
        where the arithmetic is the same (per-sequence restores regroup the cells)."""
        e = self._e
        if e._ctx is None:
            return  # already released (unavailable): the parked state is still there
        e._parked = e._ctx_state()
        for s in e._sessions.values():
            if s.turn and s.turn.chain:  # grammar samplers point into the old vocab
                s.turn.chain.close()
                s.turn.chain = None
        e._unload()
        e.state = "unavailable"

    def load_and_restore(self, plan: Plan) -> None:
        """Load ``plan`` and put the parked state back; raises the load's typed error and
        leaves the engine unloaded (and the state parked) when it fails."""
        e = self._e
        if e._ctx is not None:
            raise InvalidStateError("release the current placement first")
        t0 = time.perf_counter()
        e._load(plan)  # frees whatever it allocated when it fails
        e.state = "ready"
        parked, e._parked = e._parked, None
        lost = parked is not None and not e._set_ctx_state(parked)
        for s in e._sessions.values():
            # the parked state holds what the sessions held when it was taken: drop what
            # closed sessions and rolled-back turns left behind since
            if lost:
                llama_cpp.llama_memory_seq_rm(e._mem, s.seq, -1, -1)
                s.tokens, s.pending, s.reread = [], [], True
            else:
                llama_cpp.llama_memory_seq_rm(e._mem, s.seq, len(s.tokens), -1)
        used = {s.seq for s in e._sessions.values()}
        for seq in range(e.config.max_sessions):
            if seq not in used:
                llama_cpp.llama_memory_seq_rm(e._mem, seq, -1, -1)
        for s in e._sessions.values():
            if s.turn is None:
                continue
            if lost:  # its tokens are gone with the cache: end it, the conversation stays
                e._rollback(s.turn)
                e._end_turn(s.turn, error=InferenceError(
                    "the reply was interrupted while the model moved; send the line again"))
            else:
                s.turn.chain = e._make_chain(s.turn)
        if lost:
            log.error("the parked state did not restore; sessions will re-read their history")
        e.reshard_count += 1
        e.last_reshard_s = time.perf_counter() - t0

    def fail_active(self, error: IgiError) -> None:
        """End every active reply with ``error`` (no placement could be loaded); each turn is
        rolled back, so the conversation is as before the line."""
        e = self._e
        for t in e._active_turns():
            e._rollback(t)
            e._end_turn(t, error=error)
