"""Opening a placement on a loader thread while the engine thread keeps decoding on another.

A reshard used to stop every NPC for the whole load of the next placement (0.5–2 s for an 8B
on an H200 host). Loading a model is llama.cpp work that touches no handle of the placement
the engine decodes on: a new model and context, built from the file (memory-mapped pages the
running placement shares) and uploaded to the GPU. So it runs here, on a thread of its own
(``igi-loader``), and the engine thread only takes the finished placement over at a step
boundary (``commands.PlacementReady``), parks its sessions' state in it and carries on.

llama.cpp's C calls release the GIL (ctypes), so a load costs the decoding thread nothing but
the copy bandwidth. A load can be cancelled: llama.cpp asks the progress callback between
tensors and stops the load when it answers false (the game grew into the memory while the
placement was loading: it must never be fought for).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from igi_sdk import threads
from igi_sdk.errors import IgiError, ModelLoadError
from igi_sdk.model import ModelInventory
from igi_sdk.planner import Plan
from igi_sdk.runtime.loader import ContextSettings
from igi_sdk.runtime.placement import Placement

log = logging.getLogger("igi_sdk.runtime")


@dataclass
class LoadJob:
    """One placement being opened: the ticket the engine matches it by, and its cancel flag."""

    ticket: int
    plan: Plan
    cancelled: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True)
class LoadDone:
    """What a loader thread hands the engine thread: the placement, or why it did not open."""

    job: LoadJob
    placed: Placement | None
    error: IgiError | None
    seconds: float


def start(job: LoadJob, path: Path, inventory: ModelInventory, settings: ContextSettings,
          deliver: Callable[[LoadDone], bool]) -> threading.Thread:
    """Open ``job.plan`` on a new loader thread and ``deliver`` the outcome. ``deliver``
    answers False when nobody takes the placement any more (the engine closed): it is closed
    here then, so that nothing leaks."""
    def run() -> None:
        t0 = time.perf_counter()
        placed: Placement | None = None
        error: IgiError | None = None
        try:
            placed = Placement.open(path, inventory, job.plan, settings,
                                    cancelled=job.cancelled.is_set)
        except IgiError as e:
            error = e
        except BaseException as e:
            log.exception("loading plan '%s' in the background failed", job.plan.name)
            error = ModelLoadError(f"loading plan '{job.plan.name}' failed: {e}")
        if placed is not None and job.cancelled.is_set():
            placed.close()  # cancelled after the last tensor: the game wants the memory
            placed, error = None, ModelLoadError(
                f"loading plan '{job.plan.name}' was cancelled: the game needs the memory")
        done = LoadDone(job, placed, error, time.perf_counter() - t0)
        if not deliver(done) and placed is not None:
            placed.close()

    t = threading.Thread(target=run, name=threads.LOADER, daemon=True)
    t.start()
    return t
