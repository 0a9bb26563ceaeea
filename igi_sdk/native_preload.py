"""Native libraries that must be in the process before llama.cpp: the command runs itself again
with pyzmq's bundled libzmq and libsodium preloaded (Linux). Below the CLI and the bundle's
start, which both call it."""

from __future__ import annotations

import glob
import importlib.util
import os
import sys
from collections.abc import Mapping


def reexec_with_native_preload(environ: Mapping[str, str] | None = None) -> None:
    """Run this command again with pyzmq's bundled libzmq and libsodium loaded at start, and
    with ``environ`` (default: this process's environment) for what native libraries read once
    when they load (libgomp's wait: ``omp_wait.start_env``).

    With llama.cpp's CUDA build on the H200 host, whichever of llama.cpp and pyzmq (or numpy)
    is loaded second crashes the process: a SIGSEGV on the first message sent, or inside the
    model load. Import order cannot fix both; preloading pyzmq's libraries fixes every order
    (``benchmarks/native_order_probe.py`` shows each case). Linux only, once per process.
    """
    if sys.platform != "linux":
        return
    base = os.environ if environ is None else environ
    if os.environ.get("IGI_SDK_PRELOADED") == "1":  # preloaded: again only for ``environ``
        if environ is not None and dict(environ) != dict(os.environ):
            _exec(dict(environ))
        return
    frozen = getattr(sys, "frozen", False)
    where = None
    if frozen:  # a bundle: pyzmq's libraries are in its _internal folder
        where = os.path.join(getattr(sys, "_MEIPASS", ""), "pyzmq.libs")
    elif (spec := importlib.util.find_spec("zmq")) is not None and spec.origin is not None:
        where = os.path.join(os.path.dirname(spec.origin), os.pardir, "pyzmq.libs")
    libs = sorted(glob.glob(os.path.join(where, "*.so*"))) if where else []
    if not libs and environ is None:  # pyzmq built against the system libzmq: nothing to do
        return
    _exec(preload_env([os.path.realpath(p) for p in libs], base))


def _exec(env: dict[str, str]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    frozen = getattr(sys, "frozen", False)
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
    if names:
        env["LD_PRELOAD"] = ":".join(names + ([environ["LD_PRELOAD"]]
                                              if environ.get("LD_PRELOAD") else []))
    return env
