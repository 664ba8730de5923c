#!/usr/bin/env bash
# Issues 14 and 15 (tensor parallelism on 2 / 4 real GPUs) in one device call:
#   bash scripts/gpu-tp.sh OUTDIR
# from the repository root on the GPU machine, with .device-deps carried.
# On a 1-GPU machine, a rehearsal of the same program on logical devices of
# GPU 0 (the figures then check the program, not the speedups):
#   AG_TP_SAME_GPU=2 bash scripts/gpu-tp.sh OUTDIR
# Environment: AG_TP_SMALL=1 uses the small layer (d 1024, T 256) and a 4-layer
# decode step, for a quick run; AG_TP_DECODE_LAYERS overrides the decode
# step's layers (32 by default: the LLaMA 7B shape).
#
# It configures through scripts/gpu-run.sh (configure step only), builds
# test_cuda and actorgraph-tp-bench, then:
#   1. the CUDA tensor-parallel and collective tests (tests/cuda:
#      CudaTensorParallel*, CudaCollectives*), every layout this machine has;
#   2. actorgraph-tp-bench --devices cuda:all: tpN_layer_speedup,
#      tpN_layer_ms, tpN_gpu_busy_fraction, tpN_sim_error,
#      tpN_decode_step_speedup, and the Chrome trace of the N-GPU layer run
#      (OUTDIR/tp-layer-trace.json);
#   3. actorgraph-tp-bench --allreduce over the N GPUs: allreduce_us_<size>_<path>
#      for the own one-shot path and NCCL, and the crossover the runtime picks;
#   4. scripts/torch_tp_layer.py --world-list 1,N (PyTorch, torch.distributed
#      with NCCL, Megatron split) and tpN_vs_torch = actorgraph's N-GPU layer
#      ms over PyTorch's;
#   5. the sim's tensor-parallel figures (tp_speedup_2_sim, tp_speedup_4_sim).
# Logs go to OUTDIR (tp-*.txt); the `name: value` lines are printed at the end.
# NCCL_NVLS_ENABLE=0 for every process (NVLink multicast stays off there).
set -uo pipefail
out="${1:?usage: gpu-tp.sh OUTDIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
build="${AG_BUILD_DIR:-$here/build-gpu}"
export NCCL_NVLS_ENABLE=0
same_gpu="${AG_TP_SAME_GPU:-}"
small="${AG_TP_SMALL:-}"

AG_GPU_RUN_STEPS=configure bash scripts/gpu-run.sh "$out" >"$out/tp-configure.txt" 2>&1 || {
  echo "configure failed (see $out/tp-configure.txt)"
  tail -20 "$out/tp-configure.txt"
  exit 1
}
prefix="$here/.device-deps/prefix"
libdir="$prefix/usr/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$libdir:$libdir/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

echo "== build (test_cuda actorgraph-tp-bench)"
if ! cmake --build "$build" -j "$(nproc)" --target test_cuda actorgraph-tp-bench >"$out/tp-build.txt" 2>&1; then
  grep -E "error|FAILED" "$out/tp-build.txt" | head -30
  exit 1
fi

gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
if [ -n "$same_gpu" ]; then
  n="$same_gpu"
  members="0"
  for ((k = 1; k < n; k++)); do members="$members,0"; done
  where="$n logical devices of GPU 0 (rehearsal: not a speedup)"
  bench_devices=(--devices cuda:all --same-gpu --degree "$n")
else
  n="$gpus"
  if [ "$n" -lt 2 ]; then
    echo "this machine has $n GPU(s); issues 14/15 need 2 or 4 (AG_TP_SAME_GPU=2 rehearses on one GPU)"
    exit 1
  fi
  members="$(seq -s, 0 $((n - 1)))"
  where="GPUs $members"
  bench_devices=(--devices cuda:all)
