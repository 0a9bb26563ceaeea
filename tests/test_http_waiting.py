"""The face's line of requests waiting for the sidecar's room (igi_sdk/http/waiting.py): pure
asyncio with a stand-in for the sidecar's slots, then the real sidecar answering more
concurrent requests than it has session slots."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from igi_sdk.http.errors import HttpError
from igi_sdk.http.waiting import WaitLine
from tests.sidecars import http_sidecar


class _Slots:
    """``n`` slots; a request holds one until :meth:`end` (the stand-in of the sidecar's
    ``too_many_sessions``)."""

    def __init__(self, n: int) -> None:
        self.free, self.order = n, list[int]()

    def taker(self, i: int) -> Callable[[], Awaitable[int]]:
        async def take() -> int:
            if self.free <= 0:
                raise HttpError(429, "too_many_sessions", "every slot is taken")
            self.free -= 1
            self.order.append(i)
            return i
        return take


async def _never_gone() -> bool:
    return False


def test_requests_past_the_free_slots_wait_their_turn_in_order() -> None:
    async def main() -> tuple[list[int], list[int], int]:
        slots, line = _Slots(2), WaitLine(cap=8, wait_s=30)
        tasks = [asyncio.create_task(line.run(slots.taker(i), _never_gone)) for i in range(6)]
        await asyncio.sleep(0.05)
        assert len(line) == 4 and slots.order == [0, 1]  # two started, four wait
        done = []
        for _ in range(4):  # a request ends: its slot goes to the next in line
            slots.free += 1
            line.freed()
            done.append(await asyncio.wait_for(asyncio.shield(tasks[len(done) + 2]), 5))
        return slots.order, done, line.waited

    order, done, waited = asyncio.run(main())
    assert order == [0, 1, 2, 3, 4, 5] and done == [2, 3, 4, 5] and waited == 4


def test_the_line_is_capped_and_so_is_the_wait() -> None:
    async def main() -> tuple[list[object], int]:
        slots, line = _Slots(0), WaitLine(cap=2, wait_s=0.3)
        runs = [line.run(slots.taker(i), _never_gone) for i in range(3)]
        out = await asyncio.gather(*runs, return_exceptions=True)
        return out, len(line)

    out, left = asyncio.run(main())
    assert all(isinstance(e, HttpError) and e.status == 429 for e in out)
    codes = sorted(e.code for e in out if isinstance(e, HttpError))
    assert codes == ["busy", "too_many_sessions", "too_many_sessions"]  # the cap; two waits
    assert left == 0


def test_a_client_that_goes_away_leaves_the_line_and_other_refusals_pass_through() -> None:
    async def main() -> tuple[object, object, int]:
        slots, line = _Slots(0), WaitLine(cap=4, wait_s=30)
        left = False

        async def gone() -> bool:
            return left

        waiter = asyncio.create_task(line.run(slots.taker(0), gone))
        await asyncio.sleep(0.05)
        assert len(line) == 1
        left = True
        try:
            await asyncio.wait_for(waiter, 5)
            first: object = None
        except HttpError as e:
            first = e.status

        async def refused() -> int:
            raise HttpError(400, "invalid_argument", "no")
        try:
            await line.run(refused, _never_gone)
            second: object = None
        except HttpError as e:
            second = e.status
        return first, second, len(line)

    assert asyncio.run(main()) == (499, 400, 0)


def test_without_a_line_the_refusal_is_at_once() -> None:
    async def main() -> object:
        try:
            return await WaitLine(cap=0, wait_s=30).run(_Slots(0).taker(0), _never_gone)
        except HttpError as e:
            return e.code

    assert asyncio.run(main()) == "too_many_sessions"


@pytest.fixture(scope="module")
def two_slots(tmp_path_factory, default_model) -> Iterator[str]:
    with http_sidecar(tmp_path_factory, default_model, "--max-sessions", "2") as (base, _):
        yield base


@pytest.mark.parametrize("route", ["/completion", "/v1/chat/completions"])
def test_eight_concurrent_requests_on_two_slots_are_all_answered(two_slots, route) -> None:
    def ask(i: int) -> int:
        body = ({"prompt": f"Tell me about the number {i}.", "n_predict": 6}
                if route == "/completion" else
                {"messages": [{"role": "user", "content": f"Count to {i}."}], "max_tokens": 6,
                 "user": f"player-{i}"})
        return httpx.post(two_slots + route, json=body, timeout=120).status_code

    with ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(ask, range(8)))
    assert codes == [200] * 8
