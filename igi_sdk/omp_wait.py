"""The wait libgomp's threads start with, for ``serve --wait``.

llama.cpp's default CPU backend runs its graphs with OpenMP, and libgomp reads how its idle
threads wait (``OMP_WAIT_POLICY``, ``GOMP_SPINCOUNT``) once, when it loads: with ``import
llama_cpp``, which ``igi_sdk/__init__.py`` does before anything else (and sets ``PASSIVE``
there unless the user set a wait). A wait asked for on the command line is parsed after that,
so the command starts again with the environment that gives it (``cli.main``, in the same
re-exec that preloads pyzmq's libraries). A build without OpenMP reads neither variable: there
``--wait`` picks ggml's own pools while running (``runtime/threadpool.py``) and the restart is
harmless.
"""

from __future__ import annotations

from collections.abc import Mapping

POLICY = "OMP_WAIT_POLICY"
SPIN_COUNT = "GOMP_SPINCOUNT"
# About 20,000 rounds (tens of microseconds) before a waiting thread sleeps: long enough to catch
# the next op's barrier within one step, short enough that nothing spins between steps. It kept
# 96-97% of full spinning's decode on H100 hosts (docs/benchmarks.md, "Without a draft").
BOUNDED_SPIN = "20000"


def start_env(environ: Mapping[str, str], wait: str) -> dict[str, str] | None:
    """The environment that gives libgomp the wait ``serve --wait`` names, or None where
    ``environ`` already gives it (or ``wait`` leaves it to the environment: ``auto``, ``poll``).

    ``spin``: a bounded spin (``GOMP_SPINCOUNT`` 20000; a policy that would override it goes);
    ``sleep``: ``OMP_WAIT_POLICY=PASSIVE``, no spin count. The flag wins over variables the user
    set, since it is the more specific request."""
    env = dict(environ)
    if wait == "spin":
        env.pop(POLICY, None)
        env[SPIN_COUNT] = BOUNDED_SPIN
    elif wait == "sleep":
        env.pop(SPIN_COUNT, None)
        env[POLICY] = "PASSIVE"
    else:
        return None
    return None if env == dict(environ) else env
