"""Requests that answer once and hold no session, run on the engine thread: tokenize,
detokenize and embeddings.

Tokenizing is a command like any other although llama.cpp's tokenizer is safe to call from
several threads at once (``llama_tokenize`` reads the vocabulary only; llama-server tokenizes
on its HTTP threads while its main loop decodes): the vocabulary lives as long as the placement,
and only the engine thread knows when a reshard frees it. A text is at most MAX_TEXT_CHARS
(a few milliseconds of tokenizing), so the command is short.

Embeddings need a context with embeddings on, which the generation context is not: an
:class:`Embedder` opens a small one beside it over the same model weights the first time it is
asked (``EMBED_CTX`` cells, ``EMBED_SEQS`` sequences), and closes it whenever the placement
closes (a reshard, a release, the engine's end). A model that declares a pooling (an embedding
model: mean, CLS, last token) is pooled its way; one that declares none (a generative model
such as SmolLM2) is mean-pooled over its last hidden states. One command embeds the inputs
that fit one decode and says where the next command starts, so a batch of 64 texts is read a
decode at a time between the NPCs' steps, never in one long stall. While replies decode, a
decode holds about one step's worth of tokens (the engine's measured speed and step target),
but always one whole input: a pooled input is read in one decode, so the longest pause an
embedding puts between two of an NPC's tokens is the read of its longest input (512 tokens at
most), as long as a prompt chunk of that size.
"""

from __future__ import annotations

import ctypes
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import llama_cpp

from igi_sdk import threads
from igi_sdk.errors import InferenceError, InvalidInputError, PromptTooLongError
from igi_sdk.runtime import loader
from igi_sdk.runtime.placement import Placement
from igi_sdk.runtime.text import Vocab

EMBED_CTX = 512  # cells of the embeddings context: the longest input, and a decode's tokens
EMBED_SEQS = 8  # inputs read together in one decode at most
_POOLING_NAMES = {llama_cpp.LLAMA_POOLING_TYPE_MEAN: "mean", llama_cpp.LLAMA_POOLING_TYPE_CLS:
                  "cls", llama_cpp.LLAMA_POOLING_TYPE_LAST: "last"}


@dataclass(frozen=True)
class Tokenized:
    tokens: list[int]
    pieces: list[str] | None  # each token's text, when asked for


@dataclass(frozen=True)
class EmbedChunk:
    """What one embed command read: the vectors of inputs ``start .. next - 1``."""

    vectors: list[list[float]]
    next: int  # the first input not read yet (== len(inputs): all done)
    tokens: int  # tokens read for these inputs
    pooling: str


EmbedInput = str | Sequence[int]


def tokenize(vocab: Vocab, text: str, *, add_special: bool, parse_special: bool,
             with_pieces: bool) -> Tokenized:
    tokens = vocab.tokenize(text, add_special=add_special, parse_special=parse_special)
    pieces = [_special_piece(vocab, t).decode("utf-8", "replace")
              for t in tokens] if with_pieces else None
    return Tokenized(tokens, pieces)


def detokenize(vocab: Vocab, tokens: Sequence[int]) -> str:
    """The tokens' text; special tokens spell their own text (``<|im_end|>``), as
    llama-server's /detokenize writes them, so that tokenize and detokenize round-trip."""
    _check_ids(vocab, tokens)
    return b"".join(_special_piece(vocab, t) for t in tokens).decode("utf-8", "replace")


Mixed = tuple[str | tuple[int, ...], ...]


def mixed_pieces(prompt: Sequence[str | int]) -> Mixed:
    """A prompt of texts and token ids as its texts (image slots taken out: a raw prompt holds
    no images) and runs of ids, in order."""
    from igi_sdk.runtime.image_turn import clean

    out: list[str | tuple[int, ...]] = []
    run: list[int] = []
    for item in prompt:
        if isinstance(item, str):
            if run:
                out.append(tuple(run))
                run = []
            out.append(clean(item))
        else:
            run.append(int(item))
    if run:
        out.append(tuple(run))
    return tuple(out)


