"""The sidecar's wire protocol: message schemas, framing and typed errors.

Every message is ONE ZeroMQ frame holding a msgpack map ``{v, id, type, body}`` (a ROUTER adds
the peer's identity frame, which clients never see). Requests carry a client-chosen ``id``;
every reply and stream event carries the ``id`` of the request it answers. Bodies are validated
by the pydantic models below; fields a body does not define are left out before validation and
reported back (``ignored``), so a newer client's optional fields do not break an older sidecar.
``bridge/schema/`` is exported from the models and ``bridge/PROTOCOL.md`` is the normative
description.
"""

from __future__ import annotations

import json
import re
from typing import Annotated, Any, Literal, get_args

import msgpack
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

PROTOCOL_VERSION = 1  # the major version: ``v`` of every message; must match
PROTOCOL_MINOR = 3  # additions a client of an older minor can ignore
# what this sidecar offers beyond protocol 1.0 (``hello``'s answer lists them)
FEATURES = ("goodbye", "leases", "list_sessions", "adopt_session", "set_priority",
            "resume_stream", "json_schema_string", "session_names", "draft_model",
            "images", "owners", "launch_token", "instance", "tools", "history_roles",
            "line_sampling", "logprobs", "rewrite_history", "tokenize", "embed", "complete",
            "memory", "reminder")

# Limits (also in PROTOCOL.md). The socket enforces MAX_MESSAGE_BYTES before anything is parsed.
# One image may take 16 MiB (a 2560x1600 RGBA screenshot as raw pixels is 15.6 MiB); a message
# holds one such image and the rest of a chat, so several images share 17 MiB together.
MAX_IMAGE_BYTES = 16 << 20
MAX_IMAGES = 4
MAX_MESSAGE_BYTES = MAX_IMAGE_BYTES + (1 << 20)
MAX_STR_BYTES = 1 << 20  # any msgpack str (text fields are far shorter still)
# a text field (a line, a history turn, a system prompt): what one msgpack str holds of
# 4-byte characters; what a conversation may hold is bounded by the message's bytes and the
# session's share of the context, checked before any template reads it
MAX_TEXT_CHARS = MAX_STR_BYTES // 4
MAX_HISTORY_TURNS = 256  # open_session.history: earlier turns a client may hand over
MAX_PINNED = 16  # open_session.pinned: facts kept in every prompt
MAX_REMINDER_CHARS = 1000  # open_session.reminder: read again with every line
MAX_ID = 2**53 - 1  # JSON-safe integers for engines whose scripting languages use doubles
MAX_TOKENS = 4096
# maps/arrays inside a request body, and inside a json_schema given as a JSON string: checked
# without recursion before anything else reads the body (pydantic, json, the schema converter)
MAX_NESTING = 64
MAX_LEASE_S = 300.0  # a client silent this long is gone, whatever lease it asked for


class Strict(BaseModel):
    # strict: "123" is not an int and true is not a number; the wire types are the contract
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


Text = Annotated[str, Field(max_length=MAX_TEXT_CHARS)]
Name = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9_.\-]+$")]
# an owner key or a launch token: a secret, so long enough not to be guessed
Secret = Annotated[str, Field(min_length=16, max_length=128, pattern=r"^[A-Za-z0-9_\-]+$")]

# Windows device names: a file named like one (any case, any extension: "con", "Aux.txt") is the
# device, not a file. Saved sessions are files on the player's machine, so such names are
# refused on every platform (a save must move between machines).
_DEVICE_NAMES = frozenset({"con", "prn", "aux", "nul", *(f"com{i}" for i in range(10)),
                           *(f"lpt{i}" for i in range(10))})
_DEVICE_PATTERN = ("^(?:[Cc][Oo][Nn]|[Pp][Rr][Nn]|[Aa][Uu][Xx]|[Nn][Uu][Ll]|"
                   "[Cc][Oo][Mm][0-9]|[Ll][Pp][Tt][0-9])(?:\\.|$)")


