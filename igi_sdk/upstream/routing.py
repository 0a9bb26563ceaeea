"""The model side as the faces see it when an upstream is configured: each line goes to the local
model or to the OpenAI-compatible upstream, by policy, and every conversation is kept as text so
it can move either way without losing a line.

A session answered upstream keeps its transcript here; when it comes back to the local model its
local copy is reopened with that transcript as history (read once, with the next line). A reply
the local engine could not start because it became unavailable goes upstream under ``overflow``
before the player sees anything. Upstream replies are delivered through the local model's
outbox, so every listener runs on the outbox thread, whoever answers.
"""

from __future__ import annotations

import base64
import hashlib
import io
import logging
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

from igi_sdk.errors import (
    EngineUnavailableError,
    IgiError,
    InvalidImageError,
    InvalidStateError,
    SessionBusyError,
    TooManySessionsError,
    UpstreamUnavailableError,
)
from igi_sdk.events import (
    Outbox,
    ReplyDone,
    ReplyEvent,
    ReplyFailed,
    ReplyText,
    SessionFigures,
    next_reply_id,
)
from igi_sdk.serving.backend import (
    Backend,
    EmbedResult,
    ReservationDone,
    StreamHandle,
    StreamListener,
    TokenizeResult,
)
from igi_sdk.upstream.client import CHARS_PER_TOKEN_CAP, UpstreamCall, UpstreamClient
from igi_sdk.upstream.config import SchemaFormat, UpstreamConfig, affinity_headers
from igi_sdk.upstream.policy import LocalHealth, route
from igi_sdk.upstream.transcript import Transcript
from igi_sdk.wire import protocol as P

log = logging.getLogger("igi_sdk.upstream")

# a local reply shorter than this says little about the decode speed
_SPEED_SAMPLE_TOKENS = 8


class LocalModel(Backend, Protocol):
    """The local model host, as routing needs it beyond the Backend seam."""

    @property
    def outbox(self) -> Outbox: ...

    def health(self) -> LocalHealth: ...


def _done(value: Any) -> Future[Any]:
    fut: Future[Any] = Future()
    fut.set_result(value)
    return fut


def _failed(error: BaseException) -> Future[Any]:
    fut: Future[Any] = Future()
    fut.set_exception(error)
    return fut


