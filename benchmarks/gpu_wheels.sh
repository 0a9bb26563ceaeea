#!/usr/bin/env bash
# The SDK's runtime dependencies that the GPU machines' image lacks (it has numpy, msgpack,
# psutil, Pillow, httpx, nvidia-ml-py; ../shared/gpu/wheels has pydantic, pyzmq, gguf), as
# wheels for its Python 3.12 on x86-64 Linux, into .gpu/wheels-extra for gpu_run.sh to install
# there (no index is reachable from those machines). Versions: this checkout's environment.
#
#   bash benchmarks/gpu_wheels.sh [PYTHON]
set -euo pipefail
py=${1:-.venv/bin/python}
dest=.gpu/wheels-extra
pkgs=(llguidance fastapi opentelemetry-api starlette uvicorn httptools uvloop platformdirs annotated-doc pynvml)
pins=()
for p in "${pkgs[@]}"; do
  v=$("$py" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$p")
  pins+=("$p==$v")
done
mkdir -p "$dest"
"$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_31_x86_64 --platform manylinux_2_28_x86_64 \
  --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any \
  -d "$dest" "${pins[@]}" 2>&1 | grep -v "^WARNING" || true
ls "$dest"
