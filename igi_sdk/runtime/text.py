"""Tokenizer, detokenizer and chat template over llama.cpp's vocab (no Python tokenizer)."""

from __future__ import annotations

import ctypes

import llama_cpp

# Used when a GGUF carries no chat template: ChatML is what most small instruct models speak.
FALLBACK_TEMPLATE = b"chatml"


class Vocab:
    def __init__(self, model: llama_cpp.llama_model_p) -> None:
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        tmpl = llama_cpp.llama_model_chat_template(model, None)
        self.template: bytes = tmpl if tmpl else FALLBACK_TEMPLATE
        self.n_tokens = llama_cpp.llama_vocab_n_tokens(self.vocab)

    def tokenize(self, text: str, *, add_special: bool) -> list[int]:
        data = text.encode("utf-8")
        cap = len(data) + 8
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, True)
        if n < 0:  # buffer too small: -n is the size needed
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self.vocab, data, len(data), buf, cap, add_special, True)
        return list(buf[:n])

    def piece(self, token: int) -> bytes:
        """Bytes of one token (special tokens render as nothing: they are control, not text)."""
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, 64, 0, False)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, -n, 0, False)
        return buf.raw[:n]

    def detokenize(self, tokens: list[int]) -> str:
        return b"".join(self.piece(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

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
