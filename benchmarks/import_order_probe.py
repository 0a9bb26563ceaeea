"""Does importing numpy before llama_cpp break model loading? Runs each order in a subprocess.

Prints the exit status of each order and, for the failing one, which OpenMP / BLAS libraries the
process had mapped, so the cause can be read off rather than guessed."""

from __future__ import annotations

import subprocess
import sys

LOAD = """
import sys, ctypes
order = sys.argv[1]
if order == "numpy-first":
    import numpy
import llama_cpp
import numpy
llama_cpp.llama_backend_init()
sys.path.insert(0, ".")
from igi_sdk.model import write_synthetic_gguf
p = write_synthetic_gguf("/tmp/probe-tiny.gguf", "tiny-llama")
mp = llama_cpp.llama_model_default_params()
mp.n_gpu_layers = 99
maps = [ln.split()[-1] for ln in open("/proc/self/maps") if ".so" in ln]
libs = sorted({m for m in maps if any(k in m for k in ("gomp", "omp", "openblas", "blas"))})
print(order, "libs:", libs, flush=True)
m = llama_cpp.llama_model_load_from_file(str(p).encode(), mp)
print(order, "loaded" if m else "load returned NULL", flush=True)
"""

for order in ("llama-first", "numpy-first"):
    r = subprocess.run([sys.executable, "-c", LOAD, order], capture_output=True, text=True)
    print(f"{order}: exit {r.returncode}")
    print("  " + "\n  ".join(r.stdout.strip().splitlines()))
    if r.returncode != 0:
        print("  stderr tail: " + " | ".join(r.stderr.strip().splitlines()[-5:]))
