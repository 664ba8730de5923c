#!/usr/bin/env bash
# Issues 14 and 15 (tensor parallelism on 2 / 4 real GPUs) in one device call:
#   bash scripts/gpu-tp.sh OUTDIR
# from the repository root on the GPU machine, with .device-deps carried.
# On a 1-GPU machine, a rehearsal of the same program on logical devices of
# GPU 0 (the figures then check the program, not the speedups):
#   AG_TP_SAME_GPU=2 bash scripts/gpu-tp.sh OUTDIR
# Environment: AG_TP_SMALL=1 uses the small layer (d 1024, T 256), a 4-layer
# decode step and a 4-layer model in step 2c, for a quick run;
# AG_TP_DECODE_LAYERS overrides the decode step's layers (32 by default: the
# LLaMA 7B shape).
# AG_TP_GPUS=N runs on the first N GPUs of a larger machine (with
# CUDA_VISIBLE_DEVICES naming them, so that cuda:all and PyTorch see N):
# issue 14's 2-GPU figures on a 4-GPU host.
# AG_TP_SKIP_SIM=1 skips step 5 (the sim figures need no GPU: run them anywhere);
# AG_TP_SKIP_ALLREDUCE=1 / AG_TP_SKIP_TORCH=1 skip steps 3 / 4 (a rerun that
# keeps an earlier run's all-reduce and PyTorch figures).
# Step 1b runs the GPU-death scenarios (on 4 GPUs CudaFault.AGpuDying*, on 2
# CudaFault.OnTwoGpus*: each collective path; bounded by AG_TP_FAULT_LIMIT
# seconds, log in OUTDIR/tp-fault.txt). AG_TP_SKIP_TESTS=1 skips steps 1 and
# 1b (a rerun of the figures after the tests passed).
# AG_TP_OP_PROFILE=1 adds step 2b: each op's GPU time in the layer on 1 GPU
# and at degree N (actorgraph-tp-bench --op-profile), in OUTDIR/tp-opprofile.txt.
#
# AG_TP_PREBUILT=1 skips the build (see below: binaries built on the dev
# machine and carried, which saves the GPU machine minutes of nvcc);
# AG_TP_TEST_LIMIT / AG_TP_BENCH_LIMIT / AG_TP_LAYOUT_LIMIT (300) /
# AG_TP_ALLREDUCE_LIMIT bound steps 1, 2, 2c and 3 in seconds (a hang then
# ends the step, with every thread's stack where the machine has gdb).
#
# It configures through scripts/gpu-run.sh (configure step only), builds
# test_cuda and actorgraph-tp-bench, then:
#   1. the CUDA tensor-parallel and collective tests (tests/cuda:
#      CudaTensorParallel*, CudaCollectives*, and the decode step as one
#      kernel a rank, CudaGenerate.*TensorParallelDecodeStep*, on GPUs 0 and
#      1), every layout this machine has;
#   2. actorgraph-tp-bench --devices cuda:all: tpN_layer_speedup (device
#      spans), tpN_layer_device_ms, tpN_layer_speedup_wall, tpN_layer_ms,
#      tpN_gpu_busy_fraction, tpN_sim_error, tpN_decode_step_speedup, and the
#      Chrome traces (OUTDIR/tp-layer-trace.json: the N-GPU layer;
#      tp-layer-trace-1gpu.json, tp-layer-trace-decode-*.json), with
#      --no-layouts (step 2c runs them bounded on their own);
#   2a. the layer again with --copy-engine off (NCCL's all-reduces, no
#      sequence parallelism: the default before session 42): the same figures
#      with a _nccl suffix, tpN_vs_torch_nccl, and its trace
#      (OUTDIR/tp-layer-trace-nccl.json); AG_TP_SKIP_NCCL_SIDE=1 skips it;
#   2c. with N >= 4 (GPUs, or AG_TP_SAME_GPU=4): actorgraph-tp-bench --layouts,
#      issue 15's layout comparison on GPUs 0..3: a 24-layer LLaMA (d 4096,
#      ~10 GB bf16) with 16 micro-batches of B 1 x T 512 as 1 GPU, 2 stages x
#      2, 4 x 1 and 1 x 4: pp2xtp2_speedup, pp2xtp2_vs_pp4, pp2xtp2_vs_tp4,
#      pp_layout_ms_{1x1,2x2,4x1,1x4}, the winning layout in the table
#      (OUTDIR/tp-layouts.txt), and one 2 x 2 round's Chrome trace in
#      OUTDIR/tp-layer-trace-pp2xtp2.json; with N = 2, --layouts
#      --layout-devices 2: 1 GPU, 2 stages x 1 and 1 x 2 (pp_layout_ms_*);
#   2d. the same layouts with --copy-engine off: pp_layout_ms_1x2_nccl (and
#      with N >= 4 pp_layout_ms_1x4_nccl, pp_layout_ms_2x2_nccl), so that every
#      run measures both sides of the default (AG_TP_SKIP_NCCL_SIDE=1 skips it
#      and 2a; on 4 GPUs the second layout run adds a few minutes, so a
#      device call of 600 s may need the run split in two);
#   2e. actorgraph-generate-bench on a LLaMA-2-7B-shaped model of the decode
#      layers (actorgraph-save-model, kept in /tmp between runs on one
#      machine): one GPU, then degree N with the decode step as one kernel
#      a rank and with a kernel per record, 512 positions of context:
#      tpN_generator_decode_speedup and _unfused (AG_TP_SKIP_GENERATOR=1
#      skips it);
#   3. actorgraph-tp-bench --allreduce over the N GPUs: allreduce_us_<size>_<path>
#      (the devices' time per call) and allreduce_host_us_<size>_<path> (wall
#      per call, the host enqueueing) for the own one-shot path and NCCL, and
#      the crossover the runtime picks;
#   4. scripts/torch_tp_layer.py --world-list 1,N --allreduce (PyTorch,
#      torch.distributed with NCCL, Megatron split): torch_tp_layer_ms_<w>,
#      torch_nccl_allreduce_us_<size>_Ngpu, and tpN_vs_torch = actorgraph's
#      N-GPU layer device span over PyTorch's CUDA-event time (tpN_vs_torch_wall:
#      our job wall time over the same);
#   5. the sim's tensor-parallel figures (tp_speedup_2_sim, tp_speedup_4_sim).
# Logs go to OUTDIR (tp-*.txt); the `name: value` lines are printed at the end.
# NCCL_NVLS_ENABLE=0 for every process (NVLink multicast stays off there).
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu-setup.sh" "$@"
same_gpu="${AG_TP_SAME_GPU:-}"
small="${AG_TP_SMALL:-}"