def _not_a_device_name(name: str) -> str:
    if name.split(".", 1)[0].lower() in _DEVICE_NAMES:
        raise ValueError(f"'{name}' is a reserved device name on Windows (CON, PRN, AUX, NUL, "
                         "COM0-9, LPT0-9, in any case, also with an extension); choose another")
    return name


# The name of a saved session: a file name in the sidecar's save directory (plus the
# ".igisession" suffix: at most 139 bytes, within NAME_MAX of every common file system).
SaveName = Annotated[Name, AfterValidator(_not_a_device_name),
                     Field(json_schema_extra={"not": {"pattern": _DEVICE_PATTERN}})]


# --- request bodies ------------------------------------------------------------------------------


class Hello(Strict):
    protocol: int  # the major version; any other than PROTOCOL_VERSION: unsupported_version
    minor: int = Field(0, ge=0, le=2**31)  # 0: a 1.0 client (1.0 liveness rules)
    engine: Annotated[str, Field(max_length=64)] = "unknown"
    game_pid: int | None = Field(None, ge=1, le=2**32 - 1)  # Windows DWORD pids included
    client_name: Annotated[str, Field(max_length=64)] = ""
    # a client silent this long is gone: its streams stop, its sessions wait to be adopted;
    # the sidecar grants at most MAX_LEASE_S (hello's answer says the lease in force)
    lease_s: float = Field(15.0, ge=2.0, le=3600.0, allow_inf_nan=False)
    # 1.2: the key the client's sessions belong to (nil: to this connection alone); a client
    # with the same key may adopt them, nobody else can see them
    owner: Secret | None = None
    # 1.2: the sidecar's launch token (IGI_SDK_TOKEN of its process): its holder is the game
    token: Annotated[str, Field(max_length=128)] | None = None


class LoadModel(Strict):
    path: Annotated[str, Field(min_length=1, max_length=1024)]  # relative to the model directory
    vram_budget: int | None = Field(None, ge=0, le=2**50)
    n_ctx: int = Field(4096, ge=256, le=131_072)
    max_sessions: int = Field(8, ge=1, le=64)
    # a draft model for speculative decoding (same tokenizer), relative to the model directory;
    # nil: the sidecar's own (--draft), if any
    draft: Annotated[str, Field(min_length=1, max_length=1024)] | None = None
    # the model's vision projector (mmproj GGUF), a path like ``path``; nil: text only
    mmproj: Annotated[str, Field(min_length=1, max_length=1024)] | None = None


MAX_LOGIT_BIAS = 300  # entries of a logit_bias map (a msgpack map holds at most 256)
MAX_LOGPROBS = 20  # alternatives per token event (chat.logprobs)
# a token id of logit_bias: an int, or the same as decimal text (JSON object keys are text)
BiasKey = Annotated[str, Field(pattern=r"^[0-9]{1,10}$")] | Annotated[int, Field(ge=0,
                                                                                le=2**31 - 1)]
LogitBias = Annotated[dict[BiasKey, Annotated[float, Field(ge=-100.0, le=100.0,
                                                           allow_inf_nan=False)]],
                      Field(max_length=MAX_LOGIT_BIAS)]


class Sampling(Strict):
    temperature: float = Field(0.7, ge=0.0, le=5.0, allow_inf_nan=False)
    top_p: float = Field(0.95, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int = Field(40, ge=0, le=100_000)
    min_p: float = Field(0.05, ge=0.0, le=1.0, allow_inf_nan=False)
    repeat_penalty: float = Field(1.1, ge=0.5, le=3.0, allow_inf_nan=False)
    seed: int = Field(0, ge=0, le=2**32 - 1)
    # 1.3 ("line_sampling"): OpenAI's penalties (subtracted from a token's logit: frequency
    # times its count in the penalty window, presence once if it is there) and logit biases
    # (added to the token's logit; a token id past the vocabulary is invalid_argument)
    frequency_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    presence_penalty: float = Field(0.0, ge=-2.0, le=2.0, allow_inf_nan=False)
    logit_bias: LogitBias = Field(default_factory=dict)


class LineSampling(Strict):
    """1.3 (``"line_sampling"``): ``chat.sampling``, the session's sampling overridden for
    one line; a field left out (or nil) keeps the session's value."""

    temperature: float | None = Field(None, ge=0.0, le=5.0, allow_inf_nan=False)
    top_p: float | None = Field(None, gt=0.0, le=1.0, allow_inf_nan=False)
    top_k: int | None = Field(None, ge=0, le=100_000)
    min_p: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)
    repeat_penalty: float | None = Field(None, ge=0.5, le=3.0, allow_inf_nan=False)
    seed: int | None = Field(None, ge=0, le=2**32 - 1)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0, allow_inf_nan=False)
    logit_bias: LogitBias | None = None


