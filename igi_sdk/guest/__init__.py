"""The sidecar as a good guest on the player's PC.

- :mod:`.priority` / :mod:`.win32` / :mod:`.posix`: no power throttling on Windows, and a
  priority below the game's (``BELOW_NORMAL_PRIORITY_CLASS``; nice 10 on Linux/macOS);
- :mod:`.cores` / :mod:`.cpuload`: the model's thread count from the cores the game leaves;
- :mod:`.dxgi` / :mod:`.adapters`: Windows' own per-process video memory budget and usage
  (``IDXGIAdapter3::QueryVideoMemoryInfo``), read by ``arbiter.sources.DxgiSource``;
- :mod:`.paths` / :mod:`.logs`: saves and the rotating log under the OS's per-user folders.

Each decision is a pure function with its own tests; the OS calls are thin and separate.
"""

from __future__ import annotations

import logging
import os
import sys

from igi_sdk.guest.priority import PRIORITY_ENV, plan_priority, priority_setting

log = logging.getLogger("igi_sdk.guest")


def run_behind_the_game(platform: str | None = None, setting: str | None = None) -> list[str]:
    """Lower this process's priority below the game's and, on Windows, opt it out of power
    throttling; returns what was done (logged). ``setting``: "below" (default) or "normal"
    (keep the priority; ``IGI_SDK_PRIORITY`` when not given). Call it early: on Linux a
    thread created later inherits the niceness of the thread that creates it."""
    platform = platform or sys.platform
    plan = plan_priority(platform, priority_setting(
        setting if setting is not None else os.environ.get(PRIORITY_ENV)))
    if platform == "win32":
        from igi_sdk.guest.win32 import apply_windows

        done = apply_windows(plan)
    else:
        from igi_sdk.guest.posix import apply_posix

        done = apply_posix(plan)
    if done:
        log.info("running behind the game: %s", "; ".join(done))
    return done
