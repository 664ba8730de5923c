#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz/fuzz_<name>.cpp) with clang under
# AddressSanitizer + UndefinedBehaviorSanitizer and runs each for SECONDS.
#
#   bash scripts/fuzz.sh [SECONDS] [NAME...]    default: 60 s, every target
#   bash scripts/fuzz.sh 20                      what CI runs (scripts/dev.sh test)
#   bash scripts/fuzz.sh 600 graph_nodes         one target, longer
#
# Prints `fuzz_targets: N` and `fuzz_crashes: N` and exits non-zero when a
# target crashed (a sanitizer report, an abort, a FUZZ_CHECK property, a
# timeout of 10 s per input or 2 GiB of memory). The input that did it is kept
# in build-fuzz/crashes/<name>-crash-*: replay it with
#   build-fuzz/tests/fuzz/fuzz_<name> build-fuzz/crashes/<name>-crash-...
# then fix the bug, add the input to tests/fuzz/corpus/<name>/ (the replay
# test `fuzz.<name>` of every normal build runs the corpus) and a gtest that
# names the defect next to the code it is about.
#
# New inputs the fuzzer finds go to build-fuzz/corpus/<name>/ (not the
# repository); the seeds in tests/fuzz/corpus/<name>/ are read, never written.
#
# Adding a target (e.g. the safetensors header / config.json reader once it
# exists): write tests/fuzz/fuzz_<name>.cpp defining LLVMFuzzerTestOneInput
# (see tests/fuzz/fuzz_check.hpp for FUZZ_CHECK and the byte reader), add
# an ag_add_fuzz_target(<name> LIBS ...) line to tests/fuzz/CMakeLists.txt, and
# put a few small seeds in tests/fuzz/corpus/<name>/. This script runs every
# tests/fuzz/fuzz_*.cpp it finds.
#
# Needs clang-14 and libclang-rt-14-dev (Debian; scripts/dev.sh installs them).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
seconds="${1:-60}"
shift || true
dir="${AG_FUZZ_BUILD:-$here/build-fuzz}"
jobs="${AG_BUILD_JOBS:-$(nproc)}"

cc="$(command -v clang-14 || command -v clang || true)"
cxx="$(command -v clang++-14 || command -v clang++ || true)"
if [ -z "$cxx" ]; then
  echo "fuzz.sh: clang++ not found (apt-get install clang-14 libclang-rt-14-dev)" >&2
  exit 2
fi

names=("$@")
if ((${#names[@]} == 0)); then
  for f in tests/fuzz/fuzz_*.cpp; do
    n="$(basename "$f" .cpp)"
    names+=("${n#fuzz_}")
  done
fi

launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
mkdir -p "$dir"
echo "== fuzz build ($cxx, address+undefined, libFuzzer): $dir"
# -O1 -gline-tables-only: libFuzzer's own advice, and 2-3x faster to compile
# with the sanitizers than -O2 -g; reports keep their file:line frames.
cmake -S "$here" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -gline-tables-only -DNDEBUG" \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_CXX_COMPILER="$cxx" "${launcher[@]}" \
  -DCMAKE_CXX_FLAGS="-fsanitize=fuzzer-no-link -fno-sanitize-recover=all" \
  -DACTORGRAPH_SANITIZER=address,undefined -DACTORGRAPH_CUDA=OFF \
  -DACTORGRAPH_BUILD_BENCHMARKS=OFF -DACTORGRAPH_BUILD_FUZZERS=ON >"$dir/configure.log" 2>&1 || {
  cat "$dir/configure.log"
  exit 1
}
targets=()
for n in "${names[@]}"; do targets+=("fuzz_$n"); done
cmake --build "$dir" -j "$jobs" --target "${targets[@]}"

mkdir -p "$dir/crashes"
crashes=0
for n in "${names[@]}"; do
  mkdir -p "$dir/corpus/$n"
  seeds="tests/fuzz/corpus/$n"
  [ -d "$seeds" ] || { echo "fuzz.sh: no seed corpus $seeds" >&2; exit 2; }
  echo "== fuzz_$n for $seconds s"
  log="$dir/fuzz_$n.log"
  # detect_leaks: a leak is a crash too; abort_on_error: sanitizer reports end the run
  if ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1 \
     UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
     "$dir/tests/fuzz/fuzz_$n" "$dir/corpus/$n" "$seeds" \
       -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
       -artifact_prefix="$dir/crashes/$n-" -print_final_stats=1 >"$log" 2>&1; then
    grep -E "stat::number_of_executed_units|stat::new_units_added" "$log" | tr '\n' ' ' || true
    echo
  else
    crashes=$((crashes + 1))
    echo "!! fuzz_$n crashed; the input is in $dir/crashes/ ($n-*). Last lines of $log:"
    tail -40 "$log"
  fi
done
echo "fuzz_targets: ${#names[@]}"
echo "fuzz_crashes: $crashes"
((crashes == 0))
