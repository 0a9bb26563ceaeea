#!/usr/bin/env bash
# The Unreal plugin's C++ suite: builds the engine-agnostic core (IgiSdkCore) as Unreal does
# (C++17, -fno-exceptions -fno-rtti -Wall -Wextra -Werror) with its GoogleTest tests, runs them
# against the real sidecar (they start it themselves: .venv/bin/python -m igi_sdk.cli serve),
# builds it again under ASan/UBSan and runs the codec fuzzing and a reconnect there,
# type-checks the Unreal layer against a stub of the engine headers it uses (-fsyntax-only), and
# checks the link of a modular (Editor) build: the core as a shared library with UBT's Linux
# visibility flags, the tests and the Unreal layer linked against it (a symbol the core does not
# export is an undefined reference, a failure).
# Installs cmake, g++ and libgtest-dev from Debian when missing.
# Prints "N passed, N failed"; exits 1 on any failure or when no test ran.
# IGI_CPP_SKIP_ASAN=1 skips the sanitizer build.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
started=$(date +%s)

need=()
command -v cmake >/dev/null || need+=(cmake)
command -v g++ >/dev/null || need+=(g++)
[ -f /usr/include/gtest/gtest.h ] || need+=(libgtest-dev)
if [ "${#need[@]}" -gt 0 ]; then
    sudo=""; [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing ${need[*]} (Debian packages for the C++ suite)"
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null \
        || { $sudo apt-get update -q >/dev/null \
             && $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >/dev/null; } \
        || { echo "could not install ${need[*]}"; echo "0 passed, 1 failed"; exit 1; }
fi

# a folder of its own per run (build/ is git-ignored): runs side by side must not collide
mkdir -p "$root/build"
build=$(mktemp -d "$root/build/cpp.XXXXXX")
export IGI_CPP_TMP="$build/tmp"
mkdir -p "$IGI_CPP_TMP"
export IGI_PYTHON="$root/.venv/bin/python"
export IGI_VECTORS_DIR="$root/bridge/vectors"
# a sidecar that can bind port 0 and report it is started that way; otherwise on a free port
if "$IGI_PYTHON" -m igi_sdk.cli serve --help 2>/dev/null | grep -q -- '--endpoint-file'; then
    export IGI_SIDECAR_ENDPOINT_FILE=1
fi

passed=0
failed=0
count() {  # count RESULT_XML: adds the file's tests to passed/failed
    local xml=$1
    if [ ! -f "$xml" ]; then failed=$((failed + 1)); return; fi
    read -r t f <<<"$(python3 - "$xml" <<'PY'
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
cases = [c for c in root.iter("testcase") if c.get("result", "completed") == "completed" and c.get("status", "run") == "run"]
bad = sum(1 for c in cases if c.find("failure") is not None)
print(len(cases), bad)
PY
)"
    passed=$((passed + t - f))
    failed=$((failed + f))
}

build_variant() {  # NAME SANITIZE [CMAKE ARGS]
    local name=$1 sanitize=$2
    shift 2
    cmake -S tests/cpp -B "$build/$name" -DIGI_SANITIZE="$sanitize" -DCMAKE_BUILD_TYPE=None "$@" >"$build/$name.cmake.log" 2>&1 \
        && make -C "$build/$name" -j2 >"$build/$name.make.log" 2>&1
}

# 1. the core and its tests, as Unreal compiles them
if build_variant release OFF; then
    (cd "$root" && timeout 300 "$build/release/igi_cpp_tests" --gtest_output="xml:$build/release.xml") \
        >"$build/release.log" 2>&1
    grep -E '^\[  (FAILED|PASSED)|^measured:|Failure|error' "$build/release.log" | grep -v '^\[  FAILED  \] [0-9]' | head -60
    count "$build/release.xml"
    # the Unreal layer's FSocket transport under the core client (the engine's sockets played by BSD sockets)
    (cd "$root" && timeout 300 "$build/release/igi_unreal_socket_tests" --gtest_output="xml:$build/fsocket.xml") \
        >"$build/fsocket.log" 2>&1
    grep -E '^\[  (FAILED|PASSED)|^measured:|Failure' "$build/fsocket.log" | grep -v '^\[  FAILED  \] [0-9]' | sed 's/^/FSocket transport: /' | head -20
    count "$build/fsocket.xml"
else
    echo "core: build failed"; tail -40 "$build/release.make.log" "$build/release.cmake.log"
    failed=$((failed + 1))
fi

# 1b. the Unreal layer's own code linked against the runnable UE stub and the core, driven
#     against the real sidecar it starts (crash recovery, two PIE game instances, EndPlay, restore,
#     Mantella's actions over 20 lines: on a loaded 2-core machine those alone took 540 s)
if [ -x "$build/release/igi_ue_layer_tests" ]; then
    (cd "$root" && timeout 1200 "$build/release/igi_ue_layer_tests" --gtest_output="xml:$build/ue_layer.xml") \
        >"$build/ue_layer.log" 2>&1
    grep -E '^\[  (FAILED|PASSED)|^measured:|Failure' "$build/ue_layer.log" | grep -v '^\[  FAILED  \] [0-9]' | sed 's/^/Unreal layer: /' | head -40
    count "$build/ue_layer.xml"
