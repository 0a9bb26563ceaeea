"""Draft-free drafting: proposals from n-grams of a session's own tokens (pure).

Prompt-lookup decoding: the last ``n`` tokens of the context (``n`` from ``n_max`` down to
``n_min``) are looked up among the earlier ones; where they occurred last, what followed them is
proposed. NPC dialogue repeats names, items and phrases of its prompt and of earlier turns, and
a proposal costs one dict probe per ``n`` — no draft model, no VRAM, no decode.

:class:`NgramIndex` keeps, per ``n``, the position that followed the latest occurrence of each
n-gram, updated as tokens are appended; a context that is not an extension of the indexed one
(a rollback, a restore) is indexed again from the common prefix on.
"""

from __future__ import annotations


class NgramIndex:
    """The n-gram index of one token sequence (one session)."""

    def __init__(self, n_min: int = 2, n_max: int = 4) -> None:
        if not 1 <= n_min <= n_max:
            raise ValueError(f"n-gram sizes must satisfy 1 <= n_min <= n_max (got {n_min}, "
                             f"{n_max})")
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        # per n: n-gram -> the position right after its latest occurrence (one whose
        # continuation is known, so never the context's own last n tokens)
        self._after: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in
                                                               range(n_min, n_max + 1)}

    def sync(self, context: list[int]) -> None:
        """Index ``context``: appended tokens are added; a context that diverges from the
        indexed one is indexed again (positions past the divergence would point at text the
        session no longer has)."""
        toks = self.tokens
        n = min(len(toks), len(context))
        if len(context) < len(toks) or toks[:n] != context[:n]:  # C-speed list compares
            self.tokens = []
            self._after = {k: {} for k in self._after}
            toks = self.tokens
        for tok in context[len(toks):]:
            self._append(tok)

    def _append(self, tok: int) -> None:
        toks = self.tokens
        end = len(toks)  # the new token sits at `end`: it continues the n-grams ending there
        for n, table in self._after.items():
            if end >= n:
                table[tuple(toks[end - n:end])] = end
        toks.append(tok)

    def propose(self, context: list[int], k: int) -> list[int]:
        """Up to ``k`` tokens that followed the latest earlier occurrence of the longest
        matching suffix of ``context`` (empty: no match). A match that runs into the present
        continues with its own proposal (a repeating pattern repeats)."""
        self.sync(context)
        toks, end = self.tokens, len(self.tokens)
        if k <= 0:
            return []
        for n in range(self.n_max, self.n_min - 1, -1):
            if end < n:
                continue
            start = self._after[n].get(tuple(toks[end - n:end]))
            if start is None:
                continue
            out: list[int] = []
            for i in range(k):
                p = start + i
                out.append(toks[p] if p < end else out[p - end])
            return out
        return []
