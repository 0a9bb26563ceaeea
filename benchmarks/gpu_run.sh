#!/usr/bin/env bash
# Reproduces docs/benchmarks.md on an NVIDIA machine with no internet:
#   copy ../shared/gpu (pruned llama-cpp-python sdist + build-cuda-cmake.sh + wheels) to .gpu/,
#   bash benchmarks/gpu_wheels.sh (the SDK's dependencies the image lacks), then
#   bash benchmarks/gpu_run.sh OUTDIR [part]
#   part: placement | planner-a | planner-b | final | final2 | native-order | arbiter | greedy | frames | release | http | flood |
#         dense-moe | matrix-a | matrix-b | matrix-c | peers | peers2 | peers3 | peers4 | spec |
#         vlm | bundle | npcs | shipped | busy | host | moe-placement | log-cost | prefill-probe |
#         stream-decode | load-behind | all
#   (each fits one 10-minute device call)
# One CMake build (build-cuda-cmake.sh, ~4.5 min on 16 cores) gives both llama-cpp-python's
# libraries and upstream llama.cpp's llama-bench (/tmp/lcpp/build/bin), so the upstream peers
# run beside ours in the same call. A build packed by an earlier call of the same machine kind
# (.gpu/prebuilt/bld.tar.*, see `pack_build` below) is unpacked instead when it runs here.
# Ours then runs on the pipelined scheduler (igi_sdk/bundle/patches/ggml-stream-prefetch.patch,
# and ggml-host-chunks.patch for pinned weights in pieces; `patch_ggml_base` below): a libggml-base carried as .gpu/patched/ (the same sources built
# elsewhere), or built here from the build's sources or .gpu/ggml-src.tgz (`tar czf
# .gpu/ggml-src.tgz -C <sdist>/vendor/llama.cpp ggml`); PIPELINE=0 keeps it stock.
set -uo pipefail
out=${1:-${OUT:-/tmp/igi-out}}
part=${2:-all}
mkdir -p "$out" /tmp/igi-bench
restore_build() {
  ls .gpu/prebuilt/bld.tar.* >/dev/null 2>&1 || return 1
  local dec="xz -d -T0"; ls .gpu/prebuilt/bld.tar.zst* >/dev/null 2>&1 && dec="zstd -d -T0"
  cat .gpu/prebuilt/bld.tar.* | $dec | tar -x -C / || return 1
  mkdir -p /tmp/site/llama_cpp/lib && cp -a /tmp/lcpp/build/bin/*.so* /tmp/site/llama_cpp/lib/
  /tmp/lcpp/build/bin/llama-bench --help > /dev/null 2>&1 || return 1
  PYTHONPATH=/tmp/site python3 -c "import llama_cpp; assert llama_cpp.llama_supports_gpu_offload()" \
    || return 1
  touch /tmp/site/.ready
}
pack_build() {  # PACK_BUILD=1: the build, in <= 15 MiB parts under PACK_DIR (default OUTDIR),
  # for a later call to carry as .gpu/prebuilt/ (skipped when too large to carry)
  local c="xz -T0 -3" ext=xz
  command -v zstd > /dev/null && { c="zstd -T0 -12"; ext=zst; }
  tar -c -C / tmp/lcpp/build/bin --exclude=tmp/site/llama_cpp/lib tmp/site | $c \
    > /tmp/bld.tar.$ext || return 1
  local size; size=$(stat -c %s /tmp/bld.tar.$ext)
  echo "packed build: $size bytes ($ext)"
  [ "$size" -le $(( 52 * 1024 * 1024 )) ] || { echo "too large to carry: not packed"; return 1; }
  split -b 15M -d /tmp/bld.tar.$ext "${PACK_DIR:-$out}/bld.tar.$ext."
}
patch_ggml_base() {  # ours (/tmp/site) on the pipelined scheduler
  # (igi_sdk/bundle/patches/ggml-stream-prefetch.patch): libggml-base carried as
  # .gpu/patched/ (built elsewhere from the same sources), else built here from /tmp/lcpp/ggml
  # (a fresh build) or .gpu/ggml-src.tgz with the patch; into both the build tree and /tmp/site
  # (their libraries find libggml-base through the build tree's absolute RUNPATH). Upstream's
  # binaries, the peers, run on it with GGML_SCHED_PREFETCH=0 (exported below): with no
  # weights named and no prefetch, the patched scheduler takes stock llama.cpp's paths.
  local lib=libggml-base.so.0.25.3 site=/tmp/site/llama_cpp/lib
  ok() { python3 -c "from igi_sdk.runtime._native import streams_weights as s, pins_in_pieces as p
assert s() and p()" 2>/dev/null; }
  ok && return 0
  [ -f .gpu/patched/$lib ] && cp .gpu/patched/$lib $site/$lib && cp .gpu/patched/$lib /tmp/lcpp/build/bin/$lib \
    && ok && return 0
  rm -rf /tmp/ggml-src && mkdir -p /tmp/ggml-src
  if [ -f /tmp/lcpp/ggml/CMakeLists.txt ]; then cp -r /tmp/lcpp/ggml /tmp/ggml-src/
  else tar xzf .gpu/ggml-src.tgz -C /tmp/ggml-src || return 1; fi
  local p; for p in ggml-stream-prefetch ggml-host-chunks; do  # in this order
    (cd /tmp/ggml-src && patch -p1 < "$OLDPWD/igi_sdk/bundle/patches/$p.patch") || return 1
  done
  [ -f /tmp/ggml-src/ggml/ggml.pc.in ] || touch /tmp/ggml-src/ggml/ggml.pc.in
  cmake -S /tmp/ggml-src/ggml -B /tmp/build-base -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=ON -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF > /dev/null \
    && cmake --build /tmp/build-base --target ggml-base -j"$(nproc)" > /dev/null || return 1
  local f; f=$(find /tmp/build-base -name $lib | head -1)
  cp "$f" $site/$lib && cp "$f" /tmp/lcpp/build/bin/$lib && ok
}
t_build=$SECONDS
if [ -f /tmp/site/.ready ] && [ -x /tmp/lcpp/build/bin/llama-bench ]; then
  echo "build: kept from an earlier call on this machine" | tee "$out/build.txt"
elif restore_build > "$out/build.txt" 2>&1; then
  echo "build: restored from .gpu/prebuilt in $(( SECONDS - t_build )) s" | tee -a "$out/build.txt"
else
  rm -rf /tmp/site /tmp/lcpp
  bash .gpu/build-cuda-cmake.sh .gpu >> "$out/build.txt" 2>&1 || { tail -20 "$out/build.txt"; exit 1; }
  echo "build: $(( SECONDS - t_build )) s" | tee -a "$out/build.txt"
  # the npcs part packs once its llama-server is built too
  [ "${PACK_BUILD:-0}" = 1 ] && [ "$part" != npcs ] && pack_build 2>&1 | tee -a "$out/build.txt"
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
# the SDK's own dependencies that the image lacks (llguidance, fastapi, ...), carried as wheels
# in .gpu/wheels-extra (benchmarks/gpu_wheels.sh downloads them), into /tmp/site beside
# llama-cpp-python; then every module a part starts must import, or the call stops here
if ! python3 -c "import igi_sdk.sidecar, igi_sdk.http.app, igi_sdk.runtime" 2> /dev/null \
   && ls .gpu/wheels-extra/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    .gpu/wheels-extra/*.whl 2>&1 | grep -v "^WARNING" | tail -3
fi
# PIPELINE=0: ours on the stock scheduler too (no pipelined plans). Upstream's binaries never
# prefetch (ours turns it on where a plan streams weights: runtime._native)
export GGML_SCHED_PREFETCH=0
if [ "${PIPELINE:-1}" = 1 ]; then
  patch_ggml_base > "$out/pipeline.txt" 2>&1 && echo "pipelined scheduler: on" | tee -a "$out/build.txt" \
    || { echo "pipelined scheduler: FAILED (stock scheduler)" | tee -a "$out/build.txt"; tail -5 "$out/pipeline.txt"; }
fi
python3 -c "import igi_sdk.sidecar, igi_sdk.http.app, igi_sdk.runtime" > "$out/imports.txt" 2>&1 \
  || { echo "the SDK does not import here (missing wheels? benchmarks/gpu_wheels.sh):"; \
       tail -3 "$out/imports.txt"; exit 1; }
# NOOMP=1: also llama.cpp's CPU backend built without OpenMP (ggml's own threadpools, whose wait
# the sidecar chooses while running), as /tmp/site-noomp: the same build with that one library
# swapped; rows run with PYTHONPATH=/tmp/site-noomp:... and LD_LIBRARY_PATH (the build tree's
# libraries find each other through an absolute RUNPATH, which LD_LIBRARY_PATH precedes) use it.
# Only ggml is configured (a standalone CMake project): from /tmp/lcpp when this machine built
# llama.cpp, else from .gpu/ggml-src.tgz (a restored build carries no sources; make it with
# `tar czf .gpu/ggml-src.tgz -C <sdist>/vendor/llama.cpp ggml`). The library comes back as
# OUTDIR/noomp-lib.tgz; carried as .gpu/noomp-lib.tgz, a later call on the same CPU model
# unpacks it instead of building.
noomp_from_carry() {
  [ -f .gpu/noomp-lib.tgz ] || return 1
  local cpu; cpu=$(lscpu | sed -n 's/^Model name: *//p')
  [ "$(cat .gpu/noomp-lib.cpu 2>/dev/null)" = "$cpu" ] || { echo "noomp-lib.tgz: built on another CPU"; return 1; }
  rm -rf /tmp/site-noomp && mkdir -p /tmp/site-noomp && cp -a /tmp/site/llama_cpp /tmp/site-noomp/ \
    && tar xzf .gpu/noomp-lib.tgz -C /tmp/site-noomp/llama_cpp/lib
}
noomp_build() {
  local src=/tmp/lcpp/ggml
  if [ ! -f "$src/CMakeLists.txt" ]; then
    rm -rf /tmp/ggml-src && mkdir -p /tmp/ggml-src && tar xzf .gpu/ggml-src.tgz -C /tmp/ggml-src \
      && src=/tmp/ggml-src/ggml || return 1
  fi
  # standalone ggml configures a pkg-config file the pruned sources lack; its content is unused
  [ -f "$src/ggml.pc.in" ] || touch "$src/ggml.pc.in"
  cmake -S "$src" -B /tmp/build-noomp -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_OPENMP=OFF \
      -DGGML_NATIVE=on -DBUILD_SHARED_LIBS=ON -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF \
    && cmake --build /tmp/build-noomp --target ggml-cpu -j"$(nproc)" \
    && rm -rf /tmp/site-noomp && mkdir -p /tmp/site-noomp && cp -a /tmp/site/llama_cpp /tmp/site-noomp/ \
    && find /tmp/build-noomp -name "libggml-cpu.so*" -exec cp -a {} /tmp/site-noomp/llama_cpp/lib/ \; \
    && tar czf "$out/noomp-lib.tgz" -C /tmp/site-noomp/llama_cpp/lib $(cd /tmp/site-noomp/llama_cpp/lib && ls libggml-cpu.so*) \
    && lscpu | sed -n 's/^Model name: *//p' > "$out/noomp-lib.cpu"
}
if [ "${NOOMP:-0}" = 1 ] && [ ! -f /tmp/site-noomp/.ready ]; then
  t_noomp=$SECONDS
  { { noomp_from_carry || noomp_build; } \
    && LD_LIBRARY_PATH=/tmp/site-noomp/llama_cpp/lib PYTHONPATH=/tmp/site-noomp:/tmp/site python3 -c "
from igi_sdk.runtime.threadpool import uses_openmp; assert not uses_openmp()" \
    && touch /tmp/site-noomp/.ready; } > "$out/build-noomp.txt" 2>&1
  echo "build without OpenMP: $([ -f /tmp/site-noomp/.ready ] && echo ok || echo FAILED)" \
    "in $(( SECONDS - t_noomp )) s" | tee -a "$out/build.txt"
fi
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv > "$out/gpu.txt"
lscpu | grep -E "Model name|^CPU\(s\)" >> "$out/gpu.txt"
t=$(nproc)
if [ "$part" = placement ] || [ "$part" = all ]; then
  python3 benchmarks/import_order_probe.py > "$out/import_order.txt" 2>&1
  python3 benchmarks/placement_bench.py --preset llama3-8b --workdir /tmp/igi-bench \
    --plans attn-gpu,all-gpu,all-cpu --prompt-tokens 1024 --gen 128 --threads "$t" \
    --json "$out/placement.json" > "$out/placement.txt" 2>&1
fi
if [ "$part" = planner-a ] || [ "$part" = all ]; then
  /usr/bin/time -v python3 -m igi_sdk.cli profile --fast --threads "$t" > "$out/profile.txt" 2>&1
  python3 benchmarks/planner_bench.py --models llama3-8b --budgets 2,4,8 --cases 1024:4096 \
    --strategies ours,P0,P1,full,cpu --threads "$t" --json "$out/planner.json" 2>&1 | grep -v "^{"
fi
if [ "$part" = planner-b ] || [ "$part" = all ]; then
  python3 benchmarks/planner_bench.py --models llama3-8b --budgets 2,4 --cases 4096:16384 \
    --strategies ours,P0,P1,full --threads "$t" --json "$out/planner.json" 2>&1 | grep -v "^{"
  python3 benchmarks/planner_bench.py --models qwen3-30b-a3b --budgets 4,8 --cases 1024:4096 \
    --strategies ours,P2,P1 --threads "$t" --json "$out/planner.json" 2>&1 | grep -v "^{"
  for n in 4 16; do
    python3 benchmarks/planner_bench.py --models llama3-8b --budgets 4 --cases 64:4096 \
      --sessions "$n" --gen 64 --strategies ours,P0,P1 --threads "$t" \
      --json "$out/planner.json" 2>&1 | grep -v "^{"
  done
fi
if [ "$part" = final ]; then
  /usr/bin/time -v python3 -m igi_sdk.cli profile --fast --threads "$t" > "$out/profile.txt" 2>&1
  python3 benchmarks/planner_bench.py --models qwen3-30b-a3b --budgets 4,8 --cases 1024:4096 \
    --strategies ours,P2,P1 --threads "$t" --timeout 120 --json "$out/planner.json" 2>&1 | grep -v "^{"
  python3 benchmarks/planner_bench.py --models llama3-8b --budgets 2,4 --cases 1024:4096 \
    --strategies ours,P0,P1 --threads "$t" --timeout 120 --json "$out/planner.json" 2>&1 | grep -v "^{"
fi
if [ "$part" = final2 ]; then
  /usr/bin/time -v python3 -m igi_sdk.cli profile --fast --threads "$t" > "$out/profile.txt" 2>&1
  python3 benchmarks/planner_bench.py --models llama3-8b --budgets 2,4 --cases 1024:4096 \
    --strategies ours,P0,P1 --threads "$t" --timeout 90 --json "$out/planner.json" 2>&1 | grep -v "^{"
  python3 benchmarks/planner_bench.py --models llama3-8b --budgets 4 --cases 4096:16384 \
    --strategies ours,P1 --threads "$t" --timeout 90 --json "$out/planner.json" 2>&1 | grep -v "^{"
  python3 benchmarks/planner_bench.py --models llama3-8b --budgets 4 --cases 64:4096 --sessions 4 \
    --gen 64 --strategies ours,P1 --threads "$t" --timeout 90 --json "$out/planner.json" 2>&1 | grep -v "^{"
fi
if [ "$part" = matrix-a ]; then
  # the planner matrix, part a: Llama-3-8B 1K prompts at 2/4/8 GB and full; Minitron-8B F16
  python3 benchmarks/planner_bench.py --models llama3-8b --budgets 2,4,8 --cases 1024:4096 \
    --strategies ours,P0,P1,full --threads "$t" --timeout 90 --json "$out/planner.json" 2>&1 | grep -v "^{"
  cp /tmp/igi-bench/profile.json "$out/profile.json"
  python3 benchmarks/planner_bench.py --models minitron-8b --budgets 4,8 --cases 1024:4096 \
    --strategies ours,P0,P1 --threads "$t" --timeout 120 --json "$out/planner.json" 2>&1 | grep -v "^{"
fi
if [ "$part" = matrix-b ]; then
  # part b: 4K prompts in a 16K context, batched sessions, the MoE at 2 GB and full
  python3 benchmarks/planner_bench.py --models llama3-8b --budgets 2,4 --cases 4096:16384 \
    --strategies ours,P0,P1 --threads "$t" --timeout 90 --json "$out/planner.json" 2>&1 | grep -v "^{"
  cp /tmp/igi-bench/profile.json "$out/profile.json"
  for n in 4 16; do
    python3 benchmarks/planner_bench.py --models llama3-8b --budgets 4 --cases 64:4096 \
      --sessions "$n" --gen 64 --strategies ours,P0,P1 --threads "$t" --timeout 90 \
      --json "$out/planner.json" 2>&1 | grep -v "^{"
  done
  python3 benchmarks/planner_bench.py --models qwen3-30b-a3b --budgets 2 --cases 1024:4096 \
    --strategies ours,P2,P1,full --threads "$t" --timeout 120 --json "$out/planner.json" 2>&1 | grep -v "^{"
fi
if [ "$part" = matrix-c ]; then
  # a cross-section re-run after the profile learned the copy-compute stream rate
  /usr/bin/time -v python3 -m igi_sdk.cli profile --fast --threads "$t" > "$out/profile.txt" 2>&1
  python3 benchmarks/planner_bench.py --models llama3-8b --budgets 2,4 --cases 1024:4096 \
    --strategies ours,P0,P1 --threads "$t" --timeout 90 --json "$out/planner.json" 2>&1 | grep -v "^{"
  cp /tmp/igi-bench/profile.json "$out/profile.json"
  python3 benchmarks/planner_bench.py --models llama3-8b --budgets 4 --cases 4096:16384 \
    --strategies ours,P1 --threads "$t" --timeout 90 --json "$out/planner.json" 2>&1 | grep -v "^{"
  python3 benchmarks/planner_bench.py --models minitron-8b --budgets 4 --cases 1024:4096 \
    --strategies ours,P0,P1 --threads "$t" --timeout 120 --json "$out/planner.json" 2>&1 | grep -v "^{"
fi
if [ "$part" = native-order ] || [ "$part" = all ]; then
  python3 benchmarks/native_order_probe.py --json "$out/native_order.json" 2>&1 | tee "$out/native_order.txt"
fi
if [ "$part" = arbiter ] || [ "$part" = all ]; then
  # the sidecar gets 12 of the 16 cores: the game's render thread needs CPU time too
  timeout 300 python3 benchmarks/arbiter_bench.py --workdir /tmp/igi-bench --threads 12 \
    --phase-s 5 --frame-s 5 --max-tokens 32 --reference-chats 16 --json "$out/arbiter.json" 2>&1 | tee "$out/arbiter.txt"
  cp /tmp/igi-bench/profile.json "$out/profile-12t.json"
  python3 -m igi_sdk.cli plan /tmp/igi-bench/llama3-8b.gguf --vram 4GB --ctx 4096 \
    --profile /tmp/igi-bench/profile.json > "$out/plan-4gb.txt" 2>&1
fi
if [ "$part" = http ] || [ "$part" = all ]; then
  # the OpenAI-compatible HTTP face (http_face_bench.py), the synthetic 8B under a 4 GiB cap:
  # against the ZeroMQ face of the same sidecar and against upstream llama-server (same model
  # and context, one slot, flash attention, fitted by its --fit to the sidecar's NVML peak), and
  # the KV reuse of a 10-turn NPC conversation on both. Every step has its own timeout and
  # appends to http.txt as it goes, so a call cut short still returns what it got. END: seconds
  # into this call (the build included) by which it must be done.
  END=${END:-580}
  log="$out/http.txt"; m=/tmp/igi-bench/llama3-8b.gguf
  echo "part http from $SECONDS s" | tee -a "$log"
  # the face's own cost, the model taken out (an instant model side in-process)
  timeout 60 python3 benchmarks/face_overhead.py --rounds 300 --json "$out/face-overhead.json" \
    2>&1 | tee -a "$log"
  # the model is written while llama-server compiles (the disk against the cores)
  ( [ -f "$m" ] || timeout 200 python3 benchmarks/make_synthetic.py llama3-8b "$m" --quiet ) \
    > /tmp/igi-bench/make.txt 2>&1 &
  mk=$!
  srv=/tmp/lcpp/build/bin/llama-server
  if [ ! -x "$srv" ] && [ -f /tmp/lcpp/CMakeLists.txt ]; then
    # the CUDA tree of build-cuda-cmake.sh, reconfigured with the server on
    timeout 240 bash benchmarks/build_llama_server.sh /tmp/lcpp /tmp/lcpp/build 2>&1 | tee -a "$log"
  fi
  [ -x "$srv" ] || echo "no llama-server: the bench runs without its peer" | tee -a "$log"
  wait "$mk"; cat /tmp/igi-bench/make.txt >> "$log"; ls -la "$m" 2>&1 | tee -a "$log"
  # a profile of this machine kind (measuring one takes minutes): carried, else a stored one
  prof=.gpu/profile.json
  if [ ! -f "$prof" ]; then
    prof=benchmarks/results/h100-run10-profile.json
    grep -q H200 "$out/gpu.txt" && prof=benchmarks/results/h200-profile-16t-v6b.json
  fi
  echo "model ready at $SECONDS s; profile $prof" | tee -a "$log"
  left=$(( END - SECONDS ))
  if [ "$left" -ge 60 ]; then
    timeout -k 15 "$left" python3 benchmarks/http_face_bench.py --model-dir /tmp/igi-bench \
      --model llama3-8b.gguf --rounds "${HTTP_ROUNDS:-20}" --long-rounds 3 --tokens 128 \
      --threads 12 --llama-server "$srv" --fallback-budget-mib 4096 \
      --deadline $(( $(date +%s) + left - 10 )) --logs "$out" --json "$out/http-face.json" \
      -- --profile "$prof" --vram 4GiB 2>&1 | tee -a "$log"
  else
    echo "only $left s left: the bench did not run" | tee -a "$log"
  fi
  echo "part http done at $SECONDS s" | tee -a "$log"
fi
if [ "$part" = flood ] || [ "$part" = all ]; then
  # the HTTP face under a flood of large bodies (body_flood.py: an NPC's decode through the
  # ZeroMQ face and a ping every 10 ms, alone and beside two senders of 24-30 MiB bodies), the
  # synthetic 8B under a 4 GiB cap, FLOOD_RUNS times; the face's own cost first
  log="$out/flood.txt"; m=/tmp/igi-bench/llama3-8b.gguf
  timeout 60 python3 benchmarks/face_overhead.py --rounds 300 --json "$out/face-overhead.json" \
    2>&1 | tee -a "$log"
  [ -f "$m" ] || timeout 200 python3 benchmarks/make_synthetic.py llama3-8b "$m" --quiet \
    2>&1 | tee -a "$log"
  prof=benchmarks/results/h200-profile-16t-v6b.json
  for k in $(seq 1 "${FLOOD_RUNS:-2}"); do
    timeout -k 10 200 python3 benchmarks/body_flood.py --model-dir /tmp/igi-bench \
      --model llama3-8b.gguf --threads 12 --json "$out/body-flood-$k.json" \
      -- --profile "$prof" --vram 4GiB 2>&1 | tee -a "$log"
  done
fi
if [ "$part" = frames ] || [ "$part" = all ]; then
  # the frame game (benchmarks/frame_game.py): a 60 Hz game loading and unloading 6 GiB levels
  # on a 12 GiB pool beside the sidecar; runs FRAMES_RUNS, each MODE/NPCS/STANDBY[/HOST]
  # (standby: as shipped; nostandby: `serve --no-standby`, every reshard stopping the replies
  # while it loads; HOST: `serve --host-weights`, default auto), one fresh sidecar each, while
  # the call has time left (FRAMES_END seconds into it); FRAMES_HOLD_S: each level's gameplay;
  # FRAMES_ARGS: more frame_game.py flags (e.g. --level-gib 8: a 2.5 GiB budget in gameplay)
  end=${FRAMES_END:-560}
  k=0
  for spec in ${FRAMES_RUNS:-nvml/1/standby nvml/1/nostandby}; do
    IFS=/ read -r mode npcs sb hw <<< "$spec"
    extra=""; [ "$sb" = nostandby ] && extra="--no-standby"
    k=$(( k + 1 )); name="$mode-$npcs-$sb"
    [ -n "$hw" ] && { extra="$extra --host-weights $hw"; name="$name-$hw"; }
    [ -e "$out/frames-$name.json" ] && name="$name-$k"  # a spec run twice keeps both
    left=$(( end - SECONDS ))
    [ "$left" -lt 110 ] && { echo "only $left s left: $spec not run" | tee -a "$out/frames.txt"; break; }
    echo "== $spec at $SECONDS s" | tee -a "$out/frames.txt"; : > /tmp/igi-bench/sidecar.log
    timeout -k 20 "$left" python3 benchmarks/frame_game.py --mode "$mode" --npcs "$npcs" \
      --workdir /tmp/igi-bench --threads 12 --settle-s 12 --hold-s "${FRAMES_HOLD_S:-6}" \
      --between-s 6 --tail-s 8 ${FRAMES_ARGS:-} \
      --serve-args="$extra" --json "$out/frames-$name.json" 2>&1 | tee -a "$out/frames.txt"
    tail -60 /tmp/igi-bench/sidecar.log > "$out/frames-$name-sidecar.log" 2>/dev/null
    grep -m3 "host weights\|pinned\|stream" /tmp/igi-bench/sidecar.log >> "$out/frames-$name-sidecar.log" 2>/dev/null
  done
fi
if [ "$part" = load-behind ] || [ "$part" = all ]; then
  # what a GPU rung loading behind the decode costs the NPC on the CPU standby, host weights
  # pinned against mapped (load_behind.py), the synthetic 8B, a stored profile of this kind
  m=/tmp/igi-bench/llama3-8b.gguf
  [ -f "$m" ] || timeout 200 python3 benchmarks/make_synthetic.py llama3-8b "$m" --quiet
  timeout 300 python3 benchmarks/load_behind.py --model "$m" \
    --profile benchmarks/results/h200-profile-16t-v6b.json --budget-gib "${LB_BUDGET_GIB:-4.5}" \
    --threads 12 --rounds "${LB_ROUNDS:-3}" --variants "${LB_VARIANTS:-mapped,pinned-whole,pinned}" \
    --json "$out/load-behind.json" 2>&1 \
    | grep -v "^llama_\|^load\|^print_info\|^\." | tee "$out/load-behind.txt"
fi
if [ "$part" = release ] || [ "$part" = all ]; then
  # what closing a placement costs, part by part, beside the driver's raw free (release_cost.py)
  timeout 400 python3 benchmarks/release_cost.py --workdir /tmp/igi-bench --threads 12 \
    --repeat "${RELEASE_REPEAT:-3}" --json "$out/release-cost.json" 2>&1 | tee "$out/release.txt"
fi
if [ "$part" = greedy ] || [ "$part" = all ]; then
  # the greedy game (it never talks to the sidecar; the arbiter sees it through NVML only), then,
  # with the time this call has left, the trace run alone for the reserve_vram figures (VRAM
  # freed and the reply within 100 ms; part `arbiter` runs the whole scenario with static runs).
  # The bench ends its children and writes what it has when its timeout's SIGTERM comes.
  end=560  # seconds into this call (the build included) by which both must be done
  timeout 240 python3 benchmarks/arbiter_bench.py --only prepare --workdir /tmp/igi-bench \
    --threads 12 2>&1 | tee "$out/greedy-prepare.txt"  # the synthetic 8B and the profile
  budget=$(( end - SECONDS - 170 )); [ "$budget" -gt 330 ] && budget=330
  [ "$budget" -lt 150 ] && budget=150
  timeout -k 20 "$budget" python3 benchmarks/arbiter_bench.py --only greedy --workdir /tmp/igi-bench \
    --threads 12 --max-tokens 32 --json "$out/greedy.json" 2>&1 | tee "$out/greedy.txt"
  tail -100 /tmp/igi-bench/sidecar.log > "$out/greedy-sidecar.log" 2>/dev/null
  left=$(( end - SECONDS ))
  if [ "$left" -ge 150 ]; then
    timeout -k 20 "$left" python3 benchmarks/arbiter_bench.py --only trace --workdir /tmp/igi-bench \
      --threads 12 --phase-s 5 --frame-s 5 --max-tokens 32 --json "$out/arbiter-trace.json" 2>&1 \
      | tee "$out/arbiter-trace.txt"
  else
    echo "only $left s left: run part arbiter for the reserve_vram figures" | tee "$out/arbiter-trace.txt"
  fi
  cp /tmp/igi-bench/profile.json "$out/profile-12t.json" 2>/dev/null
fi
if [ "$part" = dense-moe ] || [ "$part" = all ]; then
  python3 benchmarks/planner_bench.py --models minitron-8b --budgets 4,8 --cases 1024:4096 \
    --strategies ours,P0,P1 --threads "$t" --timeout 120 --json "$out/planner.json" 2>&1 | grep -v "^{"
  python3 benchmarks/planner_bench.py --models qwen3-30b-a3b --budgets 2 --cases 1024:4096 \
    --strategies ours,P2,P1,full --threads "$t" --timeout 120 --json "$out/planner.json" 2>&1 | grep -v "^{"
fi
if [ "$part" = peers ] || [ "$part" = peers2 ] || [ "$part" = peers3 ] || [ "$part" = peers4 ] \
   || [ "$part" = peers5 ] || [ "$part" = peers6 ] || [ "$part" = peers7 ] \
   || [ "$part" = spin ] || [ "$part" = fresh ]; then
  # ours (planner_bench) beside upstream llama-bench peers at the same VRAM (NVML
  # peak), and the n_ctx 2048 -> 4096 decode drop with the same placement at both contexts.
  # END: seconds into this call by which everything must be done (the build included).
  END=${END:-575}
  m=/tmp/igi-bench/llama3-8b.gguf
  pb() { local prof=(); [ -f /tmp/igi-bench/profile.json ] && prof=(--profile /tmp/igi-bench/profile.json)
         python3 benchmarks/planner_bench.py --models llama3-8b --threads "$t" --timeout 90 \
           --json "$out/planner.json" "${prof[@]}" "$@" 2>&1 | grep -v "^{" | grep -v "^$" | tee -a "$out/planner.txt"; }
  up() { [ $(( END - SECONDS )) -gt 40 ] || { echo "skipped peers $*: no time"; return; }
         python3 benchmarks/upstream_peers.py --model "${UPM:-$m}" --threads "$t" \
           --deadline $(( $(date +%s) + END - SECONDS )) --json "$out/peers.json" "$@" 2>&1 \
           | tee -a "$out/peers.txt"; }
  have() { [ $(( END - SECONDS )) -gt "$1" ]; }
  # the MoE (Qwen3-30B-A3B) at 4 GB and llama-bench's context, ours
  moe() { python3 benchmarks/planner_bench.py --models qwen3-30b-a3b --threads "$t" \
            --timeout 120 --json "$out/planner.json" --profile /tmp/igi-bench/profile.json \
            --budgets 4 --cases 1024:1152 --strategies ours "$@" 2>&1 | grep -v "^{" \
            | grep -v "^$" | tee -a "$out/planner.txt"; }
  rm -f /tmp/igi-bench/profile.json  # measured afresh on this machine by the first pb
  [ -f .gpu/profile.json ] && cp .gpu/profile.json /tmp/igi-bench/profile.json  # or carried
  mkdir -p "$out/plans"
  sp="$out/plans/{strategy}-{budget}-{ctx}.json"
  if [ "$part" = peers ]; then
    pb --budgets 4 --cases 1024:2048 --strategies ours --save-plan "$sp" --tag ctx2048
    up --budgets 4
    have 60 && pb --budgets 4 --cases 1024:4096 --strategies ours --save-plan "$sp" --tag ctx4096
    # the same placement at the other context: the n_ctx 4096 plan run at 2048 and vice versa
    have 50 && pb --budgets 4 --cases 1024:2048 --strategies ours --tag plan4096-at-2048 \
      --plan-file "$out/plans/ours-4.0-4096.json" --plan-ctx 4096
    have 50 && pb --budgets 4 --cases 1024:4096 --strategies ours --tag plan2048-at-4096 \
      --plan-file "$out/plans/ours-4.0-2048.json" --plan-ctx 2048
    have 50 && pb --budgets 2 --cases 1024:2048 --strategies ours --save-plan "$sp" --tag ctx2048
    up --budgets 2
  fi
  if [ "$part" = peers2 ]; then
    # a second machine: the copy-compute probe at two sizes, ours as shipped and with
    # libgomp spinning (OMP_WAIT_POLICY=ACTIVE, upstream's default) beside the upstream peers,
    # upstream with our PASSIVE policy, then 2 and 8 GB
    python3 benchmarks/stream_probe.py --layers 2,6 --threads "$t" --json "$out/stream_probe.json" \
      2>&1 | tee "$out/stream_probe.txt"
    pb --budgets 4 --cases 1024:2048 --strategies ours --save-plan "$sp" --tag ctx2048
    have 60 && OMP_WAIT_POLICY=ACTIVE pb --budgets 4 --cases 1024:2048 --strategies ours --tag omp-active
    up --budgets 4
    ngl=$(python3 -c "import json; print([r for r in json.load(open('$out/peers.json')) if r['strategy']=='ngl-best'][-1]['flags'].split()[-1])" 2>/dev/null)
    [ -n "$ngl" ] && OMP_WAIT_POLICY=PASSIVE up --budgets 4 --peers "ngl:$ngl" --tag omp-passive
    have 60 && pb --budgets 2 --cases 1024:2048 --strategies ours --save-plan "$sp" --tag ctx2048
    up --budgets 2
    have 60 && OMP_WAIT_POLICY=ACTIVE pb --budgets 2 --cases 1024:2048 --strategies ours --tag omp-active
    have 60 && pb --budgets 8 --cases 1024:2048 --strategies ours --save-plan "$sp" --tag ctx2048
    up --budgets 8 --peers fit-expert,fit-default
    have 60 && pb --budgets 4 --cases 1024:4096 --strategies ours --save-plan "$sp" --tag ctx4096
  fi
  if [ "$part" = peers3 ]; then
    # one machine: the planner with the corrected cost model as shipped (it
    # may choose a q8_0 KV cache), the same with f16 KV only, and with a bounded libgomp spin
    # (GOMP_SPINCOUNT: the SDK then sets no wait policy), beside upstream --fit expert with and
    # without a q8_0 KV cache; 4 GB, then 2 GB, then 8 GB
    pb --budgets 4 --cases 1024:2048 --strategies ours --save-plan "$sp" --tag kv-auto
    up --budgets 4 --peers fit-expert,fit-expert-q8kv
    have 60 && pb --budgets 4 --cases 1024:2048 --strategies ours --kv f16 --tag kv-f16
    have 60 && pb --budgets 2 --cases 1024:2048 --strategies ours --save-plan "$sp" --tag kv-auto
    up --budgets 2 --peers fit-expert,fit-expert-q8kv
    have 60 && pb --budgets 2 --cases 1024:2048 --strategies ours --kv f16 --tag kv-f16
    have 60 && GOMP_SPINCOUNT=${SPIN:-10000} pb --budgets 2 --cases 1024:2048 --strategies ours \
      --tag "spin${SPIN:-10000}"
    have 60 && GOMP_SPINCOUNT=${SPIN:-10000} pb --budgets 4 --cases 1024:2048 --strategies ours \
      --tag "spin${SPIN:-10000}"
    have 60 && pb --budgets 8 --cases 1024:2048 --strategies ours --save-plan "$sp" --tag kv-auto
    up --budgets 8 --peers fit-expert
  fi
  if [ "$part" = peers4 ]; then
    # after peers3 (q8_0 KV on CPU-resident layers halved decode at 2 GB): q8_0 KV only with
    # every layer's KV in VRAM, and the output head may go before attention (output-first).
    # Ours as shipped, with f16 KV only, and (2 GB) without output-first, beside upstream
    # --fit expert with and without q8_0 KV; a bounded libgomp spin at 2 GB; then 8 GB
    pb --budgets 2 --cases 1024:2048 --strategies ours --output-first --save-plan "$sp" \
      --tag shipped  # run4's default; output-first is off by default since
    up --budgets 2 --peers fit-expert,fit-expert-q8kv
    have 60 && pb --budgets 2 --cases 1024:2048 --strategies ours --kv f16 --tag attn-first-f16
    have 60 && pb --budgets 4 --cases 1024:2048 --strategies ours --output-first \
      --save-plan "$sp" --tag shipped
    up --budgets 4 --peers fit-expert,fit-expert-q8kv
    have 60 && pb --budgets 4 --cases 1024:2048 --strategies ours --kv f16 --tag kv-f16
    have 60 && GOMP_SPINCOUNT=${SPIN:-10000} pb --budgets 2 --cases 1024:2048 --strategies ours \
      --tag "spin${SPIN:-10000}"
    have 60 && pb --budgets 8 --cases 1024:2048 --strategies ours --output-first \
      --save-plan "$sp" --tag shipped
    up --budgets 8 --peers fit-expert
  fi
  if [ "$part" = peers5 ]; then
    # logits rows sized to the engine's (no staged output head): ours beside upstream --fit
    # expert at 2 and 4 GB, ours at llama-bench's own context (p + n + d = 1152 cells) and at
    # 2048, then the speculative mechanism at 4 GB with what time is left
    pb --budgets 2 --cases 1024:1152 --strategies ours --save-plan "$sp" --tag rows-ctx1152
    up --budgets 2 --peers fit-expert
    have 60 && pb --budgets 2 --cases 1024:2048 --strategies ours --save-plan "$sp" --tag rows
    have 60 && pb --budgets 4 --cases 1024:1152 --strategies ours --save-plan "$sp" --tag rows-ctx1152
    up --budgets 4 --peers fit-expert
    if have 200; then
      d=/tmp/igi-bench/llama3-draft.gguf
      python3 -c "from igi_sdk.model import spec_with, write_synthetic_gguf as w; w('$d', spec_with(
        'llama3-8b', n_layers=16, n_embd=1024, n_head=16, n_head_kv=8, n_ff=4096))"
      timeout $(( END - SECONDS )) python3 benchmarks/speculative_bench.py --target "$m" \
        --draft "$d" --profile /tmp/igi-bench/profile.json --budget-gb 4 --ctx 1152 \
        --threads "$t" --json "$out/spec-4gb.json" 2>&1 | grep -v "^llama_context" \
        | tee -a "$out/spec.txt"
    fi
  fi
  if [ "$part" = peers7 ]; then
    # after run 6 (2 GB: the q8_0-KV plan the dry run's slack made possible decoded 10.6
    # tok/s): at 2 GB the shipped f16 plan, the q8_0 plan again, upstream --fit expert; then the
    # MoE at 4 GB beside --fit expert and --n-cpu-moe (upstream's own thread waits)
    pb --budgets 2 --cases 1024:1152 --strategies ours --save-plan "$sp" --tag f16-slack
    have 60 && pb --budgets 2 --cases 1024:1152 --strategies ours --kv q8-allowed --tag q8-slack
    up --budgets 2 --peers fit-expert
    have 60 && pb --budgets 4 --cases 1024:1152 --strategies ours --tag f16-slack
    up --budgets 4 --peers fit-expert
    if have 240; then
      moe --tag moe
      UPM=/tmp/igi-bench/qwen3-30b-a3b.gguf up --budgets 4 --peers fit-expert,ncmoe-best
    fi
  fi
  if [ "$part" = fresh ]; then
    # the cost model with a profile measured on this machine (run without .gpu/profile.json):
    # dense 2, 4 and 8 GB at llama-bench's context, 4 GB at 16K, beside upstream at 4 GB
    pb --budgets 2,4,8 --cases 1024:1152 --strategies ours --tag fresh-profile
    have 90 && pb --budgets 4 --cases 4096:16384 --strategies ours --tag fresh-profile-16k
    up --budgets 4 --peers fit-expert
  fi
  if [ "$part" = spin ]; then
    # how the engine's thread waits cost decode (the SDK's default: OMP_WAIT_POLICY=PASSIVE,
    # threads sleep at every barrier so a game keeps its cores): the MoE (many barriers per
    # token) and the dense model at 4 GB, passive / spinning / a bounded spin, beside upstream
    moe --tag passive
    OMP_WAIT_POLICY=ACTIVE moe --tag active
    have 90 && GOMP_SPINCOUNT=${SPIN:-20000} moe --tag "spin${SPIN:-20000}"
    UPM=/tmp/igi-bench/qwen3-30b-a3b.gguf up --budgets 4 --peers fit-expert
    have 60 && pb --budgets 4 --cases 1024:1152 --strategies ours --tag passive
    have 60 && OMP_WAIT_POLICY=ACTIVE pb --budgets 4 --cases 1024:1152 --strategies ours \
      --tag active
    up --budgets 4 --peers fit-expert
  fi
  if [ "$part" = peers6 ]; then
    # a 64 MiB margin and the dry run's slack given to weights: ours at 2, 4 and 8 GB (at
    # llama-bench's own context) beside upstream --fit expert; the MoE at 4 GB beside --fit
    # expert and --n-cpu-moe; then a 16K-context row for the cost model. PEERS6_KV=q8-allowed
    # lets the planner choose q8_0 KV (run 6 did; f16 is the default since)
    pb --budgets 2,4,8 --cases 1024:1152 --strategies ours --save-plan "$sp" --tag slack \
      --kv "${PEERS6_KV:-f16}"
    up --budgets 2,4,8 --peers fit-expert
    if have 240; then
      moe --tag moe
      UPM=/tmp/igi-bench/qwen3-30b-a3b.gguf up --budgets 4 --peers fit-expert,ncmoe-best
    fi
    have 100 && pb --budgets 4 --cases 4096:16384 --strategies ours --tag ctx16k
  fi
  cp /tmp/igi-bench/profile.json "$out/profile.json" 2>/dev/null
  echo "done at $SECONDS s"
