"""The protocol's replies, typed: the body of ``ok`` for every request type, the stream's
``token``/``done``/``error`` events, ``heartbeat``, and every error code the sidecar can send.

``bridge/PROTOCOL.md`` is the normative text. The machine-readable contract a client in another
language tests against (JSON Schemas in ``bridge/schema``, golden vectors in ``bridge/vectors``)
is written from these types and ``protocol.REQUESTS`` by ``python bridge/generate.py``, which
is not part of the installed package (``tests/test_protocol_contract.py`` fails until the
committed files match).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from igi_sdk.wire import protocol as P

# --- reply bodies ---------------------------------------------------------------------------------
# Known request fields are strictly typed; replies may grow fields in a compatible (minor)
# version, so clients must ignore fields they do not know: these models allow extras.


class Reply(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    def wire(self) -> dict[str, Any]:
        """The body as the sidecar sends it: every field it was built with, null included
        (``watching_pid: null`` says "none"), and none it left out (``stats`` sends the
        model's figures only while one is loaded). Nested values go whole: ``last_frame`` is
        the frame body with all its fields."""
        unset = type(self).model_fields.keys() - self.model_fields_set
        return self.model_dump(exclude=unset) if unset else self.model_dump()


class Answer(Reply):
    """The body of an ``ok`` or ``done``: the answer to one request, which names the request's
    fields this sidecar did not know."""

    ignored: list[str] | None = Field(None, description="the request's fields this sidecar "
                                      "does not know (also 'sampling.field'); absent: none")


class Limits(Reply):
    max_message_bytes: int
    max_text_chars: int
    max_tokens: int
    max_sessions_per_client: int
    max_streams_per_client: int


class HelloOk(Answer):
    protocol: int = Field(description="the sidecar's major version (= v)")
    minor: int = Field(0, description="the sidecar's minor version (absent: 0)")
    features: list[str] = Field(default_factory=list,
                                description="what this sidecar offers beyond protocol 1.0")
    lease_s: float | None = Field(None, description="the lease in force for this client: "
                                  "send something at least this often")
    game: bool | None = Field(None, description="1.2: this client is the game (it gave the "
                              "sidecar's launch token, or the sidecar has none): its frames "
                              "pace the engine, its game_pid is watched, it may reserve VRAM, "
                              "shut down and hold every session slot")
    owner: str | None = Field(None, description="1.2: whose this client's sessions are: \"key\" "
                              "(its owner key), \"connection\" (this connection alone) or "
                              "\"shared\" (a client below 1.2 without a key: the one scope of "
                              "all such clients, as in 1.1)")
    model: str | None = Field(description="file name of the loaded model; null if none")
    loading: bool = Field(description="a load_model is in progress")
    instance: str | None = Field(None, description="1.2: the sidecar's instance id (serve "
                                 "--instance); null: started without one. A client that "
                                 "launched a sidecar with an instance id refuses one that "
                                 "answers with another id (or none), and one whose model is "
                                 "not the one it asked for")
    limits: Limits


class FrameOk(Answer):
    paced: bool | None = Field(None, description="1.2: true when the report paces the engine "
                               "(the game's, with a target_frame_time_ms); false for the game's "
                               "report without a target (it still feeds the VRAM arbiter and "
                               "stats) and for any other client's (used for nothing)")


class PingOk(Answer):
    t: float = Field(description="the sidecar's wall clock, seconds since the Unix epoch")


Memory = dict[str, dict[str, int]]  # {"gpu"|"cpu": {"weights"|"kv"|"compute": bytes}}


class LoadModelOk(Answer):
    model: str = Field(description="file name of the model now loaded")
    memory: Memory = Field(description="bytes by device ('gpu', 'cpu') and category "
                                       "('weights', 'kv', 'compute')")


class SessionOk(Answer):
    session: str = Field(description="the new session's id (a Name); owned by this connection")


class CancelOk(Answer):
    cancelled: bool = Field(description="true if a stream of this client with that id was "
                                        "running and was asked to stop")


class SaveSessionOk(Answer):
    name: str
    bytes: int = Field(description="size of the saved snapshot")


class EmptyOk(Answer):
    pass


class GoodbyeOk(Answer):
    closed: int = Field(description="sessions closed")
    orphaned: int = Field(description="sessions left for a later client to adopt")


class SessionListing(Reply):
    session: str
    owner: Literal["you", "orphaned"]
    persona: str
    priority: int
    busy: bool = Field(description="a reply is streaming in it")
    tokens: int = Field(description="tokens of the conversation in the model's context")
    max_tokens: int | None = Field(None, description="1.3: the most tokens (KV cells) this "
                                   "session may hold: its share of the context")
    memory: Literal["fold", "off"] | None = Field(None, description="1.3: its memory policy")
    dropped_turns: int | None = Field(None, description="1.3: turns folded out of its "
                                      "context so far (its save keeps them)")
    idle_s: float = Field(description="seconds since it was opened, adopted or orphaned")


class ListSessionsOk(Answer):
    sessions: list[SessionListing] = Field(description="this client's sessions and the "
                                                       "orphaned ones (adoptable)")
    free_slots: int = Field(description="session slots of the model no one holds (an "
                            "orphaned session holds its slot)")
    others: int = Field(description="sessions of other connected clients (not listed)")
    reclaimable: int | None = Field(None, description="1.2: orphaned sessions (of any owner) "
                                    "that open_session / restore_session close, longest-"
                                    "waiting first, when no slot is free: a newcomer can get "
                                    "free_slots + reclaimable slots (its own cap aside)")


class ResumeStreamOk(Answer):
    running: bool = Field(description="the stream has not ended yet")
    replayed: int = Field(description="events sent again after this ok (tokens after "
                                      "'after', then the terminal event if it has ended)")


class ReserveVramOk(Answer):
    recorded: bool = Field(description="always true")
    acknowledged: bool = Field(description="true: the VRAM is free now (this reply waits until "
                                           "it is)")
    granted: bool = Field(description="true: the VRAM is free now. A reservation that cannot "
                                      "be granted ends with error cannot_free or "
                                      "deadline_missed instead; none waits longer than 5 s")


class LatencyFigures(Reply):
    p50: float = Field(description="milliseconds")
    p99: float
    max: float
    n: int = Field(description="answers counted (the last 2048 at most)")


class StatsOk(Answer):
    model: str | None
    loading: bool
    clients: int = Field(description="connections that said hello and are not yet forgotten")
    uptime_s: float
    requests: int = Field(description="frames received, valid or not")
    errors: int = Field(description="error replies sent (not counting stream errors)")
    last_frame: P.Frame | None = Field(description="body of the last frame request (all fields)")
    reservations: list[P.ReserveVram] = Field(description="the last 4 reserve_vram bodies")
    control_latency_ms: dict[str, LatencyFigures] | None = Field(
        None, description="per request type answered by the socket thread: how long it took")
    orphaned_sessions: int | None = Field(None, description="sessions waiting to be adopted")
    limits: dict[str, int] | None = Field(None, description="1.3: what one request may ask: "
                                          "max_tokens (a reply), max_text_chars, "
                                          "max_message_bytes, session_slots (sessions, and "
                                          "replies at once, in all), n_ctx and "
                                          "n_ctx_per_session (the most one conversation "
                                          "holds) while a model is loaded")
    watching_pid: int | None = Field(None, description="the game process whose end ends the "
                                     "sidecar; null if none")
    launch_token: bool | None = Field(None, description="the sidecar was started with a "
                                      "launch token (only its holder is the game)")
    flood_cuts: int | None = Field(None, description="connections shut by the flood limit: "
                                   "past their rate, past their receive queue's bound, or the "
                                   "busiest while the sidecar stayed behind")
    receive_queue: dict[str, int] | None = Field(
        None, description="messages read and not yet handled: messages and bytes waiting now "
        "(all connections), peak_messages and peak_bytes (the most one connection had waiting), "
        "the bounds max_messages, max_bytes (per connection) and max_bytes_all, and cuts (the "
        "connections cut for going past them)")
    pacing_delay_s: float | None = Field(None, description="the pause between decode steps "
                                         "that the game's paced frames ask for now")
    # present only while a model is loaded:
    sessions: int | None = Field(None, description="open sessions of all clients")
    plan: str | None = Field(None, description="name of the placement plan in use")
    memory: Memory | None = None
    reshards: int | None = None
    engine: dict[str, Any] | None = Field(None, description="the engine's state ('ready', or "
                                          "'unavailable' while no placement fits), step "
                                          "timings, context cells, drafting and vision figures")
    # present only while the VRAM arbiter runs:
    arbiter: dict[str, Any] | None = Field(None, description="the VRAM arbiter's figures")
    # present only with serve --upstream:
    upstream: dict[str, Any] | None = Field(None, description="the OpenAI-compatible upstream: "
                                            "policy, replicas, sessions served there, replies, "
                                            "retries and failures")


class TokenizeOk(Answer):
    tokens: list[int] = Field(description="1.3: the text's token ids")
    pieces: list[str] | None = Field(None, description="1.3: each token's text (with_pieces); "
                                     "a token that is part of a UTF-8 character shows as the "
                                     "replacement character")


class DetokenizeOk(Answer):
    text: str = Field(description="1.3: the tokens' text (special tokens spell their text)")


class EmbedOk(Answer):
    data: list[list[float]] = Field(description="1.3: one vector per input, in order")
    tokens: int = Field(description="1.3: tokens read for all inputs together")
    pooling: str = Field("mean", description="1.3: how token vectors became one: the "
                         "model's own pooling (\"cls\", \"last\", \"mean\"), or \"mean\" for "
                         "a model that declares none (a generative model)")


# the body of the ``ok`` answering each request type; ``chat`` is answered by a stream instead
OK_REPLIES: dict[str, type[Reply] | None] = {
    "hello": HelloOk,
    "ping": PingOk,
    "load_model": LoadModelOk,
    "open_session": SessionOk,
    "chat": None,
    "cancel": CancelOk,
    "save_session": SaveSessionOk,
    "restore_session": SessionOk,
    "close_session": EmptyOk,
    "frame": FrameOk,
    "reserve_vram": ReserveVramOk,
    "stats": StatsOk,
    "shutdown": EmptyOk,
    "goodbye": GoodbyeOk,
    "list_sessions": ListSessionsOk,
    "adopt_session": SessionOk,
    "set_priority": EmptyOk,
    "resume_stream": ResumeStreamOk,
    "tokenize": TokenizeOk,
    "detokenize": DetokenizeOk,
    "embed": EmbedOk,
    "complete": None,  # a stream, as chat's
}


class TopLogprob(Reply):
    token: str
    logprob: float


class TokenLogprob(Reply):
    token: str = Field(description="the sampled token's text")
    logprob: float = Field(description="its natural-log probability")
    top: list[TopLogprob] = Field(default_factory=list, description="the likeliest tokens "
                                  "(chat.logprobs of them), most likely first")


class Token(Reply):
    text: str = Field(description="the next piece of visible text (never empty)")
    i: int = Field(ge=1, description="1, 2, 3, ... within this stream")
    logprobs: list[TokenLogprob] | None = Field(None, description="1.3, with chat.logprobs: "
                                                "the tokens whose text this piece completes")


class Usage(Reply):
    prompt_tokens: int = Field(description="tokens fed for this turn (template included)")
    completion_tokens: int = Field(description="tokens sampled for this reply")
    cached_tokens: int = Field(0, description="1.2: tokens of the conversation already in "
                               "the session's cache, reused for this turn and not in "
                               "prompt_tokens")
    dropped_turns: int = Field(0, description="1.3: turns of the conversation folded out of "
                               "the context before this line (memory \"fold\")")
    summarised_turns: int = Field(0, description="1.3: of those, the turns the memory "
                                  "message summarises (0 with dropped_turns > 0: dropped "
                                  "without a summary, no room to write one)")


class Timings(Reply):
    ttft_s: float = Field(description="request accepted -> first token sampled")
    total_s: float


class ToolCallBody(Reply):
    id: str = Field(description="call_<hex>: the id a tool result answers")
    name: str = Field(description="one of the chat's declared tools")
    arguments: str = Field(description="JSON text of an object valid against the tool's "
                           "parameters schema")


class ToolCallEvent(ToolCallBody):
    """1.3: one call of the reply, sent as soon as it is complete."""

    i: int = Field(ge=1, description="the stream's event index, counted with token events")
    index: int = Field(ge=0, description="0, 1, 2, ...: the call's place in the reply")


class Done(Answer):
    text: str = Field(description="the whole visible reply: the token texts joined")
    finish_reason: Literal["stop", "stop_string", "length", "cancelled", "tool_calls"]
    usage: Usage
    timings: Timings
    tool_calls: list[ToolCallBody] = Field(
        default_factory=list, description="1.3: the reply's calls (empty: none)")


class ErrorBody(Reply):
    code: str = Field(description="a stable code; see error_codes")
    message: str = Field(description="human-readable; do not parse")
    retryable: bool = Field(description="the same request may succeed later")


class Heartbeat(Reply):
    t: float = Field(description="the sidecar's wall clock, seconds since the Unix epoch")


EVENTS: dict[str, type[Reply]] = {"token": Token, "tool_call": ToolCallEvent, "done": Done,
                                  "error": ErrorBody,
                                  "heartbeat": Heartbeat}


@dataclass(frozen=True)
class ErrorCode:
    retryable: bool
    meaning: str


# Every code the sidecar can send: protocol.py / server.py literals and igi_sdk.errors classes.
ERROR_CODES: dict[str, ErrorCode] = {
    # envelope and body validation (protocol.parse_request)
    "malformed": ErrorCode(False, "not a msgpack map, bad or missing id, body not a map, or a "
                                  "value past the message limits (str 1 MiB, array 4096 items, "
                                  "map 256 entries) or a key that is not a string; answered "
                                  "with the message's id when it can be read, else id 0"),
    "unsupported_version": ErrorCode(False, "envelope v or hello.protocol (the major version) "
                                            f"is not {P.PROTOCOL_VERSION}"),
    "unknown_type": ErrorCode(False, "type is not a request type of this sidecar"),
    "invalid_body": ErrorCode(False, "the body breaks its schema (a missing, wrong-typed or "
                                     "out-of-range field; unknown fields are ignored)"),
    # connection and sidecar state
    "hello_required": ErrorCode(True, "this connection has not said hello (or was forgotten); "
                                      "send hello, then the request again"),
    "loading": ErrorCode(True, "a model is loading; retry when it is loaded"),
    "no_model": ErrorCode(False, "no model is loaded; send load_model"),
    "busy": ErrorCode(True, "a cap is reached: this client's max_streams_per_client streams, "
                            "image bytes of lines not yet ended (per client or in all), VRAM "
                            "reservations waiting, or connected clients; retry later"),
    "forbidden": ErrorCode(False, "only the game (the client holding the sidecar's launch "
                                  "token) may do this: reserve_vram, shutdown; or hello gave a "
                                  "wrong token"),
    "duplicate_id": ErrorCode(False, "a chat with this id is still streaming for this client"),
    "internal": ErrorCode(False, "a bug in the sidecar; the message says what failed"),
    # model files and loading
    "forbidden_path": ErrorCode(False, "load_model path resolves outside the model directory"),
    "model_not_found": ErrorCode(False, "no such model file in the model directory"),
    "model_error": ErrorCode(False, "the model file cannot be read (corrupt, permissions)"),
    "not_gguf": ErrorCode(False, "the file is not a GGUF model"),
    "truncated_model": ErrorCode(False, "the GGUF file is cut short"),
    "unsupported_architecture": ErrorCode(False, "llama.cpp cannot run this architecture"),
    "model_load_failed": ErrorCode(False, "llama.cpp refused the model (memory, tensors)"),
    "invalid_plan": ErrorCode(False, "no valid placement plan for this model"),
    "invalid_argument": ErrorCode(False, "a command-line option the SDK cannot act on (the "
                                         "CLI's refusals; the sidecar does not send it)"),
    "budget_too_small": ErrorCode(False, "vram_budget is below what the model needs"),
    # sessions and generation
    "session_error": ErrorCode(False, "a session operation failed (generic)"),
    "unknown_session": ErrorCode(False, "no such session for this connection"),
    "session_exists": ErrorCode(False, "open_session / restore_session: a session of that "
                                       "name exists (an orphaned one can be adopted)"),
    "session_owned": ErrorCode(False, "adopt_session: the session belongs to a connected "
                                      "client"),
    "unknown_stream": ErrorCode(False, "resume_stream: no such stream of this client (unknown, "
                                       "or ended more than 60 s ago)"),
    "too_many_sessions": ErrorCode(True, "max_sessions_per_client reached, or every session "
                                         "slot of the model is taken; close one and retry"),
    "session_busy": ErrorCode(True, "the session is replying (chat, save_session); wait for "
                                    "done or cancel"),
    "unknown_save": ErrorCode(False, "restore_session: no saved session by that name (names "
                                     "are case-sensitive)"),
    "invalid_state": ErrorCode(False, "restore_session: the save is damaged, truncated, not a "
                                      "session save, of an unsupported format version, too "
                                      "long for the context, or from another model"),
    "save_name_conflict": ErrorCode(False, "save_session: a save whose name differs only in "
                                           "case exists (or is being written)"),
    "save_failed": ErrorCode(False, "save_session / restore_session: the save directory or "
                                    "file cannot be written or read (read-only, permissions, "
                                    "I/O error); an earlier save of that name is unchanged"),
    "disk_full": ErrorCode(True, "save_session: no space left for the save; an earlier save of "
                                 "that name is unchanged — free space and retry"),
    "prompt_too_long": ErrorCode(False, "the line does not fit the session's context; shorten "
                                        "it or open a new session"),
    "context_full": ErrorCode(True, "other sessions hold the shared KV cells this line "
                                    "needs beyond the session's guaranteed floor (at chat, or "
                                    "as a stream error); retry when their replies end or "
                                    "they close"),
    "invalid_input": ErrorCode(False, "1.3: detokenize/embed input the model cannot read: a "
                                      "token id outside its vocabulary, or a model that cannot "
                                      "embed (a reranker)"),
    "invalid_grammar": ErrorCode(False, "grammar or json_schema cannot be compiled"),
    "invalid_image": ErrorCode(False, "chat.images: an image that is not a PNG/JPEG llama.cpp "
                                      "can decode, pixels of a zero or absurd size or that do "
                                      "not match width x height x channels, or media markers in "
                                      "the text that do not match the images; the session is "
                                      "unchanged"),
    "vision_unavailable": ErrorCode(False, "chat.images for a model loaded without a vision "
                                           "projector (load_model.mmproj / --mmproj); the "
                                           "session is unchanged"),
    "invalid_sampling": ErrorCode(False, "sampling values refused by the runtime (the body "
                                         "schema normally catches them first: invalid_body)"),
    "cancelled": ErrorCode(False, "stream error: the session was closed while it replied"),
    "engine_closed": ErrorCode(False, "stream error: the model was unloaded or replaced, or the "
                                      "sidecar is stopping"),
    "inference_failed": ErrorCode(True, "stream error: llama.cpp failed while decoding; the "
                                        "session is as before the request"),
    "engine_unavailable": ErrorCode(True, "no placement of the model fits the memory that is "
                                          "free now (the game took it); sessions are kept and "
                                          "the sidecar keeps trying — retry shortly"),
    "upstream_unavailable": ErrorCode(True, "the session is served by the OpenAI-compatible "
                                            "upstream (serve --upstream), which could not be "
                                            "reached or kept refusing after the retries; the "
                                            "line is rolled back — retry shortly"),
    "upstream_refused": ErrorCode(False, "the upstream refused the request itself (a model it "
                                         "does not serve, a body it cannot take); its message "
                                         "is passed on"),
    # reserve_vram (every reservation ends with ok/granted or one of these)
    "cannot_free": ErrorCode(False, "the model cannot give back that much: it is on a fixed "
                                    "GPU plan (no arbiter), or already on its CPU plan and the "
                                    "rest is held by other processes"),
    "deadline_missed": ErrorCode(True, "the VRAM was not free within the reservation's time "
                                       "limit (5 s); ask again"),
}
