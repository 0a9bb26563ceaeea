#!/usr/bin/env bash
# The CUDA bundle on an NVIDIA machine with no internet (docs/shipping.md):
#   bash benchmarks/gpu_run.sh OUTDIR bundle      (the CUDA build first, then this script)
# or, with that build already in /tmp/site:  bash benchmarks/bundle_gpu.sh OUTDIR
# 1. PyInstaller from .gpu/wheels (pyinstaller, pyinstaller-hooks-contrib, altgraph, packaging)
# 2. a CPU build of the same llama.cpp (/tmp/lcpp, portable: no -march=native) for the bundle's
#    fallback on machines whose GPU it cannot use
# 3. `igi-sdk bundle --gpu cuda --cpu-libs`, moved to a folder whose path has spaces and
#    non-ASCII characters (the build folder removed)
# 4. doctor from the bundle with an empty environment
# 5. the same chat on the synthetic Llama-3-8B within --vram 4GiB, development install and
#    bundle alternating (3 runs each): decode tok/s and TTFT side by side (bundle_speed.txt)
# Each step appends to OUTDIR/bundle.txt as it goes; END: seconds into the call by which it must
# be done (the build before it included).
set -uo pipefail
out=${1:-${OUT:-/tmp/igi-out}}
END=${END:-570}
log="$out/bundle.txt"
mkdir -p "$out" /tmp/igi-bench
export PYTHONPATH=${PYTHONPATH:-/tmp/site:$PWD} PYTHONUNBUFFERED=1
left() { echo $(( END - SECONDS )); }
say() { echo "$*" | tee -a "$log"; }
say "part bundle from $SECONDS s"
m=/tmp/igi-bench/llama3-8b.gguf
( [ -f "$m" ] || timeout 240 python3 benchmarks/make_synthetic.py llama3-8b "$m" --quiet ) \
  > /tmp/igi-bench/make.txt 2>&1 &
mk=$!
# 1. PyInstaller
if ! python3 -c "import PyInstaller" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    .gpu/wheels/pyinstaller-*.whl .gpu/wheels/pyinstaller_hooks_contrib-*.whl \
    .gpu/wheels/altgraph-*.whl .gpu/wheels/packaging-*.whl 2>&1 | tail -3 | tee -a "$log"
fi
python3 -c "import PyInstaller; print('PyInstaller', PyInstaller.__version__)" 2>&1 | tee -a "$log"
# 2. the CPU fallback build of the same source
t=$SECONDS
cpu=/tmp/lcpp/build-cpu
if [ ! -f "$cpu/bin/libllama.so" ] && [ -f /tmp/lcpp/CMakeLists.txt ]; then
  cmake -S /tmp/lcpp -B "$cpu" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=off \
    -DGGML_NATIVE=off -DBUILD_SHARED_LIBS=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_APP=OFF \
    > /tmp/lcpp-cpu-cmake.log 2>&1 \
    && timeout $(( $(left) - 200 )) cmake --build "$cpu" --target llama mtmd -j"$(nproc)" \
       > /tmp/lcpp-cpu-build.log 2>&1 \
    || { say "CPU fallback build failed:"; for f in /tmp/lcpp-cpu-cmake.log /tmp/lcpp-cpu-build.log; do tail -n 15 "$f"; done 2>&1 | tee -a "$log"; }
fi
cpu_libs=()
[ -f "$cpu/bin/libllama.so" ] && cpu_libs=(--cpu-libs "$cpu/bin")
say "CPU fallback build: ${cpu_libs[*]:-none} ($(( SECONDS - t )) s)"
# 3. the bundle, moved
rm -rf /tmp/igi-bundle "/tmp/Mein Spiel ü"
t=$SECONDS
python3 -m igi_sdk.cli bundle /tmp/igi-bundle --gpu cuda "${cpu_libs[@]}" \
  --log "$out/pyinstaller.log" 2>&1 | tee -a "$log"
say "bundle build: $(( SECONDS - t )) s"
[ -x /tmp/igi-bundle/igi-sdk ] || { say "no bundle"; tail -30 "$out/pyinstaller.log"; exit 1; }
du -sh /tmp/igi-bundle | tee -a "$log"
du -s /tmp/igi-bundle/_internal/* | sort -rn | head -12 | tee -a "$log"
ls -la /tmp/igi-bundle/_internal/llama_cpp/lib* >> "$log"
game="/tmp/Mein Spiel ü/Binaries/ThirdParty/IgiSdk"
mkdir -p "$(dirname "$game")" && cp -a /tmp/igi-bundle "$game" && rm -rf /tmp/igi-bundle
exe="$game/igi-sdk"
# 4. doctor, empty environment (no PATH, PYTHONPATH, LD_LIBRARY_PATH or HOME)
say "--- doctor (env -i) ---"
( cd / && timeout 60 env -i "$exe" doctor ) 2>&1 | tee -a "$log"
wait "$mk" || { say "synthetic model failed"; cat /tmp/igi-bench/make.txt; exit 1; }
# 4b. a GPU the bundle was not built for: a copy whose build record names only sm_100 (newer
# than this card) must say so and run on its CPU build
other="/tmp/igi-other/IgiSdk"
rm -rf /tmp/igi-other && mkdir -p /tmp/igi-other && cp -a "$game" "$other"
python3 - "$other/_internal/igi_sdk_build.json" <<'PY'
import json, sys
p = sys.argv[1]; d = json.load(open(p)); d["cuda_archs"] = [1000]; json.dump(d, open(p, "w"))
PY
say "--- a GPU it was not built for (build record: sm_100 only) ---"
( cd / && timeout 60 env -i "$other/igi-sdk" doctor ) 2>&1 | grep -E "^igi-sdk:|GPU choice|GPU offload|llama.cpp GPU" | tee -a "$log"
( cd / && timeout 150 env -i HOME="$HOME" "$other/igi-sdk" chat --model "$m" --max-tokens 4 --seed 1 \
  --temperature 0 "Hello there." ) 2>&1 | grep -E "^igi-sdk:|tokens, first|plan '" | head -5 | tee -a "$log"
rm -rf /tmp/igi-other
# 5. the same chat both ways; the first dev run measures and caches the machine profile that
# both then plan with (HOME kept for the bundle only for that shared cache)
line="Greetings, smith! I need a blade for the road north. What can you offer me?"
chat=(chat --model "$m" --vram 4GiB --max-tokens 128 --seed 1 --temperature 0)
speed="$out/bundle_speed.txt"
: > "$speed"
for i in 1 2 3; do
  [ "$(left)" -gt 60 ] || { say "stopped before run $i: $(left) s left"; break; }
  echo "dev $i: $( ( timeout 150 python3 -m igi_sdk.cli "${chat[@]}" "$line" > /dev/null ) 2>&1 \
    | grep -E '^\[plan|tokens, first' | tr '\n' ' ')" | tee -a "$speed"
  [ "$(left)" -gt 40 ] || break
  echo "bundle $i: $( ( cd / && timeout 150 env -i HOME="$HOME" "$exe" "${chat[@]}" "$line" \
    > /dev/null ) 2>&1 | grep -E '^igi-sdk:|^\[plan|tokens, first' | tr '\n' ' ')" | tee -a "$speed"
done
cat "$speed" >> "$log"
say "part bundle done at $SECONDS s"