def mixed_tokens(vocab: Vocab, pieces: Mixed, *, markup: bool) -> list[int]:
    """The tokens of a prompt given as texts and token ids, read as llama-server reads one: the
    ids as they are (special ones too: they are explicit), each text tokenized as a raw prompt's
    text is (``markup``: its special-token text is the token), the model's BOS only before a
    first piece that is text. InvalidInputError for an id outside the vocabulary."""
    out: list[int] = []
    for i, piece in enumerate(pieces):
        if isinstance(piece, str):
            out += vocab.tokenize_parts([(piece, markup)], add_special=i == 0)
        else:
            _check_ids(vocab, piece)
            out += piece
    return out


def empty_text_token(vocab: Vocab) -> int:
    """The token an empty text is embedded as where the model adds nothing to a text (an
    empty text has no tokens then): its BOS, else its EOS. A model that adds a BOS reads an
    empty text as that BOS alone: the same input either way. A batch a client split from
    documents is then not refused for one empty piece (llama-server embeds it too)."""
    bos = int(llama_cpp.llama_vocab_bos(vocab.vocab))
    tok = bos if bos >= 0 else int(llama_cpp.llama_vocab_eos(vocab.vocab))
    if tok < 0:
        raise InvalidInputError("an empty text: this model has no BOS or EOS token to read")
    return tok


def _check_ids(vocab: Vocab, tokens: Sequence[int]) -> None:
    bad = next((t for t in tokens if not 0 <= t < vocab.n_tokens), None)
    if bad is not None:
        raise InvalidInputError(f"token id {bad} is not in this model's vocabulary "
                                f"(0 to {vocab.n_tokens - 1})")


def _special_piece(vocab: Vocab, token: int) -> bytes:
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_token_to_piece(vocab.vocab, token, buf, 64, 0, True)
    if n < 0:
        buf = ctypes.create_string_buffer(-n)
        n = llama_cpp.llama_token_to_piece(vocab.vocab, token, buf, -n, 0, True)
    return buf.raw[:n]


