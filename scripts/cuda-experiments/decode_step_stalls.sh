#!/usr/bin/env bash
# Where the decode-step kernel's warps stall, by source line (session 86; first run in session 87): Nsight Compute's
# warp-state sampling (SourceCounters, WarpStateStats) over one launch of the one-kernel decode step, then the sampled
# stalls summed by line of gpu/cuda/decode_step.cu (and the files it inlines), most first. Session 53 read the whole
# kernel's reasons (wait 25%, short scoreboard 15%, barrier 14%, ... no instruction 3%); what is wanted now is the
# attention's lines: its first round takes 3.1 us (the phase diagnostic's ADIAG lines, sessions 82-86) for a few
# thousand instructions a warp, and which stall fills it (barrier, instruction fetch, shared-memory scoreboard) is not
# known. Needs a bench built with -lineinfo (scripts/gpu-carry.sh builds with it), and ncu on the GPU machine.
#   bash scripts/cuda-experiments/decode_step_stalls.sh BENCH MODEL_DIR OUTDIR [LAUNCH_SKIP]
# BENCH is actorgraph-generate-bench; LAUNCH_SKIP (default 80) the decode-step launches to let pass first (the
# process runs the step 128 times, untraced by graph replay: --replay off).
set -uo pipefail
bench="${1:?usage: decode_step_stalls.sh BENCH MODEL_DIR OUTDIR [LAUNCH_SKIP]}"
model="${2:?model folder}"
out="${3:?output folder}"
skip="${4:-80}"
mkdir -p "$out"
ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
[[ -n "$ncu" ]] || { echo "decode_step_stalls: no ncu on this machine"; exit 1; }
"$ncu" --version | tail -1
rep="$out/decode_step_stalls"
"$ncu" --kernel-name regex:decode_step_kernel --launch-skip "$skip" --launch-count 1 \
  --section WarpStateStats --section SourceCounters --import-source yes -f -o "$rep" \
  "$bench" --mode decode --model "$model" --devices cuda:0 --prefill 0 --new-tokens 128 --decode-step on --replay off \
  >"$out/ncu-profile.log" 2>&1 || { tail -20 "$out/ncu-profile.log"; exit 1; }
echo "== the kernel's warp states"
"$ncu" --import "$rep.ncu-rep" --page details --section WarpStateStats 2>&1 | grep -E "Stall|Warp Cycles|Issued" | head -30
# Session 87: the cuda view exported the source lines without any metric
# column (ncu 2025.3.1); the SASS views carry the per-instruction samples.
# Each view goes to its own file; the first with a stall column is summed.
echo "== sampled stalls by source line, most first"
picked=""
for view in cuda cuda,sass sass; do
  f="$out/source-${view/,/-}.csv"
  "$ncu" --import "$rep.ncu-rep" --page source --csv --print-source "$view" >"$f" 2>"$f.err" || continue
  echo "view $view: $(wc -l <"$f") lines; columns: $(grep -m1 -E 'Warp Stall|Source' "$f" | cut -c1-300)"
  if [[ -z "$picked" ]] && grep -q "Warp Stall Sampling (All" "$f"; then picked="$f"; fi
done
if [[ -n "$picked" ]]; then
  echo "summing $picked (a SASS view's rows are instructions, not source lines)"
  python3 - "$picked" <<'EOF'
import csv, sys
rows = list(csv.reader(open(sys.argv[1], newline="")))
head = next((i for i, r in enumerate(rows) if any("Warp Stall Sampling (All" in c for c in r)), None)
if head is None:
    print("no stall-sampling column in", sys.argv[1]); sys.exit(0)
cols = rows[head]
total = cols.index(next(c for c in cols if c.startswith("Warp Stall Sampling (All")))
src = next((i for i, c in enumerate(cols) if c in ("Source", "# Source")), 1)
line = next((i for i, c in enumerate(cols) if c in ("#", "Line", "# Line")), 0)
data = []
for r in rows[head + 1:]:
    try:
        data.append((float(r[total] or 0), r[line], r[src].strip()[:110]))
    except (ValueError, IndexError):
        pass
all_samples = sum(d[0] for d in data) or 1.0
for n, ln, text in sorted(data, reverse=True)[:45]:
    print(f"{100 * n / all_samples:5.1f}%  line {ln:>5}  {text}")
EOF
else
  echo "no view exported a stall column (the files above); open $rep.ncu-rep in Nsight Compute"
fi