class _Routed:
    """The stream handle the face holds: it cancels whichever side answers, including one that
    takes over after the handle was given out."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._inner: StreamHandle | UpstreamCall | None = None
        self._cancelled = False

    def attach(self, inner: StreamHandle | UpstreamCall) -> None:
        with self._lock:
            self._inner = inner
            cancelled = self._cancelled
        if cancelled:
            inner.cancel()

    def cancel(self) -> None:
        with self._lock:
            self._cancelled = True
            inner = self._inner
        if inner is not None:
            inner.cancel()


class RoutingBackend:
    """A :class:`Backend` over the local model and an upstream cluster."""

    def __init__(self, local: LocalModel, config: UpstreamConfig,
                 client: UpstreamClient | None = None) -> None:
        self.local = local
        self.cfg = config
        self.client = client or UpstreamClient(config)
        self._lock = threading.Lock()
        self._sessions: dict[str, Transcript] = {}
        self._streams = threading.BoundedSemaphore(config.max_streams)
        self._cpu_tps: float | None = None  # measured decode speed on the CPU placement
        self._calls: dict[str, UpstreamCall] = {}  # upstream replies in flight, by session
        self.figures = {"local_replies": 0, "remote_replies": 0, "moved_local": 0,
                        "overflowed": 0, "remote_sessions": 0}

    # --- the seam ---------------------------------------------------------------------------

    @property
    def model_name(self) -> str | None:
        return self.local.model_name

    def session_slots(self, local_slots: int) -> int:
        if self.cfg.policy == "local":
            return local_slots
        return local_slots + self.cfg.remote_sessions

    def load_model(self, path: Path, request: P.LoadModel,
                   draft: Path | None = None, mmproj: Path | None = None) -> dict[str, Any]:
        reply = self.local.load_model(path, request, draft, mmproj)
        with self._lock:  # the faces forget every session with the old model; so does this
            self._sessions.clear()
        return reply

    def open_session(self, request: P.OpenSession) -> Future[str]:
        sid = request.name or f"s-{uuid.uuid4().hex[:16]}"
        with self._lock:
            if sid in self._sessions:
                return _failed(SessionBusyError(f"session '{sid}' already exists"))
            system = request.system_prompt or (
                f"You are {request.persona}." if request.persona else "")
            t = self._sessions[sid] = Transcript(
                system, request.sampling, request.priority,
                [(h.role, h.content) for h in request.history])
            t.busy = True  # opening: no line until the open is settled
        where = route(self.cfg.policy, self.local.health(), cpu_tps=self._cpu_tps,
                      min_local_tps=self.cfg.min_local_tps, restored=False)
        out: Future[str] = Future()
        if where == "remote":
            if self.cfg.policy == "overflow":
                self._count("overflowed")
            return self._open_remote(t, sid, out)

        def opened(f: Future[str]) -> None:  # on the outbox thread, or at once
            try:
                f.result()
            except BaseException as e:  # noqa: BLE001 - settled below, typed
                if self._may_overflow(e):
                    self._count("overflowed")
                    self._open_remote(t, sid, out)
                    return
                with self._lock:
                    self._sessions.pop(sid, None)
                out.set_exception(e)
                return
            with self._lock:
                t.local_turns, t.busy = len(t.turns), False
            out.set_result(sid)

        self.local.open_session(request.model_copy(update={"name": sid})).add_done_callback(
            opened)
        return out

    def close_session(self, session: str) -> Future[None]:
        with self._lock:
            t = self._sessions.pop(session, None)
            call = self._calls.pop(session, None)
        if call is not None:  # its reply ends, as a local one does when its session closes
            call.cancel()
        if t is None or t.local_turns is not None:
            return self.local.close_session(session)
        return _done(None)

    def chat(self, request: P.Chat, listener: StreamListener) -> Future[StreamHandle]:
        with self._lock:
            t = self._sessions.get(request.session)
            if t is None:  # not routed (unknown): the local model answers as it does
                return self.local.chat(request, listener)
            if t.busy:
                return _failed(SessionBusyError(
                    f"session '{request.session}' is answering another line"))
            if request.history is not None:
                if not request.text and request.history[-1:] and \
                        request.history[-1].role == "assistant":
                    return _failed(InvalidStateError(
                        f"session '{request.session}' is routed to an upstream: its reply "
                        "cannot continue an assistant turn (send a user line)"))
                # the transcript the upstream is sent; a local copy is sent it with the line
                t.turns = [(h.role, h.content) for h in request.history]
            t.busy = True
        where = route(self.cfg.policy, self.local.health(), cpu_tps=self._cpu_tps,
                      min_local_tps=self.cfg.min_local_tps, restored=t.restored)
        handle = _Routed()
        out: Future[StreamHandle] = Future()
        if where == "remote":
            if self.cfg.policy == "overflow":
                self._count("overflowed")
            self._remote(request, t, listener, handle, out)
        elif t.local_fresh or t.restored:
            self._local(request, t, listener, handle, out)
        else:
            self._move_local(request, t, listener, handle, out)
        return out

    # requests without a session: the local model answers them (its tokenizer, its vectors)
    def tokenize(self, request: P.Tokenize) -> Future[TokenizeResult]:
        return self.local.tokenize(request)

    def detokenize(self, request: P.Detokenize) -> Future[str]:
        return self.local.detokenize(request)

    def embed(self, request: P.Embed) -> Future[EmbedResult]:
        return self.local.embed(request)

    def complete(self, request: P.Complete, listener: StreamListener) -> Future[StreamHandle]:
        return self.local.complete(request, listener)

    def save_session(self, session: str, path: Path) -> Future[int]:
        with self._lock:
            t = self._sessions.get(session)
            stale = t is not None and not t.local_fresh and not t.restored
        if not stale:
            return self.local.save_session(session, path)
        # its newest lines were answered upstream: the local copy reads them first
        out: Future[int] = Future()

        def save(_: object) -> None:
            saved = self.local.save_session(session, path)
            if self.cfg.policy == "remote":
                # a copy made only to save: its slot is given back once the file is written
                saved.add_done_callback(lambda _f: self._drop_local(session))
            _chain(saved, out)

        _on_success(self._reopen_local(session), out, save)
        return out

    def _drop_local(self, session: str) -> None:
        with self._lock:
            t = self._sessions.get(session)
            if t is None or t.local_turns is None:
                return
            t.local_turns = None
        self.local.close_session(session)

    def restore_session(self, path: Path, session: str | None = None) -> Future[str]:
        out: Future[str] = Future()

        def restored(sid: str) -> None:
            with self._lock:
                self._sessions[sid] = Transcript("", P.Sampling(), 0, local_turns=0,
                                                 restored=True)
            out.set_result(sid)

        _on_success(self.local.restore_session(path, session), out, restored)
        return out

    def set_priority(self, session: str, priority: int) -> None:
        with self._lock:
            t = self._sessions.get(session)
            if t is not None:
                t.priority = priority
                if t.local_turns is None:
                    return  # no local copy: the upstream has no priority to set
        self.local.set_priority(session, priority)

    def session_info(self) -> dict[str, SessionFigures]:
        info = self.local.session_info()
        with self._lock:
            for sid, t in self._sessions.items():
                if sid not in info:  # upstream only: it holds no local KV cells
                    info[sid] = SessionFigures(tokens=0, busy=t.busy, priority=t.priority)
                elif t.busy and t.where == "remote":
                    info[sid] = SessionFigures(tokens=info[sid]["tokens"], busy=True,
                                               priority=t.priority)
        return info

    def frame(self, client: str, request: P.Frame) -> None:
        self.local.frame(client, request)

    def reserve_vram(self, request: P.ReserveVram, done: ReservationDone) -> None:
        self.local.reserve_vram(request, done)

    def status(self) -> dict[str, Any]:
        out = self.local.status()
        with self._lock:
            remote = sum(1 for t in self._sessions.values() if t.where == "remote")
            figures = dict(self.figures, remote_sessions=remote)
        out["upstream"] = {"policy": self.cfg.policy, "replicas": list(self.client.bases),
                           "affinity_header": self.cfg.affinity_header,
                           "affinity_headers": list(affinity_headers(
                               "", self.cfg.affinity_header)),
                           "cpu_tps": self._cpu_tps, **figures, **self.client.figures}
        return out

    def close(self) -> None:
        self.local.close()
        self.client.close()

    # --- local ------------------------------------------------------------------------------

    def _local(self, request: P.Chat, t: Transcript, listener: StreamListener,
               handle: _Routed, out: Future[StreamHandle]) -> None:
        said = threading.Event()  # a piece of this reply reached the player

        def heard(event: ReplyEvent) -> None:  # on the outbox thread
            if isinstance(event, ReplyText):
                said.set()
            elif isinstance(event, ReplyDone):
                self._ended(t, request.text, event.result.text, event.result.finish_reason,
                            event.result.completion_tokens, local=True)
                self._measure(event)
            elif (isinstance(event, ReplyFailed) and not said.is_set()
                  and self._may_overflow(event.error)):
                # the engine became unavailable before the first token: the line was rolled
                # back, and the upstream answers it instead
                self._count("overflowed")
                self._remote(request, t, listener, handle, None)
                return
            else:
                self._free(t)
            listener(event)

        def started(f: Future[StreamHandle]) -> None:
            try:
                inner = f.result()
            except BaseException as e:  # noqa: BLE001
                if self._may_overflow(e):
                    self._count("overflowed")
                    self._remote(request, t, listener, handle, out)
                    return
                self._free(t)
                out.set_exception(e)
                return
            handle.attach(inner)
            out.set_result(handle)

        self.local.chat(request, heard).add_done_callback(started)

    def _move_local(self, request: P.Chat, t: Transcript, listener: StreamListener,
                    handle: _Routed, out: Future[StreamHandle]) -> None:
        """The session's newest lines were answered upstream (or it never had a local copy):
        its local copy is reopened with the transcript, then the line is said there."""

        def reopened(f: Future[None]) -> None:
            try:
                f.result()
            except BaseException as e:  # noqa: BLE001
                if self._may_overflow(e):
                    self._count("overflowed")
                    self._remote(request, t, listener, handle, out)
                    return
                self._free(t)
                out.set_exception(e)
                return
            self._count("moved_local")
            self._local(request, t, listener, handle, out)

        self._reopen_local(request.session).add_done_callback(reopened)

    def _reopen_local(self, session: str) -> Future[None]:
        """Close the stale local copy (if any), open it again with the whole transcript."""
        with self._lock:
            t = self._sessions[session]
            stale = t.local_turns is not None
            history = [P.HistoryTurn(role=r, content=c) for r, c in t.turns]
            t.local_turns = None
            # the engine's id is scoped (``name~scope``), past what a wire name may hold
            reopen = P.OpenSession(system_prompt=t.system, sampling=t.sampling,
                                   priority=t.priority, history=history).model_copy(
                update={"name": session})
        out: Future[None] = Future()

        def opened(_sid: str) -> None:
            with self._lock:
                t.local_turns = len(history)
            out.set_result(None)

        def reopen_now(_: object = None) -> None:
            _on_success(self.local.open_session(reopen), out, opened)

        if stale:  # closed first, whatever the close says: the open decides
            self.local.close_session(session).add_done_callback(reopen_now)
        else:
            reopen_now()
        return out

    def _measure(self, event: ReplyDone) -> None:
        """The decode speed of local replies on the CPU placement (for ``min_local_tps``)."""
        r = event.result
        span = r.total_s - r.ttft_s
        if r.completion_tokens < _SPEED_SAMPLE_TOKENS or span <= 0:
            return
        if self.local.health().on_gpu:
            return
        tps = (r.completion_tokens - 1) / span
        with self._lock:
            self._cpu_tps = tps if self._cpu_tps is None else 0.7 * self._cpu_tps + 0.3 * tps

    # --- upstream ---------------------------------------------------------------------------

    def _open_remote(self, t: Transcript, sid: str, out: Future[str]) -> Future[str]:
        """Session ``sid`` lives upstream only (within the cap on such sessions)."""
        with self._lock:
            held = sum(1 for o in self._sessions.values()
                       if o.where == "remote" and o.local_turns is None and o is not t)
            if held >= self.cfg.remote_sessions:
                del self._sessions[sid]
                full = True
            else:
                t.where, t.busy, t.local_turns = "remote", False, None
                full = False
        if full:
            out.set_exception(TooManySessionsError(
                f"{held} sessions are served upstream already, the most this sidecar keeps; "
                "close one first"))
        else:
            out.set_result(sid)
        return out

    def _remote(self, request: P.Chat, t: Transcript, listener: StreamListener,
                handle: _Routed, out: Future[StreamHandle] | None) -> None:
        """Stream the line from the upstream on a thread of its own; ``out`` (None when the
        stream was already given out) gets the handle at once."""
        outbox = self.local.outbox
        reply = next_reply_id()
        tools = bool(request.tools or request.tool_results)
        if tools or not self._streams.acquire(blocking=False):
            self._free(t)
            # tools are held to their schemas by the local model's grammar only: refused,
            # not dropped, for a line the upstream would answer
            error: IgiError = InvalidStateError(
                "tool calls are answered by the local model only; this line would go to the "
                "upstream") if tools else TooManySessionsError(
                f"{self.cfg.max_streams} replies are streaming from the upstream already; "
                "retry shortly")
            error.retryable = not tools
            if out is not None:
                out.set_exception(error)
            else:
                outbox.subscribe(reply, listener)
                outbox.post(ReplyFailed(reply, error))
            return
        call = UpstreamCall()
        handle.attach(call)
        outbox.subscribe(reply, listener)
        with self._lock:
            self._calls[request.session] = call
            t.where = "remote"
            messages = t.messages(request.text)
            sampling = t.sampling
        key = session_key(request.session)

        def run() -> None:
            try:
                if request.images:
                    messages[-1]["content"] = [{"type": "text", "text": request.text},
                                               *(_image_part(i) for i in request.images)]
                body = request_body(request, sampling, messages, key, self.cfg.schema_format)
                result = self.client.stream(
                    key, body, lambda text: outbox.post(ReplyText(reply, text)), call,
                    request.max_tokens * CHARS_PER_TOKEN_CAP)
            except IgiError as e:
                self._free(t)
                outbox.post(ReplyFailed(reply, e))
            except Exception as e:  # a bug here must still end the stream
                log.exception("upstream reply failed")
                self._free(t)
                outbox.post(ReplyFailed(reply, UpstreamUnavailableError(
                    f"the upstream reply failed ({type(e).__name__})")))
            else:
                self._ended(t, request.text, result.text, result.finish_reason,
                            result.completion_tokens, local=False)
                self._count("remote_replies")
                outbox.post(ReplyDone(reply, result))
            finally:
                with self._lock:
                    if self._calls.get(request.session) is call:
                        del self._calls[request.session]
                self._streams.release()

        threading.Thread(target=run, name="igi-upstream", daemon=True).start()
        if out is not None:
            out.set_result(handle)

    # --- shared -----------------------------------------------------------------------------

    def _may_overflow(self, error: BaseException) -> bool:
        """An error the upstream can answer instead of the local model (under overflow)."""
        return self.cfg.policy == "overflow" and isinstance(
            error, EngineUnavailableError | TooManySessionsError)

    def _ended(self, t: Transcript, line: str, reply: str, finish: str, tokens: int,
               *, local: bool) -> None:
        """A reply ended: the exchange joins the transcript (a reply cancelled before its
        first token was never said, as in the engine)."""
        with self._lock:
            if not (finish == "cancelled" and tokens == 0):
                t.commit(line, reply, local=local)
            t.busy = False
            if local:
                t.where = "local"
                self.figures["local_replies"] += 1

    def _free(self, t: Transcript) -> None:
        with self._lock:
            t.busy = False

    def _count(self, what: str) -> None:
        with self._lock:
            self.figures[what] += 1


def session_key(session: str) -> str:
    """What the upstream knows a session by (prompt_cache_key and the sticky header): stable
    per session, and neither its name nor its owner's scope."""
    return hashlib.sha256(session.encode()).hexdigest()[:32]