Priority = Annotated[int, Field(ge=-100, le=100)]


# 1.3 tools: a call's id, a declared tool's name (not a tool_choice keyword)
CallId = Annotated[str, Field(min_length=1, max_length=64)]
ToolName = Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
TOOL_CHOICES = ("auto", "none", "required")
MAX_TOOLS = 32
MAX_CALLS = 8  # calls in one reply (parallel_tool_calls)
MAX_TOOL_RESULTS = 16


class ToolCallRecord(Strict):
    """A call an earlier reply made (history), as the reply's ``tool_calls`` gave it."""

    id: CallId
    name: ToolName
    arguments: Annotated[str, Field(max_length=MAX_TEXT_CHARS)]  # JSON text of an object


class HistoryTurn(Strict):
    # 1.3 ("history_roles"): system turns stay where they stand; a tool turn is a call's result
    role: Literal["system", "user", "assistant", "tool"]
    content: Text
    tool_calls: list[ToolCallRecord] = Field(default_factory=list, max_length=MAX_CALLS)
    tool_call_id: CallId | None = None

    @model_validator(mode="after")
    def _tool_fields(self) -> HistoryTurn:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only an assistant turn carries tool_calls")
        if (self.role == "tool") != (self.tool_call_id is not None):
            raise ValueError("a tool turn, and only a tool turn, carries tool_call_id")
        return self


def _schema_map(v: dict[str, Any] | str, what: str) -> dict[str, Any]:
    """A JSON schema given as a map or as JSON text (nesting bounded before it is parsed)."""
    if not isinstance(v, str):
        return v
    if json_nesting(v) > MAX_NESTING:
        raise ValueError(f"{what} nests more than {MAX_NESTING} objects/arrays deep")
    try:
        tree = json.loads(v)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{what} is a string but not JSON ({e})") from None
    if not isinstance(tree, dict):
        raise ValueError(f"{what} must be a JSON object")
    return tree


class ToolDef(Strict):
    """A tool the reply may call: its arguments object is valid against ``parameters``."""

    name: ToolName
    description: Annotated[str, Field(max_length=2000)] = ""
    parameters: dict[str, Any] | Annotated[str, Field(max_length=MAX_TEXT_CHARS)] = Field(
        default_factory=lambda: {"type": "object"})

    @field_validator("name")
    @classmethod
    def _not_a_choice(cls, v: str) -> str:
        if v in TOOL_CHOICES:
            raise ValueError(f"a tool may not be named '{v}' (a tool_choice keyword)")
        return v

    @field_validator("parameters")
    @classmethod
    def _parameters_map(cls, v: dict[str, Any] | str) -> dict[str, Any]:
        tree = _schema_map(v, "parameters")
        if tree.get("type", "object") != "object":
            raise ValueError("parameters must describe an object (type: object)")
        return tree


class ToolResult(Strict):
    id: CallId  # the id of the call this answers
    content: Text


