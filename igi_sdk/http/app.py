"""The OpenAI-compatible HTTP face: ``/v1/chat/completions`` (streamed or not), ``/v1/models``
(both also without ``/v1``, as llama-server serves them), ``/health``, on FastAPI.

The face speaks the sidecar's own protocol to its session service (``serving/service.py``):
in the sidecar's process (``serve --http``) over an in-process connection
(``Server.connect_local``, no socket hop), so the caps, priorities, pacing and typed errors of
the protocol apply unchanged and the face only translates. It is not the game: it never holds
the launch token, so its conversations have a mod's share of the session slots, and the
game's own ``open_session`` is never refused for them (the least recently used idle one makes
way). Its sessions are the face's conversations (conversations.py); one left idle for the
orphan timeout is closed, and its transcript opens it anew on its next line.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from igi_sdk.client import BridgeError, ChatStream, Client, LocalConnect, SidecarUnavailable
from igi_sdk.http import extra_routes, sampling_options
from igi_sdk.http import tools as http_tools
from igi_sdk.http.body_parser import BodyParser
from igi_sdk.http.conversations import Conversation, Conversations, Match, Turn
from igi_sdk.http.errors import RETRY_AFTER_S, HttpError, from_code
from igi_sdk.http.guard import ForeignGuard, Gate, KeyGuard
from igi_sdk.http.guard import authorised as key_ok
from igi_sdk.http.parse import Parsed, read, rewrite_fits
from igi_sdk.http.schema import MAX_BODY_BYTES, ChatOptions
from igi_sdk.http.waiting import Freed, WaitLine

_INLINE_BODY = 64 << 10  # bodies parsed on the event loop itself (well under a millisecond)


@dataclass(frozen=True)
class HttpConfig:
    endpoint: str  # the sidecar's own ZeroMQ endpoint
    owner: str  # the owner key of the face's sessions
    token: str | None = None  # the sidecar's launch token: the face is then the game's
    api_key: str | None = None  # Bearer key every request must carry (required off loopback)
    timeout_s: float = 120.0
    max_conversations: int = 256
    # what a request must carry to be read (Host, Origin, JSON bodies: http/guard.py);
    # None only for an app mounted in-process (tests)
    gate: Gate | None = None
    # the sidecar in this process (Server.connect_local): the face calls its session service
    # directly, with no socket between them; None: through ``endpoint``
    connect: LocalConnect | None = None
    # requests the sidecar has no room for now wait, first come first served (http/waiting.py):
    # at most ``queue`` of them (0: none waits, each is refused 429 at once), each at most
    # ``queue_wait_s``
    queue: int = 64
    queue_wait_s: float = 60.0
    # the memory of the face's sessions: "fold" (a conversation past its share of the context
    # is folded into a summary, as the game's NPCs are) or "off" (refused, 400
    # context_length_exceeded, as OpenAI and llama-server refuse it: for clients that trim
    # their own history)
    memory: str = "fold"


def build_app(cfg: HttpConfig, inward: Inward | None = None,
              bodies: BodyParser | None = None) -> FastAPI:
    """The face's app; ``inward``: its connection to the sidecar, and ``bodies``: its parser
    of large bodies, given by whoever must close them when the sidecar stops
    (``serve.start``)."""
    table = Conversations(cfg.max_conversations)
    lock = asyncio.Lock()
    large_bodies = _LargeBodies()
    inward = inward if inward is not None else Inward(cfg)
    body_parser = bodies if bodies is not None else BodyParser()

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        inward.close()  # its sessions are kept, to be adopted by the next connection
        body_parser.close()

    app = FastAPI(title="igi-sdk", docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=lifespan)
    waiting = WaitLine(cfg.queue, cfg.queue_wait_s)
    app.add_middleware(Freed, line=waiting)  # a request's end: the line's head tries again
    if cfg.api_key is not None:  # before routing: an unknown route without the key is 401
        app.add_middleware(KeyGuard, api_key=cfg.api_key)
    if cfg.gate is not None:  # added last, run first
        app.add_middleware(ForeignGuard, gate=cfg.gate)
    client = inward.get

    def authorised(request: Request) -> None:
        if cfg.api_key is None:
            return
        given = request.headers.get("authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {cfg.api_key}".encode()):
            raise HttpError(401, "invalid_api_key", "a valid API key is required (Bearer)")

    @app.exception_handler(HttpError)
    async def _http_error(_request: Request, e: HttpError) -> JSONResponse:
        return JSONResponse(e.body(), status_code=e.status, headers=e.headers())

    async def stats() -> dict[str, Any]:
        """The sidecar's ``stats`` (503 while it cannot be reached)."""
        try:
            return await asyncio.to_thread(_stats, client)
        except SidecarUnavailable as e:
            raise HttpError(503, "unavailable", str(e)) from None

    @app.get("/health")
    async def health(request: Request) -> JSONResponse:
        # public (a load balancer's probe carries no key): with a key set, a caller without
        # it learns whether a model is ready, not which
        shown = key_ok(request.headers.get("authorization"), cfg.api_key)
        st = await stats()
        if st.get("model") is not None and not st.get("loading"):
            return JSONResponse({"status": "ok", **({"model": st.get("model")} if shown
                                                    else {})})
        # a load balancer or client waits and asks again, as for a 503 of the chat route
        return JSONResponse({"status": "loading" if st.get("loading") else "no_model",
                             **({"model": None} if shown else {})}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER_S)})

    # llama-server serves the OpenAI routes with and without /v1 (clients given a base URL
    # without it call these)
    @app.get("/v1/models")
    @app.get("/models")
    async def models(request: Request) -> JSONResponse:
        authorised(request)
        st = await stats()
        name = st.get("model")
        data = [] if name is None else [{"id": name, "object": "model", "created": 0,
                                         "owned_by": "igi-sdk",
                                         **sampling_options.model_limits(st)}]
        return JSONResponse({"object": "list", "data": data})

    # embeddings, completions, llama-server's native routes (http/extra_routes.py)
    extra_routes.register(app, cfg.api_key, client, waiting)

    @app.post("/v1/chat/completions", response_model=None)
    @app.post("/chat/completions", response_model=None)
    async def chat_completions(request: Request) -> Response:
        authorised(request)
        slot = _LargeBodySlot(large_bodies)
        try:
            chunks, size = await _read_capped(request, slot)
            if size <= _INLINE_BODY:  # it parses in less time than a hop to a thread costs
                parsed = read(b"".join(chunks))
            elif not slot.held:  # a millisecond or two: a worker thread, the loop runs on
                parsed = await asyncio.to_thread(_read_joined, chunks)
            else:  # the parse process: a native parse there holds no GIL of this one
                parsed = await asyncio.to_thread(body_parser.parse, chunks, size)
        finally:
            slot.release()
        req, system, history, line, images = (parsed.options, parsed.system, parsed.history,
                                              parsed.line, parsed.images)
        results = parsed.results
        key = req.prompt_cache_key or req.user or request.headers.get("x-session-id")
        priority = _priority(request.headers.get("x-igi-priority"))
        # a client that stopped reading a stream asks again at once, maybe before the face
        # noticed: a moment's wait keeps its conversation's session (see _sse)
        for i in range(200):
            if not table.stopping() and (i >= 15 or not table.busy_with(key, system, history)):
                break
            await asyncio.sleep(0.01)
        async def begin() -> tuple[Match, _Turn, object]:
            """The line's session found or opened and its reply's first piece (what the
            sidecar refuses for want of room now is retried by the waiting line)."""
            async with lock:
                match = table.match(key, system, history, parsed.prefill)
                if match.conversation.busy:
                    raise HttpError(429, "session_busy", "this conversation is answering another "
                                    "request; send the next line when it ends")
                match.conversation.busy = True
                evicted = table.evictions()
            try:
                for attempt in range(4):
                    try:
                        turn, first = await _start(client(), req, match, line, images, priority,
                                                   evicted, inward, request.is_disconnected,
                                                   results)
                        break
                    except (HttpError, _StartFailed) as failure:
                        # opened: the line's session was opened and its reply then refused
                        opened = isinstance(failure, _StartFailed)
                        e = failure.error if isinstance(failure, _StartFailed) else failure
                        # every session slot is taken, or idle conversations hold the context's
                        # cells this line needs: the least recently used idle conversation gives
                        # them up (its transcript opens anew if it comes back; a mod cannot close
                        # the conversations it has given up on)
                        room = e.code == "context_full" or (e.code == "too_many_sessions"
                                                            and match.fresh)
                        if not room or attempt == 3:
                            raise e from None
                        async with lock:
                            victim = table.least_recent_idle(but=match.conversation.session)
                            if victim is None:
                                raise e from None
                            table.forget(victim)
                        # a session opened for this line is opened again after the room is made
                        evicted = [victim, *([match.conversation.session]
                                             if match.fresh and opened else [])]
            except _ClientGone:
                # gone before the reply's first piece (a silent upstream, a long prompt): the
                # reply stops, and its session closes
                match.conversation.busy = False
                table.forget(match.conversation.session)
                await asyncio.to_thread(_close_quietly_any, client, match.conversation.session)
                raise HttpError(499, "cancelled", "the client went away") from None
            except BaseException:
                match.conversation.busy = False
                if match.fresh:  # a session opened for a line that failed: not kept
                    table.forget(match.conversation.session)
                    await asyncio.to_thread(_close_quietly_any, client, match.conversation.session)
                raise
            return match, turn, first

        match, turn, first = await waiting.run(begin, request.is_disconnected)
        if req.stream:
            return StreamingResponse(_sse(turn, req, table, line, request, inward, first,
                                          results),
                                     media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

        async def give_up_idle() -> str | None:
            """The least recently used idle conversation, given up for another choice."""
            async with lock:
                victim = table.least_recent_idle(but=match.conversation.session)
                if victim is not None:
                    table.forget(victim)
                return victim

        more = [asyncio.ensure_future(_choice(client(), req, parsed, k, priority, inward,
                                              request.is_disconnected, give_up_idle))
                for k in range(1, req.choices())]
        try:
            done = await _finished(turn, inward, first, request.is_disconnected)
            extra = list(await asyncio.gather(*more))
        except _ClientGone:
            # nobody reads this reply: it stops, and its session closes (the transcript is no
            # longer the client's)
            table.forget(match.conversation.session)
            await asyncio.to_thread(_close_quietly_any, client, match.conversation.session)
            raise HttpError(499, "cancelled", "the client went away") from None
        finally:
            match.conversation.busy = False
            for task in more:
                task.cancel()
        table.answered_turns(match.conversation, [*http_tools.line_turns(line, results),
                                                  http_tools.reply_turn(done)])
        return JSONResponse(_completion(turn, req, done, extra))

    return app


class Inward:
    """The face's one protocol connection to the sidecar, made again when it is lost."""

    def __init__(self, cfg: HttpConfig) -> None:
        self.cfg = cfg
        self._client: Client | None = None
        self._lock = threading.Lock()

    def get(self) -> Client:
        with self._lock:
            if self._client is None:
                self._client = Client(self.cfg.endpoint, timeout=self.cfg.timeout_s,
                                      engine="openai-http", keep_sessions=True,
                                      owner=self.cfg.owner, token=self.cfg.token,
                                      local=self.cfg.connect)
            return self._client

    def lost(self, c: Client) -> None:
        """``c`` stopped answering: the next request connects again (and adopts)."""
        with self._lock:
            if self._client is c:
                self._client = None
        c.close()

    def close(self) -> None:
        with self._lock:
            c, self._client = self._client, None
        if c is not None:
            c.close()


@dataclass
class _Turn:
    """A request being answered: its stream and figures."""

    client: Client
    stream: ChatStream
    conversation: Conversation
    id: str
    created: int
    # the reply's events, handed to the event loop as the sidecar sends them (_follow)
    queue: asyncio.Queue[object]
    # its tokens' logprobs as the sidecar sent them (a line that asked for them)
    logprobs: list[dict[str, Any]] = field(default_factory=list)


def _stats(client: Any) -> dict[str, Any]:
    try:
        return client().stats()
    except BridgeError as e:  # not answered in time, say: typed, not an ASGI 500
        raise from_code(e.code, e.message) from None


# A body past this many bytes is large: one at a time is read and parsed (_LargeBodies)
LARGE_BODY = 1 << 20


class _LargeBodies:
    """At most one large body is read and parsed at a time, face-wide; another is refused
    429 (retry after a second) rather than queued. The parse is the body parser's one child's
    (body_parser.py), which takes a body at a time; reading tens of MiB still costs this
    process's event loop, and one in flight bounds what a flood of them can take (an H200
    host's NPC decoded at 0.29x its speed beside two senders of such bodies, each read and
    parsed here). The event loop's thread only: no lock."""

    def __init__(self) -> None:
        self.busy = False


class _LargeBodySlot:
    """One request's claim on :class:`_LargeBodies`, taken once its body is known large."""

    def __init__(self, bodies: _LargeBodies) -> None:
        self.bodies, self.held = bodies, False

    def take(self) -> None:
        if self.held:
            return
        if self.bodies.busy:
            raise HttpError(429, "busy", "another large request body is being read; send "
                            "this one again in a moment")
        self.bodies.busy = self.held = True

    def release(self) -> None:
        if self.held:
            self.bodies.busy = self.held = False


def _read_joined(chunks: list[bytes]) -> Parsed:
    return read(b"".join(chunks))


async def _read_capped(request: Request, slot: _LargeBodySlot) -> tuple[list[bytes], int]:
    """The body's chunks and size, refused with 413 past MAX_BODY_BYTES before it is all
    read; a large one takes ``slot`` first (429 while another large body is in flight). Not
    joined here: joining tens of MiB is one copy that holds the GIL."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit():
        if int(declared) > MAX_BODY_BYTES:
            raise HttpError(413, "request_too_large",
                            f"the body is over {MAX_BODY_BYTES} bytes")
        if int(declared) > LARGE_BODY:
            slot.take()
    parts, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise HttpError(413, "request_too_large", f"the body is over {MAX_BODY_BYTES} bytes")
        if size > LARGE_BODY:  # a body sent without its length
            slot.take()
        parts.append(chunk)
    return parts, size


def _priority(header: str | None) -> int:
    if header is None:
        return 0
    try:
        value = int(header)
    except ValueError:
        raise HttpError(400, "invalid_argument", "x-igi-priority is an integer") from None
    if not -100 <= value <= 100:
        raise HttpError(400, "invalid_argument", "x-igi-priority is from -100 to 100")
    return value


async def _start(c: Client, req: ChatOptions, match: Match, line: str, images: list[bytes],
                 priority: int, evicted: list[str], inward: Inward,
                 gone: Gone, results: tuple[tuple[str, str], ...] = ()
                 ) -> tuple[_Turn, object]:
    """Send the line and await the reply's first piece (a line the shared context cannot take
    yet is refused before any token). A line of a conversation whose session the face holds
    is one request that never waits (``chat``), sent from the event loop: no worker thread.
    The requests a line may need first (closing sessions, opening or regaining its own,
    setting its priority) wait for their answers, on a worker thread."""
    options = _line_options(req, images)
    options.update(http_tools.chat_options(req))
    if results:
        options["tool_results"] = [{"id": i, "content": c} for i, c in results]
    if match.rewrite is not None:  # the session's transcript is replaced before the line
        rewrite_fits(match.rewrite, line, images)
        options["history"] = [http_tools.wire_turn(t) for t in match.rewrite]
    conv = match.conversation
    if match.fresh or evicted or match.replaced or priority or not c.greeted:
        await asyncio.to_thread(_prepare, c, req, match, priority, evicted, False,
                                inward.cfg.memory)
    turn = _send(c, conv, line, options)
    try:
        return turn, await _next_piece(turn, inward, gone)
    except HttpError as e:
        if e.code != "unknown_session" or match.fresh:
            raise _StartFailed(e) from None
    # the session is not the connection's: an earlier connection's orphan, or closed while
    # idle (the orphan timeout, or the game took its slot); asked first, not looked up before
    # every line: one request to the service fewer per line
    await asyncio.to_thread(_prepare, c, req, match, priority, [], True, inward.cfg.memory)
    turn = _send(c, conv, line, options)
    try:
        return turn, await _next_piece(turn, inward, gone)
    except HttpError as e:
        raise _StartFailed(e) from None


def _line_options(req: ChatOptions, images: list[bytes]) -> dict[str, Any]:
    """The ``chat`` options of the request's line."""
    options: dict[str, Any] = {"max_tokens": req.reply_tokens(), "stop": req.stops(),
                               **sampling_options.chat_options(req)}
    fmt = req.response_format
    if fmt is not None and fmt.type == "json_object":
        options["json_schema"] = {"type": "object"}
    elif fmt is not None and fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise HttpError(400, "invalid_argument", "response_format.json_schema.schema "
                            "is required")
        options["json_schema"] = fmt.json_schema.schema_
    if images:
        options["images"] = images
    return options