fi
if [ "$part" = shipped ] || [ "$part" = busy ]; then
  # shipped: the sidecar as shipped (threads and waits chosen while running: --threads 0) beside
  # upstream llama-bench --fit tuned by an expert, same VRAM, same run: the dense 8B at 2, 4 and
  # 8 GB, the 30B-A3B MoE at 4 GB (also beside --n-cpu-moe), 1K prompt + 128 tokens at
  # llama-bench's context; NOOMP=1 adds ours with llama.cpp's CPU backend without OpenMP.
  # busy: BUSY (default nproc - 2) CPUs spinning in other processes, the MoE at 4 GB: as shipped
  # (both builds) beside fixed policies (all threads sleeping / spinning, 2 threads).
  END=${END:-575}
  m=/tmp/igi-bench/llama3-8b.gguf; moe_m=/tmp/igi-bench/qwen3-30b-a3b.gguf
  have() { [ $(( END - SECONDS )) -gt "$1" ]; }
  # measured here unless a complete one was carried: a profile taken before the profile timed
  # decode overheads reads them as 0 and prices every CPU op as free, one before it timed the
  # GPU's prefill work prices a prefill a fifth short (docs/benchmarks.md, "Which profile
  # planned these rows"); at the thread count the rows decode with on this idle host (nproc - 1,
  # the controller's ceiling), not every CPU's (the CPU's weights timed faster than the engine
  # reads them) nor the product's default (threads_for: half the CPUs, a busy game assumed)
  if ! python3 -c "import json, sys; d = json.load(open('/tmp/igi-bench/profile.json'))