class Embedder:
    """The embeddings context of one placement (engine thread only): opened on first use,
    closed with the placement (:meth:`close`)."""

    def __init__(self) -> None:
        self._ctx: Any = None
        self._model: Any = None  # the model the context was made over
        self._batch: Any = None
        self._pooling = llama_cpp.LLAMA_POOLING_TYPE_MEAN
        self._n_embd = 0
        self.opens = 0  # contexts opened (tests, stats)

    @property
    def open(self) -> bool:
        return self._ctx is not None

    def close(self) -> None:
        threads.expect(threads.ENGINE, "closing the embeddings context")
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx is not None:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None
        self._model = None

    def _context(self, placed: Placement, n_threads: int) -> Any:
        model = placed.model
        if self._ctx is not None and self._model is model:
            return self._ctx
        self.close()  # made over another placement's model: not valid any more
        # the placement's own settings (KV types, flash attention, KV on the GPU or not),
        # sized for one decode of EMBED_CTX tokens, every one an output (a pooled embedding
        # reads them all), each input whole in one ubatch
        params = loader.context_params(
            placed.plan, loader.ContextSettings(EMBED_CTX, EMBED_SEQS, EMBED_CTX, n_threads),
            placed.gpu)
        params.n_ubatch = params.n_outputs_max = EMBED_CTX
        params.embeddings = True
        # the model's own pooling if it declares one; mean over the tokens otherwise
        declared = _declares_pooling(model)
        params.pooling_type = (llama_cpp.LLAMA_POOLING_TYPE_UNSPECIFIED if declared
                               else llama_cpp.LLAMA_POOLING_TYPE_MEAN)
        ctx = llama_cpp.llama_init_from_model(model, params)
        if not ctx:
            raise InferenceError("llama.cpp could not create the embeddings context")
        pooling = int(llama_cpp.llama_pooling_type(ctx))
        if pooling not in _POOLING_NAMES:
            llama_cpp.llama_free(ctx)
            raise InvalidInputError("this model does not make embeddings (its pooling is "
                                    f"{pooling}: a reranker, or none)")
        self._ctx, self._model, self._pooling = ctx, model, pooling
        self._n_embd = int(llama_cpp.llama_model_n_embd(model))
        self._batch = llama_cpp.llama_batch_init(EMBED_CTX, 0, 1)
        self.opens += 1
        return ctx

    def embed(self, placed: Placement, vocab: Vocab, inputs: Sequence[EmbedInput], start: int,
              *, normalize: bool, n_threads: int, budget: int = EMBED_CTX) -> EmbedChunk:
        """Embed ``inputs[start:]`` as far as one decode of at most ``budget`` tokens takes
        them (one input at least, whatever the budget: an input is read whole)."""
        threads.expect(threads.ENGINE, "embedding")
        ctx = self._context(placed, n_threads)
        groups: list[list[int]] = []
        total, i = 0, start
        while i < len(inputs) and len(groups) < EMBED_SEQS:
            item = inputs[i]
            if isinstance(item, str):
                # text is data (special-token text is text); BOS/EOS as the model wants them
                toks = vocab.tokenize(item, add_special=True, parse_special=False)
                if not toks:
                    toks = [empty_text_token(vocab)]
            else:
                toks = list(item)
                _check_ids(vocab, toks)
            if not toks:
                raise InvalidInputError(f"input {i} has no tokens")
            if len(toks) > EMBED_CTX:
                raise PromptTooLongError(f"input {i} is {len(toks)} tokens; an embedding input "
                                         f"is at most {EMBED_CTX}")
            if total + len(toks) > (min(budget, EMBED_CTX) if groups else EMBED_CTX):
                break  # the next command reads it
            groups.append(toks)
            total += len(toks)
            i += 1
        self._fill(groups)
        mem = llama_cpp.llama_get_memory(ctx)
        llama_cpp.llama_memory_clear(mem, True)
        rc = llama_cpp.llama_decode(ctx, self._batch)
        try:
            if rc != 0:
                raise InferenceError(f"llama_decode failed for embeddings ({rc})")
            vectors = [self._pooled(ctx, seq, normalize) for seq in range(len(groups))]
        finally:
            llama_cpp.llama_memory_clear(mem, True)
        return EmbedChunk(vectors, i, total, _POOLING_NAMES[self._pooling])

    def _fill(self, groups: list[list[int]]) -> None:
        b, n = self._batch, 0
        for seq, toks in enumerate(groups):
            for pos, tok in enumerate(toks):
                b.token[n] = tok
                b.pos[n] = pos
                b.n_seq_id[n] = 1
                b.seq_id[n][0] = seq
                b.logits[n] = 1  # a pooled embedding reads every token's output
                n += 1
        b.n_tokens = n

    def _pooled(self, ctx: Any, seq: int, normalize: bool) -> list[float]:
        ptr = llama_cpp.llama_get_embeddings_seq(ctx, seq)
        if not ptr:
            raise InferenceError(f"llama.cpp gave no pooled embedding for sequence {seq}")
        vec = [float(x) for x in ptr[:self._n_embd]]
        if normalize:
            norm = math.sqrt(math.fsum(x * x for x in vec))
            if norm > 0:
                vec = [x / norm for x in vec]
        return vec


def _declares_pooling(model: Any) -> bool:
    """Whether the GGUF names a pooling for its architecture (``<arch>.pooling_type``)."""
    buf = ctypes.create_string_buffer(128)
    n = llama_cpp.llama_model_meta_val_str(model, b"general.architecture", buf, len(buf))
    if n <= 0:
        return False
    arch = buf.value
    n = llama_cpp.llama_model_meta_val_str(model, arch + b".pooling_type", buf, len(buf))
    return n > 0 and buf.value not in (b"0", b"-1")