def request_body(request: P.Chat, sampling: P.Sampling, messages: list[dict[str, object]],
                 key: str, schema_format: SchemaFormat = "json_schema") -> dict[str, object]:
    """The chat completion request for one line (OpenAI fields, plus ``top_k``/``min_p`` and
    a GBNF ``grammar``, which vLLM, SGLang and llama-server read and others ignore). The
    line's own sampling (``chat.sampling``) overrides the session's."""
    if request.sampling is not None:
        sampling = sampling.model_copy(update=request.sampling.model_dump(exclude_none=True))
    body: dict[str, object] = {
        "messages": messages, "stream": True, "stream_options": {"include_usage": True},
        "max_tokens": request.max_tokens, "temperature": sampling.temperature,
        "top_p": sampling.top_p, "top_k": sampling.top_k, "min_p": sampling.min_p,
        "seed": sampling.seed, "prompt_cache_key": key}
    # OpenAI's names (llama-server's for the repeat penalty), sent only when set
    for name, neutral in (("frequency_penalty", 0.0), ("presence_penalty", 0.0),
                          ("repeat_penalty", 1.1)):
        if getattr(sampling, name) != neutral:
            body[name] = getattr(sampling, name)
    if sampling.logit_bias:
        body["logit_bias"] = {str(k): v for k, v in sampling.logit_bias.items()}
    if request.stop:
        body["stop"] = list(request.stop)
    if isinstance(request.json_schema, dict):
        body["response_format"] = (
            {"type": "json_object", "schema": request.json_schema}
            if schema_format == "json_object" else
            {"type": "json_schema", "json_schema": {"name": "reply", "schema": request.json_schema,
                                                    "strict": True}})
    if request.grammar is not None:
        body["grammar"] = request.grammar
    return body


