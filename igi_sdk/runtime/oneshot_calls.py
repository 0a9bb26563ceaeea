"""The engine facade's side of the requests without a session (runtime/oneshot.py runs them
on the engine thread): an embedding batch sent a decode at a time, and a raw completion in a
session of its own that closes when its reply ends. Everything here chains futures and never
waits: the callbacks run on the outbox thread."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

from igi_sdk.events import ReplyDone, ReplyEvent, ReplyFailed, ReplyListener
from igi_sdk.runtime import commands as C
from igi_sdk.runtime.generation import Generation
from igi_sdk.runtime.oneshot import EmbedChunk


@dataclass(frozen=True)
class Embeddings:
    vectors: list[list[float]]  # one per input, in order
    tokens: int  # tokens read for all inputs
    pooling: str  # "mean", "cls" or "last"


def embed(submit: Callable[[C.Command], Future], inputs: Sequence[str | Sequence[int]],
          normalize: bool) -> Future[Embeddings]:
    """Send one :class:`~commands.Embed` per decode's worth of inputs, the next once the last
    is answered: between two, the engine thread runs the NPCs' decode steps."""
    items = tuple(x if isinstance(x, str) else tuple(int(t) for t in x) for x in inputs)
    out: Future[Embeddings] = Future()
    vectors: list[list[float]] = []
    read = [0]

    def step(start: int) -> None:
        submit(C.Embed(items, start, normalize)).add_done_callback(done)

    def done(f: Future[EmbedChunk]) -> None:  # the outbox thread
        try:
            chunk = f.result()
        except BaseException as e:  # noqa: BLE001 - handed to the caller, typed
            out.set_exception(e)
            return
        vectors.extend(chunk.vectors)
        read[0] += chunk.tokens
        if chunk.next >= len(items):
            out.set_result(Embeddings(vectors, read[0], chunk.pooling))
        else:
            step(chunk.next)

    if not items:
        out.set_result(Embeddings([], 0, "mean"))
    else:
        step(0)
    return out


def complete(open_session: Callable[[], Future[str]],
             start: Callable[[str, ReplyListener], Future[Generation]],
             close: Callable[[str], object],
             listener: ReplyListener | None) -> Future[Generation]:
    """Open a session, start the raw reply in it, and close it when the reply ends (or the
    reply is refused): the session's slot is held only while the completion runs. The
    engine's calls are handed in, so that this module stays below the engine."""
    out: Future[Generation] = Future()

    def opened(f: Future[str]) -> None:  # the outbox thread
        try:
            sid = f.result()
        except BaseException as e:  # noqa: BLE001 - handed to the caller, typed
            out.set_exception(e)
            return

        def relay(event: ReplyEvent) -> None:
            if isinstance(event, ReplyDone | ReplyFailed):
                close(sid)  # queued: the reply has ended
            if listener is not None:
                listener(event)

        def started(g: Future[Generation]) -> None:
            try:
                handle = g.result()
            except BaseException as e:  # noqa: BLE001 - refused: nothing was said
                close(sid)
                out.set_exception(e)
                return
            out.set_result(handle)

        # always streamed into the outbox: the reply's end is what closes the session
        start(sid, relay).add_done_callback(started)

    open_session().add_done_callback(opened)
    return out
