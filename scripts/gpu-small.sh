#!/usr/bin/env bash
# Issue 16 (small kernels, CUDA graph replay) on one GPU, in one call:
#   bash scripts/gpu-small.sh OUTDIR
# from the repository root on the GPU machine, with .device-deps carried.
# Configures through scripts/gpu-run.sh (configure step only), builds the
# CUDA tests and actorgraph-e2e-bench, runs the graph-replay CUDA tests, then
# measures side by side in this one run:
#   - actorgraph, GPT-2-small shape (12 layers, d 768, 12 heads, ff 3072,
#     vocab 4096, bf16, batch 1; llama-style blocks, the model
#     scripts/torch_e2e_ref.py implements) at T 128 and at T 1, one job at a
#     time, graph replay off and on: e2e_forward_device_ms (trace: first
#     kernel start -> last kernel end) and e2e_forward_ms (host wall, submit
#     -> result with the f32 logits in host memory);
#   - PyTorch, the same model captured as a CUDA graph and replayed
#     (torch_e2e_ref.py --cuda-graph): torch_graph_device_ms, torch_graph_wall_ms;
# and prints small_forward_device_ms, small_forward_wall_ms,
# small_vs_torch_graph (device over device), small_wall_vs_torch_graph and
# decode_step_vs_torch_graph (T 1, device over device), replay on.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu-setup.sh" "$@"

gpu_configure configure /dev/null || { echo "configure failed"; exit 1; }

echo "== build (test_cuda actorgraph-e2e-bench)"
if ! cmake --build "$build" -j "$(nproc)" --target test_cuda actorgraph-e2e-bench >"$out/small-build.log" 2>&1; then
  grep -E "error|FAILED" "$out/small-build.log" | head -30
  exit 1
fi
status=0
echo "== test_cuda (all CUDA tests)"
timeout 400 "$build/tests/cuda/test_cuda" --gtest_brief=1 >"$out/small-test-cuda.txt" 2>&1 || status=1
grep -E "FAILED|PASSED|SKIPPED \[" "$out/small-test-cuda.txt" | head -20

shape=(--variant llama --layers 12 --d-model 768 --heads 12 --ff 3072 --vocab 4096 --batch 1 --dtype bf16)
e2e="$build/apps/actorgraph-e2e-bench"
fig() { grep -E "^$1: " "$2" | tail -1 | awk '{print $2}'; }
for seq in 128 1; do
  for replay in off on; do
    f="$out/small-e2e-t$seq-$replay.txt"
    echo "== actorgraph T $seq, replay $replay"
    timeout 300 "$e2e" --devices cuda:0 "${shape[@]}" --seq "$seq" --replay "$replay" --runs 200 --warmup 20 \
      --arenas 2 --skip-idle --skip-completion --skip-pipeline >"$f" 2>&1 || status=1
    grep -E "^e2e_forward_(device_)?ms" "$f"
  done
  echo "== PyTorch T $seq (eager and CUDA graph)"
  timeout 300 python3 scripts/torch_e2e_ref.py --layers 12 --d-model 768 --heads 12 --ff 3072 --vocab 4096 \
    --batch 1 --seq "$seq" --runs 200 --warmup 20 --cuda-graph >"$out/small-torch-t$seq.txt" 2>&1 || status=1
  grep -E "^torch_(forward_device|graph_device|graph_wall)_ms" "$out/small-torch-t$seq.txt"
done

dev_on=$(fig e2e_forward_device_ms "$out/small-e2e-t128-on.txt")
wall_on=$(fig e2e_forward_ms "$out/small-e2e-t128-on.txt")
dev_off=$(fig e2e_forward_device_ms "$out/small-e2e-t128-off.txt")
tg=$(fig torch_graph_device_ms "$out/small-torch-t128.txt")
tgw=$(fig torch_graph_wall_ms "$out/small-torch-t128.txt")
d1_on=$(fig e2e_forward_device_ms "$out/small-e2e-t1-on.txt")
d1_off=$(fig e2e_forward_device_ms "$out/small-e2e-t1-off.txt")
tg1=$(fig torch_graph_device_ms "$out/small-torch-t1.txt")
echo "== figures (replay on; replay off in parentheses)"
{
  echo "small_forward_device_ms: $dev_on"
  echo "small_forward_device_ms_replay_off: $dev_off"
  echo "small_forward_wall_ms: $wall_on"
  awk -v a="$dev_on" -v b="$tg" 'BEGIN { if (b > 0) printf "small_vs_torch_graph: %.3f\n", a / b }'
  awk -v a="$wall_on" -v b="$tgw" 'BEGIN { if (b > 0) printf "small_wall_vs_torch_graph: %.3f\n", a / b }'
  awk -v a="$dev_off" -v b="$tg" 'BEGIN { if (b > 0) printf "small_vs_torch_graph_replay_off: %.3f\n", a / b }'
  echo "decode_step_device_ms: $d1_on (replay off $d1_off, torch graph $tg1)"
  awk -v a="$d1_on" -v b="$tg1" 'BEGIN { if (b > 0) printf "decode_step_vs_torch_graph: %.3f\n", a / b }'
} | tee "$out/small-summary.txt"
exit $status
