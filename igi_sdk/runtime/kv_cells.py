"""KV cells moved between the sessions of the unified cache (engine thread; llama.cpp calls
on the context's memory): idle sessions give theirs back when another needs them, and a
session whose cache is empty takes the longest prefix of its prompt that another holds."""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

import llama_cpp

from igi_sdk.runtime import prefix
from igi_sdk.runtime.context_share import Admit, ContextShare
from igi_sdk.runtime.session import Session, Turn

# the fewest tokens a session takes from another's cache (below, a template's opening markup:
# nothing worth the search)
SHARED_PREFIX_MIN = 16


def reclaim_idle(share: ContextShare, sessions: Collection[Session],
                 claim: Callable[[Session], int], mem: Any, need: int,
                 but: Session | None) -> int:
    """Idle sessions give their cells back, background and least recently spoken first, until
    a session other than them (``but``) may claim ``need`` cells; each reads its conversation
    again with its next line. Returns how many gave theirs. Without this an idle NPC kept its
    cells until it closed: a talking NPC's line waited for them and its reply was cut at its
    room while nobody used them."""
    others = [o for o in sessions if o is not but]
    if share.admit(need, [claim(o) for o in others]) is not Admit.WAIT:
        return 0
    idle = sorted((o for o in others if o.turn is None and o.cells and o.rereadable),
                  key=lambda o: (o.priority, o.last_line))
    by_id = {o.id: o for o in idle}
    gone = share.to_reclaim(need, {o.id: claim(o) for o in others}, list(by_id))
    for sid in gone:
        o = by_id[sid]
        llama_cpp.llama_memory_seq_rm(mem, o.seq, -1, -1)
        o.cache_lost()
    return len(gone)


def share_prefix(t: Turn, sessions: Collection[Session], mem: Any) -> int:
    """``t``'s session (its cache empty) starts from the longest prefix of ``t``'s prompt that
    another session's cache holds: in llama.cpp's unified cache the sequences then share those
    cells, nothing copied or recomputed, and they outlive the session they came from. Returns
    the tokens taken (0: none worth it). Not for a draft model's engine (the draft's cache
    lacks them) nor a recurrent model (a state, not cells): the caller checks."""
    s = t.session
    best, donor = 0, None
    for o in sessions:
        if o is not s and not o.n_images and len(o.tokens) > best:
            n = prefix.keep(o.tokens, t.feed)
            if n > best:
                best, donor = n, o
    if donor is None or best < SHARED_PREFIX_MIN:
        return 0
    llama_cpp.llama_memory_seq_cp(mem, donor.seq, s.seq, 0, best)
    s.decoded(t.feed[:best])
    del t.feed[:best]
    t.cached_cells += best
    t.prompt_tokens -= best  # what the line reads
    return best
