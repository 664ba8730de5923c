#!/usr/bin/env bash
# Batched decode steps on one GPU (generator_options::decode_batch): where a
# step's time goes and whether the GEMV's tensor-core form
# (backend_options::cuda_gemv_tensor_core_rows) is right and pays. From the
# repository root of a GPU machine, .device-deps carried; builds what it runs.
# Two stages, a device call each (600 s a call):
#   bash scripts/gpu-batch-decode.sh OUTDIR kernels
#     the CUDA tests that run the tensor-core form (the few-row products, the
#     projection groups with norms and ropes, the batched decode of 8
#     sequences against the cpu device), then the decode step's kernels one
#     by one at 8 and 16 rows of x: the FMA GEMV, cuBLAS and the tensor cores
#     (actorgraph-cuda-bench --decode-kernels --decode-rows N);
#   bash scripts/gpu-batch-decode.sh OUTDIR steps
#     LLaMA-1B's shape, 512-token prompts, 128 new tokens
#     (actorgraph-generate-bench --mode batch): 8 sequences as they are, with
#     the tensor cores, with every product on cuBLAS (--projections off
#     --gemv off), 4 / 2 / 16 with the tensor cores, 16 without, and 8 with
#     each kind of fused record left out (AG_CUDA_DEBUG_SKIP: timing only,
#     values wrong); each line has the step's device time and the idle time
#     between steps from the trace.
set -uo pipefail
out="${1:?usage: gpu-batch-decode.sh OUTDIR kernels|steps}"
stage="${2:?usage: gpu-batch-decode.sh OUTDIR kernels|steps}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
export NCCL_NVLS_ENABLE=0
t0=$(date +%s)
case "$stage" in
  kernels) targets=(actorgraph-cuda-bench test_cuda) ;;
  steps) targets=(actorgraph-generate-bench actorgraph-save-model) ;;
  *) echo "gpu-batch-decode.sh: stage must be kernels or steps, got '$stage'" >&2; exit 2 ;;
esac
AG_GPU_RUN_STEPS="configure" bash scripts/gpu-run.sh "$out/build" > "$out/build.txt" 2>&1
cmake --build build-gpu -j "$(nproc)" --target "${targets[@]}" >> "$out/build.txt" 2>&1
echo "build rc $? at $(( $(date +%s) - t0 )) s"
libdir="$here/.device-deps/prefix/usr/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$libdir:$libdir/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
B=build-gpu
if [ "$stage" = kernels ]; then
  timeout 200 $B/tests/cuda/test_cuda --gtest_brief=1 \
    --gtest_filter='CudaOps.MatmulOfFewRows*:CudaGenerate.ProjectionGroupSteps*:CudaGenerate.NormPrologues*:CudaGenerate.RopesOfProjectionGroups*:CudaGenerate.BatchedDecodeOfEight*' \
    2>&1 | tee "$out/tests.txt" | grep -E "PASSED|FAILED|Failure|Expected|Which|sequence|tests ran|gemv mma" | head -40
  echo "tests at $(( $(date +%s) - t0 )) s"
  for rows in 8 16; do
    timeout 120 $B/apps/actorgraph-cuda-bench --decode-kernels --decode-rows $rows > "$out/kernels$rows.txt" 2>&1
    grep -E "^decode_.*_us:" "$out/kernels$rows.txt" | head -40
  done
  echo "kernels at $(( $(date +%s) - t0 )) s"
  exit 0
fi
model=/tmp/ag-llama-1b
[ -f "$model/config.json" ] || $B/apps/actorgraph-save-model --out $model --shape llama-1b > /dev/null 2>&1
echo "model at $(( $(date +%s) - t0 )) s"
run() {
  local tag="$1"; shift
  timeout 90 $B/apps/actorgraph-generate-bench --mode batch --model $model --devices cuda:0 --context 512 \
    --new-tokens 128 --rounds 1 "$@" > "$out/$tag.txt" 2>&1
  echo "$tag: $(grep -E '^(batched_decode_tokens_per_s|unbatched_decode_tokens_per_s|batched_decode_step_ms|batched_decode_job_device_ms|batched_decode_idle_between_jobs_ms|batched_decode_speedup):' "$out/$tag.txt" | tr '\n' ' ')"
}
run n8 --sequences 8
run n8-mma --sequences 8 --gemv-tensor-cores 2
run n8-cublas --sequences 8 --projections off --gemv off
run n4-mma --sequences 4 --gemv-tensor-cores 2
run n2-mma --sequences 2 --gemv-tensor-cores 2
run n16 --sequences 16
run n16-mma --sequences 16 --gemv-tensor-cores 2
for kind in attention shared gated residual; do AG_CUDA_DEBUG_SKIP=$kind run "n8-skip-$kind" --sequences 8; done
echo "done at $(( $(date +%s) - t0 )) s"
