"""The two steps every reshard is made of — release the placement, load the first candidate
that fits — as functions of what they touch (a placement, the sessions), and the outcome a
:class:`~igi_sdk.runtime.commands.LoadFirstFitting` command answers.

The arbiter's moves (``Release`` then ``LoadFirstFitting`` commands) and the vision encoder's
borrowing (the same two, run by the engine itself) both go through these; which candidates to
try is the caller's rule (arbiter/reshard.py: never a larger plan than the target, one failed
GPU load means the game is growing, so the CPU plan next). Engine thread only.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import llama_cpp

from igi_sdk.runtime.engine_state import ParkBuffer, ParkedState
from igi_sdk.runtime.placement import Placement
from igi_sdk.runtime.session import Session

log = logging.getLogger("igi_sdk.runtime")


@dataclass(frozen=True)
class LoadOutcome:
    """What a ``LoadFirstFitting`` did: the plan that loaded (None: none did, the engine is
    unavailable with its sessions kept), each failed candidate's (plan, error), and whether
    the parked state could not be put back (every session re-reads its conversation)."""

    landed: str | None
    failures: tuple[tuple[str, str], ...] = ()
    seconds: float = 0.0
    state_lost: bool = False


def park(placed: Placement, sessions: list[Session], into: ParkBuffer) -> ParkedState:
    """Park the context's state in ``into`` and free the samplers that point into the
    vocabulary (the placement stays open); returns the parked state."""
    parked = placed.park(into)
    for s in sessions:
        if s.turn and s.turn.chain:  # grammar samplers point into the old vocab
            s.turn.chain.close()
            s.turn.chain = None
    return parked


def restore(placed: Placement, parked: ParkedState | None, sessions: list[Session],
            max_sessions: int) -> bool:
    """Put ``parked`` back into a new placement and trim what changed since it was taken
    (closed sessions, rolled-back turns); False if llama.cpp refused it — then every session's
    cache is empty: a session replying reads its tokens again as the first part of its reply's
    input (the reply goes on where it was; priced as a prompt of that length), an idle one
    re-reads its conversation with its next line (``reread``)."""
    lost = parked is not None and not placed.restore(parked)
    mem = placed.mem
    for s in sessions:
        if lost:
            llama_cpp.llama_memory_seq_rm(mem, s.seq, -1, -1)
            if s.turn is not None and not s.image_cells and not s.turn.images:
                s.turn.feed = s.reread_in_reply() + s.turn.feed  # the reply goes on
            else:
                s.cache_lost()
        else:
            llama_cpp.llama_memory_seq_rm(mem, s.seq, len(s.tokens), -1)
    used = {s.seq for s in sessions}
    for seq in range(max_sessions):
        if seq not in used:
            llama_cpp.llama_memory_seq_rm(mem, seq, -1, -1)
    if lost:
        log.error("the parked state did not restore; sessions will re-read their history")
    return not lost
