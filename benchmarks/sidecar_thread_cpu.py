"""Where a streamed token's CPU time goes: the sidecar's threads and the client's process.

    python benchmarks/sidecar_thread_cpu.py [--threads 2] [--replies 4] [--tokens 256]
        [--wait spin] [--stream-every-ms MS] [--json out.json]

Starts ``igi-sdk serve`` with the default model, streams ``--replies`` greedy replies of
``--tokens`` tokens through ``igi_sdk.client.Client`` and reads, per token, every sidecar
thread's CPU time (``/proc/PID/task/TID/stat``), the time it spent runnable but waiting for a
CPU (``schedstat``) and its context switches, and the client process's own CPU time (the CPU
times count in clock ticks: a few hundred tokens make them readable). On a
machine whose cores all run llama.cpp's threads, every other thread's work comes out of the
decode: this says which thread's. Linux only.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from igi_sdk.client import Client

PROMPT = "The blacksmith of Oakvale looked up from the anvil and said:"
GREEDY = {"temperature": 0, "repeat_penalty": 1}


def _threads(pid: int) -> dict[str, tuple[str, float, float, int]]:
    """tid -> (name, CPU seconds, seconds runnable waiting for a CPU, context switches)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        base = f"/proc/{pid}/task/{tid}"
        try:
            stat = Path(f"{base}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            waited = int(Path(f"{base}/schedstat").read_text().split()[1]) / 1e9
            switches = sum(int(line.split()[1]) for line in
                           Path(f"{base}/status").read_text().splitlines()
                           if "ctxt_switches" in line)
        except (OSError, ValueError, IndexError):
            continue  # it ended meanwhile
        name = stat[stat.index("(") + 1:stat.rindex(")")]
        out[tid] = (name, (int(fields[11]) + int(fields[12])) / tick, waited, switches)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--replies", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--wait", choices=("auto", "spin", "sleep"), default="spin")
    ap.add_argument("--stream-every-ms", type=float, default=None,
                    help="serve's --stream-every-ms (default: serve's own)")
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the checkout whose sidecar runs (git worktree add DIR REV: a "
                         "change's A/B)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    endpoint = f"ipc://{tempfile.mkdtemp(prefix='igi-cpu-')}/s.sock"
    every = [] if a.stream_every_ms is None else ["--stream-every-ms", str(a.stream_every_ms)]
    proc = subprocess.Popen([sys.executable, "-m", "igi_sdk.cli", "serve", "--endpoint", endpoint,
                             "--threads", str(a.threads), "--max-sessions", "1", "--wait", a.wait,
                             "--no-arbiter", *every],
                            cwd=a.tree, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = Client(endpoint, timeout=60)
    try:
        client.wait_ready(180)
        for _ in client.complete(PROMPT, max_tokens=32, sampling=GREEDY):
            pass  # warm-up: graphs, allocators
        before, mine0, t0 = _threads(proc.pid), resource.getrusage(resource.RUSAGE_SELF), \
            time.perf_counter()
        events = pieces = 0  # tokens, and the text pieces they came in
        for _ in range(a.replies):
            stream = client.complete(PROMPT, max_tokens=a.tokens, sampling=GREEDY)
            pieces += sum(1 for _piece in stream)
            events += int((stream.done or {})["usage"]["completion_tokens"])
        wall = time.perf_counter() - t0
        after, mine1 = _threads(proc.pid), resource.getrusage(resource.RUSAGE_SELF)
    finally:
        client.close()
        proc.kill()
        proc.wait()
    rows = []
    for tid, (name, cpu, waited, sw) in after.items():
        was = before.get(tid, (name, 0.0, 0.0, 0))
        if cpu - was[1] > 0:
            rows.append({"thread": f"{name}/{tid}",
                         "cpu_ms": round((cpu - was[1]) * 1e3 / events, 3),
                         "runnable_wait_ms": round((waited - was[2]) * 1e3 / events, 3),
                         "switches": round((sw - was[3]) / events, 2)})
    rows.sort(key=lambda r: -r["cpu_ms"])
    client_cpu = (mine1.ru_utime + mine1.ru_stime - mine0.ru_utime - mine0.ru_stime)
    out = {"machine": f"{os.cpu_count()} CPUs", "args": {k: str(v) for k, v in vars(a).items()},
           "tokens": events, "pieces": pieces, "tokens_per_s": round(events / wall, 1),
           "wall_ms_per_token": round(wall * 1e3 / events, 3), "sidecar_threads": rows,
           "client_cpu_ms": round(client_cpu * 1e3 / events, 3),
           "client_switches": round((mine1.ru_nvcsw + mine1.ru_nivcsw - mine0.ru_nvcsw
                                     - mine0.ru_nivcsw) / events, 2)}
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
