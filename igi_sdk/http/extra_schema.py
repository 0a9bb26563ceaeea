"""Request bodies of the face's routes besides chat (http/extra_routes.py), bounded before
anything reads them, and mapped onto the protocol's ``complete`` options.

Unknown fields are ignored, as chat's are. A sampler the engine cannot honour is refused with
a 400 when it is set to anything but its neutral value, never dropped silently: llama-server
clients (LLMUnity) send every field with its default (``tfs_z: 1``, ``mirostat: 0``)."""

from __future__ import annotations

import secrets
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.http.errors import HttpError
from igi_sdk.wire import protocol as P

MAX_BODY_BYTES = 16 << 20  # 64 inputs of 32 000 characters, 4 UTF-8 bytes each, and more
Text = Annotated[str, Field(max_length=P.MAX_TEXT_CHARS)]
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]
Tokens = Annotated[list[TokenId], Field(min_length=1, max_length=P.MAX_TOKEN_IDS)]
Stop = Annotated[str, Field(max_length=64)]
# llama-server's /completion prompt: a text, texts and token ids in order (one prompt), or a
# list of prompts (answered by a list of results, one after another, in order)
PromptId = Annotated[int, Field(strict=True, ge=0, le=2**31 - 1)]
MixedPrompt = Annotated[list[Text | PromptId], Field(min_length=1, max_length=P.MAX_TOKEN_IDS)]
MAX_PROMPTS = 8  # prompts in one /completion request
Prompt = str | list[str | int]


# llama-server's logit_bias: [[token id or text, bias], ...] or {"id or text": bias}; a bias of
# false bans the token (sent as -100, the most the wire takes: no sampler keeps such a token)
Bias = Annotated[float, Field(strict=True, ge=-100.0, le=100.0, allow_inf_nan=False)] \
    | Annotated[bool, Field(strict=True)]
BiasText = Annotated[str, Field(min_length=1, max_length=256)]
MAX_BIAS_ENTRIES = 256  # the wire's logit_bias map holds at most this many tokens
MAX_BIAS_TEXTS = 64  # texts to tokenize for one request's logit_bias


class Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(Loose):
    include_usage: bool = False


class JsonPrompt(Loose):
    """llama-server's prompt object: its text, and images (``multimodal_data``), which a raw
    prompt here does not take (a 400: images go through /v1/chat/completions)."""

    prompt_string: Text
    multimodal_data: Annotated[list[Text], Field(max_length=16)] | Text | None = None

    def text(self) -> str:
        if self.multimodal_data:
            raise HttpError(400, "invalid_argument", "a /completion prompt takes no images "
                            "(multimodal_data); send them to /v1/chat/completions")
        return self.prompt_string


class EmbeddingsRequest(Loose):
    """OpenAI's: ``input`` a string, strings, token ids, or token id arrays."""

    input: Text | Annotated[list[Text], Field(min_length=1, max_length=P.MAX_EMBED_INPUTS)] \
        | Tokens | Annotated[list[Tokens], Field(min_length=1, max_length=P.MAX_EMBED_INPUTS)]
    model: Annotated[str, Field(max_length=256)] | None = None
    encoding_format: str | None = None  # "float" (default) or "base64"
    dimensions: int | None = Field(None, ge=1, le=1 << 16)
    user: Annotated[str, Field(max_length=256)] | None = None

    def inputs(self) -> list[str] | list[list[int]]:
        if self.encoding_format not in (None, "float", "base64"):
            raise HttpError(400, "invalid_argument", "encoding_format is 'float' or 'base64'")
        x = self.input
        if isinstance(x, str):
            return [x]
        if x and isinstance(x[0], int):
            return [x]  # type: ignore[list-item]  # one array of token ids
        return x  # type: ignore[return-value]


class NativeEmbeddingRequest(Loose):
    """llama-server's /embeddings as LLMUnity's remote mode sends it."""

    content: Text


class TokenizeRequest(Loose):
    content: Text
    add_special: bool = False
    with_pieces: bool = False
    parse_special: bool = True


class DetokenizeRequest(Loose):
    tokens: Annotated[list[TokenId], Field(max_length=P.MAX_TOKEN_IDS)]


