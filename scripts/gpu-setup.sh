# The shared start of the one-call GPU scripts (gpu-fast.sh, gpu-small.sh,
# gpu-sanitize.sh, gpu-tp.sh), sourced right after `set -uo pipefail`:
#   source "$(dirname "${BASH_SOURCE[0]}")/gpu-setup.sh" "$@"
# with OUTDIR the first argument. Sets `here` (the repository root, made the
# working directory), `out` (OUTDIR, created, absolute) and `build`
# (AG_BUILD_DIR, default build-gpu), and keeps NVLink multicast off for
# every process (NCCL_NVLS_ENABLE=0).
#
# gpu_configure [STEPS [LOG]] then runs scripts/gpu-run.sh's STEPS (default
# `configure`; `unpack-only` unpacks .device-deps alone) with its output to LOG
# (default: this terminal), and puts the unpacked libraries on
# LD_LIBRARY_PATH; non-zero when gpu-run.sh failed.
out="${1:?usage: $(basename "$0") OUTDIR}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here" || exit 1
mkdir -p "$out"
out="$(cd "$out" && pwd)"
build="${AG_BUILD_DIR:-$here/build-gpu}"
export NCCL_NVLS_ENABLE=0

gpu_configure() {
  local steps="${1:-configure}" log="${2:-}" status
  if [[ -n "$log" ]]; then
    AG_GPU_RUN_STEPS="$steps" bash scripts/gpu-run.sh "$out" >"$log" 2>&1
  else
    AG_GPU_RUN_STEPS="$steps" bash scripts/gpu-run.sh "$out"
  fi
  status=$?
  local libdir="$here/.device-deps/prefix/usr/lib/x86_64-linux-gnu"
  export LD_LIBRARY_PATH="$libdir:$libdir/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  return $status
}
