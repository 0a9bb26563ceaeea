"""The service's rules for the requests that hold no session (protocol 1.3): ``tokenize``,
``detokenize``, ``embed`` and ``complete``. Called from the session service
(serving/service.py) on its thread, with its bookkeeping; the model work goes to the
backend as futures, as every request's does.

Caps: an ``embed`` or a ``complete`` counts as one of the client's streams while it runs
(``max_streams_per_client``); a ``complete`` also holds a session slot while it runs (its
reply is decoded in a session of its own, closed at its end), counted as a session being
opened against the client's cap, so that it cannot take a slot from the game's NPCs.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol, TypeVar

from igi_sdk.serving.backend import Backend, EmbedResult
from igi_sdk.serving.clients import Client
from igi_sdk.serving.streaming import StreamHost, stream_reply
from igi_sdk.wire import contract as C
from igi_sdk.wire import protocol as P

_T = TypeVar("_T")


class _StreamCap(Protocol):
    @property
    def max_streams_per_client(self) -> int: ...


class Service(StreamHost, Protocol):
    """What these requests use of the session service (serving/service.py): a protocol, so
    that this module sits below the service and imports nothing of it."""

    @property
    def backend(self) -> Backend: ...

    @property
    def cfg(self) -> _StreamCap: ...

    def _answer(self, identity: bytes, msg_id: int, fut: Future[_T], msg_type: str,
                ok: Callable[[_T], C.Answer],
                failed: Callable[[], None] | None = None) -> None: ...

    def _need_model(self) -> None: ...

    def _session_room(self, c: Client) -> None: ...


def tokenize(svc: Service, c: Client, msg_id: int, body: P.Tokenize) -> None:
    svc._need_model()
    fut = svc.backend.tokenize(body)
    svc._answer(c.identity, msg_id, fut, "tokenize", lambda t: C.TokenizeOk(
        tokens=t.tokens, **({"pieces": t.pieces} if body.with_pieces else {})))


def detokenize(svc: Service, c: Client, msg_id: int, body: P.Detokenize) -> None:
    svc._need_model()
    svc._answer(c.identity, msg_id, svc.backend.detokenize(body), "detokenize",
                lambda text: C.DetokenizeOk(text=text))


def embed(svc: Service, c: Client, msg_id: int, body: P.Embed) -> None:
    svc._need_model()
    if _duplicate(svc, c, msg_id, "embed"):
        return
    _stream_room(svc, c)
    c.streams[msg_id] = None  # counted as a stream while it runs (it cannot be cancelled)

    def ended() -> None:
        c.streams.pop(msg_id, None)
        c.cancel_pending.discard(msg_id)

    def answered(e: EmbedResult) -> C.EmbedOk:
        ended()
        return C.EmbedOk(data=e.vectors, tokens=e.tokens, pooling=e.pooling)

    svc._answer(c.identity, msg_id, svc.backend.embed(body), "embed", answered, ended)


def complete(svc: Service, c: Client, msg_id: int, body: P.Complete) -> None:
    """A stream as ``chat``'s (serving/streaming.py): ``token`` events, then ``done`` or
    ``error``."""
    svc._need_model()
    if _duplicate(svc, c, msg_id, "complete"):
        return
    _stream_room(svc, c)
    svc._session_room(c)  # its own session for the reply's length: a slot of the client's
    c.opening += 1

    def released() -> None:  # the service thread, once
        c.opening -= 1

    stream_reply(svc, c, msg_id, "complete",
                 lambda listener: svc.backend.complete(body, listener), released)


def _duplicate(svc: Service, c: Client, msg_id: int, what: str) -> bool:
    """Whether ``msg_id`` is running already: answered with id 0, as chat's duplicate is (an
    error carrying the id would read as the end of the request still running under it)."""
    if msg_id not in c.streams:
        return False
    svc._error(c.identity, 0, P.ProtocolError(
        "duplicate_id", f"request id {msg_id} is still running; this {what} was ignored and "
        "that request goes on"))
    return True


def _stream_room(svc: Service, c: Client) -> None:
    if len(c.streams) >= svc.cfg.max_streams_per_client:
        raise P.ProtocolError("busy", f"{len(c.streams)} replies are already streaming for "
                              "this client; wait for one to finish", retryable=True)
