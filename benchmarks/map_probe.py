"""A thread that maps, touches and unmaps a fresh 4 MiB anonymous region at a fixed period and
records how long each took: the address-space work a large allocation or a new Python arena
does, which waits while another thread of the process holds its memory map (page-locking
host memory does). Shared by load_behind.py and pin_chunks.py."""

from __future__ import annotations

import mmap
import threading
import time

PROBE_BYTES = 4 << 20


class MapProbe(threading.Thread):
    """Every ``every_s``: (start, seconds) of one map, touch and unmap, in ``probes``."""

    def __init__(self, every_s: float) -> None:
        super().__init__(name="map-probe", daemon=True)
        self.every_s, self.stop = every_s, threading.Event()
        self.probes: list[tuple[float, float]] = []

    def run(self) -> None:
        while not self.stop.is_set():
            t0 = time.perf_counter()
            m = mmap.mmap(-1, PROBE_BYTES)
            m[0] = 1
            m.close()
            self.probes.append((t0, time.perf_counter() - t0))
            time.sleep(self.every_s)

    def within(self, t0: float, t1: float) -> list[float]:
        """The durations of the probes that started in ``[t0, t1)``."""
        return [s for t, s in self.probes if t0 <= t < t1]

    def longest(self, t0: float, t1: float) -> float:
        return max(self.within(t0, t1), default=0.0)
