#!/usr/bin/env bash
# ThreadSanitizer over the whole runtime, actors included: builds libcaf_core
# with -fsanitize=thread (scripts/caf-tsan.sh, cached outside the clone),
# builds actorgraph against it with -fsanitize=thread, and runs CTest.
#
#   bash scripts/tsan.sh                  every test (about 10 min on 2 cores)
#   bash scripts/tsan.sh -L actors        CTest arguments select tests
#   AG_TSAN_CI=1 bash scripts/tsan.sh     what CI runs: the actor tests (protocol,
#                                         stress, completion, bad input...) and
#                                         the device backends
#
# Halts on the first report (TSAN_OPTIONS=halt_on_error=1), so a race fails
# the test that hit it. CUDA is off (nothing runs on a GPU under TSan here).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
dir="${AG_TSAN_BUILD:-$here/build-tsan-caf}"
jobs="${AG_BUILD_JOBS:-$(nproc)}"

caf_root="$(bash "$here/scripts/caf-tsan.sh" | tail -1)"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
mkdir -p "$dir"
echo "== TSan build against instrumented CAF ($caf_root): $dir"
cmake -S "$here" -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo "${launcher[@]}" \
  -DCAF_ROOT="$caf_root" -DACTORGRAPH_SANITIZER=thread -DACTORGRAPH_CUDA=OFF \
  -DACTORGRAPH_BUILD_BENCHMARKS=OFF >"$dir/configure.log" 2>&1 || {
  cat "$dir/configure.log"
  exit 1
}
caf_lib="$(grep -E '^CAF_CORE_LIBRARY:' "$dir/CMakeCache.txt" | cut -d= -f2)"
case "$caf_lib" in
  "$caf_root"/*) ;;
  *) echo "tsan.sh: CMake found $caf_lib, not the instrumented CAF in $caf_root" >&2; exit 1 ;;
esac

# Self-check: TSan must see a race planted inside CAF actors, and nothing in
# the same program made race-free (with Debian's CAF it reports dozens of
# false races there instead): proof that the instrumented CAF is in use.
echo "== TSan self-check (tests/tsan): a planted race inside actors is reported, a clean twin is not"
for prog in planted_race no_race; do
  c++ -std=c++17 -O1 -g -fsanitize=thread -w "$here/tests/tsan/$prog.cpp" -I"$caf_root/include" \
    -L"$caf_root/lib" -Wl,-rpath,"$caf_root/lib" -lcaf_core -o "$dir/tsan_$prog"
done
planted="$(TSAN_OPTIONS=halt_on_error=0 "$dir/tsan_planted_race" 2>&1 | grep -c 'WARNING: ThreadSanitizer: data race' || true)"
clean="$(TSAN_OPTIONS=halt_on_error=0 "$dir/tsan_no_race" 2>&1 | grep -c 'WARNING: ThreadSanitizer' || true)"
echo "tsan_planted_race_reports: $planted (want >= 1); tsan_clean_reports: $clean (want 0)"
if [ "$planted" -lt 1 ] || [ "$clean" -ne 0 ]; then
  echo "tsan.sh: ThreadSanitizer does not see inside CAF's actors; is $caf_root instrumented?" >&2
  exit 1
fi

args=("$@")
if [ -n "${AG_TSAN_CI:-}" ]; then
  # the actor tests (protocol, stress, completion, bad input: CAF inside)
  # and the device backends; only their two programs are built
  cmake --build "$dir" -j "$jobs" --target test_actors test_gpu
  args=(-L '^(actors|backends)$')
else
  cmake --build "$dir" -j "$jobs"
fi
start=$(date +%s)
(cd "$dir" && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 history_size=4" \
   ctest --output-on-failure -j "$jobs" --timeout 900 "${args[@]}")
echo "tsan_seconds: $(( $(date +%s) - start ))"
