"""The engine-thread side of a session's memory (runtime/memory.py decides, this applies):
counting a conversation's tokens, folding turns out of the context, and the summary reply that
the model writes about them before the line, on the session's own sequence.

The summary is an ordinary :class:`~igi_sdk.runtime.session.Turn` (prompt chunks and decode
steps scheduled with every other NPC's, cancelled with the line's handle); its text goes into
the memory message, never to the player. It is asked at the end of the conversation the cache
holds (only the request is read: :func:`recall_prompt`); its cells then leave the cache, and the
line starts on the folded conversation: the cached system prompt and pinned facts are kept, the
new summary, the kept turns and the line are read (the KV cache keeps that prefix until the
next fold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import llama_cpp

from igi_sdk.errors import PromptTooLongError
from igi_sdk.runtime import image_turn, prefix
from igi_sdk.runtime import memory as M
from igi_sdk.runtime.sampling import SamplingParams
from igi_sdk.runtime.session import UNALIGNED, Session, Turn
from igi_sdk.runtime.text import Vocab

# the summary is greedy: the same turns give the same memory, and no sampler state moves; a
# repeat penalty, since a small model's greedy summary otherwise loops on one phrase
GREEDY = SamplingParams(temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.3)


@dataclass
class Resume:
    """A line started after its conversation was folded."""

    handle: Any  # the line's Generation (made when its summary started), or None
    dropped: int
    summarised: int


@dataclass
class Summary:
    """What a summary turn (``Turn.memo``) carries: the line it runs for, the fold it writes
    about, and the session's sampling state to put back after it."""

    line: Any  # the line's commands.StartReply, started again once the summary is written
    fold: M.Fold
    dropped: list[dict[str, str]]
    n_history: int
    n_sampled: int
    feed: list[int]  # the summary's prompt
    params: SamplingParams = GREEDY
    kept: int = 0  # the cache's tokens the prompt starts with (they stay after the summary)


