#!/usr/bin/env bash
# NVIDIA's compute-sanitizer over the one-GPU CUDA tests, in one device call:
#   bash scripts/gpu-sanitize.sh OUTDIR
# from the repository root on the GPU machine, with .device-deps carried.
# Configures through scripts/gpu-run.sh (configure step only), builds
# test_cuda, then runs:
#   - memcheck (out-of-bounds and misaligned accesses, leaks of device
#     allocations at exit) over every suite but the excluded ones below;
#   - racecheck (shared-memory hazards) over the project's own kernels with
#     the most shared-memory traffic: the whole decode step, flash attention,
#     the projection groups, and CudaOps (where it also reports cuBLAS's own
#     split-K kernels, nvjet_*: NVIDIA's code, listed apart in the summary);
#   - synccheck (barrier misuse) over the whole decode step.
# A pass fails on any error the tool reports in the project's kernels; the
# CUDA API errors the tests provoke on purpose (the out-of-memory tests'
# cudaMalloc, NCCL's probes for other architectures' kernels) are API
# reports, not access errors, and are counted apart.
#
# Excluded, with the reason printed: the sanitizer runs one kernel at a time,
# so tests whose kernels wait for each other (the in-stream and copy-engine
# collectives of two logical devices, a part waiting behind a gate kernel)
# wait until their timeouts or forever; and the fault-injection tests make a
# kernel fault on purpose, which the sanitizer stops on. Those run without
# the sanitizer in scripts/gpu-run.sh.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu-setup.sh" "$@"

gpu_configure configure /dev/null || { echo "configure failed"; exit 1; }

echo "== build (test_cuda)"
if ! cmake --build "$build" -j "$(nproc)" --target test_cuda >"$out/sanitize-build.log" 2>&1; then
  grep -E "error|FAILED" "$out/sanitize-build.log" | head -30
  exit 1
fi
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
[[ -x "$sanitizer" ]] || { echo "no compute-sanitizer on this machine (looked in PATH and /usr/local/cuda/bin)"; exit 1; }
echo "== $("$sanitizer" --version | tail -1)"
tests="$build/tests/cuda/test_cuda"
concurrent_only='CudaInStream.*:CudaCollectives.*:*CudaTensorParallel*'
fault_injection='CudaFault.*'
echo "== not run under the sanitizer (it serialises kernels; these need kernels running at once): $concurrent_only"
echo "== not run under the sanitizer (they fault a kernel on purpose): $fault_injection"

status=0
# pass NAME TOOL TIMEOUT FILTER: one sanitizer run over the tests FILTER picks.
pass() {
  local name="$1" tool="$2" limit="$3" filter="$4" log="$out/sanitize-$1.txt" t0 rc
  t0=$(date +%s)
  timeout "$limit" "$sanitizer" --tool "$tool" --print-limit 50 "$tests" --gtest_filter="$filter" >"$log" 2>&1
  rc=$?
  local ok failed own nvidia api
  ok=$(grep -c '^\[       OK' "$log")
  failed=$(grep -c '^\[  FAILED  \] Cuda' "$log")
  # Access errors and hazards, split by whose kernel: cuBLAS's (nvjet_*) or ours.
  own=$(grep -E '^========= +(Invalid|Error: Race|Barrier|Uninitialized|Misaligned|Out of range)' "$log" | grep -vc 'nvjet_')
  nvidia=$(grep -E '^========= +Error: Race' "$log" | grep -c 'nvjet_')
  api=$(grep -c '^========= Program hit' "$log")
  echo "$name ($tool): ${ok} tests passed, ${failed} failed, ${own} errors in the project's kernels, ${nvidia} in cuBLAS's, ${api} CUDA API errors provoked, $(( $(date +%s) - t0 )) s"
  if ((rc == 124)); then
    echo "  timed out after ${limit} s, last test started: $(grep -E '^\[ RUN' "$log" | tail -1)"
    status=1
  fi
  if ((failed > 0 || own > 0)); then
    grep -E '^\[  FAILED  \] Cuda|^========= +(Invalid|Error|Barrier|Uninitialized|Misaligned|Out of range)' "$log" | grep -v nvjet_ | head -20
    status=1
  fi
}
pass memcheck memcheck 420 "-$concurrent_only:$fault_injection"
pass racecheck-kernels racecheck 200 \
  'CudaGenerate.WholeDecodeStep*:CudaGenerate.FlashAttention*:CudaGenerate.Prefill*:CudaGenerate.ProjectionGroup*:CudaGenerate.NormPrologues*:CudaGenerate.RopesOf*:CudaOps.*'
pass synccheck-step synccheck 100 'CudaGenerate.WholeDecodeStep*'
echo "sanitizer_passes_clean: $((1 - status))"
exit $status