fi
echo "== $where ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $gpus GPU(s) on the machine)"
layer_flags=()
torch_flags=(--d 8192 --heads 64 --seq 2048 --batch 2 --variant llama)
decode_layers="${AG_TP_DECODE_LAYERS:-32}"
if [ -n "$small" ]; then
  layer_flags=(--small)
  torch_flags=(--d 1024 --heads 8 --seq 256 --batch 2 --variant llama)
  decode_layers="${AG_TP_DECODE_LAYERS:-4}"
fi

status=0
echo "== 1. CUDA tensor-parallel tests"
timeout 600 "$build/tests/cuda/test_cuda" --gtest_filter='*CudaTensorParallel*:CudaCollectives.*' --gtest_brief=0 \
  >"$out/tp-tests.txt" 2>&1 || status=1
sed -n '1,/tests* ran/p' "$out/tp-tests.txt" | grep -E "^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z]" | sed 's/ (.*ms)$//' | head -60
passed="$(grep -c '^\[       OK \]' "$out/tp-tests.txt")"
failed="$(grep -c '^\[  FAILED  \] .*\.' "$out/tp-tests.txt")"
skipped="$(grep -c '^\[  SKIPPED \] .*\.' "$out/tp-tests.txt")"
echo "tp_tests_passed: $passed"
echo "tp_tests_failed: $failed"
echo "tp_tests_skipped: $skipped"

echo "== 2. actorgraph-tp-bench ${bench_devices[*]} ${layer_flags[*]}"
timeout 900 "$build/apps/actorgraph-tp-bench" "${bench_devices[@]}" "${layer_flags[@]}" --decode-layers "$decode_layers" \
  --trace "$out/tp-layer-trace.json" >"$out/tp-bench.txt" 2>&1 || status=1
grep -vE '^[a-z0-9_]+: ' "$out/tp-bench.txt" | tail -12

echo "== 3. all-reduce over cuda:$members"
timeout 600 "$build/apps/actorgraph-tp-bench" --allreduce "cuda:$members" --plan-only --repeats 1 --layers 1 \
  >"$out/tp-allreduce.txt" 2>&1 || status=1
grep -E '^allreduce_' "$out/tp-allreduce.txt" | grep -vE '^allreduce_[a-z0-9_]+: ' || tail -5 "$out/tp-allreduce.txt"

echo "== 4. PyTorch tensor-parallel layer (world 1,$n)"
if [ -n "$same_gpu" ]; then
  echo "skipped: PyTorch's NCCL layer needs $n distinct GPUs (this is the one-GPU rehearsal)" | tee "$out/tp-torch.txt"
else
  timeout 900 python3 scripts/torch_tp_layer.py --world-list "1,$n" "${torch_flags[@]}" >"$out/tp-torch.txt" 2>&1 || status=1
  tail -6 "$out/tp-torch.txt"
fi

echo "== 5. sim figures"
timeout 300 "$build/apps/actorgraph-tp-bench" --run-only >"$out/tp-sim.txt" 2>&1 || status=1

echo "== figures"
ours="$(grep -E "^tp${n}_layer_ms: " "$out/tp-bench.txt" | awk '{print $2}')"
torch="$(grep -E "^torch_tp_layer_ms_${n}: " "$out/tp-torch.txt" 2>/dev/null | awk '{print $2}')"
grep -hE '^(tp[0-9]+_[a-z_]+|sim_error_1gpu|allreduce_[a-z0-9_]+|torch_tp_layer_ms_[0-9]+|tp_speedup_[24]_sim): ' \
  "$out/tp-bench.txt" "$out/tp-allreduce.txt" "$out/tp-torch.txt" "$out/tp-sim.txt" 2>/dev/null
if [ -n "$ours" ] && [ -n "$torch" ]; then
  awk -v a="$ours" -v b="$torch" -v n="$n" 'BEGIN { printf "tp%d_vs_torch: %.3f\n", n, a / b }'
else
  echo "tp${n}_vs_torch: not measured (actorgraph ${ours:-none}, PyTorch ${torch:-none})"
fi
exit $status
