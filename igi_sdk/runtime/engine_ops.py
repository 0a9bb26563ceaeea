"""The low-level steps of a reshard (:class:`EngineOps`), run on the engine thread through
``Engine.exclusive``, and :func:`move`, the engine's own reshard built of them.

The steps work on the engine's internals; :class:`ReshardHost` names exactly which (engine.py's
``Engine`` provides them), so that this module does not import engine.py.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Protocol

import llama_cpp

from igi_sdk.errors import IgiError, InferenceError, InvalidStateError
from igi_sdk.planner import Plan
from igi_sdk.runtime import engine_state
from igi_sdk.runtime.config import EngineConfig
from igi_sdk.runtime.encoder import Encoder
from igi_sdk.runtime.sampling import SamplerChain
from igi_sdk.runtime.session import Session, Turn

log = logging.getLogger("igi_sdk.runtime")


class ReshardHost(Protocol):
    """What a reshard's steps use of the engine (engine thread only): its settings and
    placement, the loaded context's handles (None while released), the state parked in host
    memory, the sessions, the encoder's borrowing, and the engine's turn lifecycle."""

    config: EngineConfig
    plan: Plan
    state: str
    reshard_count: int
    last_reshard_s: float
    _ctx: Any
    _mem: Any
    _parked: bytes | None
    _sessions: dict[str, Session]
    _encoder: Encoder

    def _load(self, plan: Plan) -> None: ...

    def _unload(self) -> None: ...

    def _active_turns(self) -> list[Turn]: ...

    def _rollback(self, t: Turn) -> None: ...

    def _end_turn(self, t: Turn, *, reason: str = "stop", error: BaseException | None = None,
                  visible_end: int | None = None) -> None: ...

    def _make_chain(self, turn: Turn) -> SamplerChain: ...


class EngineOps:
    """The low-level steps of a reshard, valid only inside :meth:`Engine.exclusive` (on the
    engine thread). The order and the fallbacks are the caller's (the arbiter's state
    machine); these only guarantee that a failed step leaves no dangling handle."""

    def __init__(self, engine: ReshardHost) -> None:
        self._e = engine

    @property
    def plan(self) -> Plan:
        return self._e.plan

    @property
    def loaded(self) -> bool:
        return self._e._ctx is not None

    def park_and_release(self, *, briefly: bool = False) -> None:
        """Copy the whole context's state to host memory, then free the placement (``briefly``:
        the engine thread loads another at once, so the engine is not shown as unavailable
        meanwhile, and the arbiter does not step in).

        The whole context, not one sequence at a time: llama.cpp puts it back cell for cell in
        the same order, so attention sums over the same layout and replies continue bit for bit
        where the arithmetic is the same (per-sequence restores regroup the cells)."""
        e = self._e
        if e._ctx is None:
            return  # already released (unavailable): the parked state is still there
        e._parked = engine_state.ctx_state(e._ctx)
        for s in e._sessions.values():
            if s.turn and s.turn.chain:  # grammar samplers point into the old vocab
                s.turn.chain.close()
                s.turn.chain = None
        e._unload()
        if not briefly:
            e.state = "unavailable"

    def load_and_restore(self, plan: Plan) -> None:
        """Load ``plan`` and put the parked state back; raises the load's typed error and
        leaves the engine unloaded (and the state parked) when it fails."""
        e = self._e
        if e._ctx is not None:
            raise InvalidStateError("release the current placement first")
        e._encoder.lent_from = None  # a reshard from outside decides the placement from here on
        t0 = time.perf_counter()
        e._load(plan)  # frees whatever it allocated when it fails
        e.state = "ready"
        parked, e._parked = e._parked, None
        lost = parked is not None and not engine_state.set_ctx_state(e._ctx, parked)
        for s in e._sessions.values():
            # the parked state holds what the sessions held when it was taken: drop what
            # closed sessions and rolled-back turns left behind since
            if lost:
                llama_cpp.llama_memory_seq_rm(e._mem, s.seq, -1, -1)
                s.tokens, s.pending, s.reread, s.image_cells = [], [], True, 0
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


def move(engine: ReshardHost, plan: Plan) -> None:
    """Reshard to ``plan`` on the engine thread, keeping every session and reply; on a
    failed load the previous placement is loaded again and the error raised."""
    previous = engine.plan
    ops = EngineOps(engine)
    ops.park_and_release(briefly=True)
    try:
        ops.load_and_restore(plan)
    except IgiError:
        try:
            ops.load_and_restore(previous)
        except BaseException:
            engine.state = "unavailable"  # nothing loads: the arbiter's recovery takes over
            raise
        raise
