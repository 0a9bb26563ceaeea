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

from collections.abc import Mapping, MutableMapping

POLICY = "OMP_WAIT_POLICY"
SPIN_COUNT = "GOMP_SPINCOUNT"
# libgomp's own default when no policy is set: about 300,000 rounds (a few milliseconds) before a
# waiting thread sleeps, cut to 100 by libgomp itself while it runs more threads than CPUs. With
# the thread count following the cores other processes leave free (runtime/thread_control.py),
# it decoded faster than sleeping at once (PASSIVE) on H200 hosts, idle and beside busy CPUs, and
# a game's frame loop missed fewer frames beside it (docs/benchmarks.md, "As shipped against
# expert llama.cpp"); 20,000 rounds sat between the two.
SPIN_ROUNDS = "300000"
# set beside the spin count where igi_sdk, not the user, chose the wait
SDK_CHOSE = "IGI_SDK_DEFAULT_WAIT"


def default_wait(environ: MutableMapping[str, str]) -> None:
    """What ``import igi_sdk`` does before libgomp loads: the spin, unless the user set a wait."""
    if not {POLICY, SPIN_COUNT} & environ.keys():
        environ[SPIN_COUNT] = SPIN_ROUNDS
        environ[SDK_CHOSE] = "1"


def in_effect(environ: Mapping[str, str]) -> str:
    """The wait libgomp's threads have under ``environ``, as a profile records it: the CPU op
    overhead it times includes the threads' wake-ups, which a sleeping wait pays at every op
    and a spinning one does not, so a profile timed under one prices the other wrongly.
    As libgomp reads them, a spin count wins over the policy."""
    count = environ.get(SPIN_COUNT, "").strip().lower()
    if count:
        return "spin" + count
    policy = environ.get(POLICY, "").strip().lower()
    return policy if policy in ("active", "passive") else "spin" + SPIN_ROUNDS


def start_env(environ: Mapping[str, str], wait: str,
              fixed_threads: bool = False) -> dict[str, str] | None:
    """The environment that gives libgomp the wait ``serve --wait`` names, or None where
    ``environ`` already gives it (or ``wait`` leaves it to the environment: ``auto``, ``poll``).

    ``spin``: ``GOMP_SPINCOUNT`` :data:`SPIN_ROUNDS` (a policy that would override it goes);
    ``sleep``: ``OMP_WAIT_POLICY=PASSIVE``, no spin count. The flag wins over variables the user
    set, since it is the more specific request. ``auto`` with a count the user fixed
    (``--threads N``) sleeps where the spin was only igi_sdk's default: spinning threads must
    follow the free cores (one without a core stalls the others at every barrier), and a count
    that moves changes the rounding of llama.cpp's kernels, so the same greedy reply under a
    different load would read differently; sleeping threads can keep the count as given."""
    env = dict(environ)
    if wait == "auto" and fixed_threads and environ.get(SDK_CHOSE) == "1":
        wait = "sleep"
    if wait == "spin":
        env.pop(POLICY, None)
        env[SPIN_COUNT] = SPIN_ROUNDS
    elif wait == "sleep":
        env.pop(SPIN_COUNT, None)
        env[POLICY] = "PASSIVE"
    else:
        return None
    return None if env == dict(environ) else env
