#!/usr/bin/env bash
# Reproduces docs/benchmarks.md on an NVIDIA machine with no internet:
#   copy ../shared/gpu (pruned llama-cpp-python sdist + build-cuda.sh + wheels) to .gpu/, then
#   bash benchmarks/gpu_run.sh [OUTDIR]
set -uo pipefail
out=${1:-${OUT:-/tmp/igi-out}}
mkdir -p "$out"
bash .gpu/build-cuda.sh .gpu || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv | tee "$out/gpu.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$out/gpu.txt"
python3 benchmarks/import_order_probe.py 2>&1 | tee "$out/import_order.txt"
python3 benchmarks/placement_bench.py --preset llama3-8b --workdir /tmp/igi-bench \
  --plans attn-gpu,all-gpu,all-cpu --prompt-tokens 1024 --gen 128 --threads "$(nproc)" \
  --json "$out/placement.json" 2>&1 | tee "$out/placement.txt"