g = d.get('gpu') or {}
sys.exit(0 if d['cpu'].get('layer_overhead_s') and g.get('layer_overhead_s')
         and g.get('prefill_token_layer_s') else 1)" 2>/dev/null; then
    python3 -c "from igi_sdk.tuning.measure import load_or_measure as m
open('/tmp/igi-bench/profile.json', 'w').write(m(threads=$(( t - 1 )), fast=True).model_dump_json())" \
      > "$out/profile.txt" 2>&1
  fi
  cp /tmp/igi-bench/profile.json "$out/profile.json" 2>/dev/null  # what the predictions used
  row() {  # row TAG ENV... -- planner_bench args
    local tag=$1; shift; local envs=(); while [ "$1" != -- ]; do envs+=("$1"); shift; done; shift
    have 45 || { echo "skipped $tag $*: no time" | tee -a "$out/$part.txt"; return; }
    env "${envs[@]}" python3 benchmarks/planner_bench.py --threads 0 --timeout 150 \
      --json "$out/planner.json" --profile /tmp/igi-bench/profile.json --strategies ours \
      --tag "$tag" "$@" 2>&1 | grep -v "^{" | grep -v "^$" | tee -a "$out/$part.txt"; }
  up() { have 45 || { echo "skipped peers $*: no time"; return; }
         python3 benchmarks/upstream_peers.py --threads "$t" \
           --deadline $(( $(date +%s) + END - SECONDS )) --json "$out/peers.json" "$@" 2>&1 \
           | tee -a "$out/$part.txt"; }
  # SPINS: the spin counts of the spin rows (libgomp's own default, unset policy: 300000), each
  # tagged TAG-spin (20000) or TAG-spinN
  spin_rows() {  # spin_rows TAG -- planner_bench args
    local tag=$1; shift 2; local n
    for n in ${SPINS:-20000}; do
      row "$tag-spin$([ "$n" = 20000 ] || echo "$n")" GOMP_SPINCOUNT="$n" -- "$@"
    done; }
  noomp=(PYTHONPATH=/tmp/site-noomp:/tmp/site:$PWD LD_LIBRARY_PATH=/tmp/site-noomp/llama_cpp/lib)
  if [ "$part" = shipped ]; then
    if [ "${SHIPPED_MOE_FIRST:-0}" = 1 ] && have 200; then
      row shipped -- --models qwen3-30b-a3b --budgets 4 --cases 1024:1152
      [ -f /tmp/site-noomp/.ready ] && row shipped-noomp "${noomp[@]}" -- --models qwen3-30b-a3b \
        --budgets 4 --cases 1024:1152
      # SHIPPED_SPIN=1: the OpenMP build with a bounded spin, threads chosen while running
      [ "${SHIPPED_SPIN:-0}" = 1 ] && spin_rows shipped -- --models qwen3-30b-a3b --budgets 4 \
        --cases 1024:1152
      up --model "$moe_m" --budgets 4 --peers ${MOE_PEERS:-fit-expert,ncmoe-best} --tag shipped
      # PEER_T=N: the expert again at N threads (ours runs at most nproc - 1: the game's core);
      # OURS_T=N: ours again at a fixed N threads
      [ -n "${PEER_T:-}" ] && up --model "$moe_m" --budgets 4 --peers fit-expert \
        --tag "shipped-t$PEER_T" --threads "$PEER_T"
      [ -n "${OURS_T:-}" ] && row "shipped-t$OURS_T" -- --models qwen3-30b-a3b --budgets 4 \
        --cases 1024:1152 --threads "$OURS_T"
      # MOE_REPS=N: N more rounds of ours and the best peer alternating (tagged rep1..repN): one
      # configuration's MoE decode spread 38-43 tok/s within a call, as wide as the gap
      for r in $(seq 1 "${MOE_REPS:-0}"); do
        row "rep$r" -- --models qwen3-30b-a3b --budgets 4 --cases 1024:1152
        up --model "$moe_m" --budgets 4 --peers "${MOE_REP_PEER:-fit-expert}" --tag "rep$r"
      done
    fi
    for gb in ${SHIPPED_BUDGETS:-4 2 8}; do
      row shipped -- --models llama3-8b --budgets "$gb" --cases 1024:1152
      up --model "$m" --budgets "$gb" --peers fit-expert --tag shipped
      # SHIPPED_STOCK=1: ours again with the plan a stock scheduler gets (no pipelined decode)
      [ "${SHIPPED_STOCK:-0}" = 1 ] && row shipped-stock -- --models llama3-8b --budgets "$gb" \
        --cases 1024:1152 --no-pipeline
      [ -f /tmp/site-noomp/.ready ] && row shipped-noomp "${noomp[@]}" -- --models llama3-8b \
        --budgets "$gb" --cases 1024:1152
      [ "${SHIPPED_SPIN:-0}" = 1 ] && spin_rows shipped -- --models llama3-8b --budgets "$gb" \
        --cases 1024:1152
      # SHIPPED_IN_TURN=1: ours again with each step prepared after the last token was taken
      [ "${SHIPPED_IN_TURN:-0}" = 1 ] && row shipped-in-turn -- --models llama3-8b \
        --budgets "$gb" --cases 1024:1152 --launch-ahead off
    done
    # SHIPPED_MOE=0: the dense rows alone
    if [ "${SHIPPED_MOE_FIRST:-0}" != 1 ] && [ "${SHIPPED_MOE:-1}" = 1 ] && have 200; then
      row shipped -- --models qwen3-30b-a3b --budgets 4 --cases 1024:1152
      [ -f /tmp/site-noomp/.ready ] && row shipped-noomp "${noomp[@]}" -- --models qwen3-30b-a3b \
        --budgets 4 --cases 1024:1152
      up --model "$moe_m" --budgets 4 --peers fit-expert,ncmoe-best --tag shipped
    fi
  fi
  if [ "$part" = busy ]; then
    [ -f "$moe_m" ] || python3 benchmarks/make_synthetic.py qwen3-30b-a3b "$moe_m" --quiet
    mo=(--models qwen3-30b-a3b --budgets 4 --cases 1024:1152)
    if [ -n "${BUSY_GAME:-}" ]; then
      # BUSY_GAME=W: a game of W frame workers (60 Hz, GAME_DUTY of each frame, default half)
      # instead of spinning processes, started anew beside each row; what each row cost the
      # game's frames lands in frames-TAG.json (benchmarks/game_frames.py), the game alone first
      gf=(python3 benchmarks/game_frames.py --workers "$BUSY_GAME" --duty "${GAME_DUTY:-0.5}")
      echo "a game of $BUSY_GAME frame workers beside each row" | tee -a "$out/$part.txt"
      "${gf[@]}" --seconds 10 --json "$out/frames-alone.json" | tee -a "$out/$part.txt"
      game_row() {  # game_row TAG ENV... -- planner_bench args
        "${gf[@]}" --seconds 400 --json "$out/frames-$1.json" >> "$out/$part.txt" &
        local g=$!; sleep 1; row "$@"; kill -TERM "$g"; wait "$g"; }
      game_row game-shipped -- "${mo[@]}"
      for n in ${SPINS:-}; do game_row "game-spin$n" GOMP_SPINCOUNT="$n" -- "${mo[@]}"; done
      game_row game-passive OMP_WAIT_POLICY=PASSIVE -- "${mo[@]}"
      tail -n 3 "$out/$part.txt"
      echo "done at $SECONDS s"; BUSY_ROWS=none
    else
      busy=${BUSY:-$(( t - 2 ))}
      for i in $(seq "$busy"); do timeout $(( END - SECONDS )) sh -c 'while :; do :; done' & done
      echo "$busy CPUs of $t spinning in other processes" | tee -a "$out/$part.txt"
    fi
    # BUSY_ROWS: which rows (default all; the 16-thread spinning one collapses to a timeout)
    want() { [ -z "${BUSY_ROWS:-}" ] || [[ ",$BUSY_ROWS," == *",$1,"* ]]; }
    want shipped && row busy-shipped -- "${mo[@]}"
    want shipped-noomp && [ -f /tmp/site-noomp/.ready ] && row busy-shipped-noomp "${noomp[@]}" -- "${mo[@]}"
    # a bounded spin in the OpenMP build with the thread count still chosen while running
    # (its ceiling from the others' runnable threads): a candidate default
    want shipped-spin && spin_rows busy-shipped -- "${mo[@]}"
    want all-passive && row "busy-fixed-${t}t-passive" OMP_WAIT_POLICY=PASSIVE -- "${mo[@]}" --threads "$t"
    want all-active && row "busy-fixed-${t}t-active" OMP_WAIT_POLICY=ACTIVE -- "${mo[@]}" --threads "$t"
    want 2-passive && row busy-fixed-2t-passive OMP_WAIT_POLICY=PASSIVE -- "${mo[@]}" --threads 2
    want 2-active && row busy-fixed-2t-active OMP_WAIT_POLICY=ACTIVE -- "${mo[@]}" --threads 2
    kill $(jobs -p) 2>/dev/null
  fi
  echo "done at $SECONDS s"
