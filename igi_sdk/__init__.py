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
if not _client_only and importlib.util.find_spec("llama_cpp") is not None:
    import llama_cpp  # noqa: F401  (must precede numpy; see above)

__version__ = "0.1.0"