# AG_TP_PREBUILT=1: $build already holds tests/cuda/test_cuda and
# apps/actorgraph-tp-bench, built on another machine (for sm_90 against the same
# packages, e.g. `AG_GPU_RUN_STEPS=configure bash scripts/gpu-run.sh OUT` then
# `cmake --build build-gpu --target test_cuda actorgraph-tp-bench` on the
# dev machine; carry build-gpu/tests/cuda/test_cuda and
# build-gpu/apps/actorgraph-tp-bench): only the packages are unpacked here.
steps=configure
[ -n "${AG_TP_PREBUILT:-}" ] && steps=unpack-only
gpu_configure "$steps" "$out/tp-configure.txt" || {
  echo "configure failed (see $out/tp-configure.txt)"
  tail -20 "$out/tp-configure.txt"
  exit 1
}

if [ -z "${AG_TP_PREBUILT:-}" ]; then
  echo "== build (test_cuda actorgraph-tp-bench actorgraph-generate-bench actorgraph-save-model)"
  start=$(date +%s)
  if ! cmake --build "$build" -j "$(nproc)" --target test_cuda actorgraph-tp-bench actorgraph-generate-bench \
    actorgraph-save-model >"$out/tp-build.txt" 2>&1; then
    grep -E "error|FAILED" "$out/tp-build.txt" | head -30
    exit 1
  fi
  echo "built in $(($(date +%s) - start)) s"
else
  echo "== prebuilt binaries in $build"
fi