def _prepare(c: Client, req: ChatOptions, match: Match, priority: int, evicted: list[str],
             regain: bool, memory: str = "fold") -> None:
    """What the line needs before it is sent (a worker thread: each request waits for its
    answer): sessions given up closed; the conversation's session opened (new), or ``regain``:
    adopted (an earlier connection's orphan) or opened anew from its transcript (closed while
    idle); its priority set."""
    conv = match.conversation
    try:
        if not c.greeted:
            c.hello()
        for sid in [*evicted, *([match.replaced] if match.replaced else [])]:
            _close_quietly(c, sid)
        if match.fresh:
            _open(c, req, conv, list(match.history), priority, memory)
        elif regain:
            _regain(c, req, conv, priority, memory)
        if priority and not match.fresh:
            try:
                c.set_priority(conv.session, priority)
            except BridgeError as e:
                if e.code != "unknown_session" or regain:
                    raise
                _regain(c, req, conv, priority, memory)
                c.set_priority(conv.session, priority)
    except BridgeError as e:
        raise from_code(e.code, e.message) from None
    except SidecarUnavailable as e:
        raise HttpError(503, "unavailable", str(e)) from None


def _regain(c: Client, req: ChatOptions, conv: Conversation, priority: int,
            memory: str = "fold") -> None:
    try:
        c.adopt_session(conv.session)
    except BridgeError as e:
        if e.code != "unknown_session":
            raise
        _open(c, req, conv, conv.turns, priority, memory)