fi
if [ "$part" = moe-placement ]; then
  # the MoE at 4 GB, ours against upstream at the same placement: llama-bench's decode (128
  # tokens at depth 1024) with -ncmoe 42 (the first 42 layers' experts in host memory: the
  # planner's placement of that budget, six layers of experts on the GPU) beside the expert's
  # -ncmoe 44, and ours as shipped (planner_bench), PLACE_REPS rounds alternating: whether the
  # gap is the placement or the runtime that drives it
  END=${END:-570}
  moe_m=/tmp/igi-bench/qwen3-30b-a3b.gguf; lb=/tmp/lcpp/build/bin/llama-bench
  [ -f "$moe_m" ] || timeout 300 python3 benchmarks/make_synthetic.py qwen3-30b-a3b "$moe_m" --quiet
  [ -f /tmp/igi-bench/profile.json ] \
    || cp "${PLACE_PROFILE:-benchmarks/results/h200-profile-16t-2026-11-30-p.json}" \
      /tmp/igi-bench/profile.json
  # PLACE_SWEEP="0,8,...,48": upstream's decode as more layers' experts go to host memory
  # (-ncmoe), depth 0: the cost of a layer's experts on the CPU (the slope) and of the rest
  # (all experts on the GPU), beside the cost model's (benchmarks/expert_scale.py)
  if [ -n "${PLACE_SWEEP:-}" ]; then
    timeout 400 "$lb" -m "$moe_m" -ngl 99 -ncmoe "$PLACE_SWEEP" -lm none -fa on -ub 2048 -p 0 \
      -n 64 -r "${PLACE_SWEEP_REPS:-3}" -t "$t" -o jsonl 2>/dev/null | tee -a "$out/moe-sweep.jsonl"
  fi
  for r in $(seq 1 "${PLACE_REPS:-3}"); do
    # PLACE_REPACK="1,0": upstream with its extra CPU buffer types on (its default) and off
    [ $(( END - SECONDS )) -gt 60 ] || break
    timeout 150 "$lb" -m "$moe_m" -ngl 99 -ncmoe 44,42 --repack "${PLACE_REPACK:-1}" -lm none \
      -fa on -ub 2048 -p 0 -n 128 -d 1024 -r 1 -t "$t" -o jsonl 2>/dev/null \
      | tee -a "$out/moe-placement-lb.jsonl"
    [ $(( END - SECONDS )) -gt 70 ] || break
    python3 benchmarks/planner_bench.py --threads 0 --timeout 120 \
      --json "$out/moe-placement.json" --profile /tmp/igi-bench/profile.json \
      --strategies ours --tag "rep$r" --models qwen3-30b-a3b --budgets 4 --cases 1024:1152 \
      --turns "${PLACE_TURNS:-1}" \
      --save-plan /tmp/igi-bench/moe-plan.json 2>&1 | grep -v "^{" | grep -v "^$" \
      | tee -a "$out/moe-placement.txt"
    # PLACE_PLAN_CASES="64:1152@0 1024:1152@16 1024:1152@0@no-pin": that plan again
    # (planner_bench --plan-file) at another prompt:ctx case and thread count (@0: the
    # engine's choice), and with a planner_bench flag (@n-batch=512: one with a value);
    # PLACE_TURNS=N: N turns in each planner_bench process (the later ones beside the first)
    for pc in ${PLACE_PLAN_CASES:-}; do
      [ $(( END - SECONDS )) -gt 70 ] || break
      IFS=@ read -r pcase pth pflag <<< "$pc"
      python3 benchmarks/planner_bench.py --threads "$pth" --timeout 120 \
        --json "$out/moe-placement.json" --profile /tmp/igi-bench/profile.json \
        --strategies ours --tag "rep$r-plan-$pcase-t$pth${pflag:+-$pflag}" \
        --models qwen3-30b-a3b --budgets 4 --cases "$pcase" --turns "${PLACE_TURNS:-1}" \
        --plan-file /tmp/igi-bench/moe-plan.json ${pflag:+--$pflag} 2>&1 \
        | grep -v "^{" | grep -v "^$" | tee -a "$out/moe-placement.txt"
    done
  done
  # PLACE_HOST=1: then that plan driven by a bare llama_decode loop in Python
  # (host_overhead.py --plan-file), with llama-bench's context settings and with the engine's,
  # and the engine alone, at all the cores and at the engine's own choice; each in a process of
  # its own (two threads' OpenMP teams in one process throttle libgomp's spin for both), beside
  # upstream at that placement with all the cores and one fewer, at depth 0 and 1024: the
  # Python loop, the context's settings, the thread count or the engine
  if [ "${PLACE_HOST:-0}" = 1 ] && [ -f /tmp/igi-bench/moe-plan.json ]; then
    timeout 150 "$lb" -m "$moe_m" -ngl 99 -ncmoe 42 -lm none -fa on -ub 2048 -p 0 -n 128 \
      -d 0,1024 -r 1 -t "$t,$(( t - 1 ))" -o jsonl 2>/dev/null | tee -a "$out/moe-placement-lb.jsonl"
    # PLACE_HOST_ROWS: context:rows:threads[:stream-every-ms] (0 threads: the engine's choice)
    for row in ${PLACE_HOST_ROWS:-llama-bench:decode,argmax:$t engine:decode,argmax:$t \
                engine:engine:$t engine:engine:0}; do
      IFS=: read -r c rows th ms <<< "$row"
      [ $(( END - SECONDS )) -gt 60 ] || break
      echo "context $c, rows $rows, threads $th, stream every ${ms:-0} ms" \
        | tee -a "$out/moe-placement.txt"
      timeout 120 python3 benchmarks/host_overhead.py --model "$moe_m" \
        --plan-file /tmp/igi-bench/moe-plan.json --context "$c" --threads "$th" --ctx 1152 \
        --tokens 128 --rounds "${PLACE_HOST_ROUNDS:-3}" --modes "$rows" \
        --stream-every-ms "${ms:-0}" --json "$out/moe-host-$c-${rows%%,*}-t$th-s${ms:-0}.json" 2>&1 \
        | grep -v "^{" | tee -a "$out/moe-placement.txt"
    done
  fi
