"""The Chat Completions request the HTTP face accepts, bounded before anything reads it.

Unknown fields are ignored, as llama-server and most local servers do: mods send the options of
whichever server they were written for; an explicit ``null`` is the field left out. Every
sampler is honoured or refused with a 400 (http/sampling_options.py), and what the face cannot
honour otherwise is refused too (a role it does not know). A text is bounded by the body's
bytes and the protocol's text bound, not by OpenAI's chat limits: what does not fit the
session's context is a 400 ``context_length_exceeded``."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.wire import protocol as P

MAX_MESSAGES = P.MAX_HISTORY_TURNS + 2  # the history, a system prompt and the new line
MAX_BODY_BYTES = 32 << 20  # what the face reads of a request at most (images included)
MAX_CHOICES = 8  # n: each choice is a session of its own (docs/openai.md)

Text = Annotated[str, Field(max_length=P.MAX_TEXT_CHARS)]


class Loose(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextPart(Loose):
    type: Literal["text"]
    text: Text


class ImageUrl(Loose):
    url: Annotated[str, Field(max_length=(P.MAX_IMAGE_BYTES * 4) // 3 + 64)]


class ImagePart(Loose):
    type: Literal["image_url"]
    image_url: ImageUrl


Part = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class CalledFunction(Loose):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    arguments: Annotated[str, Field(max_length=P.MAX_TEXT_CHARS)] = "{}"


class MessageToolCall(Loose):
    """A call of an earlier reply, as the client sends the transcript back."""

    id: Annotated[str, Field(min_length=1, max_length=64)]
    type: Literal["function"] = "function"
    function: CalledFunction


class Message(Loose):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    # left to right: pydantic's default ("smart") union validated a failing list again in
    # other modes, ~100 ms holding the GIL for one oversized image where one pass takes 17
    content: Annotated[Text | Annotated[list[Part], Field(max_length=P.MAX_IMAGES + 16)] | None,
                       Field(union_mode="left_to_right")] = None

    # an assistant message's calls; a tool message's call id
    tool_calls: Annotated[list[MessageToolCall], Field(max_length=P.MAX_CALLS)] | None = None
    tool_call_id: Annotated[str, Field(max_length=64)] | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content if isinstance(p, TextPart))

    def image_urls(self) -> list[str]:
        if isinstance(self.content, list):
            return [p.image_url.url for p in self.content if isinstance(p, ImagePart)]
        return []


class StreamOptions(Loose):
    include_usage: bool = False


class JsonSchemaFormat(Loose):
    name: Annotated[str, Field(max_length=128)] = "reply"
    schema_: dict[str, Any] | None = Field(None, alias="schema")


class ResponseFormat(Loose):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class FunctionDef(Loose):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: Annotated[str, Field(max_length=2000)] | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None  # every call is held to its schema, strict or not


class ToolParam(Loose):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(Loose):
    name: Annotated[str, Field(min_length=1, max_length=64)]


class NamedToolChoice(Loose):
    type: Literal["function"]
    function: NamedFunction


class ChatOptions(Loose):
    """Everything a request says besides its messages: what the face needs once the
    transcript is split off (a large body is parsed in another process, and only this, the
    texts and the images come back)."""

    # (None everywhere: a client's explicit null is the default)
    model: Annotated[str, Field(max_length=256)] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    # clamped to what a reply may take (sampling_options.max_tokens), not refused
    max_tokens: int | None = Field(None, ge=1, le=2**31 - 1)
    max_completion_tokens: int | None = Field(None, ge=1, le=2**31 - 1)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=100_000)  # llama-server's; 0 or -1: off
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repeat_penalty: float | None = Field(None, ge=0.5, le=3.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    logit_bias: dict[Annotated[str, Field(pattern=r"^[0-9]{1,10}$")],
                     Annotated[float, Field(ge=-100.0, le=100.0)]] | None = Field(
        None, max_length=P.MAX_LOGIT_BIAS)
    seed: int | None = Field(None, ge=-1, le=2**63 - 1)  # -1: a random one, as no seed
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0, le=P.MAX_LOGPROBS)
    stop: Annotated[str, Field(max_length=64)] | Annotated[
        list[Annotated[str, Field(min_length=1, max_length=64)]], Field(max_length=8)] | None = None
    response_format: ResponseFormat | None = None
    n: int | None = Field(None, ge=1, le=MAX_CHOICES)
    user: Annotated[str, Field(max_length=256)] | None = None
    prompt_cache_key: Annotated[str, Field(max_length=256)] | None = None
    # function calling (http/tools.py)
    tools: Annotated[list[ToolParam], Field(max_length=P.MAX_TOOLS)] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    # llama-server's samplers that do not run here: refused unless neutral (sampling_options)
    typical_p: float | None = None
    tfs_z: float | None = None
    mirostat: float | None = None
    mirostat_tau: float | None = None
    mirostat_eta: float | None = None
    dynatemp_range: float | None = None
    dynatemp_exponent: float | None = None
    xtc_probability: float | None = None
    xtc_threshold: float | None = None
    dry_multiplier: float | None = None
    dry_base: float | None = None
    dry_allowed_length: float | None = None
    dry_penalty_last_n: float | None = None
    top_n_sigma: float | None = None
    repeat_last_n: float | None = None
    penalty_last_n: float | None = None
    best_of: float | None = None
    n_probs: float | None = None

    def reply_tokens(self) -> int:
        return max(1, min(self.max_completion_tokens or self.max_tokens or 256, P.MAX_TOKENS))

    def choices(self) -> int:
        return self.n or 1

    def stops(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class ChatCompletionRequest(ChatOptions):
    messages: Annotated[list[Message], Field(min_length=1, max_length=MAX_MESSAGES)]

    def options(self) -> ChatOptions:
        """The request without its messages (the objects shared, nothing validated again)."""
        return ChatOptions.model_construct(
            **{name: getattr(self, name) for name in ChatOptions.model_fields})
