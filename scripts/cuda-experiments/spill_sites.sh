#!/usr/bin/env bash
# Where a CUDA source's register spills fall, by source line: the decode
# step's kernel runs at its 128-register cap, and `-Xptxas -v` gives only a
# kernel's spill bytes, not where they are (a spill in the products loop costs
# every item; one in the attention, once a layer). Compiles SOURCE (default
# gpu/cuda/decode_step.cu) with the build's own nvcc command plus -lineinfo
# into a cubin, prints ptxas's per-kernel spill figures, then every local-memory
# store and load (STL / LDL) in each kernel's SASS with the source line
# nvdisasm gives it, counted by line.
#   bash scripts/cuda-experiments/spill_sites.sh [BUILD_DIR [SOURCE]]
# BUILD_DIR: a configured build with CUDA (default build-gpu, else build).
# Needs nvdisasm (the CUDA toolkit's; the GPU machines have it, the 2-core
# development machine's toolkit does not: there it stops after ptxas's
# figures, unless NVDISASM names one, e.g. PyPI's:
#   pip download --no-deps nvidia-cuda-nvdisasm -d /tmp/nvd &&
#   python3 -m zipfile -e /tmp/nvd/*.whl /tmp/nvd/x &&
#   chmod +x /tmp/nvd/x/nvidia/cu13/bin/nvdisasm
#   NVDISASM=/tmp/nvd/x/nvidia/cu13/bin/nvdisasm bash spill_sites.sh
# (13.5's reads nvcc 13.0's cubins; session 83).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-}"
if [[ -z "$build" ]]; then
  build="$here/build-gpu"
  [[ -f "$build/build.ninja" ]] || build="$here/build"
fi
source_file="${2:-gpu/cuda/decode_step.cu}"
object="$(basename "$source_file").o"
cd "$build"
target=$(ninja -t targets all | grep -o "^[^:]*/${object}" | head -1)
[[ -n "$target" ]] || { echo "no object ${object} in $build" >&2; exit 1; }
command=$(ninja -t commands "$target" | tail -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The build's compile, made a cubin with line information: no dependency
# file, no object.
# A cubin holds one GPU code: sm_90's alone.
# CMake may quote each --generate-code (the GPU machines' build does): a
# quoted one goes whole, quotes and all, so eval sees no unmatched quote.
command=$(echo "$command" | sed -e 's# -MD##; s# -MT [^ ]*##; s# -MF [^ ]*##; s# -c # #' \
  -e 's#"--generate-code=[^"]*"##g' -e 's#--generate-code=[^ ]*##g' \
  -e "s#-o [^ ]*${object}#-arch=sm_90 -cubin -lineinfo -o $work/k.cubin#")
if ! eval "$command -Xptxas -v" >"$work/ptxas.log" 2>&1; then
  cat "$work/ptxas.log" >&2
  exit 1
fi
grep -E "Compiling entry|spill" "$work/ptxas.log" | sed -e 's/ptxas info *: //'
disasm="${NVDISASM:-$(command -v nvdisasm || echo /usr/local/cuda/bin/nvdisasm)}"
if [[ ! -x "$disasm" ]]; then
  echo "no nvdisasm here: the spill sites need one (set NVDISASM)"
  exit 0
fi
"$disasm" -g -c "$work/k.cubin" >"$work/k.sass"
# nvdisasm -g marks each run of instructions with `//## File "F", line N`;
# a function starts at `.text.NAME:`.
awk '
  /^\.text\./ { fn = $0; sub(/^\.text\./, "", fn); sub(/:$/, "", fn); next }
  /\/\/## File/ { match($0, /line [0-9]+/); line = substr($0, RSTART + 5, RLENGTH - 5); f = $0; sub(/.*File "/, "", f); sub(/".*/, "", f); n = split(f, parts, "/"); file = parts[n]; next }
  /[^A-Z](STL|LDL)(\.[A-Z0-9]+)*[ ]/ { kind = ($0 ~ /STL/) ? "STL" : "LDL"; count[fn "\t" file ":" line "\t" kind]++ }
  END { for (k in count) print count[k] "\t" k }
' "$work/k.sass" | sort -t$'\t' -k2,2 -k3,3V | awk -F'\t' '
  $2 != last { print "== " $2; last = $2 }
  { printf "  %-28s %s x%d\n", $3, $4, $1 }
'
