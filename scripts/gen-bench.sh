#!/usr/bin/env bash
# Generation figures of issue 12 on one GPU, side by side with PyTorch, in one call
# (from the repository root on the GPU machine, .device-deps carried):
#   bash scripts/gen-bench.sh OUTDIR
# 1. configures and builds through scripts/gpu-run.sh (steps "configure build";
#    AG_GEN_SKIP_BUILD=1 reuses an existing $AG_BUILD_DIR, default build-gpu);
# 2. scripts/torch_decode_bench.py: measured_bandwidth_gbs, torch_decode_ms_per_token
#    (static cache, CUDA graph replay), torch_prefill_tokens_per_s (skips with a reason
#    without torch);
# 3. actorgraph-save-model --shape llama-1b (bf16 random weights, 2.5 GB) into OUTDIR,
#    then actorgraph-generate-bench --mode decode on cuda:0: load_gb_per_s,
#    decode_ms_per_token, decode_vs_bandwidth_floor (at the measured bandwidth),
#    prefill_tokens_per_s (2048 tokens);
# 4. decode_vs_torch (ours / torch ms per token: lower is better) and prefill_vs_torch
#    (our tokens/s / torch's: higher is better);
# 5. actorgraph-generate-bench --mode sim: pipelined_sequences_speedup_sim.
# AG_GEN_DECODE_FLAGS adds flags to step 3's decode run (e.g. "--replay on").
# Everything is printed and written to OUTDIR/gen-bench.txt.
set -uo pipefail
out="${1:?usage: gen-bench.sh OUTDIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
build="${AG_BUILD_DIR:-$here/build-gpu}"
orig_ld_path="${LD_LIBRARY_PATH:-}"
if [ "${AG_GEN_SKIP_BUILD:-0}" != 1 ]; then
  AG_GPU_RUN_STEPS="configure build" bash scripts/gpu-run.sh "$out/build" || { echo "build failed: $out/build"; exit 1; }
fi
prefix="$here/.device-deps/prefix"
libdir="$prefix/usr/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$libdir:$libdir/openblas-pthread${orig_ld_path:+:$orig_ld_path}"
log="$out/gen-bench.txt"
: >"$log"
say() { echo "$*" | tee -a "$log"; }

say "== torch_decode_bench.py"
LD_LIBRARY_PATH="$orig_ld_path" PYTHONUNBUFFERED=1 timeout 300 python3 scripts/torch_decode_bench.py 2>&1 | tee "$out/torch-decode.txt" | tee -a "$log"
bw=$(awk '/^measured_bandwidth_gbs:/{print $2}' "$out/torch-decode.txt")
torch_ms=$(awk '/^torch_decode_ms_per_token:/{print $2}' "$out/torch-decode.txt")
torch_tps=$(awk '/^torch_prefill_tokens_per_s:/{print $2}' "$out/torch-decode.txt")

say "== actorgraph-save-model --shape llama-1b"
model="$out/llama-1b"
[ -f "$model/config.json" ] || "$build/apps/actorgraph-save-model" --out "$model" --shape llama-1b 2>&1 | tail -3 | tee -a "$log"

say "== actorgraph-generate-bench --mode decode (cuda:0)"
timeout 600 "$build/apps/actorgraph-generate-bench" --mode decode --model "$model" --devices cuda:0 \
  --context 512 --new-tokens 64 --prefill 2048 ${bw:+--bandwidth-gbs "$bw"} ${AG_GEN_DECODE_FLAGS:-} 2>&1 | tee "$out/ours-decode.txt" | tee -a "$log"
ours_ms=$(awk '/^decode_ms_per_token:/{print $2}' "$out/ours-decode.txt")
ours_tps=$(awk '/^prefill_tokens_per_s:/{print $2}' "$out/ours-decode.txt")
if [ -n "$torch_ms" ] && [ -n "$ours_ms" ]; then
  say "decode_vs_torch: $(awk -v a="$ours_ms" -v b="$torch_ms" 'BEGIN{printf "%.3f", a/b}')"
else
  say "decode_vs_torch: skipped (torch figure or ours missing)"
fi
if [ -n "$torch_tps" ] && [ -n "$ours_tps" ]; then
  say "prefill_vs_torch: $(awk -v a="$ours_tps" -v b="$torch_tps" 'BEGIN{printf "%.3f", a/b}')"
else
  say "prefill_vs_torch: skipped (torch figure or ours missing)"
fi

say "== actorgraph-generate-bench --mode sim"
timeout 300 "$build/apps/actorgraph-generate-bench" --mode sim 2>&1 | tee -a "$log"