fi
if [ "$part" = log-cost ]; then
  # what llama.cpp's log callback costs a decode (benchmarks/log_callback_cost.py: turns
  # alternating the SDK's Python callback, a native one that drops the line, and one that
  # counts the lines): the MoE at its 4 GB plan (LOG_MOE_PLAN, a saved plan), the dense 8B at
  # 4 GB (planned here from LOG_PROFILE) and all in VRAM, each beside upstream's decode
  END=${END:-570}
  moe_m=/tmp/igi-bench/qwen3-30b-a3b.gguf; m=/tmp/igi-bench/llama3-8b.gguf
  lb=/tmp/lcpp/build/bin/llama-bench
  lc() { [ $(( END - SECONDS )) -gt 60 ] || { echo "skipped $1: no time"; return; }
         local tag=$1; shift
         timeout 200 python3 benchmarks/log_callback_cost.py --rounds "${LOG_ROUNDS:-3}" \
           --json "$out/log-$tag.json" "$@" 2>&1 | grep "^round" | sed "s/^/$tag /" \
           | tee -a "$out/log-cost.txt"; }
  [ -f "$moe_m" ] || timeout 300 python3 benchmarks/make_synthetic.py qwen3-30b-a3b "$moe_m" --quiet
  [ -f "$m" ] || timeout 200 python3 benchmarks/make_synthetic.py llama3-8b "$m" --quiet
  lc moe4 --model "$moe_m" --plan-file "${LOG_MOE_PLAN:-.gpu/plans/ours-p.json}"
  timeout 120 "$lb" -m "$moe_m" -ngl 99 -ncmoe 42 -lm none -fa on -ub 2048 -p 0 -n 128 -d 1024 \
    -r 1 -t "$t,$(( t - 1 ))" -o jsonl 2>/dev/null | tee -a "$out/log-cost-lb.jsonl"
  lc full8b --model "$m"
  timeout 60 "$lb" -m "$m" -ngl 99 -lm none -fa on -ub 2048 -p 0 -n 128 -d 1024 -r 2 -t "$t" \
    -o jsonl 2>/dev/null | tee -a "$out/log-cost-lb.jsonl"
  cp "${LOG_PROFILE:-benchmarks/results/h200-profile-16t-2026-11-30-p.json}" \
    /tmp/igi-bench/profile.json
  timeout 150 python3 benchmarks/planner_bench.py --threads 0 --timeout 120 \
    --json "$out/log-planner.json" --profile /tmp/igi-bench/profile.json --strategies ours \
    --models llama3-8b --budgets 4 --cases 1024:1152 --save-plan /tmp/igi-bench/dense4.json \
    2>&1 | grep -v "^{" | grep -v "^$" | tee -a "$out/log-cost.txt"
  [ -f /tmp/igi-bench/dense4.json ] && lc dense4 --model "$m" --plan-file /tmp/igi-bench/dense4.json
  echo "done at $SECONDS s"