# bounded LIMIT LOG CMD...: runs CMD with its output in LOG for at most LIMIT
# seconds; on a hang it first writes every thread's stack (gdb, when the
# machine has it) to LOG.stacks, so a hang is diagnosed from one run.
bounded() {
  local limit="$1" log="$2"
  shift 2
  local t0=$(date +%s)
  "$@" >"$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    if (($(date +%s) - t0 >= limit)); then
      echo "TIMEOUT after ${limit} s: $*" | tee -a "$log"
      if command -v gdb >/dev/null; then
        timeout 60 gdb -p "$pid" -batch -ex "thread apply all bt 25" >"$log.stacks" 2>&1
      fi
      kill -9 "$pid" 2>/dev/null
      wait "$pid" 2>/dev/null
      return 124
    fi
    sleep 1
  done
  wait "$pid"
}

gpus="$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')"
if [ -n "$same_gpu" ]; then
  n="$same_gpu"
  members="0"
  for ((k = 1; k < n; k++)); do members="$members,0"; done
  where="$n logical devices of GPU 0 (rehearsal: not a speedup)"
  bench_devices=(--devices cuda:all --same-gpu --degree "$n")
else
  n="${AG_TP_GPUS:-$gpus}"
  if [ "$n" -gt "$gpus" ]; then
    echo "AG_TP_GPUS=$n but this machine has $gpus GPU(s)"
    exit 1
  fi
  if [ "$n" -lt 2 ]; then
    echo "this machine has $n GPU(s); issues 14/15 need 2 or 4 (AG_TP_SAME_GPU=2 rehearses on one GPU)"
    exit 1
  fi
  members="$(seq -s, 0 $((n - 1)))"
  # Fewer GPUs than the machine has: every program sees only the first n.
  if [ "$n" -lt "$gpus" ]; then export CUDA_VISIBLE_DEVICES="$members"; fi
  where="GPUs $members"
  bench_devices=(--devices cuda:all)
fi
echo "== $where ($(nvidia-smi --query-gpu=name --format=csv,noheader | head -1), $gpus GPU(s) on the machine)"
layer_flags=()
layout_flags=()
torch_flags=(--d 8192 --heads 64 --seq 2048 --batch 2 --variant llama)
decode_layers="${AG_TP_DECODE_LAYERS:-32}"
if [ -n "$small" ]; then
  layer_flags=(--small)
  layout_flags=(--layout-layers 4)
  torch_flags=(--d 1024 --heads 8 --seq 256 --batch 2 --variant llama)
  decode_layers="${AG_TP_DECODE_LAYERS:-4}"
fi

status=0
if [ -z "${AG_TP_SKIP_TESTS:-}" ]; then
  echo "== 1. CUDA tensor-parallel tests"
  bounded "${AG_TP_TEST_LIMIT:-600}" "$out/tp-tests.txt" "$build/tests/cuda/test_cuda" \
    --gtest_filter='*CudaTensorParallel*:CudaCollectives.*:CudaGenerate.*TensorParallelDecodeStep*' --gtest_brief=0 ||
    status=1
  sed -n '1,/tests* ran/p' "$out/tp-tests.txt" | grep -E "^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z]" | sed 's/ (.*ms)$//' | head -60
  passed="$(grep -c '^\[       OK \]' "$out/tp-tests.txt")"
  failed="$(grep -c '^\[  FAILED  \] .*\.' "$out/tp-tests.txt")"
  skipped="$(grep -c '^\[  SKIPPED \] .*\.' "$out/tp-tests.txt")"
  echo "tp_tests_passed: $passed"
  echo "tp_tests_failed: $failed"
  echo "tp_tests_skipped: $skipped"

  # A GPU dying inside its collectives (issue 15): each scenario runs in a
  # process of its own (a death test: the dead GPU's context stays unusable for
  # the rest of its process), bounded on its own so that a hang shows as one.
  # On 4 GPUs the group of two leaves two GPUs out; on 2 it is the machine.
  fault_filter=""
  if [ -z "$same_gpu" ]; then
    if [ "$n" -ge 4 ]; then fault_filter='CudaFault.AGpuDying*'
    elif [ "$n" -ge 2 ]; then fault_filter='CudaFault.OnTwoGpus*'; fi
  fi
  if [ -n "$fault_filter" ]; then
    echo "== 1b. a GPU dying inside its collectives ($fault_filter)"
    bounded "${AG_TP_FAULT_LIMIT:-240}" "$out/tp-fault.txt" "$build/tests/cuda/test_cuda" \
      --gtest_filter="$fault_filter" --gtest_brief=0 || status=1
    grep -E "^\[ +(OK|FAILED|SKIPPED) +\] [A-Za-z]|peer death|peer-death" "$out/tp-fault.txt" | head -16
    echo "tp_fault_tests_passed: $(grep -c '^\[       OK \]' "$out/tp-fault.txt")"
    echo "tp_fault_tests_failed: $(grep -c '^\[  FAILED  \] .*\.' "$out/tp-fault.txt")"
  fi
