"""The wait libgomp's threads start with, for ``serve --wait``.

llama.cpp's default CPU backend runs its graphs with OpenMP, and libgomp reads how its idle
threads wait (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) once, when it loads: with ``import
llama_cpp``, which ``igi_sdk/__init__.py`` does before anything else (and sets
:data:`SPIN_ROUNDS` there unless the user set a wait). A wait asked for on the command line is
parsed after that, so the command starts again with the environment that gives it
(``cli.main``, in the same re-exec that preloads pyzmq's libraries). A build without OpenMP reads
neither variable: there ``--wait`` picks ggml's own pools while running
(``runtime/threadpool.py``) and the restart is harmless.
"""

from __future__ import annotations

from collections.abc import Mapping

POLICY = "OMP_WAIT_POLICY"
SPIN_COUNT = "GOMP_SPINCOUNT"
# libgomp's own default when no policy is set: about 300,000 rounds (a few milliseconds) before a
# waiting thread sleeps, cut to 100 by libgomp itself while it runs more threads than CPUs. With
# the thread count following the cores other processes leave free (runtime/thread_control.py),
# it decoded faster than sleeping at once (PASSIVE) on every H200 host measured, idle and beside
# busy CPUs, and the game's frame loop missed fewer frames beside it (docs/benchmarks.md,
# "Thread waits"); 20,000 rounds sat between the two.
SPIN_ROUNDS = "300000"


def start_env(environ: Mapping[str, str], wait: str) -> dict[str, str] | None:
    """The environment that gives libgomp the wait ``serve --wait`` names, or None where
    ``environ`` already gives it (or ``wait`` leaves it to the environment: ``auto``, ``poll``).

    ``spin``: ``GOMP_SPINCOUNT`` :data:`SPIN_ROUNDS` (a policy that would override it goes);
    ``sleep``: ``OMP_WAIT_POLICY=PASSIVE``, no spin count. The flag wins over variables the user
    set, since it is the more specific request."""
    env = dict(environ)
    if wait == "spin":
        env.pop(POLICY, None)
        env[SPIN_COUNT] = SPIN_ROUNDS
    elif wait == "sleep":
        env.pop(SPIN_COUNT, None)
        env[POLICY] = "PASSIVE"
    else:
        return None
    return None if env == dict(environ) else env
