"""What the engine thread says, as typed events, and the one outbox they leave it through.

The engine thread computes and posts; it never runs another layer's code. A reply's text, its
end and every command's outcome are posted to an :class:`Outbox`, whose own thread
(``igi-outbox``) hands each event to the one who asked for it: a reply's listener (the protocol
server encoding frames), a command's future (and with it every ``add_done_callback`` chained to
it). So a slow or faulty listener delays no decode step, and a callback that waits on the engine
cannot deadlock it.
"""

from __future__ import annotations

import itertools
import logging
import queue
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Generic, Protocol, TypedDict, TypeVar

if sys.version_info >= (3, 11):
    from typing import NotRequired
else:  # Python 3.10 (supported): typing has it from 3.11 (pydantic brings typing_extensions)
    from typing_extensions import NotRequired

from igi_sdk import threads

log = logging.getLogger("igi_sdk.runtime")

T = TypeVar("T")


class ReplyResult(Protocol):
    """A finished reply (``runtime.generation.GenerationResult``)."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float
    total_s: float
    cached_tokens: int
    tool_calls: tuple[ToolCall, ...]  # 1.3: the calls it made (empty: none)
    dropped_turns: int  # 1.3: turns its memory folded out of the context for it
    summarised_turns: int  # ... of them in the summary it wrote


@dataclass(frozen=True)
class TokenLogprob:
    """A sampled token's text and log-probability, and its likeliest alternatives'
    (``top``: (text, logprob), most likely first)."""

    token: str
    logprob: float
    top: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class ReplyText:
    """Text of reply ``reply`` as it is produced (stop strings already held back);
    ``logprobs``: the tokens whose text it completes, for a reply that asked for them."""

    reply: int
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ReplyDone:
    """Reply ``reply`` ended without error (``result.finish_reason`` says how)."""

    reply: int
    result: ReplyResult


@dataclass(frozen=True)
class ReplyFailed:
    """Reply ``reply`` ended with a typed error; its line is rolled back."""

    reply: int
    error: BaseException


@dataclass(frozen=True)
class ToolCall:
    """One call a reply made (1.3 tools): ``index`` its place in the reply, ``arguments`` the
    JSON text of an object valid against the tool's schema."""

    index: int
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class ReplyToolCall:
    """Reply ``reply`` completed a call (its closing tag was sampled)."""

    reply: int
    call: ToolCall


ReplyEvent = ReplyText | ReplyToolCall | ReplyDone | ReplyFailed
# a reply's subscriber; runs on the outbox thread, so it may encode and send, but should not
# wait long: the next reply's events queue behind it
ReplyListener = Callable[[ReplyEvent], None]


@dataclass(frozen=True)
class CommandDone(Generic[T]):
    """A command's outcome: ``future`` gets ``value`` or ``error`` on the outbox thread."""

    future: Future[T]
    value: T | None = None
    error: BaseException | None = None


@dataclass(frozen=True)
class _Stop:
    pass


EngineEvent = ReplyText | ReplyToolCall | ReplyDone | ReplyFailed | CommandDone | _Stop


class DraftFigures(TypedDict):
    """Speculative decoding's record: tokens drafted and accepted over ``passes`` verify
    passes; ``alpha`` the per-token acceptance (the chance the target keeps a drafted token
    given it kept the ones before: what ``igi-sdk plan --alpha`` means), ``acceptance_rate``
    accepted ÷ drafted, ``tokens_per_pass`` tokens a verify pass yielded on average; ``k`` the
    drafts per step chosen last and whether it drafts now."""

    drafted: int
    accepted: int
    passes: int
    alpha: float | None
    acceptance_rate: float | None
    tokens_per_pass: float | None
    k: int
    drafting: bool


class SessionFigures(TypedDict):
    """One session as the engine reports it to listings (read without waiting for it)."""

    tokens: int  # KV cells its conversation holds
    busy: bool  # a reply is being generated
    priority: int
    draft: NotRequired[DraftFigures]
    max_tokens: NotRequired[int]  # KV cells it may ever hold (its share of the context)
    memory: NotRequired[str]  # "fold" | "off" (runtime/memory.py)
    dropped_turns: NotRequired[int]  # turns folded out of its context so far

_reply_ids = itertools.count(1)


def next_reply_id() -> int:
    """A process-wide reply id (``next`` on a count is atomic under the GIL)."""
    return next(_reply_ids)


class Outbox:
    """One queue out of the engine thread and the thread that delivers from it.

    ``post`` is all the engine thread does (a queue put); listeners and futures are completed
    on ``igi-outbox``. One outbox may serve several engines in turn (the sidecar keeps one
    across model loads)."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[EngineEvent] = queue.SimpleQueue()
        self._listeners: dict[int, ReplyListener] = {}
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._drain, name=threads.OUTBOX, daemon=True)
        self._started = False
        self._closed = False
        self.delivered = 0

    # --- any thread ---------------------------------------------------------------------------

    def subscribe(self, reply: int, listener: ReplyListener) -> None:
        """``listener`` hears reply ``reply``'s events, up to and including its end."""
        with self._lock:
            self._listeners[reply] = listener
            if not self._started:
                self._started = True
                self._thread.start()

    def unsubscribe(self, reply: int) -> None:
        """The reply never started (its command failed): nothing will be said for it."""
        with self._lock:
            self._listeners.pop(reply, None)

    def post(self, event: EngineEvent) -> None:
        """Queue ``event`` for delivery (the engine thread's only contact with the others)."""
        if isinstance(event, CommandDone | _Stop) or event.reply in self._listeners:
            self._ensure_started()
            self._queue.put(event)

    def settle(self, future: Future[T], value: T | None = None,
               error: BaseException | None = None) -> None:
        """Complete ``future`` on the outbox thread (``error`` when given, else ``value``)."""
        self.post(CommandDone(future, value, error))

    def close(self, timeout: float = 10.0) -> None:
        """Deliver what is queued, then stop the thread."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            started = self._started
        if started:
            self._queue.put(_Stop())
            if threading.current_thread() is not self._thread:
                self._thread.join(timeout)

    def _ensure_started(self) -> None:
        if not self._started:
            with self._lock:
                if not self._started:
                    self._started = True
                    self._thread.start()

    # --- outbox thread ------------------------------------------------------------------------

    def _drain(self) -> None:
        while True:
            event = self._queue.get()
            if isinstance(event, _Stop):
                return
            try:
                self._deliver(event)
            except Exception:  # a listener's fault must not stop the others' deliveries
                log.exception("delivering an engine event failed")
            self.delivered += 1

    def _deliver(self, event: EngineEvent) -> None:
        if isinstance(event, CommandDone):
            fut = event.future  # set running by the engine thread, which ran the command
            if event.error is not None:
                fut.set_exception(event.error)
            else:
                fut.set_result(event.value)  # type: ignore[arg-type]
            return
        if isinstance(event, _Stop):
            return
        ends = isinstance(event, ReplyDone | ReplyFailed)
        with self._lock:
            listener = (self._listeners.pop(event.reply, None) if ends
                        else self._listeners.get(event.reply))
        if listener is not None:
            listener(event)
