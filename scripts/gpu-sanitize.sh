#!/usr/bin/env bash
# NVIDIA's compute-sanitizer over the one-GPU CUDA tests, in one device call:
#   bash scripts/gpu-sanitize.sh OUTDIR
# from the repository root on the GPU machine, with .device-deps carried.
# Configures through scripts/gpu-run.sh (configure step only), builds
# test_cuda, then runs:
#   - memcheck (out-of-bounds and misaligned accesses, leaks of device
#     allocations at exit) over every suite but the excluded ones below;
#   - racecheck (shared-memory hazards) over the project's own kernels with
#     the most shared-memory traffic: flash attention, the projection groups
#     and CudaOps (where it also reports cuBLAS's own split-K kernels,
#     nvjet_*: NVIDIA's code, listed apart in the summary), then the whole
#     decode step, a process for each of its test's shapes (the tool's host
#     memory);
#   - synccheck (barrier misuse) over the whole decode step.
# The passes take more than one device call: AG_SANITIZE_PASSES="memcheck
# racecheck-kernels", "synccheck-step" and "racecheck-step" (with
# AG_SANITIZE_STEP_SHAPES to split its shapes over calls) run those passes
# only; AG_SANITIZE_MEMCHECK_FILTER=<gtest filter> runs memcheck over
# those tests alone. AG_SANITIZE_TESTS=<path> runs a test_cuda built
# elsewhere for these GPUs (sm_90, against the libraries .device-deps
# unpacks) instead of configuring and building one here (about 5 minutes).
# Session 83 on an H100: synccheck-step 114 s; the whole-step test's
# shapes in one racecheck process were killed for memory after 276 s.
# A pass fails on any error the tool reports in the project's kernels, and
# when the test program does not reach GoogleTest's last line (a crash, or
# the out-of-memory killer: its later tests never ran); the
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

if [[ -n "${AG_SANITIZE_TESTS:-}" ]]; then
  gpu_configure unpack-only /dev/null || { echo "unpacking .device-deps failed"; exit 1; }
  tests="$AG_SANITIZE_TESTS"
  [[ -x "$tests" ]] || { echo "AG_SANITIZE_TESTS=$tests: not an executable"; exit 1; }
  echo "== test_cuda built elsewhere: $tests"
else
  gpu_configure configure /dev/null || { echo "configure failed"; exit 1; }
  echo "== build (test_cuda)"
  if ! cmake --build "$build" -j "$(nproc)" --target test_cuda >"$out/sanitize-build.log" 2>&1; then
    grep -E "error|FAILED" "$out/sanitize-build.log" | head -30
    exit 1
  fi
  tests="$build/tests/cuda/test_cuda"
fi
sanitizer="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
[[ -x "$sanitizer" ]] || { echo "no compute-sanitizer on this machine (looked in PATH and /usr/local/cuda/bin)"; exit 1; }
echo "== $("$sanitizer" --version | tail -1)"
concurrent_only='CudaInStream.*:CudaCollectives.*:*CudaTensorParallel*'
fault_injection='CudaFault.*'
echo "== not run under the sanitizer (it serialises kernels; these need kernels running at once): $concurrent_only"
echo "== not run under the sanitizer (they fault a kernel on purpose): $fault_injection"

