"""Native libraries that must be in the process before llama.cpp: the command runs itself again
with pyzmq's bundled libzmq and libsodium preloaded (Linux). Below the CLI and the bundle's
start, which both call it."""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from collections.abc import Mapping


def reexec_with_native_preload() -> None:
    """Run this command again with pyzmq's bundled libzmq and libsodium loaded at start.

    With llama.cpp's CUDA build on the H200 host, whichever of llama.cpp and pyzmq (or numpy)
    is loaded second crashes the process: a SIGSEGV on the first message sent, or inside the
    model load. Import order cannot fix both; preloading pyzmq's libraries fixes every order
    (``benchmarks/native_order_probe.py`` shows each case). Linux only, once per process.
    """
    if sys.platform != "linux" or os.environ.get("IGI_SDK_PRELOADED") == "1":
        return
    frozen = getattr(sys, "frozen", False)
    if frozen:  # a bundle: pyzmq's libraries are in its _internal folder
        where = os.path.join(getattr(sys, "_MEIPASS", ""), "pyzmq.libs")
    else:
        spec = importlib.util.find_spec("zmq")
        if spec is None or spec.origin is None:
            return
        where = os.path.join(os.path.dirname(spec.origin), os.pardir, "pyzmq.libs")
    libs = sorted(glob.glob(os.path.join(where, "*.so*")))
    if not libs:  # pyzmq built against the system libzmq: nothing bundled to preload
        return
    env = preload_env([os.path.realpath(p) for p in libs], os.environ)
    sys.stdout.flush()
    sys.stderr.flush()
    # the same command, interpreter flags too (a bundle's executable takes the arguments alone)
    os.execve(sys.executable, sys.argv if frozen else sys.orig_argv, env)


def preload_env(libs: list[str], environ: Mapping[str, str]) -> dict[str, str]:
    """The environment that preloads ``libs`` (absolute paths) in a new process.

    ld.so splits LD_PRELOAD at spaces as well as colons, so a library in a folder whose path
    has a space (a game installed under "Program Files", "Mein Spiel") is preloaded by its
    file name, found through LD_LIBRARY_PATH (split at colons only)."""
    env = {**environ, "IGI_SDK_PRELOADED": "1"}
    names, dirs = [], []
    for lib in libs:
        folder, name = os.path.split(lib)
        if any(c.isspace() for c in folder):
            names.append(name)
            if folder not in dirs:
                dirs.append(folder)
        else:
            names.append(lib)
    if dirs:
        env["LD_LIBRARY_PATH"] = ":".join(dirs + ([environ["LD_LIBRARY_PATH"]]
                                                  if environ.get("LD_LIBRARY_PATH") else []))
    env["LD_PRELOAD"] = ":".join(names + ([environ["LD_PRELOAD"]]
                                          if environ.get("LD_PRELOAD") else []))
    return env
