"""Tokenizer, detokenizer and chat template over llama.cpp's vocab (no Python tokenizer)."""

from __future__ import annotations

import ctypes
import logging
import re
from collections.abc import Sequence

import llama_cpp

log = logging.getLogger("igi_sdk.runtime")

# Used when a GGUF carries no chat template: ChatML is what most small instruct models speak.
FALLBACK_TEMPLATE = b"chatml"

# A templated prompt as (text, is the template's own markup) parts. Only markup may hold special
# tokens: message contents (player lines, replies, system prompts) are data, so a player who
# types "<|im_end|><|im_start|>system" gets those characters read as text, not as control.
Part = tuple[str, bool]
_C_SPACE = " \t\n\v\f\r"  # what llama.cpp's trim() (C isspace) takes off a content
# stands for message i while the template is rendered: private-use characters no template writes
_STAND_IN = "\ue000{}\ue001"
_STAND_IN_RE = re.compile("\ue000([0-9]+)\ue001")
_CONTROL = llama_cpp.LLAMA_TOKEN_ATTR_CONTROL
_USER_DEFINED = llama_cpp.LLAMA_TOKEN_ATTR_USER_DEFINED


class Vocab:
    def __init__(self, model: llama_cpp.llama_model_p) -> None:
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        tmpl = llama_cpp.llama_model_chat_template(model, None)
        self.template: bytes = tmpl if tmpl else FALLBACK_TEMPLATE
        self.n_tokens = llama_cpp.llama_vocab_n_tokens(self.vocab)
        # each token's bytes and end-of-generation flag, asked once per vocabulary entry: a
        # reply asks both for every token it samples (a dict hit costs less than the buffer
        # and the native call)
        self._pieces: dict[int, bytes] = {}
        self._eog: dict[int, bool] = {}
        self._longest: int | None = None

    def tokenize(self, text: str, *, add_special: bool, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(
            self.vocab, data, len(data), buf, cap, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(
                self.vocab, data, len(data), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def prompt_parts(self, messages: list[dict[str, str]], *, add_assistant: bool) -> list[Part]:
        """:meth:`apply_template`'s text cut into markup and message contents.

        The template is rendered a second time with a stand-in for each content; the text
        between stand-ins is markup."""
        full = self.apply_template(messages, add_assistant=add_assistant)
        stand_ins = [{"role": m["role"], "content": _STAND_IN.format(i)}
                     for i, m in enumerate(messages)]
        skeleton = self.apply_template(stand_ins, add_assistant=add_assistant)
        contents = [m["content"].partition("\0")[0] for m in messages]  # C strings, as rendered
        parts = _fill_in(skeleton, full, contents)
        if parts is not None:
            return parts
        # a template that rewrites contents beyond trimming them: the whole text is markup only
        # if no content holds special-token text, else data (a degraded prompt, never control)
        plain = all(self.tokenize(c, add_special=False)
                    == self.tokenize(c, add_special=False, parse_special=False) for c in contents)
        log.warning("chat template output not split into markup and contents; contents %s",
                    "hold no special tokens" if plain else "hold special tokens: read as text")
        return [(full, plain)]

    def tokenize_parts(self, parts: Sequence[Part], *, add_special: bool) -> list[int]:
        """Tokens of a templated prompt, with special tokens only where its markup has them.

        The text between two control tokens is tokenized in one piece with special parsing off,
        as llama.cpp does to a whole prompt with it on: when no content holds special-token text
        the tokens are exactly those of the joined text, and a prompt cut between parts (the
        engine's incremental turns) tokenizes as the whole does when the cut is at a control
        token, as after each message in ChatML."""
        marked = [(text, self.tokenize(text, add_special=False) if markup else None)
                  for text, markup in parts]
        # llama.cpp matches user-defined tokens even with special parsing off: those the markup
        # uses are cut apart in contents (gpt-oss's <|start|>, <|message|>, <|end|> are such)
        guard = {self._literal(t) for _, toks in marked for t in toks or ()
                 if self._attr(t) & _USER_DEFINED}
        runs, ends = [""], []  # text between control tokens; the token (or None) after each
        for text, toks in marked:
            if toks is None:
                pieces = _cut_apart(text, guard)
                runs[-1] += pieces[0]
                for piece in pieces[1:]:
                    ends.append(None)
                    runs.append(piece)
                continue
            pos = 0
            for t in toks:
                lit = self._literal(t)
                at = text.find(lit, pos) if self._attr(t) & _CONTROL else -1
                if at >= 0:
                    runs[-1] += text[pos:at]
                    ends.append(t)
                    runs.append("")
                    pos = at + len(lit)
            runs[-1] += text[pos:]
        add_bos = add_special and llama_cpp.llama_vocab_get_add_bos(self.vocab)
        out = [llama_cpp.llama_vocab_bos(self.vocab)] if add_bos else []
        for i, run in enumerate(runs):
            before = ends[i - 1] if i else None
            after = ends[i] if i < len(ends) else None
            if before is not None and self._attr(before) & llama_cpp.LLAMA_TOKEN_ATTR_RSTRIP:
                run = run.lstrip(_C_SPACE)  # as llama.cpp strips around such a token
            if after is not None and self._attr(after) & llama_cpp.LLAMA_TOKEN_ATTR_LSTRIP:
                run = run.rstrip(_C_SPACE)
            if run:
                out += self.tokenize(run, add_special=False, parse_special=False)
            if after is not None:
                out.append(after)
        return out

    def _attr(self, token: int) -> int:
        return int(llama_cpp.llama_vocab_get_attr(self.vocab, token))

    def _literal(self, token: int) -> str:
        return (llama_cpp.llama_vocab_get_text(self.vocab, token) or b"").decode("utf-8", "replace")

    def piece(self, token: int) -> bytes:
        """Bytes of one token (special tokens render as nothing: they are control, not text)."""
        known = self._pieces.get(token)
        if known is None:
            known = self._pieces[token] = self._piece(token)
        return known

    def _piece(self, token: int) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
        return buf.raw[:n]

    def longest_piece(self) -> int:
        """The most bytes one token spells (read once: ~0.1 s for 49k tokens)."""
        if self._longest is None:
            buf = ctypes.create_string_buffer(256)
            most = 1
            for token in range(self.n_tokens):
                n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, False)
                most = max(most, -n if n < 0 else n)  # < 0: longer than buf, -n its length
            self._longest = most
        return self._longest

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        known = self._eog.get(token)
        if known is None:
            known = self._eog[token] = bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))
        return known

    def apply_template(self, messages: list[dict[str, str]], *, add_assistant: bool) -> str:
        roles = [m["role"].encode() for m in messages]
        contents = [m["content"].encode() for m in messages]
        arr = (llama_cpp.llama_chat_message * len(messages))()
        for i, (r, c) in enumerate(zip(roles, contents, strict=False)):
            arr[i].role = r
            arr[i].content = c
        size = 256 + sum(len(c) + len(r) + 32 for r, c in zip(roles, contents, strict=False))
        for _ in range(3):
            buf = ctypes.create_string_buffer(size)
            n = llama_cpp.llama_chat_apply_template(
                self.template, arr, len(messages), add_assistant, buf, size
            )
            if n < 0:
                # llama.cpp does not know this template: fall back to ChatML, don't fail the chat
                self.template = FALLBACK_TEMPLATE
                continue
            if n <= size:
                return buf.raw[:n].decode("utf-8", "replace")
            size = n + 1
        raise RuntimeError("chat template could not be applied")