def count(vocab: Vocab, mem: M.Memory, text: str, most: int) -> int:
    """Tokens of one message (its content, as data, and its template's markup). A text that
    cannot fit ``most`` tokens whatever its tokens are is not tokenized (no token spells more
    bytes than the vocabulary's longest piece): its lower bound is enough to drop it."""
    n = mem.counts.get(text)
    if n is None:
        size = len(text.encode("utf-8"))
        fewest = -(-size // vocab.longest_piece())
        if fewest > most:
            return fewest + M.MESSAGE_OVERHEAD
        n = len(vocab.tokenize(text, add_special=False, parse_special=False))
        mem.counts[text] = n
    return n + M.MESSAGE_OVERHEAD


def latest_counts(vocab: Vocab, mem: M.Memory, texts: list[str], budget: int) -> list[int]:
    """Each text's tokens, counted from the latest back until they pass ``budget``; older
    ones are only bounded from below (they leave the context whatever they hold), so a long
    history costs the engine thread no more than what may stay."""
    out, total = [0] * len(texts), 0
    for i in range(len(texts) - 1, -1, -1):
        if total > budget:
            out[i] = -(-len(texts[i].encode("utf-8")) // vocab.longest_piece())
            continue
        out[i] = count(vocab, mem, texts[i], budget)
        total += out[i]
    return out


def check_line(vocab: Vocab, s: Session, content: str, max_tokens: int, most: int) -> None:
    """PromptTooLongError for a line that cannot fit ``most`` even after a fold: the system
    prompt, the pinned facts and the reminder (kept by every fold), the line and its reply's room
    (memory.never_fits). Counted as the fold counts (the template's markup over-counted);
    a line well under the share costs no tokenizing (its bytes bound its tokens)."""
    mem = s.memory
    texts = [t for t in (mem.system or "", M.memory_text(mem.pinned, ""), mem.reminder) if t]
    if sum(len(t.encode("utf-8")) + M.MESSAGE_OVERHEAD for t in [*texts, content]) \
            + M.reply_room(max_tokens, most) + M.MARGIN <= most:
        return  # a token spells one byte at least: it fits
    kept = sum(count(vocab, mem, t, most) for t in texts)
    line = count(vocab, mem, content, most)
    if M.never_fits(kept_tokens=kept, line_tokens=line, max_tokens=max_tokens, most=most):
        room = M.reply_room(max_tokens, most)
        raise PromptTooLongError(
            f"this line is about {line} tokens and the system prompt about {kept}, and {room} "
            f"are kept for the reply; one session may hold at most {most} of the context's "
            "cells, and no fold of the earlier turns makes room for it. Shorten the line or "
            "the system prompt, or ask for fewer max_tokens")


def plan_line(vocab: Vocab, s: Session, content: str, max_tokens: int,
              most: int) -> M.Fold | None:
    """The fold this line needs (None: none, or memory is off for this session)."""
    mem = s.memory
    if mem.mode != "fold" or s.n_images:  # an image's cells cannot be re-read from text
        return None
    if len(mem.counts) > 4 * len(s.messages) + 64:  # contents no longer in context
        live = {m["content"] for m in s.messages} | {content}
        mem.counts = {k: v for k, v in mem.counts.items() if k in live}
    head, turns = s.messages[:mem.head], s.messages[mem.head:]
    head_tokens = sum(count(vocab, mem, m["content"], most) for m in head)
    bare = M.memory_text(mem.pinned, "")
    head_after = (sum(count(vocab, mem, m["content"], most) for m in head[:1] if mem.system)
                  + (count(vocab, mem, bare, most) if bare else M.MESSAGE_OVERHEAD)
                  + M.SUMMARY_TOKENS + 8)  # "Earlier in this conversation: "
    return M.plan(head_tokens=head_tokens, head_after=head_after,
                  turns=latest_counts(vocab, mem, [m["content"] for m in turns], most),
                  roles=[m["role"] for m in turns],
                  line_tokens=(count(vocab, mem, content, most)  # the reminder comes with it
                               + (count(vocab, mem, mem.reminder, most) if mem.reminder else 0)),
                  max_tokens=max_tokens, most=most)


def summary_prompt(vocab: Vocab, s: Session, dropped: list[dict[str, str]],
                   budget: int) -> list[int]:
    """The summary's prompt tokens, its material cut to ``budget`` tokens (the latest turns
    first; [] when not one of them fits); special tokens come from the template's markup
    only."""
    mem = s.memory
    lines = M.transcript_lines(dropped)
    lines = M.fit_lines(lines, latest_counts(vocab, mem, lines, budget), budget)
    if dropped and not lines:
        return []
    parts = vocab.prompt_parts(M.summary_messages(mem.summary, lines, mem.system),
                               add_assistant=True)
    return vocab.tokenize_parts(parts, add_special=True)


def recall_prompt(vocab: Vocab, s: Session, dropped: list[dict[str, str]],
                  room: int) -> list[int]:
    """The summary's prompt as the cached conversation up to the dropped turns' end and the
    request (memory.recall_messages); [] when it cannot fit ``room`` tokens (counted from the
    latest turns back, so a history far past the room is not tokenized whole)."""
    mem = s.memory
    head = s.messages[:mem.head]
    texts = [m["content"] for m in (*head, *dropped)]
    if sum(latest_counts(vocab, mem, texts, room)) > room:
        return []
    parts = vocab.prompt_parts(M.recall_messages(head, dropped), add_assistant=True)
    feed = vocab.tokenize_parts(parts, add_special=True)
    return feed if len(feed) <= room else []


def prepare(vocab: Vocab, s: Session, line: Any, room: int,
            most: int) -> Summary | Resume | None:
    """What a line (a commands.StartReply) needs first: None (nothing to fold), a
    :class:`Summary` to run (its prompt fits ``room``, the cells the session may claim now),
    or a :class:`Resume` after the oldest turns were dropped without one (no room to write
    it)."""
    f = plan_line(vocab, s, image_turn.user_content(line.text, 0), line.max_tokens, most)
    if f is None:
        return None
    dropped = s.messages[s.memory.head:][:f.drop]
    room -= M.SUMMARY_TOKENS + 2  # the summary's reply, its first token and a spare cell
    feed = recall_prompt(vocab, s, dropped, room) if dropped else []
    if not feed:  # the conversation does not fit the room left: the dropped turns as data
        bare = len(summary_prompt(vocab, s, [], 0))  # the instruction and what was remembered
        feed = summary_prompt(vocab, s, dropped, room - bare) if room - bare >= 32 else []
    if not feed or len(feed) > room:
        fold(s, f, None)
        return Resume(None, len(dropped), 0)
    return Summary(line, f, dropped, len(s.history), s.n_sampled, feed)


def turn(s: Session, handle: Any, job: Summary, order: int) -> Turn:
    """The summary's turn (its sampler is the engine's to make)."""
    return Turn(session=s, handle=handle, feed=list(job.feed), prompt_text="",
                prompt_tokens=len(job.feed), max_tokens=M.SUMMARY_TOKENS,
                stop=M.SUMMARY_STOP, grammar=None, order=order, memo=job)


def ended(t: Turn, mem_handle: Any, error: BaseException | None, *,
          cancelled: bool) -> Resume | None:
    """A summary turn ended: its cells are dropped; unless it failed or was cancelled (None:
    nothing is folded), its text becomes the memory and the oldest turns leave the prompt;
    returns how the line resumes."""
    job, mem = t.memo, t.session.memory
    forget(t, mem_handle)
    mem.summary_prompt_tokens += t.prompt_tokens
    mem.summary_tokens += len(t.generated)
    if error is not None or cancelled:
        t.raw, t.generated, t.prompt_tokens = "", [], 0
        return None
    summary = M.clean_summary(t.raw) or None
    fold(t.session, job.fold, summary)
    n = len(job.dropped)
    return Resume(t.handle, n, n if summary else 0)


def start(s: Session, turn: Turn, mem_handle: Any) -> None:
    """The summary ``turn`` takes the session's sequence: the cache's longest common token
    prefix with its prompt stays (the conversation up to the dropped turns' end, when the
    prompt is :func:`recall_prompt`'s), the rest of the cache is dropped; the line reads what
    it needs again (runtime/prefix.py keeps the system prompt and pinned facts)."""
    job: Summary = turn.memo
    keep = prefix.keep(s.tokens, job.feed) if not s.reread and not s.image_cells else 0
    if keep and llama_cpp.llama_memory_seq_rm(mem_handle, s.seq, keep, -1):
        s.kept_prefix(turn, keep)
        turn.feed, turn.cached_cells = job.feed[keep:], keep
        turn.prompt_tokens = len(turn.feed)
        job.kept = keep
    else:  # nothing in common, or a cache that cannot drop a tail (recurrent layers)
        llama_cpp.llama_memory_seq_rm(mem_handle, s.seq, -1, -1)
        s.cache_lost()
        s.reread_for(turn)
        s.reread = True  # until the line has read the conversation again
        job.kept = 0
    s.turn = turn


def forget(t: Turn, mem_handle: Any) -> None:
    """The summary's cells leave the sequence and its tokens the sampling history; the
    conversation's cached prefix stays (the next line keeps what it has in common with it and
    reads the rest), or, without one, the conversation is read again (idempotent)."""
    s, job = t.session, t.memo
    kept = job.kept
    if (kept and mem_handle is not None and not s.reread and len(s.tokens) >= kept
            and llama_cpp.llama_memory_seq_rm(mem_handle, s.seq, kept, -1)):
        del s.tokens[kept:]
        s.pending, s.committed_text = [], UNALIGNED  # the next line aligns by tokens
    else:
        if mem_handle is not None:
            llama_cpp.llama_memory_seq_rm(mem_handle, s.seq, -1, -1)
        s.cache_lost()
    del s.history[job.n_history:]
    s.n_sampled = job.n_sampled


def fold(s: Session, f: M.Fold, summary: str | None) -> list[dict[str, str]]:
    """Move the first ``f.drop`` turns to the archive and rebuild the head (with ``summary``
    as the memory when given, else the memory as it was); returns the dropped turns."""
    mem = s.memory
    turns = s.messages[mem.head:]
    dropped, kept = turns[:f.drop], turns[f.drop:]
    mem.archive.extend(dropped)
    if summary is not None:
        mem.summary = summary
        mem.summaries += 1
    mem.folds += 1
    mem.dropped += len(dropped)
    s.messages = M.head_of(mem) + kept
    return dropped


def transcript(s: Session) -> list[dict[str, str]]:
    """Every message of the conversation, those folded out of the context included (the
    system prompt first; the memory message is not part of it)."""
    mem = s.memory
    head = [{"role": "system", "content": mem.system}] if mem.system else []
    return head + mem.archive + s.messages[mem.head:]