class OpenSession(Strict):
    system_prompt: Text = ""
    persona: Annotated[str, Field(max_length=128)] = ""
    sampling: Sampling = Sampling()
    priority: Priority = 0
    name: Name | None = None  # a stable session id chosen by the game ("npc.brom")
    # earlier turns of a conversation the client kept itself (an OpenAI-style transcript),
    # read into the session's cache with its first line
    history: list[HistoryTurn] = Field(default_factory=list, max_length=MAX_HISTORY_TURNS)
    # 1.3: a conversation past the session's share of the context: "fold" summarises its
    # oldest turns out of the prompt, "off" refuses the line (prompt_too_long)
    memory: Literal["fold", "off"] = "fold"
    pinned: list[Text] = Field(default_factory=list, max_length=MAX_PINNED)  # in every prompt
    # 1.3 ("reminder"): a short note restated just before each player line, never kept in the
    # conversation ("Stay in character as Brom, the blacksmith of Oakvale.")
    reminder: Annotated[str, Field(max_length=MAX_REMINDER_CHARS)] = ""


class ChatImage(Strict):
    """One image of a chat line: PNG/JPEG file bytes (``data``), or raw 8-bit pixels, rows top
    to bottom (``pixels`` with ``width``, ``height``, ``channels`` 3 = RGB or 4 = RGBA)."""

    data: Annotated[bytes, Field(min_length=1, max_length=MAX_IMAGE_BYTES)] | None = None
    pixels: Annotated[bytes, Field(min_length=1, max_length=MAX_IMAGE_BYTES)] | None = None
    # pixels only; sizes are checked where the image is read (invalid_image)
    width: int = Field(0, ge=0, le=65_535)
    height: int = Field(0, ge=0, le=65_535)
    channels: int = Field(3, ge=3, le=4)

    @model_validator(mode="after")
    def _one_source(self) -> ChatImage:
        if (self.data is None) == (self.pixels is None):
            raise ValueError("an image has either data (PNG/JPEG bytes) or pixels")
        return self


class Chat(Strict):
    """``grammar`` (GBNF) and ``json_schema`` constrain the reply; give at most one."""

    session: Name
    text: Text
    max_tokens: int = Field(256, ge=1, le=MAX_TOKENS)
    stop: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=8)
    grammar: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | None = None
    # a map, or the same as a JSON string (engines without a JSON tree type send text)
    json_schema: dict[str, Any] | Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | None = None
    # images the NPC sees with this line (a model loaded with its mmproj); where they go:
    # PROTOCOL.md, ``chat``
    images: list[ChatImage] = Field(default_factory=list, max_length=MAX_IMAGES)
    # 1.3: this line's sampling ("line_sampling"), and the log-probabilities of each token
    # sampled with its ``logprobs`` most likely alternatives ("logprobs")
    sampling: LineSampling | None = None
    logprobs: int | None = Field(None, ge=0, le=MAX_LOGPROBS)
    # 1.3 ("tools"): what the reply may call (PROTOCOL.md, "Tools")
    tools: list[ToolDef] = Field(default_factory=list, max_length=MAX_TOOLS)
    tool_choice: Annotated[str, Field(min_length=1, max_length=64)] = "auto"
    parallel_tool_calls: bool = True
    tool_results: list[ToolResult] = Field(default_factory=list, max_length=MAX_TOOL_RESULTS)
    # 1.3 ("rewrite_history"): the session's conversation after its system prompt, replaced
    # before this line; the cache keeps the longest common token prefix. Ending with an
    # assistant turn and ``text`` "": the reply continues that turn (prefill)
    history: list[HistoryTurn] | None = Field(None, max_length=MAX_HISTORY_TURNS)

    @field_validator("json_schema")
    @classmethod
    def _schema_as_map(cls, v: dict[str, Any] | str | None) -> dict[str, Any] | None:
        return None if v is None else _schema_map(v, "json_schema")

    @model_validator(mode="after")
    def _one_constraint(self) -> Chat:
        if self.grammar is not None and self.json_schema is not None:
            raise ValueError("give either grammar or json_schema, not both")
        if self.tools and (self.grammar is not None or self.json_schema is not None):
            raise ValueError("tools constrain the reply themselves: give no grammar or "
                             "json_schema with them")
        names = [t.name for t in self.tools]
        if len(set(names)) != len(names):
            raise ValueError("tool names must be unique")
        if self.tool_choice not in TOOL_CHOICES and self.tool_choice not in names:
            raise ValueError(f"tool_choice '{self.tool_choice}' is neither auto, none, "
                             "required nor the name of a declared tool")
        if self.tool_choice == "required" and not self.tools:
            raise ValueError("tool_choice 'required' needs tools")
        return self