else
  echo "== 1. and 1b. skipped (AG_TP_SKIP_TESTS)"
fi

echo "== 2. actorgraph-tp-bench ${bench_devices[*]} ${layer_flags[*]}"
bounded "${AG_TP_BENCH_LIMIT:-900}" "$out/tp-bench.txt" "$build/apps/actorgraph-tp-bench" "${bench_devices[@]}" \
  "${layer_flags[@]}" --decode-layers "$decode_layers" --trace "$out/tp-layer-trace.json" --no-layouts || status=1
grep -vE '^[a-z0-9_]+: ' "$out/tp-bench.txt" | tail -12

# The same layer without the copy-engine collectives (NCCL's all-reduces and
# no sequence parallelism; on by default, see
# backend_options::cuda_copy_engine_collectives): its figures are printed
# with a _nccl suffix.
if [ -z "${AG_TP_SKIP_NCCL_SIDE:-}" ]; then
  echo "== 2a. the layer with --copy-engine off"
  bounded 120 "$out/tp-bench-nccl.txt" "$build/apps/actorgraph-tp-bench" "${bench_devices[@]}" "${layer_flags[@]}" \
    --decode-layers 0 --copy-engine off --no-layouts --trace "$out/tp-layer-trace-nccl.json" || status=1
fi

if [ -n "${AG_TP_OP_PROFILE:-}" ]; then
  echo "== 2b. op profile of the layer (1 GPU, then degree $n; plain launches)"
  bounded 180 "$out/tp-opprofile.txt" "$build/apps/actorgraph-tp-bench" "${bench_devices[@]}" "${layer_flags[@]}" \
    --op-profile || status=1
  grep -E "^op_profile [a-z0-9]+: " "$out/tp-opprofile.txt"
fi

# 4 layouts x 4 rounds of 16 jobs of a ~10 GB model, and 5 uploads of it
# (one per layout, one more for the traced 2 x 2 round): bounded on its own.
# On 2 GPUs, 3 layouts and no trace.
layouts=()
if [ "$n" -ge 4 ]; then
  echo "== 2c. layouts: 1 GPU, 2 stages x 2, 4 x 1, 1 x 4 ${layout_flags[*]}"
  layouts=(--layouts)
  bounded "${AG_TP_LAYOUT_LIMIT:-300}" "$out/tp-layouts.txt" "$build/apps/actorgraph-tp-bench" "${bench_devices[@]}" \
    "${layout_flags[@]}" "${layouts[@]}" --trace "$out/tp-layer-trace.json" || status=1
elif [ "$n" -eq 2 ]; then
  # On two GPUs: 1 GPU, 2 stages x 1 and 1 x 2, many jobs in flight.
  echo "== 2c. layouts: 1 GPU, 2 stages x 1, 1 x 2 ${layout_flags[*]}"
  layouts=(--layouts --layout-devices 2)
  bounded "${AG_TP_LAYOUT_LIMIT:-300}" "$out/tp-layouts.txt" "$build/apps/actorgraph-tp-bench" "${bench_devices[@]}" \
    "${layout_flags[@]}" "${layouts[@]}" || status=1
else
  echo "== 2c. layouts: skipped, they need 2 or 4 devices ($n here)"