fi
if [ "$part" = prefill-probe ]; then
  # what the cost model leaves unpriced in a prefill (benchmarks/stream_probe.py): a profile
  # measured here, then Llama-3-8B's and Qwen3-30B-A3B's first N layers, streamed and all in
  # VRAM, priced with it; then ours (planner_bench) on that profile, the plans kept, so the
  # TTFT each predicts can be set beside the measured one
  END=${END:-570}
  have() { [ $(( END - SECONDS )) -gt "$1" ]; }
  # (at the thread count the rows decode with on this idle host: nproc - 1)
  timeout 300 python3 -c "from igi_sdk.tuning.measure import measure_profile as m
open('/tmp/igi-bench/profile.json', 'w').write(m(threads=$(( t - 1 )), fast=True).model_dump_json())" \
    > "$out/profile.txt" 2>&1 && cp /tmp/igi-bench/profile.json "$out/profile.json"
  # PROBE_TOKENS="": no probes, the rows only
  for tk in ${PROBE_TOKENS-512 1024}; do
    have 200 || break
    timeout 200 python3 benchmarks/stream_probe.py --layers "${PROBE_LAYERS:-2,4,8}" \
      --presets llama3-8b,qwen3-30b-a3b --modes streamed,gpu --tokens "$tk" --threads "$t" \
      --profile /tmp/igi-bench/profile.json --json "$out/probe-$tk.json" 2>&1 | cut -c1-400 \
      | tee -a "$out/probe.txt"
  done
  mkdir -p "$out/plans"
  for spec in ${PROBE_ROWS:-llama3-8b@8 llama3-8b@2 qwen3-30b-a3b@4 llama3-8b@4}; do
    have 70 || break
    IFS=@ read -r model gb <<< "$spec"
    timeout 150 python3 benchmarks/planner_bench.py --threads 0 --timeout 140 \
      --json "$out/planner.json" --profile /tmp/igi-bench/profile.json --strategies ours \
      --models "$model" --budgets "$gb" --cases 1024:1152 \
      --save-plan "$out/plans/$model-{budget}.json" 2>&1 | grep -v "^{" | grep -v "^$" \
      | tee -a "$out/probe.txt"
  done
  echo "done at $SECONDS s"
