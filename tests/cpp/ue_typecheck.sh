#!/usr/bin/env bash
# Type-checks the plugin's Unreal layer (Source/IgiSdk) and the core as the engine builds it
# (no BSD sockets, FSocket instead) against tests/cpp/ue_stub, a stub of the UE 5.3 headers it
# uses: -fsyntax-only, C++17, no exceptions, no RTTI, warnings as errors. Lists each file checked.
# Usage: ue_typecheck.sh OUT_DIR
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-build/ue_typecheck}
plugin=unreal_plugin/IgiSdk/Source
mkdir -p "$out/gen"
# UnrealHeaderTool's output, empty here: one NAME.generated.h per reflected header
for h in "$plugin"/IgiSdk/Public/*.h; do
    : > "$out/gen/$(basename "${h%.h}").generated.h"
done
flags=(-std=c++17 -fsyntax-only -fno-exceptions -fno-rtti -Wall -Wextra -Werror -Wno-unused-parameter
       -Itests/cpp/ue_stub -I"$out/gen" -I"$plugin/IgiSdk/Public" -I"$plugin/IgiSdk/Private"
       -I"$plugin/IgiSdkCore/Public")
status=0
for f in "$plugin"/IgiSdk/Private/*.cpp; do
    g++ "${flags[@]}" "$f" || status=1
    echo "$f"
done
for f in "$plugin"/IgiSdkCore/Private/*.cpp; do
    g++ "${flags[@]}" -DIGI_SDK_NO_BSD_SOCKETS=1 -DIGI_SDK_UNREAL_MODULE=1 "$f" || status=1
    echo "$f"
done
exit $status
