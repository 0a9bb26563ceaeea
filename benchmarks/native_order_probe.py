"""Which load orders of llama.cpp's CUDA build, pyzmq and numpy crash, and what fixes them.

Each case runs in a fresh subprocess (a crash is an exit code, not a lost probe); each case is
tried plain and with each mitigation. Also prints the static-TLS size of every native library
involved, read from its ELF program headers, since a library that needs static TLS and is
loaded late is the usual cause of load-order crashes.

    python3 benchmarks/native_order_probe.py [--json out.json]
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import struct
import subprocess
import sys

PRELUDE = """
import sys
sys.path.insert(0, ".")
steps = sys.argv[1].split(",")
def zmq_send():
    import zmq
    c = zmq.Context()
    r = c.socket(zmq.ROUTER); port = r.bind_to_random_port("tcp://127.0.0.1")
    d = c.socket(zmq.DEALER); d.connect(f"tcp://127.0.0.1:{port}")
    d.send(b"hi"); assert r.recv_multipart()[1] == b"hi"
    c.destroy(0)
def load():
    import llama_cpp
    p = "/tmp/probe-order.gguf"
    llama_cpp.llama_backend_init()
    mp = llama_cpp.llama_model_default_params(); mp.n_gpu_layers = 99
    m = llama_cpp.llama_model_load_from_file(str(p).encode(), mp)
    assert m, "load returned NULL"
for s in steps:
    if s == "send": zmq_send()
    elif s == "load": load()
    else: __import__(s)
print("ok")
"""

CASES = ["llama_cpp,send", "zmq,llama_cpp,load", "llama_cpp,zmq,load,send", "numpy,llama_cpp,load"]


def tls_size(path: str) -> int:
    """PT_TLS memory size of an ELF64 shared library (0 if none)."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return 0
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    for i in range(phnum):
        p_type, = struct.unpack_from("<I", table, i * phentsize)
        if p_type == 7:  # PT_TLS
            return struct.unpack_from("<Q", table, i * phentsize + 40)[0]
    return 0


def libraries() -> list[str]:
    import importlib.util

    out = []
    for mod in ("llama_cpp", "zmq", "numpy"):
        spec = importlib.util.find_spec(mod)
        if spec and spec.origin:
            root = os.path.dirname(os.path.dirname(spec.origin))
            out += glob.glob(os.path.join(os.path.dirname(spec.origin), "**", "*.so*"),
                             recursive=True)
            out += glob.glob(os.path.join(root, f"{mod}*.libs", "*.so*"))
            out += glob.glob(os.path.join(root, "py" + mod + ".libs", "*.so*"))
    return sorted(set(out))


def run(case: str, env_extra: dict[str, str], prefix: list[str]) -> int:
    env = {k: v for k, v in os.environ.items() if k != "IGI_SDK_CLIENT_ONLY"} | env_extra
    r = subprocess.run([*prefix, sys.executable, "-c", PRELUDE, case], env=env,
                       capture_output=True, text=True, timeout=120)
    return r.returncode if r.stdout.strip().endswith("ok") or r.returncode else -999


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json")
    ap.add_argument("--fix-out", help="write a shell line applying the first mitigation here")
    args = ap.parse_args()
    os.environ["IGI_SDK_CLIENT_ONLY"] = "1"  # this process: no native libraries of its own
    sys.path.insert(0, ".")
    from igi_sdk.model import spec_with, write_synthetic_gguf

    write_synthetic_gguf("/tmp/probe-order.gguf", spec_with("tiny-llama", n_layers=2))
    tls = {os.path.basename(p): tls_size(p) for p in libraries()}
    print("static TLS per library (bytes):",
          {k: v for k, v in tls.items() if v}, flush=True)
    zmq_libs = glob.glob(os.path.join(os.path.dirname(
        __import__("importlib.util").util.find_spec("zmq").origin), "..", "pyzmq.libs", "*.so*"))
    mitigations = {
        "plain": ({}, []),
        "static-tls-tunable": ({"GLIBC_TUNABLES": "glibc.rtld.optional_static_tls=4194304"}, []),
        "big-stack": ({}, ["prlimit", "--stack=268435456"]),
        "preload-libzmq": ({"LD_PRELOAD": ":".join(sorted(zmq_libs))}, []),
    }
    results: dict[str, dict[str, int]] = {}
    for case in CASES:
        results[case] = {}
        for name, (env, prefix) in mitigations.items():
            rc = run(case, env, prefix)
            results[case][name] = rc
        print(f"{case:32s} " + "  ".join(f"{k}={v}" for k, v in results[case].items()),
              flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"tls": tls, "results": results}, f, indent=1)
    fixed = [m for m in mitigations if all(r[m] == 0 for r in results.values())]
    print("mitigations that fix every case:", fixed or "none")
    if args.fix_out:  # a shell line that applies the first one, for scripts
        env, prefix = mitigations[fixed[0]] if fixed else ({}, [])
        line = " ".join(f"export {k}='{v}';" for k, v in env.items())
        if prefix:
            line += " ulimit -s 262144;"
        if not fixed:
            line = "echo 'no mitigation fixes every load order'; return 3"
        with open(args.fix_out, "w") as f:
            f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