fi
if [ "$part" = stream-decode ]; then
  # pipelined decode (igi_sdk/bundle/patches/ggml-stream-prefetch.patch): CPU-resident FFN
  # weights named in GGML_SCHED_STREAM_WEIGHTS computed on the GPU at every batch, copied from
  # pinned memory while the CPU computes the FFN before them. The synthetic 8B on a plan with
  # every FFN on the CPU (2 GB), host_overhead's greedy decode on that placement, one process
  # per variant: none streamed, every second / third / two of three / every layer streamed,
  # with the prefetch and without; upstream's llama-bench with the same FFNs on the CPU on the
  # patched library, with and without streaming.
  END=${END:-570}
  have() { [ $(( END - SECONDS )) -gt "$1" ]; }
  log="$out/stream.txt"
  python3 -c "from igi_sdk.runtime._native import streams_weights as s; assert s()" \
    || { echo "no pipelined scheduler (see pipeline.txt): stopping" | tee -a "$log"; exit 1; }
  m=/tmp/igi-bench/llama3-8b.gguf
  [ -f "$m" ] || timeout 300 python3 benchmarks/make_synthetic.py llama3-8b "$m" --quiet
  prof=${STREAM_PROFILE:-benchmarks/results/h200-prefill-probe-2026-11-30-ak-profile.json}
  plan=/tmp/igi-bench/plan-stream.json
  python3 -m igi_sdk.cli plan "$m" --vram "${STREAM_VRAM:-2GB}" --ctx 1152 --profile "$prof" \
    --json "$plan" 2>&1 | sed -n '1,4p;/^chosen/p' | tee -a "$log"
  cp "$plan" "$out/plan-stream.json"
  names() {  # the FFN weights of the layers i with i % $1 in $2 (a python set literal)
    python3 -c "print(','.join(f'blk.{i}.ffn_{w}.weight' for i in range(32) if i % $1 in $2 for w in ('gate', 'up', 'down')))"; }
  peak() {  # the device's most used memory (MiB) while "$@" runs
    nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -lms 100 > /tmp/smi.txt &
    local p=$!; "$@"; local rc=$?; kill $p 2>/dev/null; wait $p 2>/dev/null
    echo "peak MiB $(sort -n /tmp/smi.txt | tail -1)" | tee -a "$log"; return $rc; }
  for v in ${STREAM_VARIANTS:-none odd odd-noprefetch third twothirds all}; do
    have 45 || break
    case $v in
      none) sw="";; odd|odd-noprefetch|odd-prefetch-sync) sw=$(names 2 "{1}");; third) sw=$(names 3 "{2}");;
      twothirds) sw=$(names 3 "{1,2}");; all) sw=$(names 1 "{0}");;
    esac
    pf=1; [ "$v" = odd-noprefetch ] && pf=0; [ "$v" = odd-prefetch-sync ] && pf=2
    echo "== $v (prefetch $pf, $(echo "$sw" | tr ',' '\n' | grep -c weight) weights streamed)" | tee -a "$log"
    GGML_SCHED_STREAM_WEIGHTS="$sw" GGML_SCHED_PREFETCH=$pf peak timeout 120 \
      python3 benchmarks/host_overhead.py --model "$m" --plan-file "$plan" --context engine \
      --modes argmax --threads $(( t - 1 )) --ctx 1152 --tokens "${STREAM_TOKENS:-64}" \
      --rounds 3 --json "$out/stream-$v.json" 2>&1 | grep -E "^round|rror|Traceback" \
      | tail -6 | tee -a "$log"
    python3 -c "import json; d = json.load(open('$out/stream-$v.json')); print('median ms', d['median_ms'], 'tokens', d['greedy_tokens']['argmax'])" 2>&1 | tee -a "$log"
  done
  lb=/tmp/lcpp/build/bin/llama-bench
  for v in none odd; do
    have 40 || break
    sw=""; [ "$v" = odd ] && sw=$(names 2 "{1}")
    echo "== llama-bench $v" | tee -a "$log"
    GGML_SCHED_PREFETCH=1 GGML_SCHED_STREAM_WEIGHTS="$sw" peak timeout 100 $lb -m "$m" -ngl 99 \
      -ot "blk\.[0-9]+\.ffn_(gate|up|down)\.weight=CPU" -lm none -fa on -p 0 -n 64 -r 3 \
      -t $(( t - 1 )) -o jsonl 2>/dev/null | tee -a "$out/stream-lb.jsonl" \
      | python3 -c "import json,sys; [print(r['n_gen'], round(r['avg_ts'], 2), 'tok/s') for r in map(json.loads, sys.stdin)]" \
      | tee -a "$log"
  done
  echo "done at $SECONDS s" | tee -a "$log"