fi
if [ "${#layouts[@]}" -gt 0 ]; then
  grep -E '^(layouts: |pp_layout_winner)' "$out/tp-layouts.txt" || tail -5 "$out/tp-layouts.txt"
  # The same rounds without the copy-engine collectives, whose default (on)
  # rests on many jobs in flight not losing with them under job lanes
  # (docs/BENCHMARKS.md, session 42): printed with a _nccl suffix.
  if [ -z "${AG_TP_SKIP_NCCL_SIDE:-}" ]; then
    echo "== 2d. the same layouts with --copy-engine off"
    bounded "${AG_TP_LAYOUT_LIMIT:-300}" "$out/tp-layouts-nccl.txt" "$build/apps/actorgraph-tp-bench" \
      "${bench_devices[@]}" "${layout_flags[@]}" "${layouts[@]}" --copy-engine off || status=1
    grep -E '^layouts: (1 x 2|1 x 4|2 x 2)' "$out/tp-layouts-nccl.txt" || tail -5 "$out/tp-layouts-nccl.txt"
  fi
fi

# The generator's decode step with its KV cache (LLaMA-2-7B's shape, 512
# positions of context): one GPU, then degree n with the step as one kernel
# a rank (plan_options::fuse_tp_decode_step) and with a kernel per record.
# tpN_generator_decode_speedup is the fused step's against one GPU (the
# step issue 14's tp2_decode_step_speedup asks about, with a cache); the
# tp-bench's decode step above has none.
gen_bench="$build/apps/actorgraph-generate-bench"
if [ -n "${AG_TP_SKIP_GENERATOR:-}" ] || [ ! -x "$gen_bench" ] || [ ! -x "$build/apps/actorgraph-save-model" ]; then
  echo "== 2e. the generator's decode step: skipped (AG_TP_SKIP_GENERATOR, or no actorgraph-generate-bench built)"
else
  echo "== 2e. the generator's decode step, LLaMA-2-7B's shape, $decode_layers layers: 1 GPU, degree $n fused and not"
  model="${AG_TP_GENERATOR_MODEL:-/tmp/ag-tp-llama2-7b-$decode_layers}"
  [ -f "$model/config.json" ] ||
    bounded 600 "$out/tp-gen-model.txt" "$build/apps/actorgraph-save-model" --shape llama2-7b --layers "$decode_layers" \
      --out "$model" || status=1
  for v in one on off; do
    if [ "$v" = one ]; then args=(--devices cuda:0); else args=(--devices "cuda:$members" --tp "$n" --tp-decode-step "$v"); fi
    bounded 300 "$out/tp-gen-$v.txt" "$gen_bench" --mode decode --model "$model" --prefill 0 --new-tokens 64 "${args[@]}" ||
      status=1
    grep -E "^(decode  |decode step, greedy|decode job, ranks)" "$out/tp-gen-$v.txt" | cut -c1-160
  done
  gen_ms() { grep -E '^decode_ms_per_token: ' "$out/tp-gen-$1.txt" 2>/dev/null | awk '{print $2}'; }
  one_ms="$(gen_ms one)" on_ms="$(gen_ms on)" off_ms="$(gen_ms off)"
  if [ -n "$one_ms" ] && [ -n "$on_ms" ] && [ -n "$off_ms" ]; then
    awk -v a="$one_ms" -v b="$on_ms" -v c="$off_ms" -v n="$n" \
      'BEGIN { printf "tp%d_generator_decode_speedup: %.3f\ntp%d_generator_decode_speedup_unfused: %.3f\n", n, a / b, n, a / c }'
  else
    echo "tp${n}_generator_decode_speedup: not measured (1 GPU ${one_ms:-none}, fused ${on_ms:-none}, unfused ${off_ms:-none} ms)"
  fi
fi

if [ -z "${AG_TP_SKIP_ALLREDUCE:-}" ]; then
  echo "== 3. all-reduce over cuda:$members"
  bounded "${AG_TP_ALLREDUCE_LIMIT:-600}" "$out/tp-allreduce.txt" "$build/apps/actorgraph-tp-bench" \
    --allreduce "cuda:$members" --plan-only --repeats 1 --layers 1 || status=1
  grep -E '^allreduce_' "$out/tp-allreduce.txt" | grep -vE '^allreduce_[a-z0-9_]+: ' || tail -5 "$out/tp-allreduce.txt"
