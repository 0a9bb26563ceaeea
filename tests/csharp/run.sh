#!/usr/bin/env bash
# The Unity package's C# suite: compiles the engine-agnostic core (Unity's C# subset: mcs
# -langversion:7.2, warnings as errors), type-checks the Unity layer against a UnityEngine stub
# when there is one, checks each player platform's build of it (platform_checks.py), and runs the
# NUnit tests against the real sidecar (they start it themselves).
# Prints "N passed, N failed" (the NUnit tests and the platform checks together); exits 1 on any failure or when no test ran.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
# a folder of its own per run (build/ is git-ignored): runs started side by side (the top-level
# suite and a developer's) must not delete each other's working directory
mkdir -p "$root/build"
build=$(mktemp -d "$root/build/csharp.XXXXXX")
keep_build() { echo "build and logs kept in $build"; }

flags=(-langversion:7.2 -warnaserror+ -nologo)
platform_passed=0
platform_failed=0
nunit_dll=$(ls /usr/lib/cli/nunit.framework-2.6.*/nunit.framework.dll 2>/dev/null | head -1)
[ -n "$nunit_dll" ] || nunit_dll=$(find /usr/lib -name nunit.framework.dll 2>/dev/null | head -1)
[ -n "$nunit_dll" ] || { echo "nunit.framework.dll not found (apt-get install libnunit-framework2.6.3-cil)"; exit 1; }

core=()
while IFS= read -r -d '' f; do core+=("$f"); done < <(find unity_plugin/Runtime/Core -name '*.cs' -print0 | sort -z)
mcs "${flags[@]}" -target:library -out:"$build/Igi.Sdk.Core.dll" "${core[@]}" \
    || { echo "core: compile failed"; echo "0 passed, 1 failed"; rm -rf "$build"; exit 1; }
# Unity compiles against .NET Standard 2.1 or .NET Framework 4.x: the core must keep to what
# both have (a type-level check against mono-devel's netstandard 2.0 facade; see the script)
python3 tests/csharp/netstandard_types.py "$build/Igi.Sdk.Core.dll" \
    || { echo "core: uses types outside .NET Standard 2.0"; echo "0 passed, 1 failed"; rm -rf "$build"; exit 1; }

