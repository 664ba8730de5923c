#!/usr/bin/env bash
# Run on the dev machine: builds GPU programs for sm_90 here, so that a call
# on the `device` tool's machine spends none of its 30 minutes building (a
# cold build of the decode programs and test_cuda takes 5-7 minutes there;
# unpacking these takes 2 s). Session 86 ran HEAD's test_cuda, every
# compute-sanitizer pass and an alternation of experiment binaries this way.
#
#   [AG_CARRY_EXPERIMENTS="ag-exp-..."] [AG_CARRY_PATCH_TESTS=1] bash scripts/gpu-carry.sh [NAME=PATCH.diff[+PATCH.diff...] ...]
#
# NAME=A.diff+B.diff builds A and B applied together; AG_CARRY_PATCH_TESTS=1
# packs each patch's test_cuda too, so that a variant about to land can run
# the CUDA tests in the call that measures it.
#
# Builds, in build-carry (Release, CUDA on for sm_90 with -lineinfo, oneDNN off: the GPU
# machines have no oneDNN; the other libraries are the .deb files of
# scripts/fetch-gpu-deps.sh, which the GPU side unpacks), HEAD's
# actorgraph-generate-bench, actorgraph-generate, actorgraph-save-model and
# test_cuda into carry/head/, then for each NAME=PATCH (a patch on
# gpu/cuda/decode_step.cu, as scripts/cuda-experiments/ keeps them) the two
# decode programs with the patch applied into carry/NAME/, and packs
# carry/ into .gpu-carry/carry.tar.xz (git-ignored): one xz stream whose
# dictionary outgrows a binary, since the variants differ in one kernel
# (HEAD's four and two patches' two each: 22 MB with -lineinfo). The working tree's decode_step.cu is restored
# after each patch (build-carry's objects are then the last patch's until its
# next build, which the restored file's time stamp makes recompile).
#
# On the GPU machine (carry [".device-deps/debs", ".gpu-carry"]), after
# `source scripts/gpu-setup.sh OUT`:
#   gpu_unpack_carry /tmp/carry   # unpacks the .debs and the binaries, checks they load
#   /tmp/carry/head/test_cuda ...
# AG_SANITIZE_TESTS=/tmp/carry/head/test_cuda bash scripts/gpu-sanitize.sh OUT
# then runs the sanitizer passes on the carried binary.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
build="$here/build-carry"
dest="$here/.gpu-carry"
kernel=gpu/cuda/decode_step.cu
if ! git diff --quiet -- "$kernel"; then
  echo "gpu-carry: $kernel has uncommitted changes; the patches apply to HEAD's" >&2
  exit 1
fi
for spec in "$@"; do
  [[ "$spec" == *=* ]] || { echo "gpu-carry: '$spec' is not NAME=PATCH[+PATCH...]" >&2; exit 1; }
  IFS=+ read -ra parts <<<"${spec#*=}"
  for part in "${parts[@]}"; do
    [[ -f "$part" ]] || { echo "gpu-carry: '$spec': '$part' is not a file" >&2; exit 1; }
  done
done
mkdir -p "$dest"
# -lineinfo (source lines for Nsight Compute and compute-sanitizer reports;
# it changes no code): also set on a build-carry configured without it.
if [[ ! -f "$build/CMakeCache.txt" ]] || ! grep -q "^CMAKE_CUDA_FLAGS:STRING=.*-lineinfo" "$build/CMakeCache.txt"; then
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DACTORGRAPH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_CUDA_FLAGS=-lineinfo -DACTORGRAPH_DNNL=OFF -DACTORGRAPH_BUILD_TESTS=ON -DACTORGRAPH_BUILD_BENCHMARKS=ON \
    -DACTORGRAPH_BUILD_FUZZERS=OFF >"$dest/configure.log" 2>&1 || { tail -30 "$dest/configure.log"; exit 1; }
fi
apps="actorgraph-generate-bench actorgraph-generate"
jobs="$(nproc)"
rm -rf "$dest/carry"
mkdir -p "$dest/carry/head"
echo "== HEAD: $apps actorgraph-save-model test_cuda"
cmake --build "$build" -j "$jobs" --target $apps actorgraph-save-model test_cuda >"$dest/build-head.log" 2>&1 ||
  { grep -E "error|FAILED" "$dest/build-head.log" | head -20; exit 1; }
for t in $apps actorgraph-save-model; do strip -o "$dest/carry/head/$t" "$build/apps/$t"; done
# AG_CARRY_EXPERIMENTS="ag-exp-bulk-ring-stream ...": standalone programs of
# scripts/cuda-experiments (their CMake targets) packed into carry/head/ too.
for t in ${AG_CARRY_EXPERIMENTS:-}; do
  cmake --build "$build" -j "$jobs" --target "$t" >"$dest/build-$t.log" 2>&1 ||
    { grep -E "error|FAILED" "$dest/build-$t.log" | head -20; exit 1; }
  strip -o "$dest/carry/head/$t" "$(find "$build/scripts/cuda-experiments" -maxdepth 1 -name "$t" -type f)"
done
strip -o "$dest/carry/head/test_cuda" "$build/tests/cuda/test_cuda"
restore() { git checkout -q -- "$kernel"; }
trap restore EXIT
patch_targets="$apps"
if [[ "${AG_CARRY_PATCH_TESTS:-0}" == 1 ]]; then patch_targets="$apps test_cuda"; fi
for spec in "$@"; do
  name="${spec%%=*}"
  IFS=+ read -ra parts <<<"${spec#*=}"
  echo "== $name: ${parts[*]}"
  for part in "${parts[@]}"; do git apply "$part"; done
  # shellcheck disable=SC2086  # the targets are several words
  cmake --build "$build" -j "$jobs" --target $patch_targets >"$dest/build-$name.log" 2>&1 ||
    { grep -E "error|FAILED" "$dest/build-$name.log" | head -20; exit 1; }
  restore
  mkdir -p "$dest/carry/$name"
  for t in $apps; do strip -o "$dest/carry/$name/$t" "$build/apps/$t"; done
  if [[ "$patch_targets" == *test_cuda ]]; then strip -o "$dest/carry/$name/test_cuda" "$build/tests/cuda/test_cuda"; fi
done
(cd "$dest" && tar cf - carry | xz -T1 --lzma2=preset=9,dict=256MiB >carry.tar.xz) && rm -rf "$dest/carry"
ls -la "$dest/carry.tar.xz"
