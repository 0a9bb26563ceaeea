"""Decode beside a busy core under several OpenMP wait settings (the wait policy).

Runs the probe of ``tests/test_cpu_coexist.py`` (two CPUs, the default model, decode idle and
with one spinning process on one CPU, alternately) once per setting, in a fresh process each
(libgomp reads its environment when it loads), with ``IGI_SDK_THREADS`` threads (default 2: a
thread per CPU, the case where a barrier waits on a thread that has no core; the SDK's own
default on two CPUs is one thread, which no wait policy can slow).

    python benchmarks/coexist_spin.py --settings passive,spin:1000,spin:10000,default \
        --threads 2 --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def probe_source() -> str:
    text = (REPO / "tests" / "test_cpu_coexist.py").read_text()
    m = re.search(r'_PROBE = textwrap\.dedent\("""(.*?)"""\)', text, re.S)
    assert m, "probe not found in tests/test_cpu_coexist.py"
    import textwrap
    return textwrap.dedent(m.group(1))


def env_for(setting: str, threads: int) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "IGI_SDK_THREADS")}
    if threads > 0:
        env["IGI_SDK_THREADS"] = str(threads)
    if setting == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    elif setting == "active":
        env["OMP_WAIT_POLICY"] = "ACTIVE"
    elif setting.startswith("spin:"):
        env["GOMP_SPINCOUNT"] = setting.split(":", 1)[1]
    elif setting == "libgomp":  # libgomp's own default: the SDK must not set anything
        env["OMP_WAIT_POLICY"] = ""  # an empty value counts as "the user chose" for igi_sdk
    # "default": whatever igi_sdk sets on import
    return env


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--settings", default="passive,spin:1000,spin:10000,default")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    src = probe_source()
    rows = []
    for setting in a.settings.split(","):
        out = subprocess.run([sys.executable, "-c", src, str(a.rounds)],
                             env=env_for(setting, a.threads), cwd=REPO, capture_output=True,
                             text=True, timeout=600)
        if out.returncode != 0:
            print(setting, "failed:", out.stderr[-800:], flush=True)
            continue
        m = json.loads(out.stdout.strip().splitlines()[-1])
        idle, busy = statistics.median(m["idle"]), statistics.median(m["busy"])
        row = dict(setting=setting, threads=m["threads"], idle_tps=idle, busy_tps=busy,
                   ratio=busy / idle if idle else 0.0, raw=m)
        rows.append(row)
        print(f"{setting:14} threads {m['threads']}  idle {idle:6.1f}  busy {busy:6.1f} tok/s"
              f"  busy/idle {row['ratio']:.0%}  elsewhere {m['cpus_used_elsewhere']}", flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
