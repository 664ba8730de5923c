#!/usr/bin/env bash
# The measurement plan for session 93's candidates (written when the session's
# device time ran out; one `device` call of at most 600 s on a 1-GPU kind):
#   on the development machine:
#     AG_CARRY_EXPERIMENTS=ag-exp-bulk-ring-stream AG_CARRY_PATCH_TESTS=1 bash scripts/gpu-carry.sh \
#       land=scripts/cuda-experiments/decode_step_every_pull.diff \
#       s2=scripts/cuda-experiments/decode_step_two_slots.diff \
#       lands2=scripts/cuda-experiments/decode_step_every_pull.diff+scripts/cuda-experiments/decode_step_two_slots.diff \
#       pull=scripts/cuda-experiments/decode_step_lsu_pull.diff diagpull=scripts/cuda-experiments/decode_step_diag_pull.diff \
#       s1pull=scripts/cuda-experiments/decode_step_one_slot.diff+scripts/cuda-experiments/decode_step_lsu_pull.diff \
#       s2pull=scripts/cuda-experiments/decode_step_two_slots.diff+scripts/cuda-experiments/decode_step_lsu_pull.diff
#   then run, carry [".device-deps/debs", ".gpu-carry"]:
#     OUT=$OUT bash scripts/cuda-experiments/decode_step_every_pull_plan.sh
# 1. HEAD, the pull at every GEMV phase's entry as it would land (land), the
#    2-slot rings (s2), both (lands2), the switched patch's bulk forms, and
#    shallower rings (1 or 2 slots, streaming faster) with L2 pulls of 1-3
#    items at every phase's entry buffering the waits instead, alternated
#    (decode_step_alternate.sh), each variant's tokens checked;
# 2. the fastest of land, s2 and lands2, where it beats HEAD by 0.3%: its
#    CudaGenerate tests, then issue 12's figures through scripts/gen-bench.sh
#    with its binaries, PyTorch in the same call (HEAD's where none wins);
# 3. the phase diagnostic's raw log (session 93's call a printed none of its lines).
set -u
cd "$(dirname "${BASH_SOURCE[0]}")/../.." || exit 1
out="${OUT:?set OUT to the output folder}"
export AG_ALTERNATE_BUDGET_S="${AG_ALTERNATE_BUDGET_S:-150}"
bash scripts/cuda-experiments/decode_step_alternate.sh 3 \
  "head head" "land land" "s2 s2" "lands2 lands2" \
  "e1b pull AG_DECODE_PULL_EVERY=1 AG_DECODE_PULL_BULK=1" \
  "p2rb pull AG_DECODE_PULL=2 AG_DECODE_PULL_AT=1 AG_DECODE_PULL_BULK=1" \
  "s1e2 s1pull AG_DECODE_PULL_EVERY=2" "s1e3 s1pull AG_DECODE_PULL_EVERY=3" \
  "s1e3r s1pull AG_DECODE_PULL_EVERY=3 AG_DECODE_PULL=2 AG_DECODE_PULL_AT=1" "s2e1 s2pull AG_DECODE_PULL_EVERY=1"
mean() { awk -v n="$1" '$1 == n && $2 + 0 > 0 {s += $2; c++} END {if (c) printf "%.4f", s / c}' "$out/results.txt"; }
head_ms=$(mean head)
pick=head best=$head_ms
for v in land s2 lands2; do
  ms=$(mean "$v")
  echo "mean $v ${ms:-none} (head ${head_ms:-none})"
  if awk -v b="$best" -v m="$ms" -v h="$head_ms" 'BEGIN {exit !(m > 0 && m < b && m < h * 0.997)}'; then pick=$v best=$ms; fi
done
echo "== picked $pick"
if [ "$pick" != head ]; then
  echo "== $pick: test_cuda CudaGenerate.*"
  (cd /tmp && timeout 120 "/tmp/carry/$pick/test_cuda" --gtest_filter='CudaGenerate.*' 2>&1 | tail -6)
fi
# gen-bench.sh reads $AG_BUILD_DIR/apps/: the picked variant's programs, and the
# model /tmp/l1b the alternation saved (the same shape gen-bench saves).
mkdir -p /tmp/genb/apps /tmp/gen
for t in actorgraph-generate-bench actorgraph-generate; do ln -sf "/tmp/carry/$pick/$t" "/tmp/genb/apps/$t"; done
ln -sf /tmp/carry/head/actorgraph-save-model /tmp/genb/apps/actorgraph-save-model
ln -sfn /tmp/l1b /tmp/gen/llama-1b
echo "== gen-bench ($pick)"
AG_GEN_SKIP_BUILD=1 AG_BUILD_DIR=/tmp/genb timeout 200 bash scripts/gen-bench.sh /tmp/gen 2>&1 |
  grep -E "^[a-z_]+: |^==|^decode  |^bandwidth floor" | tail -30
cp /tmp/gen/*.txt "$out/" 2>/dev/null
echo "== phase diagnostic (HEAD's schedule)"
AG_DECODE_DIAG=80 timeout 45 /tmp/carry/diagpull/actorgraph-generate-bench --mode decode --model /tmp/l1b \
  --devices cuda:0 --context 512 --new-tokens 128 --prefill 0 --decode-step on --replay off >"$out/diag.log" 2>&1
echo "rc $?"
grep -E "DIAG" "$out/diag.log" | tail -40
