#!/usr/bin/env bash
# ThreadSanitizer over the whole runtime, actors included: builds libcaf_core
# with -fsanitize=thread (scripts/caf-tsan.sh, cached outside the clone),
# builds actorgraph against it with -fsanitize=thread (CMakePresets.json
# preset tsan-caf, in build-tsan-caf/) and runs CTest.
#
#   bash scripts/tsan.sh                  every test
#   bash scripts/tsan.sh -L actors        extra arguments go to CTest
#   AG_TSAN_CI=1 bash scripts/tsan.sh     what CI runs (presets tsan-caf-ci): the
#                                         actor tests (protocol, stress,
#                                         completion, bad input...), the device
#                                         backends, the generator's tests
#                                         (test_checkpoint) and the TSan
#                                         self-check
#
# The self-check (tests/tsan, label tsan) proves the setup: TSan must report a
# race planted inside two actors and nothing in its race-free twin (with
# Debian's uninstrumented CAF that twin gets dozens of false reports, and a
# real race inside an actor can go unseen). Tests halt on the first report
# (TSAN_OPTIONS=halt_on_error=1), so a race fails the test that hit it. CUDA
# is off. Prints `tsan_seconds: N` (CTest's run, not the build).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
jobs="${AG_BUILD_JOBS:-$(nproc)}"

AG_CAF_TSAN_ROOT="$(bash "$here/scripts/caf-tsan.sh" | tail -1)"
export AG_CAF_TSAN_ROOT
dir="$here/build-tsan-caf"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
mkdir -p "$dir"
echo "== TSan build against the instrumented CAF ($AG_CAF_TSAN_ROOT): preset tsan-caf, $dir"
cmake --preset tsan-caf "${launcher[@]}" >"$dir/configure.log" 2>&1 || {
  cat "$dir/configure.log"
  exit 1
}
caf_lib="$(grep -E '^CAF_CORE_LIBRARY:' "$dir/CMakeCache.txt" | cut -d= -f2)"
case "$caf_lib" in
  "$AG_CAF_TSAN_ROOT"/*) ;;
  *) echo "tsan.sh: CMake found $caf_lib, not the instrumented CAF in $AG_CAF_TSAN_ROOT" >&2; exit 1 ;;
esac

preset=tsan-caf
[ -n "${AG_TSAN_CI:-}" ] && preset=tsan-caf-ci
cmake --build --preset "$preset" -j "$jobs"
start=$(date +%s)
if [ "$preset" = tsan-caf-ci ]; then
  # Printed so that nobody takes it as covered (docs/TESTING.md, "Known"):
  echo "tsan.sh: not run under TSan here: apps.soak_short (its target is not in this build; the soak runs in the release and ASan builds)"
fi
ctest --preset "$preset" -j "$jobs" "$@"
echo "tsan_seconds: $(( $(date +%s) - start ))"
