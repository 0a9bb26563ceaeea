"""Requests the sidecar cannot take yet wait their turn, as llama-server queues them.

A request the sidecar refuses because its session slots, its streams or the shared context's
cells are all taken now (``too_many_sessions``, ``busy``, ``context_full``: retryable) waits in
the face's line, first come first served, and is started again when a request ends (and every
tenth of a second at the head of the line: a slot the game gives back, or a session that
times out, frees one without any request of the face ending). The line is bounded: past
``cap`` waiting requests, or after ``wait_s`` in it, the request gets the 429 it would have
got at once; a client that goes away while it waits leaves the line.

The sidecar's rules are unchanged: the game's own sessions come first (its ``open_session`` is
never refused for the face's requests, and a reply the game preempts is still answered 503),
and a request in the line holds nothing of the sidecar's. Event loop only: no lock.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from typing import TypeVar

from igi_sdk.http.errors import HttpError
from igi_sdk.http.guard import Asgi, Receive, Scope, Send

T = TypeVar("T")

# the sidecar's "everything is taken now" answers: a request waits for one of these to clear
FULL = frozenset({"too_many_sessions", "busy", "context_full"})
HEAD_POLL_S = 0.1  # the head of the line tries again this often without a wake-up
POLL_S = 0.5  # the others look this often whether their client is still there


class WaitLine:
    """The face's line of requests waiting for the sidecar's room."""

    def __init__(self, cap: int, wait_s: float) -> None:
        self.cap, self.wait_s = cap, wait_s
        self._line: deque[asyncio.Event] = deque()
        self.waited = 0  # requests that waited and were then started (for tests and stats)

    def __len__(self) -> int:
        return len(self._line)

    def freed(self) -> None:
        """A request ended (its slot, stream and cells may be free now): the head tries."""
        if self._line:
            self._line[0].set()

    async def run(self, start: Callable[[], Awaitable[T]],
                  gone: Callable[[], Awaitable[bool]]) -> T:
        """``start()``'s result, once the sidecar takes it: at once when nobody waits and it
        is taken, else after its turn in the line. HttpError: ``start``'s own refusals, 429 past
        the cap or the wait, 499 when the client went away while waiting."""
        if not self._line:
            try:
                return await start()
            except HttpError as e:
                if e.code not in FULL or self.cap <= 0:
                    raise
        if len(self._line) >= self.cap:
            raise HttpError(429, "busy", f"{len(self._line)} requests already wait for the "
                            "sidecar's room, the most this face queues; send this one again in "
                            "a moment")
        me = asyncio.Event()
        self._line.append(me)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.wait_s
        last: HttpError | None = None
        try:
            while True:
                if self._line[0] is me:
                    me.clear()  # a wake-up during the attempt below is kept for the next one
                    try:
                        out = await start()
                        self.waited += 1
                        return out
                    except HttpError as e:
                        if e.code not in FULL:
                            raise
                        last = e
                left = deadline - loop.time()
                if left <= 0:
                    what = last or HttpError(429, "busy", "the sidecar is busy")
                    raise HttpError(429, what.code, f"{what.message} (waited {self.wait_s:g} s "
                                    "for the sidecar's room)")
                poll = HEAD_POLL_S if self._line[0] is me else POLL_S
                try:
                    await asyncio.wait_for(me.wait(), min(poll, left))
                except TimeoutError:
                    pass
                if await gone():
                    raise HttpError(499, "cancelled", "the client went away while its request "
                                    "waited")
        finally:
            head = self._line[0] is me
            self._line.remove(me)
            if head and self._line:  # the next one tries now (there may be room for it too)
                self._line[0].set()


class Freed:
    """ASGI middleware: every request's end wakes the line's head (the slot, stream and cells
    the request held may be free now)."""

    def __init__(self, app: Asgi, line: WaitLine) -> None:
        self.app, self.line = app, line

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await self.app(scope, receive, send)
        finally:
            if scope.get("type") == "http":
                self.line.freed()