def _send(c: Client, conv: Conversation, line: str, options: dict[str, Any]) -> _Turn:
    """Send the line (never waits: the client has said hello) and follow its reply."""
    try:
        stream = c.chat(conv.session, line, **options)
    except SidecarUnavailable as e:
        raise HttpError(503, "unavailable", str(e)) from None
    turn = _Turn(c, stream, conv, f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()),
                 asyncio.Queue())
    _follow(turn, asyncio.get_running_loop())
    return turn


async def _choice(c: Client, req: ChatOptions, parsed: Parsed, k: int, priority: int,
                  inward: Inward, gone: Gone, room: Callable[[], Awaitable[str | None]]
                  ) -> Choice:
    """Choice ``k`` of a request with ``n`` > 1: a session of its own, opened with the
    request's transcript, answering the line with its own seed, then closed (choices are not
    conversations the face keeps)."""
    conv = Conversation(f"choice-{uuid.uuid4().hex}", parsed.system)
    options = {**_line_options(req, parsed.images), **http_tools.chat_options(req),
               **sampling_options.chat_options(req, k)}
    if parsed.results:
        options["tool_results"] = [{"id": i, "content": c} for i, c in parsed.results]
    opened, evicted = False, list[str]()
    try:
        for attempt in range(4):
            try:
                if not opened or evicted:  # (opened: only the idle conversations close)
                    await asyncio.to_thread(_prepare, c, req,
                                            Match(conv, not opened, tuple(parsed.history)),
                                            priority, evicted, False, inward.cfg.memory)
                opened, evicted = True, []
                turn = _send(c, conv, parsed.line, options)
                first = await _next_piece(turn, inward, gone)
                break
            except HttpError as e:
                # every slot taken, or the context's cells: an idle conversation makes way
                if e.code not in ("too_many_sessions", "context_full") or attempt == 3:
                    raise
                victim = await room()
                if victim is None:
                    raise
                evicted = [victim]
        done = await _finished(turn, inward, first, gone)
        return done, turn.logprobs
    finally:
        with anyio.CancelScope(shield=True):
            await asyncio.to_thread(_close_quietly_any, lambda: c, conv.session)


