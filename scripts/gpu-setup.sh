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
#
# gpu_unpack_carry DIR unpacks the binaries scripts/gpu-carry.sh built on the
# dev machine (.gpu-carry/carry.tar.xz, carried with .device-deps/debs) into
# DIR (DIR/head/test_cuda, DIR/NAME/actorgraph-generate-bench, ...), with the
# .debs' libraries and CUDA's on LD_LIBRARY_PATH; non-zero, naming them,
# when a binary lacks a library (then build here instead).
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

gpu_unpack_carry() {
  local dir="${1:?usage: gpu_unpack_carry DIR}" tmp f miss status=0 d
  gpu_configure unpack-only /dev/null || { echo "gpu_unpack_carry: unpacking .device-deps failed" >&2; return 1; }
  for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
    [[ -d "$d" ]] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$d"
  done
  export LD_LIBRARY_PATH
  [[ -f "$here/.gpu-carry/carry.tar.xz" ]] || { echo "gpu_unpack_carry: no .gpu-carry/carry.tar.xz (carry it)" >&2; return 1; }
  tmp="$(mktemp -d)"
  tar xJf "$here/.gpu-carry/carry.tar.xz" -C "$tmp" || { rm -rf "$tmp"; return 1; }
  rm -rf "$dir" && mkdir -p "$(dirname "$dir")" && mv "$tmp/carry" "$dir" && rmdir "$tmp" || return 1
  for f in "$dir"/*/*; do
    miss="$(ldd "$f" 2>&1 | grep "not found")"
    if [[ -n "$miss" ]]; then
      echo "gpu_unpack_carry: $f: $miss" >&2
      status=1
    fi
  done
  return $status
}
