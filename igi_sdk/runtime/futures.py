"""Composing the engine's futures without blocking a thread: a command's future continued on
another thread (the engine's, the I/O worker's). Errors pass through to the end future."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

from igi_sdk.errors import EngineClosedError

T = TypeVar("T")
P = TypeVar("P")


def on_pool(pool: ThreadPoolExecutor, fn: Callable[[], T]) -> Future[T]:
    """Run ``fn`` on ``pool``; a pool that is shut down (the engine is closing) gives a future
    that fails with :class:`EngineClosedError`."""
    try:
        return pool.submit(fn)
    except RuntimeError:  # the pool is shut down: the engine is closing
        fut: Future[T] = Future()
        fut.set_exception(EngineClosedError("the engine is closed"))
        return fut


def chain(first: Future, then: Callable[[Any], Future[T]]) -> Future[T]:
    """A future of ``then(result of first)``'s result: ``then`` is called (on the thread that
    finished ``first``) and must return at once with a future; nothing blocks on the way."""
    out: Future[T] = Future()

    def relay(f: Future) -> None:
        try:
            out.set_result(f.result())
        except BaseException as e:  # noqa: BLE001 - handed on
            out.set_exception(e)

    def step(f: Future) -> None:
        try:
            then(f.result()).add_done_callback(relay)
        except BaseException as e:  # noqa: BLE001 - handed on
            out.set_exception(e)

    first.add_done_callback(step)
    return out


def then(fut: Future, fn: Callable[[Any], T], pool: ThreadPoolExecutor) -> Future[T]:
    """A future of ``fn(result of fut)``, run on ``pool`` (errors pass through)."""
    out: Future[T] = Future()

    def done(f: Future) -> None:
        try:
            value = f.result()
        except BaseException as e:  # noqa: BLE001 - handed on
            out.set_exception(e)
            return

        def run() -> None:
            try:
                out.set_result(fn(value))
            except BaseException as e:  # noqa: BLE001 - handed on
                out.set_exception(e)

        try:
            pool.submit(run)
        except RuntimeError:  # the pool is shut down: the engine is closing
            out.set_exception(EngineClosedError("the engine is closed"))

    fut.add_done_callback(done)
    return out


def prepared(pool: ThreadPoolExecutor, prepare: Callable[[], P],
             start: Callable[[P], Future[T]], abandon: Callable[[T], None]) -> Future[T]:
    """A future of ``start(prepare())``'s result, returned at once: ``prepare`` runs on
    ``pool``, then ``start`` (on the pool's thread) must return at once with a future. If the
    caller cancels the returned future meanwhile, what ``start`` began is ``abandon``-ed (and
    ``start`` is not called if it has not been yet)."""
    out: Future[T] = Future()

    def relay(f: Future[T]) -> None:
        e = f.exception()
        if out.cancelled():  # the caller gave up: stop what it started
            if e is None:
                abandon(f.result())
        elif e is None:
            out.set_result(f.result())
        else:
            out.set_exception(e)

    def ready(f: Future[P]) -> None:
        e = f.exception()
        if out.cancelled():
            return
        if e is not None:
            out.set_exception(e)
            return
        start(f.result()).add_done_callback(relay)

    try:
        pool.submit(prepare).add_done_callback(ready)
    except RuntimeError:  # the pool is shut down: the engine is closing
        out.set_exception(EngineClosedError("the engine is closed"))
    return out