class _StartFailed(Exception):
    """The line failed after its session was opened (the retry must open it again)."""

    def __init__(self, error: HttpError) -> None:
        super().__init__(error)
        self.error = error


def _open(c: Client, req: ChatOptions, conv: Conversation, history: list[Turn],
          priority: int, memory: str = "fold") -> None:
    # the session's own sampling stays the default: each line carries the request's
    # (sampling_options.line_sampling), so a later request is sampled as it asks
    c.open_session(conv.system, name=conv.session, priority=priority, sampling={},
                   history=[http_tools.wire_turn(t) for t in history],
                   **({"memory": "off"} if memory == "off" else {}))


def _close_quietly_any(client: Any, sid: str) -> None:
    try:
        _close_quietly(client(), sid)
    except SidecarUnavailable:
        pass  # its session waits as an orphan until the orphan timeout


def _close_quietly(c: Client, sid: str) -> None:
    """Close a session the face no longer uses (adopted first if it waits as an orphan)."""
    try:
        c.close_session(sid)
        return
    except BridgeError:
        pass
    try:
        c.adopt_session(sid)
        c.close_session(sid)
    except BridgeError:
        pass  # gone already


class _ClientGone(Exception):
    """The HTTP client disconnected while its reply was awaited."""


Gone = Callable[[], Awaitable[bool]]