class Cancel(Strict):
    request: int = Field(ge=0, le=MAX_ID)  # the id of the chat to stop


class SessionRef(Strict):
    session: Name


class SaveSession(Strict):
    session: Name
    name: SaveName  # file name inside the sidecar's save directory


class RestoreSession(Strict):
    name: SaveName
    session: Name | None = None  # the restored session's id (as open_session's name)


class SetPriority(Strict):
    session: Name
    priority: Priority


class Goodbye(Strict):
    keep_sessions: bool = False  # true: leave them for a later client to adopt


class ResumeStream(Strict):
    request: int = Field(ge=0, le=MAX_ID)  # the chat's id
    after: int = Field(0, ge=0, le=MAX_TOKENS)  # the last token ``i`` received


class Frame(Strict):
    frame: int = Field(ge=0, le=MAX_ID)
    frame_time_ms: float = Field(ge=0.0, le=10_000.0, allow_inf_nan=False)
    target_frame_time_ms: float | None = Field(None, gt=0.0, le=1000.0, allow_inf_nan=False)
    vram_used: int | None = Field(None, ge=0, le=2**50)
    vram_budget: int | None = Field(None, ge=0, le=2**50)
    # the game's CPU use: threads it keeps busy and/or its share of the machine's CPU time;
    # the model's CPU threads keep off the cores they hold
    busy_threads: int | None = Field(None, ge=0, le=4096)
    cpu_share: float | None = Field(None, ge=0.0, le=1.0, allow_inf_nan=False)


class ReserveVram(Strict):
    bytes: int = Field(ge=0, le=2**50)
    deadline_frames: int = Field(ge=0, le=100_000)


class Empty(Strict):
    pass


# --- 1.3: tokenize, detokenize, embed, complete (no session: each answers one request) ----------
MAX_EMBED_INPUTS = 64
MAX_TOKEN_IDS = 4096  # token ids in one array (the msgpack array cap)
TokenId = Annotated[int, Field(ge=0, le=2**31 - 1)]


class Tokenize(Strict):
    text: Text
    add_special: bool = False  # BOS/EOS as the model adds them to a prompt
    with_pieces: bool = False  # also each token's text
    # special-token text (``<|im_end|>``) read as that token, as llama-server's /tokenize does
    parse_special: bool = True


class Detokenize(Strict):
    tokens: list[TokenId] = Field(max_length=MAX_TOKEN_IDS)


class Embed(Strict):
    """Texts, or token id arrays, to embed (one vector each, in order)."""

    input: list[Text | Annotated[list[TokenId], Field(min_length=1, max_length=MAX_TOKEN_IDS)]] \
        = Field(min_length=1, max_length=MAX_EMBED_INPUTS)
    normalize: bool = True  # unit length (L2)


# a prompt given as llama-server takes one: texts and token ids in order (ids as they are,
# special ones too; each text tokenized as the prompt's text is, BOS only before a first text)
MixedPrompt = Annotated[list[Text | TokenId], Field(min_length=1, max_length=MAX_TOKEN_IDS)]


