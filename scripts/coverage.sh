#!/usr/bin/env bash
# Line coverage of the product code (actors/, graph/, gpu/, messages/, apps/)
# by the CPU test suite: a build with gcc's --coverage in build-cov (CUDA and
# the benchmarks off), ctest there, then gcovr's table, least covered files
# last. Not part of CI: run it to find code no test reaches.
#
#   bash scripts/coverage.sh            # build, test, print the table
#   bash scripts/coverage.sh report     # the table again from the last run
#
# Prints `coverage_lines_percent: X` at the end. Needs gcovr (pip install
# gcovr). On the 2-core development machine: about 8 min to build, 1 min of
# tests (session 78: 93% of 17,977 lines).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
dir="${AG_COVERAGE_BUILD:-$here/build-cov}"
jobs="${AG_BUILD_JOBS:-$(nproc)}"

if ! command -v gcovr > /dev/null; then
  echo "coverage.sh: gcovr not found (pip install gcovr)" >&2
  exit 1
fi

if [ "${1:-}" != report ]; then
  mkdir -p "$dir"
  cmake -S . -B "$dir" -G Ninja -DACTORGRAPH_BUILD_TESTS=ON -DCMAKE_BUILD_TYPE=Debug \
    "-DCMAKE_CXX_FLAGS_DEBUG=-O1 -g0 --coverage" -DCMAKE_EXE_LINKER_FLAGS=--coverage \
    -DACTORGRAPH_CUDA=OFF -DACTORGRAPH_BUILD_BENCHMARKS=OFF > "$dir/configure.log"
  cmake --build "$dir" -j "$jobs"
  find "$dir" -name '*.gcda' -delete
  (cd "$dir" && ctest -j "$jobs" --output-on-failure) | tail -3
fi

gcovr -r . "$dir" --filter 'actors/|graph/|gpu/|messages/|apps/' --exclude 'tests/' -j "$jobs" \
  --gcov-ignore-parse-errors=all --sort uncovered-number --txt - 2> /dev/null | tee "$dir/coverage.txt" | tail -40
percent="$(awk '/^TOTAL/ {print $4}' "$dir/coverage.txt" | tr -d '%')"
echo "coverage_lines_percent: ${percent:-unknown}"