async def _finished(turn: _Turn, inward: Inward, first: object, gone: Gone) -> dict[str, Any]:
    """The reply's ``done`` body, awaited on the event loop (no worker thread waits for it);
    _ClientGone if the client disconnects first."""
    async for piece in _pieces(turn, inward, first, gone):
        if isinstance(piece, HttpError):
            raise piece
    assert turn.stream.done is not None
    return turn.stream.done


def _usage(done: dict[str, Any]) -> dict[str, Any]:
    usage = done.get("usage", {})
    new, out = int(usage.get("prompt_tokens", 0)), int(usage.get("completion_tokens", 0))
    # the tokens the session's cache held and the line reused: read by OpenAI's clients as
    # part of the prompt (prompt_tokens_details.cached_tokens)
    cached = int(usage.get("cached_tokens", 0))
    return {"prompt_tokens": cached + new, "completion_tokens": out,
            "total_tokens": cached + new + out,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _finish_reason(done: dict[str, Any]) -> str:
    reason = done.get("finish_reason")
    return reason if reason in ("length", "tool_calls") else "stop"


Choice = tuple[dict[str, Any], list[dict[str, Any]]]  # a reply's done body, its logprobs


def _completion(turn: _Turn, req: ChatOptions, done: dict[str, Any],
                extra: list[Choice] | None = None) -> dict[str, Any]:
    """The completion; ``extra``: the other choices' when ``n`` > 1."""
    extra = extra or []
    choices = [(done, turn.logprobs), *extra]
    usage = _usage(done)
    for more, _ in extra:  # every choice's reply counts, as OpenAI bills them
        usage["completion_tokens"] += _usage(more)["completion_tokens"]
        usage["total_tokens"] += _usage(more)["completion_tokens"]
    return {"id": turn.id, "object": "chat.completion", "created": turn.created,
            "model": req.model or "igi-sdk",
            "choices": [{"index": i, "message": http_tools.message(d),
                         "finish_reason": _finish_reason(d), "logprobs": _lp(req, lp)}
                        for i, (d, lp) in enumerate(choices)],
            "usage": usage}


def _lp(req: ChatOptions, lps: list[dict[str, Any]]) -> dict[str, Any] | None:
    if not req.logprobs:
        return None
    return {"content": sampling_options.openai_logprobs(lps), "refusal": None}


def _chunk(turn: _Turn, req: ChatOptions, delta: dict[str, Any],
           finish: str | None = None, lps: list[dict[str, Any]] | None = None) -> bytes:
    body = {"id": turn.id, "object": "chat.completion.chunk", "created": turn.created,
            "model": req.model or "igi-sdk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish,
                         "logprobs": None if lps is None else _lp(req, lps)}]}
    return b"data: " + json.dumps(body).encode() + b"\n\n"