class Complete(Strict):
    """A raw prompt continued, no chat template: its text is data (special-token text is read
    as text). Streamed as ``chat`` is; ``sampling`` as open_session's."""

    prompt: Text | MixedPrompt
    max_tokens: int = Field(256, ge=1, le=MAX_TOKENS)
    stop: list[Annotated[str, Field(min_length=1, max_length=64)]] = Field(
        default_factory=list, max_length=8)
    sampling: Sampling = Sampling()
    grammar: Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | None = None
    json_schema: dict[str, Any] | Annotated[str, Field(max_length=MAX_TEXT_CHARS)] | None = None
    priority: Priority = 0
    # special-token text in the prompt read as the token, as llama-server reads a prompt (a
    # client that writes its own template markup: LLMUnity, CHIM); false: it is text
    parse_special: bool = False

    @field_validator("json_schema")
    @classmethod
    def _schema_as_map(cls, v: dict[str, Any] | str | None) -> dict[str, Any] | None:
        return Chat._schema_as_map(v)  # as chat's

    @field_validator("prompt")
    @classmethod
    def _text_bounded(cls, v: str | list[str | int]) -> str | list[str | int]:
        if not isinstance(v, str) and sum(len(x) for x in v if isinstance(x, str)) \
                > MAX_TEXT_CHARS:
            raise ValueError(f"the prompt's texts hold more than {MAX_TEXT_CHARS} characters")
        return v

    @model_validator(mode="after")
    def _one_constraint(self) -> Complete:
        if self.grammar is not None and self.json_schema is not None:
            raise ValueError("give either grammar or json_schema, not both")
        return self


REQUESTS: dict[str, type[Strict]] = {
    "hello": Hello,
    "ping": Empty,
    "load_model": LoadModel,
    "open_session": OpenSession,
    "chat": Chat,
    "cancel": Cancel,
    "save_session": SaveSession,
    "restore_session": RestoreSession,
    "close_session": SessionRef,
    "frame": Frame,
    "reserve_vram": ReserveVram,
    "stats": Empty,
    "shutdown": Empty,
    "goodbye": Goodbye,
    "list_sessions": Empty,
    "adopt_session": SessionRef,
    "set_priority": SetPriority,
    "resume_stream": ResumeStream,
    "tokenize": Tokenize,
    "detokenize": Detokenize,
    "embed": Embed,
    "complete": Complete,
}

# Replies / events the sidecar sends (type -> meaning); bodies are plain maps documented in
# PROTOCOL.md: "ok" (a request's result), "token" (one streamed piece), "done" (end of a
# stream), "error" (typed failure), "heartbeat" (liveness, id 0).
# Clients ignore reply types they do not know (a later minor version may add some).
REPLY_TYPES = ("ok", "token", "tool_call", "done", "error", "heartbeat")


# --- errors --------------------------------------------------------------------------------------