def _image_part(image: P.ChatImage) -> dict[str, object]:
    """An image as an OpenAI ``image_url`` data URL: file bytes as they are, raw pixels as a
    PNG (Pillow; the sizes were bounded by the protocol)."""
    if image.data is not None:
        kind = "image/png" if image.data[:8] == b"\x89PNG\r\n\x1a\n" else "image/jpeg"
        raw = image.data
    else:
        from PIL import Image

        pixels = image.pixels or b""
        mode = "RGBA" if image.channels == 4 else "RGB"
        if image.width * image.height * image.channels != len(pixels) or not image.width:
            raise InvalidImageError("pixels do not match width x height x channels")
        buf = io.BytesIO()
        Image.frombytes(mode, (image.width, image.height), pixels).save(buf, "PNG")
        kind, raw = "image/png", buf.getvalue()
    url = f"data:{kind};base64,{base64.b64encode(raw).decode()}"
    return {"type": "image_url", "image_url": {"url": url}}


def _on_success(src: Future[Any], out: Future[Any], then: Callable[[Any], None]) -> None:
    """``then(result)`` once ``src`` succeeds; its error ends ``out`` instead."""
    def done(f: Future[Any]) -> None:
        try:
            value = f.result()
        except BaseException as e:  # noqa: BLE001 - handed on, typed
            out.set_exception(e)
            return
        then(value)

    src.add_done_callback(done)


def _chain(src: Future[Any], dst: Future[Any]) -> None:
    def copy(f: Future[Any]) -> None:
        try:
            dst.set_result(f.result())
        except BaseException as e:  # noqa: BLE001
            dst.set_exception(e)

    src.add_done_callback(copy)
