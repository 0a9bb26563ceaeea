#!/usr/bin/env bash
# The whole test suite: Python (pytest), the Unity package's C# core (mono + NUnit) and the Unreal
# plugin's C++ core (cmake + GoogleTest, tests/cpp/run.sh), against the real sidecar. Installs
# the Debian packages the C# suite and the browser test need when they are missing
# (tests/cpp/run.sh installs its own).
# Exit status: non-zero if any suite fails (pytest's 5, "no tests ran", counts as a failure).
set -uo pipefail
cd "$(dirname "$0")/.."

need=()
command -v mcs >/dev/null || need+=(mono-mcs)
command -v ikdasm >/dev/null || need+=(mono-devel)  # the netstandard facade and its reader
command -v mono >/dev/null || need+=(mono-runtime)
command -v nunit-console >/dev/null || need+=(nunit-console libnunit-framework2.6.3-cil)
ldconfig -p 2>/dev/null | grep -q 'libzmq\.so\.5' || need+=(libzmq5)
# a real browser for what a web page could reach (tests/test_http_guard.py)
command -v chromium >/dev/null || need+=(chromium)
if [ "${#need[@]}" -gt 0 ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing ${need[*]} (Debian packages for the C# suite and the browser test)"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null \
        || { $sudo apt-get update -q >/dev/null \
             && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null; } \
        || { echo "could not install ${need[*]}"; exit 1; }
fi

IGI_REQUIRE_BROWSER=1 .venv/bin/python -m pytest -q
py=$?
[ "$py" -eq 5 ] && echo "no Python tests ran"

bash tests/csharp/run.sh
cs=$?

bash tests/cpp/run.sh
cpp=$?

[ "$py" -eq 0 ] && [ "$cs" -eq 0 ] && [ "$cpp" -eq 0 ]
