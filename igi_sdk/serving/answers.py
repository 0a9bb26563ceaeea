"""The frames and bodies the session service answers with (an ``ok`` or ``done`` frame, the
``done`` body of a reply, an error's body, the wire error of any failure): shared by the
service and the requests it hands to other modules (serving/oneshot.py), below both."""

from __future__ import annotations

import logging

from igi_sdk.errors import IgiError
from igi_sdk.serving.backend import ChatResult
from igi_sdk.wire import contract as C
from igi_sdk.wire import protocol as P

log = logging.getLogger("igi_sdk.serving")


def ok_frame(msg_id: int, reply: C.Answer, ignored: tuple[str, ...], msg_type: str = "ok") -> bytes:
    """The frame of an answer (``ok``, or a stream's ``done``), naming the request's fields
    this sidecar did not know. ``ignored`` goes last, as it always has on the wire (a model
    built with it would send it first: inherited fields come first)."""
    body = reply.wire()
    if ignored:
        body["ignored"] = list(ignored)
    return P.encode(msg_id, msg_type, body)


def done_body(r: ChatResult) -> C.Done:
    return C.Done(text=r.text, finish_reason=r.finish_reason,
                  usage=C.Usage(prompt_tokens=r.prompt_tokens,
                                completion_tokens=r.completion_tokens,
                                cached_tokens=r.cached_tokens,
                                dropped_turns=r.dropped_turns,
                                summarised_turns=r.summarised_turns),
                  timings=C.Timings(ttft_s=r.ttft_s, total_s=r.total_s),
                  tool_calls=[C.ToolCallBody(id=k.id, name=k.name, arguments=k.arguments)
                              for k in r.tool_calls])


def error_body(e: P.ProtocolError) -> dict[str, object]:
    return C.ErrorBody(code=e.code, message=e.message, retryable=e.retryable).wire()


def typed(e: object, msg_type: str) -> P.ProtocolError:
    """The wire error for any failure: typed errors keep their code; anything else is a bug."""
    if isinstance(e, P.ProtocolError):
        return e
    if isinstance(e, IgiError):
        return P.ProtocolError(e.code, e.message, retryable=e.retryable)
    log.error("request %s failed: %r", msg_type, e,
              exc_info=e if isinstance(e, BaseException) else None)
    return P.ProtocolError("internal", f"internal error: {e}")