test_dlls=()
# The Unity layer (written on top of the core) type-checks against a stub of UnityEngine.
# (IGI_CSHARP_SKIP_UNITY=1 skips it, for work on the core alone.)
if [ -f tests/csharp/UnityEngineStub.cs ] && [ -z "${IGI_CSHARP_SKIP_UNITY:-}" ]; then
    unity=()
    while IFS= read -r -d '' f; do unity+=("$f"); done < <(find unity_plugin/Runtime/Unity -name '*.cs' -print0 2>/dev/null | sort -z)
    if [ -d unity_plugin/Editor ]; then
        editor_stub=$(ls tests/csharp/UnityEditorStub.cs unity_plugin/Editor/UnityEditorStub.cs 2>/dev/null | head -1)
        if [ -n "$editor_stub" ]; then
            while IFS= read -r -d '' f; do
                [ "$f" = "$editor_stub" ] || unity+=("$f")
            done < <(find unity_plugin/Editor -name '*.cs' -print0 | sort -z)
            unity+=("$editor_stub")
        fi
    fi
    mcs "${flags[@]}" -target:library -out:"$build/Igi.Sdk.Unity.typecheck.dll" \
        tests/csharp/UnityEngineStub.cs "${core[@]}" "${unity[@]}" \
        || { echo "Unity layer: type check failed"; echo "0 passed, 1 failed"; rm -rf "$build"; exit 1; }
    echo "Unity layer: type check ok (${#unity[@]} files)"
    # as IL2CPP and a development build of Unity 6 compile it (other #if branches)
    mcs "${flags[@]}" -define:ENABLE_IL2CPP -define:DEVELOPMENT_BUILD -define:UNITY_2023_1_OR_NEWER -target:library \
        -out:"$build/Igi.Sdk.Unity.il2cpp.dll" tests/csharp/UnityEngineStub.cs "${core[@]}" "${unity[@]}" \
        || { echo "Unity layer (IL2CPP defines): type check failed"; echo "0 passed, 1 failed"; rm -rf "$build"; exit 1; }
    # each player platform's build: "__Internal" only in mobile players, never a desktop one
    # (a source check), the Windows, macOS, Linux, iOS and WebGL compiles, their P/Invokes read
    # back from the assemblies; counted with the tests below
    python3 tests/csharp/platform_checks.py "$build/platforms" > "$build/platforms.log" 2>&1
    grep -v '^ok: ' "$build/platforms.log"
    read -r platform_passed platform_failed < <(sed -n 's/^platform checks: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "$build/platforms.log")
    [ -n "${platform_failed:-}" ] || { platform_passed=0; platform_failed=1; tail -20 "$build/platforms.log"; }
    # the Unity layer's own NUnit tests (components driven by hand against real sidecars)
    unity_tests=()
    while IFS= read -r -d '' f; do unity_tests+=("$f"); done < <(find tests/csharp/unity -name '*.cs' -print0 2>/dev/null | sort -z)
    if [ "${#unity_tests[@]}" -gt 0 ]; then
        mcs "${flags[@]}" -target:library -r:"$build/Igi.Sdk.Unity.typecheck.dll" -r:"$nunit_dll" \
            -out:"$build/Igi.Sdk.Unity.Tests.dll" "${unity_tests[@]}" \
            || { echo "Unity layer tests: compile failed"; echo "0 passed, 1 failed"; rm -rf "$build"; exit 1; }
        test_dlls+=("$build/Igi.Sdk.Unity.Tests.dll")
    fi
fi

tests=()
while IFS= read -r -d '' f; do tests+=("$f"); done < <(find unity_plugin/Tests/Runtime -name '*.cs' -print0 | sort -z)
mcs "${flags[@]}" -target:library -r:"$build/Igi.Sdk.Core.dll" -r:"$nunit_dll" \
    -out:"$build/Igi.Sdk.Tests.dll" "${tests[@]}" \
    || { echo "tests: compile failed"; echo "0 passed, 1 failed"; rm -rf "$build"; exit 1; }
cp "$nunit_dll" "$build/"
# the native transport's DllImport("libzmq"): Debian ships only libzmq.so.5 without the -dev package
cat > "$build/Igi.Sdk.Core.dll.config" <<'XML'
<configuration>
  <dllmap dll="libzmq" target="libzmq.so.5" os="linux"/>
  <dllmap dll="libzmq" target="libzmq.5.dylib" os="osx"/>
</configuration>
XML

# the sidecar the tests start: the development install's, or another (a bundle) when given
export IGI_SDK_EXE="${IGI_SDK_EXE:-$root/.venv/bin/igi-sdk}"
echo "sidecar: $IGI_SDK_EXE"
export IGI_VECTORS_DIR="${IGI_VECTORS_DIR:-$root/bridge/vectors}"
# (the NPC-action tests wait for whole calls: on a loaded 2-core machine the suite passed 600 s,
# and Mantella's 20 lines alone took 466 s)
(cd "$build" && timeout 1800 nunit-console -nologo -labels -xml="$build/TestResult.xml" "$build/Igi.Sdk.Tests.dll" "${test_dlls[@]}" ${NUNIT_ARGS:-}) \
    > "$build/nunit.log" 2>&1
nunit=$?
# the summary, every failure with its message, and the measurements tests print
sed -n '/^Tests run:/,$p' "$build/nunit.log" | grep -v '^\*\*\*\*\* ' | head -150
grep -E '^measured:' "$build/nunit.log" | sort -u || true

result=$(python3 - "$build/TestResult.xml" <<'PY'
import sys, xml.etree.ElementTree as ET
try:
    cases = ET.parse(sys.argv[1]).getroot().iter("test-case")
except Exception as e:  # no result file: nunit did not run
    print("0 0 0"); sys.exit()
passed = failed = ignored = 0
for c in cases:
    if c.get("executed") != "True":
        ignored += 1
    elif c.get("success") == "True":
        passed += 1
    else:
        failed += 1
        print("FAILED:", c.get("name"), file=sys.stderr)
print(passed, failed, ignored)
PY
)
read -r passed failed ignored <<<"$result"
ran=$((passed + failed))
if [ "$ran" -eq 0 ]; then
    tail -40 "$build/nunit.log"
fi
passed=$((passed + platform_passed))
failed=$((failed + platform_failed))
[ "$ignored" -gt 0 ] && echo "$ignored not run (ignored)"
echo "$passed passed, $failed failed"
if [ "$failed" -eq 0 ] && [ "$ran" -gt 0 ] && [ "$nunit" -eq 0 ]; then
    [ -n "${IGI_CSHARP_KEEP:-}" ] && keep_build || rm -rf "$build"
    exit 0
fi
keep_build
exit 1
