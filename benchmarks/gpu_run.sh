#!/usr/bin/env bash
# Reproduces docs/benchmarks.md on an NVIDIA machine with no internet:
#   copy ../shared/gpu (pruned llama-cpp-python sdist + build-cuda.sh + wheels) to .gpu/, then
#   bash benchmarks/gpu_run.sh OUTDIR [part]
#   part: placement | planner-a | planner-b | final | final2 | native-order | arbiter | greedy |
#         dense-moe | matrix-a | matrix-b | matrix-c | all
#   (each fits one 10-minute device call)
set -uo pipefail
out=${1:-${OUT:-/tmp/igi-out}}
part=${2:-all}
mkdir -p "$out" /tmp/igi-bench
bash .gpu/build-cuda.sh .gpu > "$out/build.txt" 2>&1 || { tail -20 "$out/build.txt"; exit 1; }
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
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
