"""A bundle looks at the NVIDIA driver before it chooses which llama.cpp build to load: the probe
must not load llama.cpp (it did, through the runtime package, so a CUDA bundle refusing a GPU
kept running on it)."""

from __future__ import annotations

import os
import subprocess
import sys


def test_the_driver_probe_loads_no_llama_cpp() -> None:
    code = ("import sys\n"
            "from igi_sdk.bundle.gpu import probe_driver\n"
            "probe_driver()\n"
            "heavy = ('llama_cpp', 'igi_sdk.runtime')\n"
            "loaded = sorted(m for m in sys.modules if m.startswith(heavy))\n"
            "print(loaded)\n"
            "sys.exit(1 if loaded else 0)\n")
    env = {**os.environ, "IGI_SDK_CLIENT_ONLY": "1"}  # as the bundle's entry imports it
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
