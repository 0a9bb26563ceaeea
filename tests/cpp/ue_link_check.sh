#!/usr/bin/env bash
# Links the plugin's two modules the way a modular (Editor) build on Linux does, where the type
# check cannot see link errors: IgiSdkCore as a shared library, compiled as UBT compiles a module
# (C++17, no exceptions, no RTTI, -fvisibility-ms-compat -fvisibility-inlines-hidden, -fPIC, the
# engine's definitions IGI_SDK_NO_BSD_SOCKETS/IGI_SDK_UNREAL_MODULE, IGISDKCORE_API as UBT
# defines a module's API macro there: visibility("default")), then IgiSdk's code (against
# tests/cpp/ue_stub) as a shared library linked against it. The engine's own symbols stay
# undefined (the stub has no bodies; the engine provides them), so the check is on the core's:
# every igi:: symbol IgiSdk needs must be exported by the core, else it prints them and fails.
# Usage: ue_link_check.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/ue_link_check}
plugin=unreal_plugin/IgiSdk/Source
rm -rf "$out" && mkdir -p "$out/gen" "$out/core" "$out/ue"
for h in "$plugin"/IgiSdk/Public/*.h; do
    : > "$out/gen/$(basename "${h%.h}").generated.h"
done
flags=(-std=c++17 -c -fPIC -O1 -fno-exceptions -fno-rtti -fvisibility-ms-compat -fvisibility-inlines-hidden
       -Wall -Wextra -Werror -Wno-unused-parameter '-DIGISDKCORE_API=__attribute__((visibility("default")))'
       -Itests/cpp/ue_stub -I"$out/gen" -I"$plugin/IgiSdk/Public" -I"$plugin/IgiSdk/Private"
       -I"$plugin/IgiSdkCore/Public")
status=0
compile() {  # SOURCE OBJECT [EXTRA FLAGS]
    local src=$1 obj=$2
    shift 2
    g++ "${flags[@]}" "$@" "$src" -o "$obj" || { echo "does not compile: $src"; return 1; }
}
for f in "$plugin"/IgiSdkCore/Private/*.cpp; do
    compile "$f" "$out/core/$(basename "${f%.cpp}").o" -DIGI_SDK_NO_BSD_SOCKETS=1 -DIGI_SDK_UNREAL_MODULE=1 &
done
wait
for f in "$plugin"/IgiSdk/Private/*.cpp; do
    compile "$f" "$out/ue/$(basename "${f%.cpp}").o" || status=1
done
[ "$(ls "$out"/core/*.o 2>/dev/null | wc -l)" -eq "$(ls "$plugin"/IgiSdkCore/Private/*.cpp | wc -l)" ] || { echo "the core does not compile"; exit 1; }
[ "$status" -eq 0 ] || exit 1

# the core needs nothing from the engine's stub: link it with every symbol resolved
g++ -shared -o "$out/libUnrealEditor-IgiSdkCore.so" "$out"/core/*.o -Wl,--no-undefined -pthread || { echo "the core does not link"; exit 1; }
g++ -shared -o "$out/libUnrealEditor-IgiSdk.so" "$out"/ue/*.o -L"$out" -lUnrealEditor-IgiSdkCore -pthread \
    || { echo "the Unreal layer does not link"; exit 1; }

# the igi:: symbols IgiSdk takes from elsewhere, each of which the core must export
nm -D --undefined-only "$out/libUnrealEditor-IgiSdk.so" | awk '{print $NF}' | sort -u >"$out/needed.txt"
nm -D --defined-only "$out/libUnrealEditor-IgiSdkCore.so" | awk '{print $NF}' | sort -u >"$out/exported.txt"
grep -c . "$out/exported.txt" >/dev/null
needed_igi=$(c++filt <"$out/needed.txt" | paste -d'\t' "$out/needed.txt" - | awk -F'\t' '$2 ~ /^igi::/ {print $1}')
missing=$(comm -23 <(printf '%s\n' "$needed_igi" | grep . | sort -u) "$out/exported.txt")
n_needed=$(printf '%s\n' "$needed_igi" | grep -c .)
n_exported=$(c++filt <"$out/exported.txt" | grep -c '^igi::')
if [ -n "$missing" ]; then
    echo "the core does not export $(printf '%s\n' "$missing" | grep -c .) of the $n_needed igi:: symbols IgiSdk uses (undefined references when the Editor loads IgiSdk):"
    printf '%s\n' "$missing" | c++filt | head -40
    exit 1
fi
echo "IgiSdk uses $n_needed igi:: symbols; the core exports all of them ($n_exported igi:: exported)"
