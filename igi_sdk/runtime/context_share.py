"""Who may take how many of the shared context's KV cells: the rule, as pure arithmetic.

All sessions decode in one llama.cpp context of ``n_ctx`` cells (a unified KV cache: an idle
NPC reserves nothing in llama.cpp itself). Without a rule, one long line (a huge prompt, an
image, a long reply) could fill the cells and leave every other session unable to say a word.
The rule:

* Every session slot (``max_sessions`` of them, open or not) is guaranteed a **floor** of
  cells: by default ``n_ctx // (2 * max_sessions)``, so half the context is floors and half is a
  pool shared first come, first served.
* A session *claims* the cells it holds plus those its reply in progress has been admitted
  for (the rest of its prompt and images). A claim below the floor counts as the floor.
* A session may claim up to its **room**: ``n_ctx`` minus what every other slot claims (at
  least its floor). It may thus grow beyond its floor only into cells that no other session
  holds and no other slot's floor needs; at most ``n_ctx - (max_sessions - 1) * floor``.

Because claims only grow within the room, the claims of all slots never add up to more than
``n_ctx``: a session always has at least its floor, whatever the others do.

The game may also **cap** what one session holds (``serve --session-ctx``,
``EngineConfig.session_ctx``): a session then never claims more than ``cap`` cells, whatever
room is free, as a llama-server slot never holds more than its ``n_ctx / --parallel``. A
prompt longer than that is refused outright (PromptTooLongError), never waited for.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from enum import Enum


class Admit(Enum):
    """What becomes of a request for cells."""

    OK = "ok"
    WAIT = "wait"  # other sessions hold the cells: retry once they end or close
    NEVER = "never"  # more than one session may ever hold, even with every other slot idle


@dataclass(frozen=True)
class ContextShare:
    n_ctx: int
    slots: int  # max_sessions
    floor: int  # cells guaranteed to every slot
    cap: int = 0  # the most cells one session may hold (0: what the floors leave it)

    @classmethod
    def of(cls, n_ctx: int, max_sessions: int, floor: int = -1, cap: int = 0) -> ContextShare:
        """The share of ``n_ctx`` cells among ``max_sessions`` slots; ``floor`` < 0 takes the
        default rule (half the context as floors), 0 none (first come, first served); a floor
        larger than an even split is cut to it. ``cap`` > 0: no session holds more than that
        many cells (a floor above it is cut to it: a slot keeps no cells it may never use)."""
        if cap < 0:
            raise ValueError(f"a session's cap is 0 (none) or a count of cells, not {cap}")
        slots = max(1, max_sessions)
        even = n_ctx // slots
        f = n_ctx // (2 * slots) if floor < 0 else floor
        f = max(0, min(f, even))
        return cls(n_ctx, slots, min(f, cap) if cap else f, cap)

    @property
    def most(self) -> int:
        """The most cells one session may ever claim (every other slot at its floor, and no
        more than the cap)."""
        left = self.n_ctx - (self.slots - 1) * self.floor
        return min(left, self.cap) if self.cap else left

    def reserved(self, claim: int) -> int:
        """Cells a slot claiming ``claim`` keeps from the others."""
        return max(claim, self.floor)

    def room(self, others: Iterable[int]) -> int:
        """Cells a session may claim while the other open sessions claim ``others``; the
        slots not open keep their floors."""
        claims = list(others)
        idle = max(0, self.slots - 1 - len(claims))
        return min(self.most,
                   self.n_ctx - sum(self.reserved(c) for c in claims) - idle * self.floor)

    def admit(self, need: int, others: Iterable[int]) -> Admit:
        """Whether a session may claim ``need`` cells while the others claim ``others``."""
        if need > self.most:
            return Admit.NEVER
        return Admit.OK if need <= self.room(others) else Admit.WAIT

    def rooms(self, claims: dict[str, int]) -> dict[str, int]:
        """The room of every open session (by id) given all their claims, in one pass."""
        idle = max(0, self.slots - len(claims))
        total = sum(self.reserved(c) for c in claims.values()) + idle * self.floor
        return {sid: min(self.most, self.n_ctx - (total - self.reserved(c)))
                for sid, c in claims.items()}

    def to_reclaim(self, need: int, claims: dict[str, int], idle: list[str]) -> list[str]:
        """The idle sessions (of ``idle``, taken in its order) whose cells must go so that a
        session may claim ``need`` while the other open sessions claim ``claims`` (by id):
        dropping one returns what it claims beyond its floor. None at all when even every
        idle session's cells would not make the room (they would be re-read for nothing)."""
        if need > self.most:
            return []
        free = self.room(claims.values())  # below ``need`` (<= most): not cut by the cap
        out = []
        for sid in idle:
            if free >= need:
                break
            gain = self.reserved(claims[sid]) - self.floor
            if gain > 0:
                free += gain
                out.append(sid)
        return out if free >= need else []
