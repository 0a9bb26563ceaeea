"""Page-locking host memory in one piece or in chunks: what another thread's address-space work
waits meanwhile, and whether a copy that spans two chunks still runs at pinned speed, off the
calling thread.

    python3 benchmarks/pin_chunks.py [--gib 3] [--chunk-mib 64] [--json OUT/pin-chunks.json]

llama.cpp page-locks a placement's host weights in one ``cudaMallocHost``; while it runs, any
other thread of the process that maps memory waits (``load_behind.py``). Registering memory
the process already mapped (``cudaHostRegister``) a chunk at a time bounds that wait by one
chunk, if the driver lets go of the memory map between calls; this measures it, and whether a
tensor that straddles two registrations still copies asynchronously (a pipelined decode needs
its copies queued without blocking). Talks to the CUDA runtime through ctypes (benchmarks only).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import glob
import json
import mmap
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from map_probe import MapProbe

H2D = 1  # cudaMemcpyHostToDevice
MIB = 1 << 20


def cudart() -> ctypes.CDLL:
    names = [ctypes.util.find_library("cudart"),
             *sorted(glob.glob("/usr/local/cuda*/lib64/libcudart.so*")),
             *sorted(glob.glob("/tmp/lcpp/build/bin/libcudart.so*"))]
    for name in names:
        if name:
            try:
                return ctypes.CDLL(name)
            except OSError:
                continue
    raise RuntimeError("no libcudart found")


class Cuda:
    def __init__(self) -> None:
        self.rt = cudart()
        self.rt.cudaGetErrorString.restype = ctypes.c_char_p

    def check(self, err: int, what: str) -> None:
        if err:
            raise RuntimeError(f"{what}: {self.rt.cudaGetErrorString(err).decode()}")

    def call(self, name: str, *args: Any) -> None:
        self.check(getattr(self.rt, name)(*args), name)


def timed(probe: MapProbe, fn: Callable[[], None]) -> dict[str, float]:
    t0 = time.perf_counter()
    fn()
    t1 = time.perf_counter()
    time.sleep(0.05)  # a probe that started inside and ended after counts
    return {"seconds": round(t1 - t0, 4), "longest_map_s": round(probe.longest(t0, t1), 4)}


def copy_figures(cu: Cuda, dst: ctypes.c_void_p, src: int, n: int, stream: ctypes.c_void_p
                 ) -> dict[str, float]:
    """The host thread's time to queue one copy, and the copy's GB/s once it finished."""
    t0 = time.perf_counter()
    cu.call("cudaMemcpyAsync", dst, ctypes.c_void_p(src), ctypes.c_size_t(n), H2D, stream)
    t1 = time.perf_counter()
    cu.call("cudaStreamSynchronize", stream)
    t2 = time.perf_counter()
    return {"queue_s": round(t1 - t0, 5), "gbps": round(n / (t2 - t0) / 1e9, 2)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=3.0)
    ap.add_argument("--chunk-mib", type=int, default=64)
    ap.add_argument("--copy-mib", type=int, default=64)
    ap.add_argument("--json")
    args = ap.parse_args(argv)
    size, chunk = int(args.gib * (1 << 30)), args.chunk_mib * MIB
    copy = min(args.copy_mib * MIB, chunk)  # one size for every copy: GB/s comparable
    cu = Cuda()
    cu.call("cudaFree", ctypes.c_void_p(0))  # the context, before anything is timed
    stream = ctypes.c_void_p()
    cu.call("cudaStreamCreate", ctypes.byref(stream))
    dst = ctypes.c_void_p()
    cu.call("cudaMalloc", ctypes.byref(dst), ctypes.c_size_t(copy))
    probe = MapProbe(every_s=0.005)
    probe.start()
    time.sleep(0.1)
    out: dict[str, Any] = {"args": vars(args)}

    host = ctypes.c_void_p()
    out["malloc_host_one_piece"] = timed(probe, lambda: cu.call(
        "cudaMallocHost", ctypes.byref(host), ctypes.c_size_t(size)))
    out["copy_pinned_one_piece"] = copy_figures(cu, dst, host.value + chunk, copy, stream)
    out["free_host_one_piece"] = timed(probe, lambda: cu.call("cudaFreeHost", host))

    region = mmap.mmap(-1, size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(region))
    out["copy_pageable"] = copy_figures(cu, dst, base + chunk, copy, stream)

    def register() -> None:
        for off in range(0, size, chunk):
            cu.call("cudaHostRegister", ctypes.c_void_p(base + off),
                    ctypes.c_size_t(min(chunk, size - off)), 0)

    out["register_chunks"] = timed(probe, register)
    # inside one chunk, and across the boundary of two registrations
    out["copy_registered_inside"] = copy_figures(cu, dst, base + chunk, copy, stream)
    try:  # (the runtime may refuse a source that two registrations cover)
        out["copy_registered_across"] = copy_figures(cu, dst, base + chunk - copy // 2, copy,
                                                     stream)
    except RuntimeError as e:
        out["copy_registered_across"] = {"error": str(e)}
        cu.rt.cudaGetLastError()  # cleared: the calls after it are not refused for it

    def unregister() -> None:
        for off in range(0, size, chunk):
            cu.call("cudaHostUnregister", ctypes.c_void_p(base + off))

    out["unregister_chunks"] = timed(probe, unregister)
    probe.stop.set()
    out["map_probe_alone_s"] = round(max((s for _, s in probe.probes[:20]), default=0.0), 4)
    for k, v in out.items():
        if k != "args":
            print(f"{k:26s} {v}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
