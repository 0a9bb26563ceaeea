"""A reply streamed to its client, as ``chat`` and ``complete`` stream it: ``token`` (and
``tool_call``) events, then one ``done`` or ``error``; each frame logged for
``resume_stream``; the request counted among the client's streams until its end, and a
``cancel`` that came before the stream's handle applied as soon as the handle comes.

Below the session service (serving/service.py) and serving/oneshot.py, both of which start
their streams here; what it uses of the service is named as a protocol (no import of it).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from pydantic import ValidationError

from igi_sdk.events import ReplyDone, ReplyEvent, ReplyText, ReplyToolCall
from igi_sdk.serving.answers import done_body, error_body, ok_frame, typed
from igi_sdk.serving.backend import ChatResult, StreamHandle, StreamListener
from igi_sdk.serving.clients import Client
from igi_sdk.serving.ownership import StreamLog
from igi_sdk.wire import contract as C
from igi_sdk.wire import protocol as P


class StreamHost(Protocol):
    """What a stream uses of the session service: its thread (``later``) and its sends."""

    @property
    def _ignored(self) -> tuple[str, ...]: ...

    def later(self, fn: Callable[[], None]) -> None: ...

    def _send(self, identity: bytes, frame: bytes) -> None: ...

    def _send_logged(self, identity: bytes, log: StreamLog, frame: bytes) -> None: ...

    def _error(self, identity: bytes, msg_id: int, e: P.ProtocolError) -> None: ...


def stream_reply(host: StreamHost, c: Client, msg_id: int, msg_type: str,
                 start: Callable[[StreamListener], Future[StreamHandle]],
                 released: Callable[[], None],
                 answered: Callable[[ChatResult], None] | None = None) -> None:
    """Starts the stream of request ``msg_id`` (a ``msg_type``) with ``start(listener)``, the
    backend's call, and answers it to ``c`` as it goes. ``released`` runs once, on the
    service thread, when the stream ends (what the request held besides its stream: a
    session's reply in progress, image bytes, a session slot); ``answered``, there too, with
    the reply's result when it ends with ``done``. Called on the service thread, once the
    request passed its checks."""
    identity, ignored = c.identity, host._ignored
    events = c.logs[msg_id] = StreamLog()

    def ended() -> None:  # on the service thread
        if msg_id in c.streams:  # once per stream
            del c.streams[msg_id]
            released()
        c.cancel_pending.discard(msg_id)
        events.ended_at = time.monotonic()

    said = 0  # token and tool_call events of this stream so far (outbox thread only)

    def listener(event: ReplyEvent) -> None:  # on the model side's outbox thread
        # it encodes the frame here, off the service thread; the stream's log (socket-thread
        # state, for resume_stream) is appended and the frame sent there, in event order
        nonlocal said
        if isinstance(event, ReplyText):
            said += 1
            # a validated model per token costs under 3 us over a plain dict (1.3 -> 3.9 us
            # per encoded token), nothing beside a decode step; its fields are set but
            # logprobs (asked for by the line), so model_dump() without nulls is its wire
            # body, without wire()'s bookkeeping
            token = P.encode(msg_id, "token", C.Token(
                text=event.text, i=said, logprobs=_logprobs(event)).model_dump(
                    exclude_none=True))
            host.later(lambda: host._send_logged(identity, events, token))
            return
        if isinstance(event, ReplyToolCall):  # 1.3: counted with the token events
            said += 1
            k = event.call
            call = P.encode(msg_id, "tool_call", C.ToolCallEvent(
                i=said, index=k.index, id=k.id, name=k.name, arguments=k.arguments).wire())
            host.later(lambda: host._send_logged(identity, events, call))
            return
        result = None
        if isinstance(event, ReplyDone):
            result = event.result
            try:
                frame = ok_frame(msg_id, done_body(result), ignored, "done")
            except ValidationError as e:  # figures the contract does not allow: a bug
                frame = P.encode(msg_id, "error", error_body(typed(e, msg_type)))
        else:
            frame = P.encode(msg_id, "error", error_body(typed(event.error, msg_type)))

        def end() -> None:  # on the service thread
            if result is not None and answered is not None:
                answered(result)
            events.terminal = frame
            host._send(identity, frame)
            ended()

        host.later(end)

    c.streams[msg_id] = None  # reserved: the stream may end before the handle arrives

    def started(f: Future[StreamHandle]) -> None:  # on the service thread
        try:
            handle = f.result()
        except Exception as e:  # noqa: BLE001 - answered, typed
            ended()
            events.terminal = P.encode(msg_id, "error", error_body(typed(e, msg_type)))
            host._error(identity, msg_id, typed(e, msg_type))
            return
        if msg_id in c.streams:
            c.streams[msg_id] = handle
        if msg_id in c.cancel_pending:
            c.cancel_pending.discard(msg_id)
            handle.cancel()

    fut = start(listener)
    fut.add_done_callback(lambda f: host.later(lambda: started(f)))


def _logprobs(event: ReplyText) -> list[C.TokenLogprob] | None:
    """A text event's logprobs in their wire shape (None: the line asked for none)."""
    if not event.logprobs:
        return None
    return [C.TokenLogprob(token=t.token, logprob=t.logprob,
                           top=[C.TopLogprob(token=a, logprob=b) for a, b in t.top])
            for t in event.logprobs]