_END = object()


@dataclass(frozen=True)
class _Logprobbed:
    """A text piece of a reply that asked for logprobs, with its tokens'."""

    text: str
    logprobs: list[dict[str, Any]]


def _follow(turn: _Turn, loop: asyncio.AbstractEventLoop) -> None:
    """Hand the reply's events to the event loop as the sidecar sends them: the client calls
    the sink on the thread that files them (the sidecar's serving thread, for the face's
    in-process connection), one wake-up of the loop per event and no thread waiting."""
    stream, queue = turn.stream, turn.queue

    def hand_on(item: object) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, item)
        except RuntimeError:  # the face's loop has stopped: nobody reads this reply now
            pass

    def sink(rtype: str, body: dict[str, Any]) -> None:
        if rtype == "token":
            stream.pieces.append(body["text"])
            lps = body.get("logprobs")
            if lps:  # the piece with the tokens it completes (a streamed chunk carries them)
                turn.logprobs.extend(lps)
                hand_on(_Logprobbed(body["text"], lps))
            else:
                hand_on(body["text"])
        elif rtype == "tool_call":
            hand_on(http_tools.piece_of(body))
        elif rtype == "done":
            stream.done = body
            hand_on(_END)
        elif rtype == "error":
            hand_on(BridgeError(body.get("code", "error"), body.get("message", ""),
                                bool(body.get("retryable"))))

    turn.client.follow(stream.id, sink)


