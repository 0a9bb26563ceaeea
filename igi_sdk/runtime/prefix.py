"""What a line reads of its prompt when the session's conversation was rewritten (pure: no
llama.cpp, no engine state).

A client that trims an earlier reply, stops a stream early, inserts an instruction or sends a
transcript whose template renders history differently changes the text before the new line.
The KV cache then still holds the tokens the earlier prompt had: the longest common token prefix
of those and of the new prompt is kept, and only the rest is read (:func:`keep`). A transcript
that ends with an assistant message is continued (prefill): the template renders that message
open (:func:`open_last`)."""

from __future__ import annotations

from collections.abc import Sequence

from igi_sdk.runtime.speculative import common_prefix

Part = tuple[str, bool]  # (text, is the template's own markup): text.Part
Message = dict[str, str]
_C_SPACE = " \t\n\v\f\r"  # what llama.cpp's trim() takes off a content (text.py)


def keep(held: Sequence[int], new: Sequence[int]) -> int:
    """Tokens of ``held`` (the cache's) kept for the prompt ``new``: their longest common
    prefix, less one when ``new`` is all cached (its last token is read again: the reply's
    first token is sampled from the logits that read gives)."""
    if not new:
        return 0
    n = common_prefix(list(held), list(new))
    return min(n, len(new) - 1)


def rewritten(messages: Sequence[Message], history: Sequence[tuple[str, str]]) -> list[Message]:
    """The conversation ``messages`` with everything after its system prompt (its first
    message, when that is a system message) replaced by ``history``."""
    head = [dict(messages[0])] if messages and messages[0]["role"] == "system" else []
    return head + [{"role": role, "content": text} for role, text in history]


def is_prefill(messages: Sequence[Message], line: str, has_images: bool,
               rewrite: bool) -> bool:
    """A line continues the last assistant message: the conversation was rewritten (a client
    sends the whole transcript) and ends with an assistant message, and the line is empty."""
    return (rewrite and not line and not has_images and bool(messages)
            and messages[-1]["role"] == "assistant")


def open_last(parts: Sequence[Part], content: str) -> list[Part] | None:
    """``parts`` (a conversation rendered without a generation prompt) with the markup that
    closes its last message cut off, so the model writes on from ``content``, that message's
    (non-empty) text; None when the last content part is not that text (a template that
    rewrites it: the message cannot be continued)."""
    last = max((i for i, (_, markup) in enumerate(parts) if not markup), default=-1)
    if last < 0:
        return None
    text = parts[last][0]
    if text not in (content.partition("\0")[0], content.partition("\0")[0].strip(_C_SPACE)):
        return None
    return list(parts[:last + 1])
