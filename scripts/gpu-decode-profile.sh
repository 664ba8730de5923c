#!/usr/bin/env bash
# Where a decode step's time goes, kernel by kernel (issue 12), in one call on a
# GPU machine, from the repository root, with .device-deps carried and
# build-gpu/apps/{actorgraph-save-model,actorgraph-generate-bench} built (or carried):
#   bash scripts/gpu-decode-profile.sh OUTDIR [extra generate-bench flags]
# 1. saves the LLaMA-1B shape (bf16, random weights) into /tmp (not OUTDIR: 2.5 GB);
# 2. actorgraph-generate-bench --mode decode --replay on: decode_ms_per_token;
# 3. the same run under Nsight Systems (nodes of the replayed CUDA graphs traced one by
#    one) and its kernel summary (OUTDIR/kernels.csv), or, without nsys, Nsight
#    Compute's gpu__time_duration of 2000 kernels after the first 4000 (kernels.csv);
# 4. prints the kernels grouped by name: count per token, microseconds per token.
set -uo pipefail
out="${1:?usage: gpu-decode-profile.sh OUTDIR [flags]}"
shift
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
AG_GPU_RUN_STEPS=unpack-only bash scripts/gpu-run.sh "$out/unpack" >/dev/null 2>&1
libdir="$here/.device-deps/prefix/usr/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$libdir:$libdir/openblas-pthread:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
apps="${AG_BUILD_DIR:-$here/build-gpu}/apps"
model=/tmp/ag-llama-1b
[ -f "$model/config.json" ] || "$apps/actorgraph-save-model" --out "$model" --shape llama-1b 2>&1 | tail -1
tokens=64
bench=("$apps/actorgraph-generate-bench" --mode decode --model "$model" --devices cuda:0 --context 512
       --new-tokens "$tokens" --replay on "$@")
echo "== decode, no profiler"
"${bench[@]}" 2>&1 | tee "$out/decode.txt"
nsys=$(command -v nsys || ls /usr/local/cuda/bin/nsys /opt/nvidia/nsight-systems/*/bin/nsys 2>/dev/null | head -1)
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
if [ -n "$nsys" ]; then
  echo "== nsys: $nsys"
  "$nsys" profile --cuda-graph-trace=node --trace=cuda -o "$out/decode" --force-overwrite true "${bench[@]}" >/dev/null 2>&1
  "$nsys" stats --report cuda_gpu_kern_sum --format csv --output "$out/kernels" "$out/decode.nsys-rep" >/dev/null 2>&1
  csv=$(ls "$out"/kernels*.csv 2>/dev/null | head -1)
  # Columns: Time (%),Total Time (ns),Instances,Avg,Med,Min,Max,StdDev,Name
  [ -n "$csv" ] && python3 - "$csv" "$tokens" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1])))
head, body = rows[0], rows[1:]
ti, ni, nm = head.index("Total Time (ns)"), head.index("Instances"), head.index("Name")
# The run also prefills 2048 tokens and warms up: count only what one token's
# decode repeats, approximated by kernels per token = instances / tokens rounded.
total = sum(float(r[ti]) for r in body)
print(f"{'us total':>10} {'instances':>9} {'avg us':>8}  name")
for r in body[:40]:
    print(f"{float(r[ti])/1e3:10.1f} {int(r[ni]):9d} {float(r[ti])/1e3/max(1,int(r[ni])):8.2f}  {r[nm][:110]}")
print(f"kernels_total_ms: {total/1e6:.3f}")
EOF
elif [ -n "$ncu" ]; then
  echo "== ncu: $ncu"
  "$ncu" --metrics gpu__time_duration.sum --launch-skip 4000 --launch-count 2000 --csv "${bench[@]}" \
    >"$out/kernels.csv" 2>/dev/null
  python3 - "$out/kernels.csv" <<'EOF'
import csv, sys, collections
# The bench's own output comes first (one line of it has commas enough to
# pass for a row): start at ncu's header.
rows = list(csv.reader(open(sys.argv[1])))
start = next(i for i, r in enumerate(rows) if "Kernel Name" in r and "Metric Value" in r)
head, body = rows[start], [r for r in rows[start + 1:] if len(r) == len(rows[start])]
kn, mv = head.index("Kernel Name"), head.index("Metric Value")
agg = collections.defaultdict(lambda: [0, 0.0])
for r in body:
    a = agg[r[kn][:110]]; a[0] += 1; a[1] += float(r[mv].replace(",", ""))
print(f"{'us total':>10} {'count':>6} {'avg us':>8}  name")
for name, (n, t) in sorted(agg.items(), key=lambda kv: -kv[1][1]):
    print(f"{t/1e3:10.1f} {n:6d} {t/1e3/n:8.2f}  {name}")
EOF
else
  echo "neither nsys nor ncu found: no kernel profile"
fi
