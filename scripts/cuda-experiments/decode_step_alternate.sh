#!/usr/bin/env bash
# Alternates decode-step variants on the GPU machine, one process a run, so
# that every variant meets the same machine state (session 92; the pattern of
# sessions 84-87's calls). Needs the binaries scripts/gpu-carry.sh packed
# (carry [".device-deps/debs", ".gpu-carry"] to the `device` tool):
#
#   OUT=$OUT bash scripts/cuda-experiments/decode_step_alternate.sh ROUNDS "NAME DIR [VAR=VALUE ...]" ...
#
# DIR is a folder of the carry (head, or a patch's NAME); the VAR=VALUEs set
# a patch's switches for that run. Each run is actorgraph-generate-bench
# --mode decode on the LLaMA-1B shape (saved once, random bf16 weights), 512
# tokens of context, 128 new tokens; its decode_ms_per_token goes to
# $OUT/results.txt and the summary lists every variant's runs. Stops starting
# rounds after AG_ALTERNATE_BUDGET_S seconds (default 480), so that one call
# of at most 600 s returns what it measured.
# Before the rounds, each variant's 32 greedy tokens (actorgraph-generate from
# its folder) are compared with HEAD's: $OUT/tokens.txt says same or DIFFER.
# Example (the per-line L2 pull, decode_step_lsu_pull.diff, packed as "pull"):
#   ... decode_step_alternate.sh 3 "head head" "p2 pull AG_DECODE_PULL=2" "p2r pull AG_DECODE_PULL=2 AG_DECODE_PULL_AT=1"
set -u
rounds="${1:?usage: decode_step_alternate.sh ROUNDS \"NAME DIR [VAR=VALUE ...]\" ...}"
shift
[ $# -gt 0 ] || { echo "decode_step_alternate: no variants given" >&2; exit 2; }
out="${OUT:?set OUT to the output folder}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$here" || exit 1
source scripts/gpu-setup.sh "$out" > /dev/null
gpu_unpack_carry /tmp/carry > /dev/null || exit 1
nvidia-smi -L
t0=$(date +%s)
budget="${AG_ALTERNATE_BUDGET_S:-480}"
[ -d /tmp/l1b ] || /tmp/carry/head/actorgraph-save-model --shape llama-1b --out /tmp/l1b 2>&1 | tail -1
echo "model ready after $(( $(date +%s) - t0 )) s"
: > "$out/results.txt"
run() {  # NAME DIR [VAR=VALUE ...]
  local name=$1 dir=$2 ms
  shift 2
  ms=$(env "$@" timeout 60 "/tmp/carry/$dir/actorgraph-generate-bench" --mode decode --model /tmp/l1b --devices cuda:0 \
         --context 512 --new-tokens 128 --prefill 0 2>&1 | tee -a "$out/runs.log" |
       awk '/^decode_ms_per_token:/{print $2}')
  echo "$name ${ms:-failed}" | tee -a "$out/results.txt"
}
# Each variant's greedy tokens against HEAD's first (a variant that changes
# the schedule, not the arithmetic, must give the same ones): 32 tokens after
# a 40-token prompt, printed as "tokens NAME same|DIFFER".
prompt=$(seq -s, 11 50)
tokens_of() {  # DIR [VAR=VALUE ...]
  local dir=$1
  shift
  env "$@" timeout 60 "/tmp/carry/$dir/actorgraph-generate" --model /tmp/l1b --devices cuda:0 --prompt-ids "$prompt" \
    --max-new-tokens 32 2>&1 | grep "^generated:"
}
reference=$(tokens_of head)
echo "HEAD's ${reference:-(no tokens: actorgraph-generate failed)}"
check_tokens() {  # NAME DIR [VAR=VALUE ...]
  local name=$1 got
  shift
  got=$(tokens_of "$@")
  if [ -n "$reference" ] && [ "$got" = "$reference" ]; then echo "tokens $name same"; else echo "tokens $name DIFFER: ${got:-none}"; fi
}
for variant in "$@"; do
  # shellcheck disable=SC2086  # a variant's words are its name, folder and switches
  check_tokens $variant
done | tee "$out/tokens.txt"
for ((round = 1; round <= rounds; ++round)); do
  for variant in "$@"; do
    # shellcheck disable=SC2086  # a variant's words are its name, folder and switches
    run $variant
  done
  if [ $(( $(date +%s) - t0 )) -gt "$budget" ]; then echo "budget spent after round $round"; break; fi
done
echo "== ms a token, each variant's runs in order"
awk '{v[$1] = v[$1] " " $2} END {for (k in v) print k ":" v[k]}' "$out/results.txt" | sort
