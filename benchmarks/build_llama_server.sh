#!/usr/bin/env bash
# Upstream llama.cpp's `llama-server` from the vendored source, for benchmarks that run it as a
# peer of the sidecar's OpenAI-compatible face.
#
#   bash benchmarks/build_llama_server.sh SRC BUILD [cmake -D options...]
#
# SRC is a llama.cpp tree (the vendored one of llama-cpp-python's sdist), BUILD its CMake build
# folder: an existing CUDA build (build-cuda-cmake.sh's /tmp/lcpp/build) is reconfigured with
# the server on and only the server's targets are compiled; a new folder is configured with the
# options given (e.g. -DGGML_CUDA=OFF for a CPU build). The pruned sdist lacks the web UI's
# sources (tools/ui), so an empty UI (no assets: the API only) is put in their place.
set -euo pipefail
src=${1:?SRC}; bld=${2:?BUILD}; shift 2
if [ ! -f "$src/tools/ui/CMakeLists.txt" ]; then
  mkdir -p "$src/tools/ui"
  cat > "$src/tools/ui/CMakeLists.txt" <<'EOF'
# No web UI: an empty asset table with the interface the server links against.
set(UI_H "${CMAKE_CURRENT_BINARY_DIR}/ui.h")
set(UI_CPP "${CMAKE_CURRENT_BINARY_DIR}/ui.cpp")
file(WRITE "${UI_H}" "#pragma once
#include <cstddef>
#include <string>
#include <vector>
struct llama_ui_asset { std::string name; std::string type; std::string etag;
                        const unsigned char * data; size_t size; };
const std::vector<llama_ui_asset> & llama_ui_get_assets();
const llama_ui_asset * llama_ui_find_asset(const std::string & name);
bool llama_ui_use_gzip();
")
file(WRITE "${UI_CPP}" "#include \"ui.h\"
const std::vector<llama_ui_asset> & llama_ui_get_assets() {
    static const std::vector<llama_ui_asset> none; return none; }
const llama_ui_asset * llama_ui_find_asset(const std::string &) { return nullptr; }
bool llama_ui_use_gzip() { return false; }
")
add_custom_target(llama-ui-assets)
add_library(llama-ui STATIC "${UI_CPP}")
set_target_properties(llama-ui PROPERTIES POSITION_INDEPENDENT_CODE ON)
target_include_directories(llama-ui PUBLIC "${CMAKE_CURRENT_BINARY_DIR}")
EOF
fi
gen=(); [ -f "$bld/CMakeCache.txt" ] || { command -v ninja > /dev/null && gen=(-G Ninja); }
t0=$(date +%s)
cmake -S "$src" -B "$bld" "${gen[@]}" -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_APP=OFF "$@" > "$bld.server-cmake.log" 2>&1 \
  || { echo "build_llama_server: configure failed:"; tail -30 "$bld.server-cmake.log"; exit 1; }
cmake --build "$bld" --target llama-server -j"${JOBS:-$(nproc)}" > "$bld.server-build.log" 2>&1 \
  || { echo "build_llama_server: build failed:"; tail -40 "$bld.server-build.log"; exit 1; }
"$bld/bin/llama-server" --version 2>&1 | tail -2
echo "build_llama_server: $bld/bin/llama-server in $(( $(date +%s) - t0 )) s"