async def _next_piece(turn: _Turn, inward: Inward, gone: Gone | None = None) -> object:
    """The reply's next text piece, or ``_END``; HttpError for the error it ended with. A
    sidecar silent past the client's limit is gone (503), as a waiting client would count
    it. ``gone``: asked each second without a piece (a reply that sends nothing for a while,
    an upstream's say, is not left running for a client that has left): _ClientGone."""
    queue, limit = turn.queue, turn.client.silence_limit_s
    while True:
        if not queue.empty():  # no timer for a piece already there
            piece = queue.get_nowait()
        else:
            try:
                piece = await asyncio.wait_for(queue.get(), timeout=1.0)
            except TimeoutError:
                if gone is not None and await gone():
                    raise _ClientGone from None
                if turn.client.silent_for() > limit:
                    inward.lost(turn.client)
                    raise HttpError(503, "unavailable", "no answer from the sidecar") from None
                continue
        if isinstance(piece, BridgeError):
            if piece.code == "cancelled":  # the face cancels only replies nobody reads: the
                # game took this session's slot (its open_session is never refused)
                raise HttpError(503, "preempted", "the game needed this conversation's "
                                "session slot; send the request again")
            raise from_code(piece.code, piece.message)
        return piece


async def _pieces(turn: _Turn, inward: Inward, first: object,
                  gone: Gone) -> AsyncIterator[object]:
    """The reply's text pieces after ``first``, then its end: a piece is a str, or the
    HttpError the reply ended with (the last). _ClientGone when the client has left."""
    if first is _END:
        return
    while True:
        try:
            piece = await _next_piece(turn, inward, gone)
        except HttpError as e:
            yield e
            return
        if piece is _END:
            return
        yield piece


