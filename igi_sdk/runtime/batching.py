"""One decode step's batch: which tokens of which replies go in the engine's reused
llama_batch (how many of each: the scheduler's :func:`~igi_sdk.runtime.scheduler.takes`),
drafts after the plain tokens. Functions of their inputs, called on the engine thread."""

from __future__ import annotations

from typing import Any

from igi_sdk.runtime import scheduler
from igi_sdk.runtime.session import Turn
from igi_sdk.runtime.speculative import Proposal, put_token

# (turn, tokens taken, batch index of its logits or -1) per turn fed
Fed = list[tuple[Turn, int, int]]


def fill_batch(batch: Any, cap: int, turns: list[Turn], budget: int) -> Fed:
    """Put up to ``budget`` pending tokens in the (reused) llama_batch of ``cap`` tokens; every
    decoding reply gets its one token even past the budget (bounded by the session count).

    Returns (turn, tokens taken, batch index of its logits or -1) per turn fed."""
    fed: Fed = []
    n = 0
    token, pos, n_seq_id, seq_ids, logits = _fields(batch, cap)
    for t, take in zip(turns, scheduler.takes([len(t.feed) for t in turns], budget, cap),
                       strict=True):
        if take <= 0:
            continue
        pos0, seq, feed = len(t.session.tokens), t.session.seq, t.feed
        for i in range(take):
            token[n + i] = feed[i]
            pos[n + i] = pos0 + i
            n_seq_id[n + i] = 1
            seq_ids[n + i][0] = seq
            logits[n + i] = 0
        # the prompt is complete (no image left to read): sample after it
        wants_logits = take == len(feed) and not t.images
        if wants_logits:
            logits[n + take - 1] = 1
        fed.append((t, take, n + take - 1 if wants_logits else -1))
        n += take
    batch.n_tokens = n
    return fed


def fill_next(batch: Any, cap: int, picks: list[tuple[Turn, int]]) -> Fed:
    """Each decoding reply's just-sampled token at the position after its session's cached
    tokens, logits at each: the step after this one, put in the batch before the token is
    taken (EngineCore's launch ahead). Returns the turns fed as :func:`fill_batch` does."""
    token, pos, n_seq_id, seq_ids, logits = _fields(batch, cap)
    fed: Fed = []
    for i, (t, tok) in enumerate(picks):
        token[i] = tok
        pos[i] = len(t.session.tokens)
        n_seq_id[i] = 1
        seq_ids[i][0] = t.session.seq
        logits[i] = 1
        fed.append((t, 1, i))
    batch.n_tokens = len(picks)
    return fed


# a batch's field pointers, fetched once per batch object and kept on it: reading a pointer
# field of a ctypes structure makes a new pointer object each time (five per token otherwise).
# llama_batch_init's arrays never move while the batch lives.
_Fields = tuple[Any, Any, Any, list[Any], Any]


def _fields(batch: Any, cap: int) -> _Fields:
    fields: _Fields | None = getattr(batch, "_fields_of_igi", None)
    if fields is None or len(fields[3]) < cap:
        seq_id = batch.seq_id
        fields = (batch.token, batch.pos, batch.n_seq_id, [seq_id[i] for i in range(cap)],
                  batch.logits)
        batch._fields_of_igi = fields
    return fields


def add_drafts(batch: Any, cap: int, outputs_cap: int, fed: Fed,
               drafts: dict[int, Proposal]) -> None:
    """Append the drafts of the decoding replies after the step's plain tokens, logits at
    each: the plain tokens (and so the split of prompts into chunks) and their KV cells are
    those of a step without drafts; drafts past the batch's capacity are cut (and dropped
    from ``drafts``), each kept one's ``rows`` set to its verify positions' logits rows."""
    n = batch.n_tokens
    room = cap - n
    # logits rows: llama.cpp aborts past the context's n_outputs_max
    rows = min(room, outputs_cap - sum(1 for _, _, idx in fed if idx >= 0))
    for t, take, idx in fed:
        proposal = drafts.get(t.session.seq)
        if proposal is None:
            continue
        keep = min(len(proposal.tokens), rows) if take == 1 and idx >= 0 else 0
        if keep == 0:
            del drafts[t.session.seq]
            continue
        del proposal.tokens[keep:], proposal.dists[keep:]
        pos0, seq = len(t.session.tokens) + 1, t.session.seq
        proposal.rows = [idx, *range(n, n + keep)]
        for i, tok in enumerate(proposal.tokens):
            put_token(batch, n + i, tok, pos0 + i, seq, True)
        n += keep
        rows -= keep
    batch.n_tokens = n