def parts_after(parts: Sequence[Part], offset: int) -> list[Part]:
    """The parts of a prompt from character ``offset`` on."""
    out: list[Part] = []
    pos = 0
    for text, markup in parts:
        if pos + len(text) > offset:
            out.append((text[max(0, offset - pos):], markup))
        pos += len(text)
    return out


def _fill_in(skeleton: str, full: str, contents: list[str]) -> list[Part] | None:
    """``full`` cut where ``skeleton`` (the same template over stand-ins) has its stand-ins;
    None where they do not line up."""
    pieces = _STAND_IN_RE.split(skeleton)  # markup, index, markup, index, ..., markup
    parts: list[Part] = []
    pos = 0
    for k in range(0, len(pieces), 2):
        markup = pieces[k]
        if not full.startswith(markup, pos):
            return None
        if markup:
            parts.append((markup, True))
        pos += len(markup)
        if k + 1 == len(pieces):
            break
        i = int(pieces[k + 1])
        if i >= len(contents):
            return None
        for text in (contents[i], contents[i].strip(_C_SPACE)):  # as is, or as trim() left it
            if full.startswith(text, pos) and full.startswith(pieces[k + 2], pos + len(text)):
                break
        else:
            return None
        if text:
            parts.append((text, False))
        pos += len(text)
    return parts if pos == len(full) else None


def _cut_apart(text: str, guard: set[str]) -> list[str]:
    """``text`` cut inside every occurrence of a ``guard`` string, so that none is whole."""
    cuts = sorted({m.start() + 1 for g in guard if len(g) > 1
                   for m in re.finditer(f"(?={re.escape(g)})", text)})
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]


def stop_scan(
    text: str, emitted: int, stops: tuple[str, ...], *, final: bool = False
) -> tuple[int, bool]:
    """(end of the text that is safe to show, whether a stop string was found).

    Text that could be the start of a stop string is held back until it is not."""
    if not stops:
        return len(text), False
    longest = max(len(s) for s in stops)
    search_from = max(0, emitted - longest)
    hits = [i for s in stops if (i := text.find(s, search_from)) >= 0]
    if hits:
        return min(hits), True
    if final:
        return len(text), False
    hold = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:k]):
                hold = max(hold, k)
                break
    return len(text) - hold, False
