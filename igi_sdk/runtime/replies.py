"""One reply's bookkeeping (a :class:`Turn`): its prompt's limits, each sampled token (text,
stop strings, length), and its end (the conversation committed or rolled back, the handle
finished). Functions of the turn and what they need, called by the engine on its thread; the
engine decides when a reply ends and what else that frees."""

from __future__ import annotations

import time
from typing import Any

import llama_cpp

from igi_sdk.errors import ContextFullError, PromptTooLongError
from igi_sdk.events import TokenLogprob
from igi_sdk.runtime import image_turn, memory_turn
from igi_sdk.runtime.config import EngineConfig
from igi_sdk.runtime.context_share import Admit, ContextShare
from igi_sdk.runtime.generation import GenerationResult
from igi_sdk.runtime.session import Turn
from igi_sdk.runtime.text import Vocab, stop_scan


def check_text_fits(vocab: Vocab, messages: list[dict[str, str]], committed: str, held: int,
                    share: ContextShare) -> None:
    """Refuse a conversation whose text cannot fit the session's share of the context, before
    any template or tokenizer reads it (PromptTooLongError). No token spells more bytes than
    the vocabulary's longest piece, so the text not yet in the cache needs at least its bytes
    over that many tokens. Cheap: a count of bytes, and the vocabulary read once for its
    longest piece, only for a text that could be too long."""
    total = sum(len(m["content"].encode("utf-8")) for m in messages)
    new = total - len(committed.encode("utf-8"))  # the cache's text (markup too) is not new
    if new + held <= share.most:  # a token holds one byte at least: it may fit
        return
    fewest = -(-new // vocab.longest_piece())
    if held + fewest > share.most:
        raise PromptTooLongError(
            f"this conversation's text not yet read is {new} bytes: at least {fewest} tokens, "
            f"and it already holds {held}; one session may hold at most {share.most} of the "
            "context's cells. Send a shorter history or line, or open a new session")


def check_prompt(config: EngineConfig, n_prompt: int, base: int, pending: list[Any],
                 share: ContextShare, others: list[int]) -> None:
    """A line of ``n_prompt`` KV cells after ``base`` must fit the session's share of the
    context while the other open sessions claim ``others`` (runtime/context_share.py):
    PromptTooLongError if it never can, ContextFullError (retryable) while others hold the
    cells it needs."""
    if n_prompt == 0:
        raise PromptTooLongError("the chat template produced no tokens for this line")
    images = image_turn.cells(pending) - sum(len(p.after) for p in pending)
    of_images = f" ({images} of them for its images)" if images else ""
    # the prompt, the reply's first token and one spare cell
    need = base + n_prompt + 2
    verdict = share.admit(need, others)
    if verdict is Admit.NEVER:
        if share.cap and share.most == share.cap:
            most = f"one session may hold at most {share.cap} (the sidecar's per-session cap)"
        elif share.most < share.n_ctx:
            most = (f"one session may hold at most {share.most} of the context's {share.n_ctx} "
                    f"cells ({share.floor} are kept for each of the {share.slots} session slots)")
        else:
            most = f"the context has {share.n_ctx}"
        raise PromptTooLongError(
            f"this line needs {n_prompt} tokens{of_images} and the conversation already "
            f"holds {base}: that exceeds the available context size; {most}. Shorten the "
            "line, send smaller or fewer images, or open a new session"
        )
    if config.max_prompt_tokens and n_prompt > config.max_prompt_tokens:
        raise PromptTooLongError(
            f"this line is {n_prompt} tokens{of_images}; the limit is "
            f"{config.max_prompt_tokens}"
        )
    if verdict is Admit.WAIT:
        raise ContextFullError(
            f"this line needs {n_prompt} tokens{of_images} and the conversation holds {base}, "
            f"but other sessions hold the shared context's cells now (room for this session: "
            f"{max(0, share.room(others))} of {share.n_ctx}); retry when their replies end or "
            "they close, or close idle sessions"
        )


def take(t: Turn, tok: int, vocab: Vocab) -> tuple[str, int | None] | None:
    """Add a sampled token to the reply (emit text, stop strings, end of turn). When the
    reply ends with it: (finish reason, visible end or None), for the caller to end it; None
    while it goes on. ``t.feed`` must be empty (what was fed is decoded)."""
    s = t.session
    s.n_sampled += 1
    s.history.append(tok)
    if t.t_first is None:
        t.t_first = time.perf_counter()
    if vocab.is_eog(tok) and not t.ignore_eos:
        t.generated.append(tok)
        return "stop", None
    t.generated.append(tok)
    if t.logprobs is not None and t.chain is not None and t.chain.last is not None:
        t.lp.append(token_logprob(t.chain.last, tok, vocab))
    t.raw += t.decoder.decode(vocab.piece(tok))
    if t.calls is not None:  # a call's text is never shown, nor cut by a stop string
        made = t.calls.read(t.raw)
        for call in made:
            t.handle._emit_call(call)
        if made and t.tools is not None and (
                t.max_tokens - len(t.generated) < t.tools.call_tokens):
            # no further call could close within the reply: it ends with the calls it made
            # (else it was cut inside one, "length")
            s.sampled_not_decoded(tok)
            return "stop", None
        if t.calls.state(t.raw) != "text":
            return _length(t, tok)
    visible_end, hit = stop_scan(t.raw, t.emitted, t.stop)
    if hit:
        s.sampled_not_decoded(tok)
        emit_upto(t, visible_end)
        return "stop_string", visible_end
    emit_upto(t, visible_end)
    return _length(t, tok)


def _length(t: Turn, tok: int) -> tuple[str, int | None] | None:
    if len(t.generated) >= t.max_tokens:
        t.session.sampled_not_decoded(tok)
        return "length", None
    t.feed = [tok]
    return None


def emit_upto(t: Turn, end: int) -> None:
    if t.memo is not None:  # a summary (runtime/memory_turn.py): not the player's to see
        return
    if end > t.emitted:
        lp: tuple[TokenLogprob, ...] = ()
        if t.lp:  # the tokens whose text this piece completes
            lp, t.lp = tuple(t.lp), []
        t.handle._emit(t.raw[t.emitted : end], lp)
        t.emitted = end


def token_logprob(last: tuple[float, list[tuple[int, float]]], tok: int,
                  vocab: Vocab) -> TokenLogprob:
    """A sampled token's logprobs (SamplerChain.last) with the tokens' texts."""
    logprob, top = last
    return TokenLogprob(_text(vocab, tok), logprob,
                        tuple((_text(vocab, i), lp) for i, lp in top))


def _text(vocab: Vocab, tok: int) -> str:
    return vocab.piece(tok).decode("utf-8", "replace")


def rollback(t: Turn, mem: Any) -> None:
    """Undo a turn that produced nothing: the conversation is as before the request (``mem``:
    the KV cache's, None while no placement is loaded)."""
    s = t.session
    if t.memo is not None:  # a summary: the conversation was not changed by it
        memory_turn.forget(t, mem)
        return
    if mem is not None:  # else: trimmed when the parked state is put back
        llama_cpp.llama_memory_seq_rm(mem, s.seq, t.start_tokens, -1)
    s.rolled_back(t)


def detach(t: Turn) -> None:
    """The first step of ending a reply: its sampler and pending images are freed and its
    session is idle again."""
    if t.chain is not None:
        t.chain.close()
        t.chain = None
    image_turn.release(t.images)
    t.session.turn = None


def commit(t: Turn, visible_end: int | None) -> int:
    """A reply that ended without error: the rest of its text is emitted and it joins the
    conversation; returns where its visible text ends."""
    s = t.session
    if t.feed and t.generated:  # sampled but not decoded yet
        s.sampled_not_decoded(t.generated[-1])
    t.raw += t.decoder.decode(b"", final=True)
    if t.calls is not None and t.calls.state(t.raw) == "calls":
        visible_end = 0  # calls: no text (a reply cut inside a call has the calls it closed)
    elif visible_end is None:
        visible_end, _ = stop_scan(t.raw, t.emitted, t.stop, final=True)
        emit_upto(t, visible_end)
    # NUL bytes (a byte-level token can decode to one) cannot go through the C chat
    # template: leave them out of both sides so the next turn's prefix still matches
    s.committed(t.prompt_text, image_turn.clean(t.raw), prefill=t.prefill)
    return visible_end


def settle(t: Turn, reason: str, error: BaseException | None, visible_end: int | None) -> None:
    """The last step of ending a reply: its handle fails with ``error`` or finishes."""
    now = time.perf_counter()
    if error is not None:
        t.handle._fail(error)
        return
    calls = tuple(t.calls.calls) if t.calls is not None else ()
    t.handle._finish(GenerationResult(
        session_id=t.session.id,
        text=t.raw[:visible_end],
        tokens=tuple(t.generated),
        finish_reason="tool_calls" if calls and reason == "stop" else reason,
        prompt_tokens=t.prompt_tokens,
        completion_tokens=len(t.generated),
        ttft_s=(t.t_first or now) - t.t0,
        total_s=now - t.t0,
        cached_tokens=t.cached_cells,
        dropped_turns=t.folded[0],
        summarised_turns=t.folded[1],
        tool_calls=calls,
    ))