else
  echo "== 3. all-reduce: skipped (AG_TP_SKIP_ALLREDUCE)"
fi

echo "== 4. PyTorch tensor-parallel layer (world 1,$n)"
if [ -n "${AG_TP_SKIP_TORCH:-}" ]; then
  echo "skipped (AG_TP_SKIP_TORCH)" | tee "$out/tp-torch.txt"
elif [ -n "$same_gpu" ]; then
  echo "skipped: PyTorch's NCCL layer needs $n distinct GPUs (this is the one-GPU rehearsal)" | tee "$out/tp-torch.txt"
else
  timeout 900 python3 scripts/torch_tp_layer.py --world-list "1,$n" --allreduce "${torch_flags[@]}" >"$out/tp-torch.txt" 2>&1 || status=1
  tail -6 "$out/tp-torch.txt"
fi

if [ -z "${AG_TP_SKIP_SIM:-}" ]; then
  echo "== 5. sim figures"
  timeout 300 "$build/apps/actorgraph-tp-bench" --run-only >"$out/tp-sim.txt" 2>&1 || status=1
else
  echo "== 5. sim figures: skipped (AG_TP_SKIP_SIM; they need no GPU)"
fi

echo "== figures"
ours="$(grep -E "^tp${n}_layer_device_ms: " "$out/tp-bench.txt" | awk '{print $2}')"
ours_wall="$(grep -E "^tp${n}_layer_ms: " "$out/tp-bench.txt" | awk '{print $2}')"
torch="$(grep -E "^torch_tp_layer_ms_${n}: " "$out/tp-torch.txt" 2>/dev/null | awk '{print $2}')"
grep -hE '^(tp[0-9]+_[a-z_]+|sim_error_1gpu|layer_[a-z0-9_]+|decode_[a-z0-9_]+|allreduce_[a-z0-9_]+|torch_tp_layer_ms_[0-9]+|torch_nccl_[a-z0-9_]+|tp_speedup_[24]_sim|pp2xtp2_[a-z0-9_]+|pp_layout_[a-z0-9_]+): ' \
  "$out/tp-bench.txt" "$out/tp-layouts.txt" "$out/tp-allreduce.txt" "$out/tp-torch.txt" "$out/tp-sim.txt" 2>/dev/null
grep -hE "^(tp${n}_(layer_speedup|layer_device_ms|layer_ms|gpu_busy_fraction|sim_error|start_skew_us)|pp_layout_ms_(1x2|1x4|2x2)|pp2xtp2_speedup): " \
  "$out/tp-bench-nccl.txt" "$out/tp-layouts-nccl.txt" 2>/dev/null |
  sed -E 's/^([a-z0-9_]+): /\1_nccl: /'
ours_nccl="$(grep -E "^tp${n}_layer_device_ms: " "$out/tp-bench-nccl.txt" 2>/dev/null | awk '{print $2}')"
if [ -n "$ours_nccl" ] && [ -n "$torch" ]; then
  awk -v a="$ours_nccl" -v b="$torch" -v n="$n" 'BEGIN { printf "tp%d_vs_torch_nccl: %.3f\n", n, a / b }'
fi
# tpN_vs_torch: device span against PyTorch's CUDA-event time of its layer
# (the same measure); tpN_vs_torch_wall: our job's wall time (submit to
# future) against the same PyTorch figure.
if [ -n "$ours" ] && [ -n "$torch" ]; then
  awk -v a="$ours" -v w="$ours_wall" -v b="$torch" -v n="$n" \
    'BEGIN { printf "tp%d_vs_torch: %.3f\ntp%d_vs_torch_wall: %.3f\n", n, a / b, n, w / b }'
else
  echo "tp${n}_vs_torch: not measured (actorgraph ${ours:-none}, PyTorch ${torch:-none})"
fi
exit $status