fi
if [ "$part" = host ]; then
  # host: where an all-GPU decode step's time goes outside the model's compute
  # (benchmarks/host_overhead.py): llama_decode alone, + a numpy argmax, + llama.cpp's host
  # sampler, + backend (in-graph) greedy sampling, igi_sdk's engine, and upstream llama-bench's
  # tg; the synthetic 8B, every layer on the GPU; HOST_MODELS adds others (presets)
  for p in llama3-8b ${HOST_MODELS:-}; do
    hm=/tmp/igi-bench/$p.gguf
    [ -f "$hm" ] || timeout 300 python3 benchmarks/make_synthetic.py "$p" "$hm" --quiet
    # HOST_ONE=0: without the one-sequence rows (engine and llama-bench included)
    [ "${HOST_ONE:-1}" = 1 ] && timeout 280 python3 benchmarks/host_overhead.py --model "$hm" \
      --ngl 99 --threads $(( t - 1 )) --ctx 4096 --tokens 128 --rounds "${HOST_ROUNDS:-5}" \
      --llama-bench /tmp/lcpp/build/bin/llama-bench --json "$out/host-$p.json" 2>&1 \
      | tee -a "$out/host.txt"
    # HOST_SEQS="1 4 16": the llama.cpp rows with that many sequences decoding together (many
    # NPCs: every step reads and picks N logits rows)
    for n in ${HOST_SEQS:-}; do
      timeout 200 python3 benchmarks/host_overhead.py --model "$hm" --ngl 99 \
        --threads $(( t - 1 )) --ctx 4096 --tokens 128 --rounds "${HOST_ROUNDS:-5}" --seqs "$n" \
        --modes decode,argmax,sampler,backend --json "$out/host-$p-seqs$n.json" 2>&1 \
        | tee -a "$out/host.txt"
    done
  done
fi
if [ "$part" = spec ]; then
  # speculative decoding's mechanism: decode tok/s vs forced acceptance, a synthetic 16-layer
  # draft (1024 wide, 0.2 GB) of the target's vocabulary on the GPU, beside upstream --fit
  # expert at the same budget (GB) and the same turn (1K prompt, 128 tokens at depth 1K)
  END=${END:-575}
  m=/tmp/igi-bench/llama3-8b.gguf; d=/tmp/igi-bench/llama3-draft.gguf
  [ -f "$m" ] || python3 benchmarks/make_synthetic.py llama3-8b "$m" --quiet | tee "$out/spec.txt"
  python3 -c "from igi_sdk.model import spec_with, write_synthetic_gguf as w; w('$d', spec_with(
    'llama3-8b', n_layers=16, n_embd=1024, n_head=16, n_head_kv=8, n_ff=4096))"
  # a carried profile of this machine kind, else one measured here (about a minute)
  sprof=.gpu/profile.json
  if [ ! -f "$sprof" ]; then
    sprof=/tmp/igi-bench/profile.json
    [ -f "$sprof" ] || python3 -c "from igi_sdk.tuning.measure import load_or_measure as m
open('$sprof', 'w').write(m(threads=$t, fast=True).model_dump_json())" >> "$out/spec.txt" 2>&1
  fi
  # SPEC_ALPHAS: the forced acceptance rates (e.g. a real pair's measured α)
  for gb in ${SPEC_BUDGETS:-4 2}; do
    [ $(( END - SECONDS )) -gt 90 ] || { echo "skipped ${gb} GB: no time" | tee -a "$out/spec.txt"; continue; }
    timeout $(( END - SECONDS )) python3 benchmarks/speculative_bench.py --target "$m" --draft "$d" \
      --profile "$sprof" --budget-gb "$gb" --ctx "${SPEC_CTX:-2048}" --threads "$t" \
      --alphas "${SPEC_ALPHAS:-0.5,0.6,0.7,0.8,0.9}" \
      --json "$out/spec-${gb}gb.json" 2>&1 | grep -v "^llama_context" | tee -a "$out/spec.txt"
    [ $(( END - SECONDS )) -gt 60 ] && python3 benchmarks/upstream_peers.py --model "$m" \
      --threads "$t" --budgets "$gb" --peers fit-expert --deadline $(( $(date +%s) + END - SECONDS )) \
      --json "$out/spec-peers.json" 2>&1 | tee -a "$out/spec.txt"
  done
  echo "done at $SECONDS s"
fi
if [ "$part" = vlm ]; then
  # image chat within a VRAM budget (docs/vlm.md): the synthetic Qwen2.5-VL-7B pair (Q4_0 LM,
  # F16 tower, zero weights), images at 1080p, 720p, 1440p, 480p and budgets 8, 4, 14.5 GB,
  # naive / upstream-defaults / ours, one process each; rows that cannot start in time skipped
  END=${END:-575}
  # VLM_ARGS: e.g. "--configs ours,paper-baseline --budgets 4 --gen 100"
  # shellcheck disable=SC2086
  python3 benchmarks/vlm_bench.py --profile .gpu/profile.json --threads "$t" --timeout 90 ${VLM_ARGS:-} \
    --deadline $(( $(date +%s) + END - SECONDS )) --json "$out/vlm.json" 2>&1 \
    | grep -v "^llama_context" | tee "$out/vlm.txt"
  echo "done at $SECONDS s"
fi
if [ "$part" = bundle ]; then
  # the CUDA bundle built here, moved, run with an empty environment, its chat speed beside
  # the development install's (benchmarks/bundle_gpu.sh; END counts from this call's start)
  END=$(( ${END:-570} - SECONDS )) bash benchmarks/bundle_gpu.sh "$out"
fi
if [ "$part" = npcs ]; then
  # many NPCs at once (benchmarks/many_npcs.py): 4 and 16 sessions of the synthetic 8B, each its
  # own 300-1000-token prompt, all sent together, 128 tokens each; ours as shipped against
  # upstream llama-server --parallel N at our NVML peak (--fit, else the best -ngl). One budget
  # per call: NPCS_BUDGETS=4 (default), 8 or full (all on the GPU, llama-server -ngl 99).
  # END: seconds into this call (the build included) by which it must be done.
  END=${END:-580}
  log="$out/npcs.txt"; m=/tmp/igi-bench/llama3-8b.gguf
  echo "part npcs from $SECONDS s" | tee -a "$log"
  ( [ -f "$m" ] || timeout 200 python3 benchmarks/make_synthetic.py llama3-8b "$m" --quiet ) \
    > /tmp/igi-bench/make-npcs.txt 2>&1 &
  mk=$!
  srv=/tmp/lcpp/build/bin/llama-server
  if [ ! -x "$srv" ] && [ -f /tmp/lcpp/CMakeLists.txt ]; then
    timeout 240 bash benchmarks/build_llama_server.sh /tmp/lcpp /tmp/lcpp/build 2>&1 | tee -a "$log"
    # PACK_BUILD=1: the build packed again, the server in it, for later calls to carry
    [ -x "$srv" ] && [ "${PACK_BUILD:-0}" = 1 ] && pack_build 2>&1 | tee -a "$log"
  fi
  [ -x "$srv" ] || echo "no llama-server: the NPC rows run without their peer" | tee -a "$log"
  wait "$mk"; cat /tmp/igi-bench/make-npcs.txt >> "$log"
  prof=.gpu/profile.json
  if [ ! -f "$prof" ]; then
    prof=benchmarks/results/h100-run10-profile.json
    grep -q H200 "$out/gpu.txt" && prof=benchmarks/results/h200-profile-16t-v6b.json
  fi
  left=$(( END - SECONDS ))
  echo "model ready at $SECONDS s; profile $prof; $left s left" | tee -a "$log"
  # the run's own deadline comes 15 s before this timeout: it stops its servers and writes
  # NPCS_SERVE: more `serve` arguments for ours (e.g. "--talking 16 --no-arbiter");
  # NPCS_NO_PEER=1: ours alone (a variant beside a peer row of an earlier run in this call)
  # NPCS_TALKING=1: ours told that all N talk at once (serve --talking N)
  # NPCS_PEER_ARGS: more llama-server arguments (a later -ub overrides the expert's 2048)
  # NPCS_WATCH_S: how often ours is asked for its last step (engine_samples; 0.05 for 8 GB rows)
  peer=(--llama-server "$srv" --peer-args "${NPCS_PEER_ARGS:-}"); [ "${NPCS_NO_PEER:-0}" = 1 ] && peer=()
  [ "${NPCS_TALKING:-0}" = 1 ] && peer+=(--talking-all)
  # shellcheck disable=SC2086
  timeout -k 15 "$left" python3 benchmarks/many_npcs.py --model "$m" \
    --budgets "${NPCS_BUDGETS:-4}" --npcs "${NPCS_N:-4,16}" --tokens 128 --threads "$t" \
    "${peer[@]}" --peer-placement "${NPCS_PEER:-auto}" --profile "$prof" \
    --watch-every-s "${NPCS_WATCH_S:-1}" \
    --deadline $(( $(date +%s) + left - 15 )) --out "$out" -- ${NPCS_SERVE:-} 2>&1 \
    | grep -v "^llama_context" | tee -a "$log"
  echo "part npcs done at $SECONDS s" | tee -a "$log"
fi
if [ "${PACK_RESULTS:-0}" = 1 ]; then  # few files back from a device call: one archive
  (cd "$out" && tar -czf /tmp/results.tgz --exclude='bld.tar.*' . && \
    find . -mindepth 1 -not -name 'bld.tar.*' -delete && mv /tmp/results.tgz results.tgz)
fi