else
    echo "Unreal layer: its tests were not built (see $build/release.make.log)"; failed=$((failed + 1))
fi

# 2. the same under ASan/UBSan: every test again (the fuzzers with more rounds)
if [ -z "${IGI_CPP_SKIP_ASAN:-}" ]; then
    if build_variant asan ON; then
        (cd "$root" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
            IGI_FUZZ_ROUNDS=200000 timeout 300 "$build/asan/igi_cpp_tests" \
            --gtest_output="xml:$build/asan.xml") >"$build/asan.log" 2>&1
        rc=$?
        grep -E '^\[  (FAILED|PASSED)|^measured:|Failure|ERROR: |runtime error' "$build/asan.log" | grep -v '^\[  FAILED  \] [0-9]' | sed 's/^/asan: /' | head -40
        count "$build/asan.xml"
        # a sanitizer report ends the process with a non-zero status even when gtest counted a pass
        if [ "$rc" -ne 0 ] && ! grep -q '^\[  FAILED' "$build/asan.log"; then
            echo "asan: the test process exited $rc"; tail -30 "$build/asan.log"; failed=$((failed + 1))
        fi
        # the FSocket transport's reader thread and buffer under the sanitizers too
        (cd "$root" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
            timeout 300 "$build/asan/igi_unreal_socket_tests" --gtest_output="xml:$build/asan_fsocket.xml") \
            >"$build/asan_fsocket.log" 2>&1
        rc=$?
        grep -E '^\[  (FAILED|PASSED)|Failure|ERROR: |runtime error' "$build/asan_fsocket.log" | grep -v '^\[  FAILED  \] [0-9]' | sed 's/^/asan: FSocket transport: /' | head -20
        count "$build/asan_fsocket.xml"
        if [ "$rc" -ne 0 ] && ! grep -q '^\[  FAILED' "$build/asan_fsocket.log"; then
            echo "asan: the FSocket transport's test process exited $rc"; tail -30 "$build/asan_fsocket.log"; failed=$((failed + 1))
        fi
    else
        echo "asan: build failed"; tail -40 "$build/asan.make.log"
        failed=$((failed + 1))
    fi
fi

# 3. the Unreal layer against the stub of the engine headers it uses
if bash tests/cpp/ue_typecheck.sh "$build/ue" >"$build/ue.log" 2>&1; then
    echo "Unreal layer: type check ok ($(grep -c . "$build/ue.log" || true) files)"
    passed=$((passed + 1))
else
    echo "Unreal layer: type check failed"; head -60 "$build/ue.log"
    failed=$((failed + 1))
fi

# 4. the core as a shared library built as UBT builds a module for the Editor on Linux (hidden
#    visibility, IGISDKCORE_API = visibility("default")), the tests linked against it: an
#    unexported symbol fails the link; the codec, frame and two sidecar tests run from it
if build_variant shared OFF -DIGI_UBT_SHARED=ON; then
    (cd "$root" && timeout 300 "$build/shared/igi_cpp_tests_shared" \
        --gtest_filter='MsgPack*:Zmtp*:Endpoint*:ClientOptions*:FrameReport*:Frames*:Json*:ToolRules*:Sidecar.HelloIsTheGameWithLeaseAndFeatures:Sidecar.StreamedChatDeliversEveryTokenInOrder' \
        --gtest_output="xml:$build/shared.xml") >"$build/shared.log" 2>&1
    grep -E '^\[  (FAILED|PASSED)|Failure' "$build/shared.log" | grep -v '^\[  FAILED  \] [0-9]' | sed 's/^/shared core: /' | head -20
    count "$build/shared.xml"
else
    undefined=$(grep -o "undefined reference to \`[^']*'" "$build/shared.make.log" | sort -u)
    echo "shared core: the tests do not link against the core built as a shared library with UBT's visibility ($(printf '%s\n' "$undefined" | grep -c .) undefined references)"
    printf '%s\n' "$undefined" | head -20
    [ -n "$undefined" ] || tail -30 "$build/shared.make.log" "$build/shared.cmake.log"
    failed=$((failed + 1))
fi

# 5. the Unreal layer's code linked against that shared core
if bash tests/cpp/ue_link_check.sh "$build/ue_link" >"$build/ue_link.log" 2>&1; then
    echo "Unreal layer: link check ok: $(tail -1 "$build/ue_link.log")"
    passed=$((passed + 1))
else
    echo "Unreal layer: link check failed"; head -40 "$build/ue_link.log"
    failed=$((failed + 1))
fi

echo "C++ suite: $(( $(date +%s) - started )) s; logs in $build"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
