"""Check that every framework type the compiled C# core uses is part of .NET Standard 2.0.

No netstandard reference assembly can be installed here (NuGet is out of reach; Debian's
mono-devel ships netstandard.dll only as a facade), so this is a type-level check: the facade
forwards every .NET Standard 2.0 type to Mono's assemblies, and each type the core references
from mscorlib, System or System.Core must be one of those forwarders. Members are not checked.

Usage: python3 netstandard_types.py CORE.dll [FACADE.dll]; prints one line; exit 1 on a miss.
"""

from __future__ import annotations

import re
import subprocess
import sys

FRAMEWORK = ("mscorlib", "System", "System.Core")


def _il(path: str) -> str:
    return subprocess.run(["ikdasm", path], capture_output=True, text=True, check=True).stdout


def main() -> int:
    core = sys.argv[1]
    facade = sys.argv[2] if len(sys.argv) > 2 else "/usr/lib/mono/4.5/Facades/netstandard.dll"
    standard = set(re.findall(r"^\.class extern forwarder (\S+)", _il(facade), re.M))
    used = set()
    for assembly, name in re.findall(r"\[([A-Za-z.]+)\]([A-Za-z0-9_.`/]+)", _il(core)):
        if assembly in FRAMEWORK:
            used.add(name.split("/")[0])  # a nested type belongs to its outer one
    missing = sorted(used - standard)
    if missing:
        print(f"netstandard 2.0: {len(missing)} of {len(used)} framework types the core uses "
              f"are not in it: {', '.join(missing)}")
        return 1
    print(f"netstandard 2.0: all {len(used)} framework types the core uses are in it "
          f"({len(standard)} types; type level, members not checked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
