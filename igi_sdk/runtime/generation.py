"""What a caller holds while a reply is generated: a streaming, cancellable handle."""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from igi_sdk.errors import IgiError
from igi_sdk.events import (
    Outbox,
    ReplyDone,
    ReplyFailed,
    ReplyText,
    ReplyToolCall,
    TokenLogprob,
    ToolCall,
)


@dataclass(frozen=True)
class GenerationResult:
    session_id: str
    text: str  # what the player sees (stop strings removed)
    tokens: tuple[int, ...]  # every token sampled for this reply
    finish_reason: str  # "stop" (end of turn), "stop_string", "length", "cancelled"
    prompt_tokens: int
    completion_tokens: int
    ttft_s: float  # request accepted -> first token sampled
    total_s: float
    cached_tokens: int = 0  # KV cells of the session the turn reused (prompt_tokens excludes them)
    # turns of the conversation folded out of the context before this line, and of those the
    # ones its memory summarises (runtime/memory.py)
    dropped_turns: int = 0
    summarised_turns: int = 0
    tool_calls: tuple[ToolCall, ...] = ()  # the calls the reply made (finish_reason "tool_calls")

    @property
    def decode_tps(self) -> float:
        """Tokens per second after the first token."""
        span = self.total_s - self.ttft_s
        if self.completion_tokens < 2 or span <= 0:
            return 0.0
        return (self.completion_tokens - 1) / span


_DONE = object()


@dataclass
class Generation:
    """Iterate it for text pieces as they are produced; :meth:`result` waits for the end.

    Safe to use from any thread; :meth:`cancel` may be called from another thread than the one
    iterating."""

    session_id: str
    # text pieces, then _DONE (a SimpleQueue: a put per token takes no lock in Python)
    _events: queue.SimpleQueue = field(default_factory=queue.SimpleQueue, repr=False)
    _cancel: threading.Event = field(default_factory=threading.Event, repr=False)
    _finished: threading.Event = field(default_factory=threading.Event, repr=False)
    _result: GenerationResult | None = field(default=None, repr=False)
    _error: BaseException | None = field(default=None, repr=False)
    # the reply's id in its events, and the outbox they go to when someone listens to them
    # (a server forwarding the stream without a thread per reply)
    reply: int = 0
    outbox: Outbox | None = field(default=None, repr=False)
    # ends the engine's decode in flight early (a long prompt chunk), from any thread
    interrupt: Callable[[], None] | None = field(default=None, repr=False)
    # the engine thread's list of events made since its last llama_decode: it hands them out
    # with the next one (EngineCore._hand_out: after its call where that only queues the GPU's
    # work, else before it), so the threads they wake run while the device computes, not
    # while the engine prepares the step (None: handed out at once)
    held: list[Callable[[], None]] | None = field(default=None, repr=False)
    # no text waits longer than this to be sent (EngineConfig.stream_every_s), and a piece
    # goes only when its oldest text would otherwise overstay it: each piece wakes the threads
    # between the engine and the reader, and on a busy CPU each wake-up is taken out of a
    # decode step
    stream_every_s: float = 0.0
    _unsent_text: list[str] = field(default_factory=list, repr=False)
    _unsent_logprobs: list[TokenLogprob] = field(default_factory=list, repr=False)
    # monotonic: when the oldest unsent text must go; until when a piece just went (text made
    # before then waits for later text, made after it goes at once: the reader is waiting)
    _text_due: float = field(default=float("inf"), repr=False)
    _quiet_until: float = field(default=float("-inf"), repr=False)

    def cancel(self) -> None:
        """Stop at the next decode step; text produced so far stays in the conversation."""
        self._cancel.set()
        if self.interrupt is not None:
            self.interrupt()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    @property
    def done(self) -> bool:
        return self._finished.is_set()

    def __iter__(self) -> Iterator[str]:
        while True:
            item = self._events.get()
            if item is _DONE:
                if self._error is not None:
                    raise self._error
                return
            yield item

    def result(self, timeout: float | None = None) -> GenerationResult:
        if not self._finished.wait(timeout):
            raise TimeoutError(f"generation for session {self.session_id} still running")
        if self._error is not None:
            raise self._error
        assert self._result is not None
        return self._result

    # --- engine side ------------------------------------------------------------------------

    def _emit(self, text: str, logprobs: tuple[TokenLogprob, ...] = ()) -> None:
        if not text:
            return
        now = time.monotonic()
        if not self._unsent_text:
            # due a window after it was made, not a window after the last piece: at 6.3 ms a
            # token and a 16 ms window that sends 3 tokens a piece where the other sends 2,
            # each token's wait within the window either way (the CPU sidecar's threads took
            # 0.10-0.15 ms less CPU a token, benchmarks/sidecar_thread_cpu.py)
            self._text_due = (self._quiet_until if now >= self._quiet_until
                              else now + self.stream_every_s)
        self._unsent_text.append(text)
        self._unsent_logprobs.extend(logprobs)
        if now >= self._text_due:
            self._send_text(now)

    def release_text(self, by: float) -> None:
        """Send the text waiting to go with a later piece if its oldest would be due before
        ``by`` (monotonic: when the engine can next look), so none waits past its window for
        a step or a wait; ``by`` = inf sends it whatever its time."""
        if self._unsent_text and by >= self._text_due:
            self._send_text(time.monotonic())

    def _send_text(self, now: float) -> None:
        text, logprobs = "".join(self._unsent_text), tuple(self._unsent_logprobs)
        self._unsent_text.clear()
        self._unsent_logprobs.clear()
        self._quiet_until = now + self.stream_every_s
        self._send(functools.partial(self._emit_now, text, logprobs))

    def _emit_now(self, text: str, logprobs: tuple[TokenLogprob, ...]) -> None:
        self._events.put(text)
        if self.outbox is not None:
            self.outbox.post(ReplyText(self.reply, text, logprobs))

    def _emit_call(self, call: ToolCall) -> None:
        """A complete call: to listeners only (iterating a handle yields text)."""
        self.release_text(float("inf"))  # the text before the call goes first
        if self.outbox is not None:
            self._send(functools.partial(self.outbox.post, ReplyToolCall(self.reply, call)))

    def _send(self, event: Callable[[], None]) -> None:
        if self.held is None:
            event()
        else:
            self.held.append(event)

    def _finish(self, result: GenerationResult) -> None:
        self.release_text(float("inf"))
        self._send(functools.partial(self._finish_now, result))

    def _finish_now(self, result: GenerationResult) -> None:
        self._result = result
        self._finished.set()
        self._events.put(_DONE)
        if self.outbox is not None:
            self.outbox.post(ReplyDone(self.reply, result))

    def _fail(self, error: IgiError | BaseException) -> None:
        self.release_text(float("inf"))
        self._send(functools.partial(self._fail_now, error))

    def _fail_now(self, error: IgiError | BaseException) -> None:
        self._error = error
        self._finished.set()
        self._events.put(_DONE)
        if self.outbox is not None:
            self.outbox.post(ReplyFailed(self.reply, error))
