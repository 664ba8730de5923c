#!/usr/bin/env bash
# Issue 16 (small-kernel path, host cost) on one GPU, in one call:
#   bash scripts/gpu-fast.sh OUTDIR
# from the repository root on the GPU machine, with .device-deps carried.
# Configures through scripts/gpu-run.sh (configure step only), builds only the
# targets below, then prints:
#   - the CUDA tests (test_cuda) and the actor tests (test_actors), pass/fail;
#   - dispatch_us_per_split (instant sim devices: the host's runtime cost per
#     split on this machine's CPU), 3 runs, and the 1-3 op split figure;
#   - submit_to_then_us on cuda:0 and on sim:1 (actorgraph-bench: median
#     submit -> then() of a tiny one-kernel job, one job at a time);
#   - submit_to_then_us from actorgraph-e2e-bench's completion figure on cuda:0
#     (the same round trip, with the trace on, beside host_completion_us_*).
# Logs go to OUTDIR (fast-*.txt); a summary is printed.
set -uo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/gpu-setup.sh" "$@"

gpu_configure || { echo "configure failed"; exit 1; }

echo "== build (test_cuda test_actors actorgraph-bench actorgraph-e2e-bench)"
if ! cmake --build "$build" -j "$(nproc)" --target test_cuda test_actors actorgraph-bench actorgraph-e2e-bench \
    >"$out/fast-build.log" 2>&1; then
  grep -E "error|FAILED" "$out/fast-build.log" | head -30
  exit 1
fi

status=0
echo "== test_cuda"
timeout 300 "$build/tests/cuda/test_cuda" --gtest_brief=1 >"$out/fast-test-cuda.txt" 2>&1 || status=1
tail -3 "$out/fast-test-cuda.txt"
echo "== test_actors"
timeout 300 "$build/tests/test_actors" --gtest_brief=1 >"$out/fast-test-actors.txt" 2>&1 || status=1
tail -3 "$out/fast-test-actors.txt"

bench="$build/apps/actorgraph-bench"
echo "== dispatch_us_per_split (instant sim devices, 3 runs), then 1-3 op splits"
for i in 1 2 3; do timeout 120 "$bench" --dispatch-only=1 | tail -1; done 2>&1 | tee "$out/fast-dispatch.txt"
timeout 120 "$bench" --dispatch-only=3 | tail -1 | sed 's/^dispatch_us_per_split/dispatch_us_per_split_1to3_ops/' |
  tee -a "$out/fast-dispatch.txt"
echo "== submit_to_then_us (actorgraph-bench, one job at a time)"
for d in cuda:0 sim:1; do
  timeout 120 "$bench" --dispatch-only=4 --then-devices=$d 2>&1 | sed "s/^submit_to_then_us:/submit_to_then_us ($d):/"
done | tee "$out/fast-then.txt"
echo "== actorgraph-e2e-bench completion figure on cuda:0"
timeout 300 "$build/apps/actorgraph-e2e-bench" --devices=cuda:0 --skip-forward --skip-pipeline >"$out/fast-e2e.txt" 2>&1 ||
  status=1
grep -E "^(host_completion_us_median|host_completion_us_p99|submit_to_then_us):" "$out/fast-e2e.txt"
exit $status
