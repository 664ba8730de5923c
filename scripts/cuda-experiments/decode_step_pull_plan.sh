#!/usr/bin/env bash
# The measurement plan for the L2-pull patches (session 92, written when no
# GPU was lent; one `device` call of at most 600 s on a 1-GPU kind):
#   on the development machine:
#     AG_CARRY_EXPERIMENTS=ag-exp-bulk-ring-stream bash scripts/gpu-carry.sh \
#       pull=scripts/cuda-experiments/decode_step_lsu_pull.diff diagpull=scripts/cuda-experiments/decode_step_diag_pull.diff
#   then run, carry [".device-deps/debs", ".gpu-carry"]:
#     OUT=$OUT bash scripts/cuda-experiments/decode_step_pull_plan.sh
# 1. the pull's variants alternated with HEAD (decode_step_alternate.sh);
# 2. the phase diagnostic without the pull, with it, and with the cache rows kept;
# 3. an L2 hit's round trip beside the rings on this GPU (bulk_ring_stream's
#    probe; session 85 measured it on an H200 only).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
export AG_ALTERNATE_BUDGET_S=330
bash scripts/cuda-experiments/decode_step_alternate.sh 3 \
  "head head" "p0 pull" \
  "p1e pull AG_DECODE_PULL=1" "p2e pull AG_DECODE_PULL=2" "p3e pull AG_DECODE_PULL=3" \
  "p2r pull AG_DECODE_PULL=2 AG_DECODE_PULL_AT=1" "p2t pull AG_DECODE_PULL=2 AG_DECODE_PULL_AT=2" \
  "p2e32 pull AG_DECODE_PULL=2 AG_DECODE_PULL_STRIDE=32" \
  "k pull AG_DECODE_KEEP_ROWS=1" "p2k pull AG_DECODE_PULL=2 AG_DECODE_KEEP_ROWS=1" "p3k pull AG_DECODE_PULL=3 AG_DECODE_KEEP_ROWS=1" \
  "e1 pull AG_DECODE_PULL_EVERY=1" "e1k pull AG_DECODE_PULL_EVERY=1 AG_DECODE_KEEP_ROWS=1" \
  "p2e1k pull AG_DECODE_PULL=2 AG_DECODE_PULL_EVERY=1 AG_DECODE_KEEP_ROWS=1"
for v in "AG_DECODE_PULL=0" "AG_DECODE_PULL=2" "AG_DECODE_PULL=2 AG_DECODE_KEEP_ROWS=1"; do
  echo "== diagnostic, $v"
  # shellcheck disable=SC2086  # a variant is several VAR=VALUE words
  env AG_DECODE_DIAG=80 $v timeout 60 /tmp/carry/diagpull/actorgraph-generate-bench --mode decode --model /tmp/l1b \
    --devices cuda:0 --context 512 --new-tokens 128 --prefill 0 --decode-step on --replay off 2>&1 | grep -E "^(DIAG|RDIAG|ADIAG|ROUND)|decode_ms"
done
echo "== L2 hit's round trip beside the rings (BRS_PROBE=1)"
BRS_PROBE=1 timeout 120 /tmp/carry/head/ag-exp-bulk-ring-stream 2>&1 | tail -15
