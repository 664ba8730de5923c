#!/usr/bin/env bash
# Batched decode steps on one GPU (generator_options::decode_batch): where a
# step's time goes, and whether the GEMV's tensor-core form
# (backend_options::cuda_gemv_tensor_core_rows) and the attention's rows
# apart (transformer_config::rows_apart) are right and pay. From the
# repository root of a GPU machine, .device-deps carried; builds what it
# runs. Stages, one or more a device call (600 s a call):
#   bash scripts/gpu-batch-decode.sh OUTDIR tests [steps] [skips] [kernels]
#   tests:   the CUDA tests of the few-row products, the projection groups
#            (norms, ropes), fused attention and the generator's CUDA tests
#            (the batched decode of 8 sequences against the cpu device);
#   steps:   LLaMA-1B's shape, 512-token prompts, 128 new tokens
#            (actorgraph-generate-bench --mode batch): 8 sequences as they
#            are and without pipelined steps (--pipeline-depth 1), 2 / 4 /
#            16, a sequence alone in a slot of 8 lanes and of 2 lanes
#            against a slot of its own (--sequences 1 --decode-batch N:
#            whether decode_batch can be on by default); each line has the
#            step's device time and the idle time between steps;
#   skips:   8 sequences with each kind of fused record left out
#            (AG_CUDA_DEBUG_SKIP: timing only, values wrong);
#   kernels: the decode step's kernels one by one at 2, 4 and 8 rows of x:
#            the FMA GEMV, cuBLAS and the tensor cores
#            (actorgraph-cuda-bench --decode-kernels --decode-rows N).
set -uo pipefail
out="${1:?usage: gpu-batch-decode.sh OUTDIR tests|steps|skips|kernels...}"
shift
[ $# -ge 1 ] || { echo "usage: gpu-batch-decode.sh OUTDIR tests|steps|skips|kernels..." >&2; exit 2; }
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
targets=()
for stage in "$@"; do
  case "$stage" in
    tests) targets+=(test_cuda) ;;
    kernels) targets+=(actorgraph-cuda-bench) ;;
    steps|skips) targets+=(actorgraph-generate-bench actorgraph-save-model) ;;
    *) echo "gpu-batch-decode.sh: a stage is tests, steps, skips or kernels, got '$stage'" >&2; exit 2 ;;
  esac
done
AG_GPU_RUN_STEPS="configure" bash scripts/gpu-run.sh "$out/build" > "$out/build.txt" 2>&1
cmake --build build-gpu -j "$(nproc)" --target "${targets[@]}" >> "$out/build.txt" 2>&1
rc=$?
echo "build rc $rc at $(( $(date +%s) - t0 )) s"
[ $rc -eq 0 ] || { grep -E "error" "$out/build.txt" | head -20; exit 1; }
libdir="$here/.device-deps/prefix/usr/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$libdir:$libdir/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=build-gpu
run() {
  local tag="$1"; shift
  timeout 90 $B/apps/actorgraph-generate-bench --mode batch --model $model --devices cuda:0 --context 512 \
    --new-tokens 128 --rounds 1 "$@" > "$out/$tag.txt" 2>&1
  echo "$tag: $(grep -E '^(batched_decode_tokens_per_s|unbatched_decode_tokens_per_s|batched_decode_step_ms|batched_decode_job_device_ms|batched_decode_idle_between_jobs_ms|batched_decode_speedup):' "$out/$tag.txt" | tr '\n' ' ')"
}
for stage in "$@"; do
  case "$stage" in
    tests)
      timeout 240 $B/tests/cuda/test_cuda --gtest_brief=1 \
        --gtest_filter='CudaOps.MatmulOfFewRows*:CudaOps.*ttention*:CudaGenerate.*' \
        2>&1 | tee "$out/tests.txt" | grep -E "PASSED|FAILED|Failure|Expected|Which|sequence|tests ran|gemv mma|cache rows" | head -40
      echo "tests at $(( $(date +%s) - t0 )) s" ;;
    kernels)
      for rows in 8 2 4; do
        timeout 120 $B/apps/actorgraph-cuda-bench --decode-kernels --decode-rows $rows > "$out/kernels$rows.txt" 2>&1
        grep -E "^decode_.*rows.*_us:" "$out/kernels$rows.txt" | head -40
      done
      echo "kernels at $(( $(date +%s) - t0 )) s" ;;
    steps)
      model=/tmp/ag-llama-1b
      [ -f "$model/config.json" ] || $B/apps/actorgraph-save-model --out $model --shape llama-1b > /dev/null 2>&1
      echo "model at $(( $(date +%s) - t0 )) s"
      run n8 --sequences 8
      run n8-depth1 --sequences 8 --pipeline-depth 1
      run lone-in-8 --sequences 1 --decode-batch 8
      run lone-in-2 --sequences 1 --decode-batch 2
      run n2 --sequences 2
      run n4 --sequences 4
      run n16 --sequences 16
      echo "steps at $(( $(date +%s) - t0 )) s" ;;
    skips)
      model=/tmp/ag-llama-1b
      [ -f "$model/config.json" ] || $B/apps/actorgraph-save-model --out $model --shape llama-1b > /dev/null 2>&1
      for kind in attention shared gated residual; do AG_CUDA_DEBUG_SKIP=$kind run "n8-skip-$kind" --sequences 8; done
      echo "skips at $(( $(date +%s) - t0 )) s" ;;
  esac
done
