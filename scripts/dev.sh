#!/usr/bin/env bash
# The two quick-start commands (README):
#   bash scripts/dev.sh demo   install what is missing, build the REPL alone (no tests,
#                              no benchmarks; CUDA only with a GPU), run the demo
#                              script examples/demo.ag, then the prompt
#   bash scripts/dev.sh test   install what is missing, build, run every test
#                              (release build, then the installed package with
#                              examples/consumer, then AddressSanitizer + UBSan,
#                              then the actor and backend tests under
#                              ThreadSanitizer with an instrumented CAF, then 20 s
#                              of each fuzz target; builds are
#                              CMakePresets.json presets). docs/TESTING.md has the
#                              full forms.
# Works on a fresh Debian bookworm machine as root (apt); on a machine where
# everything is installed it skips apt. Extra arguments after `demo` go to the REPL
# instead of the demo script (e.g. `demo --script examples/checked.ag`).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
mode="${1:-}"
shift || true
jobs="${AG_BUILD_JOBS:-$(nproc)}"

packages=(build-essential cmake ninja-build pkg-config git
          libcaf-dev libconcurrentqueue-dev libgtest-dev libgmock-dev libbenchmark-dev
          libopenblas-dev libdnnl-dev libreadline-dev libcli11-dev python3 python3-numpy
          nlohmann-json3-dev libsentencepiece-dev
          clang-14 libclang-rt-14-dev)  # clang: libFuzzer (scripts/fuzz.sh)

install_missing() {
  local missing=()
  for p in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  if ((${#missing[@]})); then
    echo "== installing: ${missing[*]}"
    local sudo=""
    [ "$(id -u)" = 0 ] || sudo="sudo"
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -qq
    $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
  fi
}

# The Python reference checks need numpy: prefer an interpreter that has it
# (Debian's python3-numpy lives in /usr/bin/python3, which a pyenv shim may hide).
python_args=()
pick_python() {
  python_args=()
  local py
  for py in "$(command -v python3 || true)" /usr/bin/python3; do
    if [ -n "$py" ] && "$py" -c 'import numpy' 2>/dev/null; then
      python_args=(-DPython3_EXECUTABLE="$py")
      return
    fi
  done
}

# preset_build <preset> <binary dir> [cmake args...]: configure and build a
# CMakePresets.json preset (the presets and this script stay one definition).
preset_build() {
  local preset="$1" dir="$2"
  shift 2
  pick_python
  mkdir -p "$dir"
  cmake --preset "$preset" "${python_args[@]}" "$@" >"$dir/configure.log" 2>&1 || {
    cat "$dir/configure.log"
    return 1
  }
  grep -E "actorgraph:|skipp" "$dir/configure.log" || true
  cmake --build --preset "$preset" -j "$jobs"
}

# consumer_check: installs the release build into a temporary prefix, then
# configures, builds and runs examples/consumer (find_package(actorgraph))
# against it, as a user's project would: it links the installed libraries.
consumer_check() {
  local tmp
  tmp="$(mktemp -d)"
  cmake --install build --prefix "$tmp/prefix" >"$tmp/install.log" 2>&1 || {
    cat "$tmp/install.log"
    return 1
  }
  cmake -S examples/consumer -B "$tmp/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/configure.log" 2>&1 || {
    cat "$tmp/configure.log"
    return 1
  }
  cmake --build "$tmp/build" -j "$jobs"
  "$tmp/build/actorgraph-consumer" sim:2
  rm -rf "$tmp"
}

case "$mode" in
  demo)
    install_missing
    # Only what the REPL needs (preset demo: its own build dir, no tests, no
    # benchmarks), and the CUDA backend only where a GPU can run it (nvcc alone
    # is slow).
    cuda=OFF
    if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then cuda=AUTO; fi
    preset_build demo build-demo -DACTORGRAPH_CUDA="$cuda"
    if (($#)); then exec ./build-demo/apps/actorgraph "$@"; fi
    exec ./build-demo/apps/actorgraph --init examples/demo.ag
    ;;
  test)
    install_missing
    start=$(date +%s)
    echo "== release build (preset release)"
    preset_build release build
    echo "== tests (release; GPU tests skip with a reason when there is no GPU)"
    ctest --preset release -j "$jobs"
    echo "== installed package: examples/consumer built against a temporary install, run on sim:2"
    consumer_check
    echo "== soak, CI size: 50,000 jobs on 8 sim devices with faults, cancels, deadlines, continuations (apps/soak.cpp)"
    soak_start=$(date +%s)
    ./build/apps/actorgraph-soak --jobs 50000 --devices sim:8 --in-flight 64 --seed 13
    echo "soak_ci_seconds: $(( $(date +%s) - soak_start ))"
    echo "== generation soak, CI size: 3,000 sequences over random generators and layouts on 4 sim devices with cancels, op errors and killed devices (apps/generate_soak.cpp)"
    ./build/apps/actorgraph-generate-soak --sequences 3000 --devices sim:4 --seed 13 --epochs 3
    echo "== generation soak narrowed to tensor degree 2 on 2 stages with batched decode and op errors: the void collective parts of failed jobs (before session 91 they wrote into their job's memory and gave other sequences wrong tokens)"
    ./build/apps/actorgraph-generate-soak --sequences 2000 --devices sim:4 --seed 13 --epochs 2 --layout 2x2 --decode-batch 3 --op-error-rate 0.003 --cancel-rate 0 --kills 0
    echo "== AddressSanitizer + UndefinedBehaviorSanitizer build (preset asan; CUDA off: nothing runs on a GPU here; its REPL has no GNU readline: the plain line mode)"
    preset_build asan build-asan
    ctest --preset asan -j "$jobs"
    echo "== ThreadSanitizer over the actors (CAF built with -fsanitize=thread, cached), the backends and the generator (preset tsan-caf-ci)"
    AG_TSAN_CI=1 bash scripts/tsan.sh
    echo "== fuzzing: every target for 20 s (clang, address + undefined)"
    bash scripts/fuzz.sh 20
    echo "== all tests passed in $(( $(date +%s) - start )) s"
    ;;
  *)
    echo "usage: bash scripts/dev.sh demo [repl args...] | test" >&2
    exit 2
    ;;
esac