async def _stopped(turn: _Turn, wait_s: float = 10.0) -> str | None:
    """Stop a reply nobody reads and await its end: the text it said, or None when it could
    not be stopped in ``wait_s``."""
    try:
        await asyncio.to_thread(turn.stream.cancel)
        deadline = time.monotonic() + wait_s
        while (piece := await asyncio.wait_for(turn.queue.get(),
                                               max(0.0, deadline - time.monotonic()))) \
                is not _END:
            if isinstance(piece, BridgeError):
                return None
    except (BridgeError, SidecarUnavailable, TimeoutError):
        return None
    done = turn.stream.done
    return None if done is None else str(done.get("text", ""))


async def _sse(turn: _Turn, req: ChatOptions, table: Conversations,
               line: str, request: Request, inward: Inward,
               first: object, results: tuple[tuple[str, str], ...] = ()
               ) -> AsyncIterator[bytes]:
    """The reply as server-sent events, from its ``first`` piece on; a client that goes away
    cancels it (checked between pieces too: a server may notice a closed connection only at a
    later write)."""
    finished = False
    try:
        yield _chunk(turn, req, {"role": "assistant", "content": ""})
        if isinstance(first, str):
            yield _chunk(turn, req, {"content": first})
        elif isinstance(first, _Logprobbed):
            yield _chunk(turn, req, {"content": first.text}, lps=first.logprobs)
        elif isinstance(first, http_tools.CallPiece):
            yield _chunk(turn, req, http_tools.call_delta(first))
        n = 0
        pieces = _pieces(turn, inward, first, request.is_disconnected)
        while True:
            try:
                piece = await anext(pieces)
            except (StopAsyncIteration, _ClientGone) as end:
                if isinstance(end, _ClientGone):
                    return  # the finally below cancels the reply
                break
            if isinstance(piece, HttpError):
                yield b"data: " + json.dumps(piece.body()).encode() + b"\n\n"
                return
            if isinstance(piece, http_tools.CallPiece):
                yield _chunk(turn, req, http_tools.call_delta(piece))
                continue
            n += 1
            if n % 8 == 0 and await request.is_disconnected():
                return  # the finally below cancels the reply
            if isinstance(piece, _Logprobbed):
                yield _chunk(turn, req, {"content": piece.text}, lps=piece.logprobs)
                continue
            assert isinstance(piece, str)
            yield _chunk(turn, req, {"content": piece})
        done = turn.stream.done or {}
        yield _chunk(turn, req, {}, _finish_reason(done))
        if req.stream_options is not None and req.stream_options.include_usage:
            usage = {"id": turn.id, "object": "chat.completion.chunk", "created": turn.created,
                     "model": req.model or "igi-sdk", "choices": [],
                     "usage": _usage(done)}
            yield b"data: " + json.dumps(usage).encode() + b"\n\n"
        yield b"data: [DONE]\n\n"
        table.answered_turns(turn.conversation, [*http_tools.line_turns(line, results),
                                                 http_tools.reply_turn(done)])
        finished = True
    finally:
        # shielded: the server cancels this generator when the client goes away, and every
        # await in a cancelled scope would be cancelled too, leaving the reply running
        with anyio.CancelScope(shield=True):
            if not finished and turn.stream.done is None:
                # the client went away: the reply stops and its session keeps what was said
                # (the client's next transcript is read against it: only what differs is
                # read); closed if it does not stop in time
                turn.conversation.stopping = True
                try:
                    said = await _stopped(turn)
                finally:
                    turn.conversation.stopping = False
                if said is None:
                    table.forget(turn.conversation.session)
                    await asyncio.to_thread(_close_quietly_any, lambda: turn.client,
                                            turn.conversation.session)
                else:
                    table.answered_turns(turn.conversation, [
                        *http_tools.line_turns(line, results), ("assistant", said)])
            turn.conversation.busy = False
