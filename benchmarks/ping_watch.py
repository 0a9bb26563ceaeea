"""How another client sees the sidecar while something else loads it: a thread that pings over
ZeroMQ every 10 ms on a client of its own and reports p50/p99/max of the round trips.

    with PingWatch(endpoint) as watch:
        ...load the sidecar...
    summary = watch.summary()   # {"p50": ms, "p99": ms, "max": ms, "n": count}
"""

from __future__ import annotations

import threading
import time
from types import TracebackType


class PingWatch:
    def __init__(self, endpoint: str, *, every_s: float = 0.01, timeout_s: float = 30) -> None:
        self._endpoint = endpoint
        self._every_s = every_s
        self._timeout_s = timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ping-watch", daemon=True)
        self.round_trips: list[float] = []

    def __enter__(self) -> PingWatch:
        self.start()
        return self

    def start(self) -> None:
        self._thread.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        # imported here: the scripts that use this decide first whether the process is client-only
        from igi_sdk.client import Client

        client = Client(self._endpoint, timeout=self._timeout_s)
        try:
            while not self._stop.is_set():
                t0 = time.perf_counter()
                client.request("ping")
                self.round_trips.append(time.perf_counter() - t0)
                time.sleep(self._every_s)
        finally:
            client.close()

    def summary(self) -> dict[str, float]:
        rt = sorted(self.round_trips)
        if not rt:
            return {"p50": 0.0, "p99": 0.0, "max": 0.0, "n": 0}
        return {"p50": round(rt[len(rt) // 2] * 1e3, 2),
                "p99": round(rt[int(len(rt) * 0.99)] * 1e3, 2),
                "max": round(rt[-1] * 1e3, 2), "n": len(rt)}