class _Sampled(Loose):
    """Samplers both completion routes share."""

    temperature: float | None = Field(None, ge=0.0, le=5.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    seed: int | None = Field(None, ge=-1, le=2**32 - 1)  # -1: a random seed, as llama-server
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    stop: Stop | Annotated[list[Stop | None], Field(max_length=32)] | None = None

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        given = [self.stop] if isinstance(self.stop, str) else self.stop
        out = [s for s in given if s]  # null and "" stop nothing (CHIM sends an unset one)
        if len(out) > 8:
            raise HttpError(400, "invalid_argument", "at most 8 stop strings")
        return out

    def sampling(self, **more: Any) -> dict[str, Any]:
        s: dict[str, Any] = {k: v for k, v in more.items() if v is not None}
        if self.temperature is not None:
            s["temperature"] = self.temperature
        if self.top_p is not None:
            s["top_p"] = self.top_p
        # no seed (or -1): a random one, so that asking again gives another reply
        s["seed"] = (self.seed if self.seed is not None and self.seed >= 0
                     else secrets.randbelow(2**32))
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not value:
                continue
            if name not in P.Sampling.model_fields:
                raise HttpError(400, "invalid_argument", f"{name} is not supported here")
            s[name] = value
        return s


class CompletionsRequest(_Sampled):
    """OpenAI's legacy /v1/completions."""

    model: Annotated[str, Field(max_length=256)] = ""
    prompt: Text | Annotated[list[Text], Field(min_length=1, max_length=1)]
    max_tokens: int | None = Field(None, ge=1, le=P.MAX_TOKENS)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    echo: bool | None = False
    n: int | None = Field(1, ge=1, le=1)
    best_of: int | None = Field(None, ge=1, le=1)
    logprobs: int | None = Field(None, ge=0, le=0)
    suffix: Annotated[str, Field(max_length=0)] | None = None
    user: Annotated[str, Field(max_length=256)] | None = None

    def the_prompt(self) -> str:
        return self.prompt if isinstance(self.prompt, str) else self.prompt[0]

    def complete_options(self) -> dict[str, Any]:
        return {"max_tokens": self.max_tokens or 16, "stop": self.stops(),
                "sampling": self.sampling(), "parse_special": True}


class NativeCompletionRequest(_Sampled):
    """llama-server's /completion, with the fields LLMUnity and CHIM send."""

    prompt: Text | MixedPrompt | JsonPrompt | Annotated[
        list[Text | MixedPrompt | JsonPrompt], Field(min_length=1, max_length=MAX_PROMPTS)]
    logit_bias: Annotated[list[tuple[PromptId | BiasText, Bias]],
                          Field(max_length=MAX_BIAS_ENTRIES)] \
        | Annotated[dict[BiasText, Bias], Field(max_length=MAX_BIAS_ENTRIES)] | None = None
    n_predict: int | None = Field(None, ge=-2, le=1 << 20)
    stream: bool | None = False
    top_k: int | None = Field(None, ge=-1, le=100_000)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, ge=0.0, le=3.0)
    grammar: Annotated[str, Field(max_length=P.MAX_TEXT_CHARS)] | None = None
    json_schema: dict[str, Any] | None = None
    ignore_eos: bool | None = False
    # what the engine has no sampler for: refused unless neutral
    mirostat: int | None = Field(None, ge=0, le=2)
    tfs_z: float | None = None
    typical_p: float | None = None
    n_probs: int | None = Field(None, ge=0, le=100)

    def prompts(self) -> list[Prompt]:
        """The request's prompts, as llama-server reads its ``prompt``: a list holding a list,
        or only texts, is several prompts; a list of texts and token ids with one id at least
        is one prompt."""
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if isinstance(p, JsonPrompt):
            return [p.text()]
        if any(isinstance(x, list | JsonPrompt) for x in p) \
                or all(isinstance(x, str) for x in p):
            if len(p) > MAX_PROMPTS:
                raise HttpError(400, "invalid_argument", f"at most {MAX_PROMPTS} prompts in "
                                "one request")
            return [x.text() if isinstance(x, JsonPrompt) else x  # type: ignore[misc]
                    for x in p]  # each a text, a prompt object or a mixed prompt
        return [p]  # type: ignore[list-item]  # texts and token ids: one prompt

    def bias_entries(self) -> list[tuple[int | str, float]]:
        """``logit_bias`` as (token id or text, bias) pairs, in order; a key of digits is a
        token id (llama-server's map form), false is -100 (banned), true is refused."""
        given = self.logit_bias
        if not given:
            return []
        pairs = list(given.items()) if isinstance(given, dict) else list(given)
        out: list[tuple[int | str, float]] = []
        for key, bias in pairs:
            if bias is True:
                raise HttpError(400, "invalid_argument", "a logit_bias is a number, or false "
                                "to ban the token")
            value = -100.0 if bias is False else float(bias)
            if isinstance(key, str) and key.isascii() and key.isdigit() and len(key) <= 10:
                key = int(key)
            out.append((key, value))
        if len({k for k, _ in out if isinstance(k, str)}) > MAX_BIAS_TEXTS:
            raise HttpError(400, "invalid_argument", f"logit_bias holds at most "
                            f"{MAX_BIAS_TEXTS} texts")
        return out

    def max_tokens(self) -> int:
        n = self.n_predict
        if n is None:
            return P.MAX_TOKENS  # llama-server: until the end of the text
        return P.MAX_TOKENS if n < 0 else min(n, P.MAX_TOKENS)

    def complete_options(self) -> dict[str, Any]:
        if self.mirostat:
            raise HttpError(400, "invalid_argument", "mirostat sampling is not supported")
        for name in ("tfs_z", "typical_p"):
            value = getattr(self, name)
            if value is not None and value != 1.0:
                raise HttpError(400, "invalid_argument", f"{name} other than 1 (off) is not "
                                "supported")
        if self.n_probs:
            raise HttpError(400, "invalid_argument", "n_probs is not supported")
        if self.ignore_eos:
            raise HttpError(400, "invalid_argument", "ignore_eos is not supported")
        top_k = None if self.top_k is None else max(0, self.top_k)  # <= 0: off
        repeat = self.repeat_penalty
        if repeat is not None and repeat < 0.5:  # 0 reads as llama-server's "off" (1.0)
            repeat = 1.0 if repeat == 0 else repeat
        options: dict[str, Any] = {
            "max_tokens": self.max_tokens(), "stop": self.stops(), "parse_special": True,
            "sampling": self.sampling(top_k=top_k, min_p=self.min_p, repeat_penalty=repeat)}
        if self.grammar:  # "" is none (LLMUnity sends an empty grammar)
            options["grammar"] = self.grammar
        if self.json_schema:
            if P.nesting(self.json_schema, P.MAX_NESTING) > P.MAX_NESTING:
                raise HttpError(400, "invalid_body", "json_schema nests too deep")
            if self.grammar:
                raise HttpError(400, "invalid_argument", "give grammar or json_schema")
            options["json_schema"] = self.json_schema
        return options
