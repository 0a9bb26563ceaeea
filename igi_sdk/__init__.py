"""igi-sdk: run a local LLM beside a game on the same GPU without taking the game's VRAM.

Import order matters: with the CUDA build of llama.cpp, importing numpy before ``llama_cpp``
makes ``llama_model_load_from_file`` crash (seen on an H200 host; see docs/architecture.md).
Importing ``llama_cpp`` here, before any submodule pulls in numpy, fixes the order for every
entry point of the SDK in one place. pyzmq clashes with it in either order; the ``igi-sdk``
command preloads pyzmq's libraries for that (see ``igi_sdk.cli``).
"""

from __future__ import annotations

import importlib.util
import os

# A process that only talks to a sidecar (a game's tools, a harness that runs its own CUDA
# work) sets IGI_SDK_CLIENT_ONLY=1 and never maps llama.cpp's native libraries: two CUDA
# runtimes in one process (llama.cpp's and, say, CuPy's) are asking for a crash.
_client_only = os.environ.get("IGI_SDK_CLIENT_ONLY") == "1"

# llama.cpp's CPU backend is built with OpenMP (libgomp): its threads meet at an OpenMP barrier
# after every op, and libgomp reads how they wait there once, when it is loaded (by `import
# llama_cpp` below), so the wait is set before: a spin of 300,000 rounds (libgomp's own default
# without a policy) before a thread sleeps. Spinning threads used to collapse beside a game whose
# threads held the cores; the thread count now follows the cores other processes leave free
# (runtime/thread_control.py), and with it the spin decoded faster than sleeping at once on H200
# hosts, idle or busy (igi_sdk/omp_wait.py). A wait policy or spin count the user set wins
# (docs/architecture.md, "Coexisting with the game's CPU work"). A build of llama.cpp without
# OpenMP has no libgomp: its threads' wait is chosen while running (runtime/threadpool.py).
if not _client_only:
    from igi_sdk.omp_wait import default_wait

    default_wait(os.environ)

if not _client_only and importlib.util.find_spec("llama_cpp") is not None:
    import llama_cpp  # noqa: F401  (must precede numpy; see above)

__version__ = "0.1.0"