status=0
# pass NAME TOOL TIMEOUT FILTER [LOG_NAME]: one sanitizer run over the tests FILTER picks.
# LOG_NAME (default NAME) names the log, out/sanitize-LOG_NAME.txt.
pass() {
  local name="$1" tool="$2" limit="$3" filter="$4" log="$out/sanitize-${5:-$1}.txt" t0 rc
  if [[ -n "${AG_SANITIZE_PASSES:-}" && " $AG_SANITIZE_PASSES " != *" $name "* ]]; then
    echo "$name ($tool): not run (AG_SANITIZE_PASSES=\"$AG_SANITIZE_PASSES\")"
    return
  fi
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
  echo "${5:-$name} ($tool): ${ok} tests passed, ${failed} failed, ${own} errors in the project's kernels, ${nvidia} in cuBLAS's, ${api} CUDA API errors provoked, $(( $(date +%s) - t0 )) s"
  if ((rc == 124)); then
    echo "  timed out after ${limit} s, last test started: $(grep -E '^\[ RUN' "$log" | tail -1)"
    status=1
  elif ! grep -qE '^\[==========\] [0-9]+ tests? from .* ran\.' "$log"; then
    # The test program ended before GoogleTest's last line: a crash, or the
    # kernel's out-of-memory killer (the tool's shadow state lives in host
    # memory). Its tests after that point never ran, so the pass is not clean.
    echo "  the test program did not finish (the tool's exit status ${rc}; 9 or 137: killed, e.g. out of memory), last test started: $(grep -E '^\[ RUN' "$log" | tail -1)"
    status=1
  fi
  if ((failed > 0 || own > 0)); then
    grep -E '^\[  FAILED  \] Cuda|^========= +(Invalid|Error|Barrier|Uninitialized|Misaligned|Out of range)' "$log" | grep -v nvjet_ | head -20
    status=1
  fi
}
# AG_SANITIZE_MEMCHECK_FILTER narrows memcheck to some tests (session 84:
# 'CudaGenerate.WholeDecodeStep*:CudaGenerate.*Decode*', 105 s on an H100);
# by default it runs every suite but the excluded ones.
pass memcheck memcheck 420 "${AG_SANITIZE_MEMCHECK_FILTER:--$concurrent_only:$fault_injection}"
# racecheck keeps its shadow state in host memory, and the whole decode
# step at LLaMA-1B's widths takes most of it: WholeDecodeStepAsOneKernelEqualsRecompute
# (its widest shape 2 layers of d_model 2048, d_ff 8192) took 75 GiB of
# resident memory of the machine's 128 (session 55, 110 s), so it runs in a
# process of its own. The repeat test runs those widths 96 times: its shadow
# state grew past 128 GiB until the out-of-memory killer ended it (session
# 55), so it is left out (it runs under memcheck and synccheck).
race_too_big='CudaGenerate.WholeDecodeStepGivesTheSameBitsEveryRun'
echo "== not run under racecheck (its shadow state outgrows host memory): $race_too_big"
pass racecheck-kernels racecheck 300 \
  'CudaGenerate.FlashAttention*:CudaGenerate.Prefill*:CudaGenerate.ProjectionGroup*:CudaGenerate.NormPrologues*:CudaGenerate.RopesOf*:CudaOps.*'
# The whole-step test's 12 shapes in one process outgrew the machine's 128
# GiB under racecheck (session 83: killed after 276 s, where session 55's
# fewer shapes took 75 GiB), so the pass runs them a process each
# (AG_WHOLE_STEP_SHAPE=i), until the test says it has no shape i;
# AG_SANITIZE_STEP_SHAPES="0 1 2" runs those shapes only (to split the pass
# over device calls).
if [[ -z "${AG_SANITIZE_PASSES:-}" || " $AG_SANITIZE_PASSES " == *" racecheck-step "* ]]; then
  for shape in ${AG_SANITIZE_STEP_SHAPES:-$(seq 0 63)}; do
    AG_WHOLE_STEP_SHAPE=$shape pass racecheck-step racecheck 240 'CudaGenerate.WholeDecodeStepAsOneKernelEqualsRecompute' \
      "racecheck-step-$shape"
    if grep -q 'no such shape' "$out/sanitize-racecheck-step-$shape.txt"; then
      echo "  (the test has no shape $shape: its shapes are all run)"
      break
    fi
  done
fi
pass synccheck-step synccheck 300 'CudaGenerate.WholeDecodeStep*'
echo "sanitizer_passes_clean: $((1 - status))${AG_SANITIZE_PASSES:+ (only the passes: $AG_SANITIZE_PASSES)}"
exit $status
