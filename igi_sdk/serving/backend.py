"""What the protocol server needs of the model side — the seam between ``bridge`` (speaks the
protocol) and ``sidecar`` (owns engine, planner, arbiter). The server never waits on it: every
call returns at once, model work as a :class:`~concurrent.futures.Future`."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Protocol

from igi_sdk.events import ReplyEvent, ReplyResult, SessionFigures
from igi_sdk.wire import protocol as P

# a finished reply's figures, as the model side reports them
ChatResult = ReplyResult


class StreamHandle(Protocol):
    def cancel(self) -> None: ...


class TokenizeResult(Protocol):
    """Token ids and each one's text (``runtime.oneshot.Tokenized``)."""

    tokens: list[int]
    pieces: list[str] | None


class EmbedResult(Protocol):
    """One vector per input (``runtime.oneshot_calls.Embeddings``)."""

    vectors: list[list[float]]
    tokens: int
    pooling: str


# a reply's typed events: ReplyText*, then ReplyDone or ReplyFailed (igi_sdk/events.py); called
# on the model side's outbox thread, never on the engine's
StreamListener = Callable[[ReplyEvent], None]
# how a reservation ends: None = granted, else the typed error
ReservationDone = Callable[[Exception | None], None]


class Backend(Protocol):
    @property
    def model_name(self) -> str | None: ...

    def session_slots(self, local_slots: int) -> int:
        """Sessions this side can hold when the local model has ``local_slots`` (more with an
        upstream that serves sessions beyond them)."""
        ...

    def load_model(self, path: Path, request: P.LoadModel,
                   draft: Path | None = None, mmproj: Path | None = None) -> dict[str, Any]:
        """Load (or replace) the model, with ``draft`` (a resolved ``request.draft``) for
        speculative decoding and ``mmproj`` (a resolved ``request.mmproj``) for image input;
        blocking — the server calls it on a worker thread.
        Returns the ``load_model`` reply body."""
        ...

    def open_session(self, request: P.OpenSession) -> Future[str]:
        """A new session, with ``request.name`` as its id when given."""
        ...

    def close_session(self, session: str) -> Future[None]: ...

    def chat(self, request: P.Chat, listener: StreamListener) -> Future[StreamHandle]: ...

    def save_session(self, session: str, path: Path) -> Future[int]: ...

    # 1.3: requests without a session (serving/oneshot.py)
    def tokenize(self, request: P.Tokenize) -> Future[TokenizeResult]: ...

    def detokenize(self, request: P.Detokenize) -> Future[str]: ...

    def embed(self, request: P.Embed) -> Future[EmbedResult]: ...

    def complete(self, request: P.Complete, listener: StreamListener) -> Future[StreamHandle]:
        """A raw prompt's reply, streamed as ``chat``'s, in a session of its own."""
        ...

    def restore_session(self, path: Path, session: str | None = None) -> Future[str]:
        """A session from a save file, with id ``session`` when given."""
        ...

    def set_priority(self, session: str, priority: int) -> None:
        """At once; takes effect at the next decode step."""
        ...

    def session_info(self) -> dict[str, SessionFigures]:
        """Session id -> {"tokens", "busy", "priority"}; never waits on the engine thread."""
        ...

    def frame(self, client: str, request: P.Frame) -> None:
        """A frame tick from ``client`` (a stable id of the connection)."""
        ...

    def reserve_vram(self, request: P.ReserveVram, done: ReservationDone) -> None: ...

    def status(self) -> dict[str, Any]:
        """Engine and arbiter figures for ``stats``; never waits on the engine thread."""
        ...

    def close(self) -> None: ...