class ProtocolError(Exception):
    """A request the sidecar refuses; becomes an ``error`` reply with these fields."""

    def __init__(self, code: str, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.code, self.message, self.retryable = code, message, retryable

    def body(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable}


# --- framing -------------------------------------------------------------------------------------


def encode(msg_id: int, msg_type: str, body: dict[str, Any] | None = None) -> bytes:
    return msgpack.packb(
        {"v": PROTOCOL_VERSION, "id": msg_id, "type": msg_type, "body": body or {}},
        use_bin_type=True,
    )


def decode_envelope(frame: bytes) -> tuple[int, str, dict[str, Any]]:
    """(id, type, raw body) of a request, or ProtocolError. The id is returned as soon as it is
    known, so even a malformed body can be answered against the right request (see
    :func:`parse_request`). Envelope keys other than v/id/type/body are ignored."""
    try:
        msg = _unpack(frame)
    except Exception as e:  # noqa: BLE001 - msgpack raises many types for garbage input
        said = str(e)
        if "exceeds max_" in said or "map key" in said:  # msgpack names the limit or the key
            raise ProtocolError("malformed", f"a value breaks the message limits (str 1 MiB, "
                                             f"array 4096 items, map 256 entries, string "
                                             f"keys): {said[:120]}") from None
        raise ProtocolError("malformed", f"not a msgpack message: {type(e).__name__}") from None
    if not isinstance(msg, dict):
        raise ProtocolError("malformed", "a message must be a msgpack map {v, id, type, body}")
    msg_id = msg.get("id")
    if not isinstance(msg_id, int) or isinstance(msg_id, bool) or not 0 <= msg_id <= MAX_ID:
        raise ProtocolError("malformed", "'id' must be an integer from 0 to 2^53 - 1")
    v = msg.get("v")
    if not isinstance(v, int) or isinstance(v, bool) or v != PROTOCOL_VERSION:
        raise ProtocolError("unsupported_version",
                            f"protocol version {v!r} is not supported; "
                            f"this sidecar speaks {PROTOCOL_VERSION}")
    msg_type = msg.get("type")
    if not isinstance(msg_type, str) or msg_type not in REQUESTS:
        raise ProtocolError("unknown_type", f"unknown message type {msg_type!r}; expected one of "
                                            f"{sorted(REQUESTS)}")
    body = msg.get("body", {})
    if not isinstance(body, dict):
        raise ProtocolError("malformed", "'body' must be a map")
    return msg_id, msg_type, body


class EnvelopeError(ProtocolError):
    """A ProtocolError that knows which request id it answers (0 if unknown)."""

    def __init__(self, msg_id: int, err: ProtocolError) -> None:
        super().__init__(err.code, err.message, retryable=err.retryable)
        self.msg_id = msg_id


class Request(BaseModel):
    """A validated request: ``ignored`` names the body fields it had that this sidecar does not
    know (``"sampling.foo"`` for nested ones); they were left out, and answers report them."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    id: int
    type: str
    body: Strict
    ignored: tuple[str, ...] = ()


def json_nesting(text: str) -> int:
    """How deep the objects/arrays of JSON ``text`` nest, read without parsing (brackets inside
    strings do not count): a bound to check before ``json.loads``, which recurses."""
    depth = deepest = 0
    for m in _JSON_LEXEME.finditer(text):
        tok = m.group()
        if tok in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif tok in "]}":
            depth -= 1
    return deepest


_JSON_LEXEME = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]')


def nesting(value: object, limit: int) -> int:
    """How deep maps/arrays nest in ``value`` (decoded msgpack), counted without recursion and
    given up past ``limit`` (so the answer is at most ``limit + 1``)."""
    deepest, todo = 0, [(value, 1)]
    while todo:
        node, depth = todo.pop()
        if isinstance(node, dict):
            items: list[object] = [*node.keys(), *node.values()]
        elif isinstance(node, (list, tuple)):
            items = list(node)
        else:
            continue
        deepest = max(deepest, depth)
        if deepest > limit:
            return deepest
        todo.extend((x, depth + 1) for x in items)
    return deepest


def without_unknown(model: type[Strict], body: dict[str, Any],
                    prefix: str = "") -> tuple[dict[str, Any], list[str]]:
    """``body`` without the keys ``model`` does not define (recursing into sub-models), and
    their dotted names."""
    known, ignored, clean = model.model_fields, [], {}
    for key, value in body.items():
        f = known.get(key) if isinstance(key, str) else None
        if f is None:
            ignored.append(f"{prefix}{key}")
            continue
        sub = _submodel(f.annotation)
        if sub is not None and isinstance(value, dict):
            value, deeper = without_unknown(sub, value, f"{prefix}{key}.")
            ignored += deeper
        elif sub is not None and isinstance(value, list):  # a list of sub-models (images)
            items = []
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    item, deeper = without_unknown(sub, item, f"{prefix}{key}.{i}.")
                    ignored += deeper
                items.append(item)
            value = items
        clean[key] = value
    return clean, ignored


def _submodel(annotation: Any) -> type[Strict] | None:
    """The sub-model of a field: ``M``, ``M | None`` or ``list[M]``."""
    todo = [annotation]
    while todo:
        t = todo.pop()
        if isinstance(t, type) and issubclass(t, Strict):
            return t
        todo.extend(get_args(t))
    return None


def parse_request(frame: bytes) -> Request:
    """Validate a request frame; raises EnvelopeError carrying the id to answer."""
    try:
        msg_id, msg_type, body = decode_envelope(frame)
    except ProtocolError as e:
        raise EnvelopeError(_best_effort_id(frame), e) from None
    if nesting(body, MAX_NESTING) > MAX_NESTING:
        raise EnvelopeError(msg_id, ProtocolError(
            "invalid_body", f"'{msg_type}' body nests more than {MAX_NESTING} maps/arrays deep"))
    model = REQUESTS[msg_type]
    clean, ignored = without_unknown(model, body)
    try:
        parsed = model.model_validate(clean)
    except ValidationError as e:
        parts = [f"{'.'.join(map(str, err['loc'])) or 'body'}: {err['msg']}"
                 for err in e.errors()[:5]]
        raise EnvelopeError(msg_id, ProtocolError(
            "invalid_body", f"invalid '{msg_type}' body: " + "; ".join(parts))) from None
    except (RecursionError, MemoryError, TypeError, ValueError) as e:  # a validator's own
        raise EnvelopeError(msg_id, ProtocolError(
            "invalid_body", f"invalid '{msg_type}' body ({type(e).__name__})")) from None
    if isinstance(parsed, Hello) and parsed.protocol != PROTOCOL_VERSION:
        raise EnvelopeError(msg_id, ProtocolError(
            "unsupported_version", f"this sidecar speaks protocol {PROTOCOL_VERSION}.x, the "
            f"client {parsed.protocol}: the major versions must match"))
    return Request(id=msg_id, type=msg_type, body=parsed, ignored=tuple(ignored))


def _unpack(frame: bytes) -> Any:
    # bin up to the message's own size (the socket bounds it): an image over MAX_IMAGE_BYTES is
    # refused by its schema, against its request's id, not as an unreadable message
    return msgpack.unpackb(frame, raw=False, strict_map_key=True, max_bin_len=MAX_MESSAGE_BYTES,
                           max_str_len=MAX_STR_BYTES, max_array_len=4096, max_map_len=256)


def _best_effort_id(frame: bytes) -> int:
    i = peek_id(frame)
    return i if i is not None and 0 <= i <= MAX_ID else 0


# "id" as a msgpack str key, in each encoding an encoder may choose (fixstr, str8/16/32)
_ID_KEYS = (b"\xa2id", b"\xd9\x02id", b"\xda\x00\x02id", b"\xdb\x00\x00\x00\x02id")
_INT_HEADS = frozenset([*range(0x00, 0x80), *range(0xcc, 0xd4), *range(0xe0, 0x100)])


def peek_id(frame: bytes) -> int | None:
    """The integer ``id`` of a frame that is one msgpack map, read without the value limits of
    :func:`_unpack`: a message refused for what it holds (a str over 1 MiB, an array over 4096
    items, a map over 256 entries, a non-string key) still has an id, and its ``error`` must
    carry it, or that request would never end. The other values are skipped, not built (the
    C unpacker's skip: milliseconds for a 17 MiB message). None: not a map, no integer ``id``,
    or not one whole msgpack document."""
    up = msgpack.Unpacker(max_buffer_size=max(len(frame), 1))
    try:
        up.feed(frame)
        found: int | None = None
        for _ in range(up.read_map_header()):
            key_at = up.tell()
            is_id = any(frame.startswith(k, key_at) for k in _ID_KEYS)
            up.skip()
            if is_id and frame[up.tell()] in _INT_HEADS:
                value = up.unpack()
                found = value if isinstance(value, int) else None
            else:
                if is_id:
                    found = None  # the last "id" counts, as when the map is read whole
                up.skip()
        if up.tell() != len(frame):
            return None  # more than one document
        return found
    except Exception:  # noqa: BLE001 - msgpack raises many types for garbage input
        return None


def decode_reply(frame: bytes) -> tuple[int, str, dict[str, Any]]:
    """Client side: (id, type, body) of a sidecar message."""
    msg = msgpack.unpackb(frame, raw=False)
    return int(msg["id"]), str(msg["type"]), dict(msg.get("body") or {})
