#!/usr/bin/env bash
# Run on the GPU machine (from the repository root, with .device-deps carried):
#   bash scripts/gpu-run.sh OUTDIR [ctest args...]
# 1. unpacks .device-deps/debs/*.deb (from scripts/fetch-gpu-deps.sh) into
#    .device-deps/prefix with dpkg -x (never into /);
# 2. configures the whole project (Release, sm_90, CUDA on) against that prefix
#    and builds everything;
# 3. runs `ctest -L gpu` (the CUDA tests), then the other test labels, then the
#    GPU benchmarks (apps/actorgraph-cuda-bench, scripts/torch_ref_bench.py),
#    then the end-to-end ones (apps/actorgraph-e2e-bench, scripts/torch_e2e_ref.py);
# 4. writes logs and results into OUTDIR (build.log, ctest-gpu.log,
#    ctest-all.log, cuda-bench.txt, torch-bench.txt, summary.txt).
# Environment: AG_GPU_RUN_STEPS (default "configure build gpu all bench e2e"; also
# "lanes": actorgraph-lanes-bench on cuda:0 and sim; "asan": the CI's
# AddressSanitizer + UBSan suite (preset asan's settings, CUDA off) built and
# run on this machine's many cores in build-asan-gpu, ctest-asan.log) picks steps;
# AG_BUILD_DIR (default build-gpu); AG_JOBS (default nproc).
set -uo pipefail
out="${1:?usage: gpu-run.sh OUTDIR [ctest args...]}"
shift || true
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$here"
mkdir -p "$out"
out="$(cd "$out" && pwd)"
steps="${AG_GPU_RUN_STEPS:-configure build gpu all bench e2e}"
build="${AG_BUILD_DIR:-$here/build-gpu}"
jobs="${AG_JOBS:-$(nproc)}"
prefix="$here/.device-deps/prefix"
summary="$out/summary.txt"
: >"$summary"
note() { echo "== $*" | tee -a "$summary"; }
has() { [[ " $steps " == *" $1 "* ]]; }

# NVLink multicast must stay off on the shared GPU hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

note "host $(hostname) $(date -u +%FT%TZ)"
{ nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv,noheader || true; } 2>&1 | tee -a "$summary"
{ nvcc --version | tail -1; cmake --version | head -1; g++ --version | head -1; } 2>&1 | tee -a "$summary"

# --- unpack the packages ------------------------------------------------------
if compgen -G ".device-deps/debs/*.deb" >/dev/null; then
  mkdir -p "$prefix"
  for f in .device-deps/debs/*.deb; do dpkg -x "$f" "$prefix"; done
  note "unpacked $(ls .device-deps/debs/*.deb | wc -l) packages into $prefix"
else
  note "no .device-deps/debs: using system packages only"
fi
libdir="$prefix/usr/lib/x86_64-linux-gnu"
blasdir="$libdir/openblas-pthread"
# dpkg -x does not run maintainer scripts: make the unversioned symlinks that
# update-alternatives would have made.
if [ -e "$blasdir/libopenblas.so.0" ] && [ ! -e "$blasdir/libopenblas.so" ]; then
  ln -sf libopenblas.so.0 "$blasdir/libopenblas.so"
fi
orig_ld_path="${LD_LIBRARY_PATH:-}"
export LD_LIBRARY_PATH="$libdir:$blasdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export CAF_ROOT="$prefix"

# --- configure and build everything ----------------------------------------------
cflags=""
[ -d "$prefix/usr/include/x86_64-linux-gnu/openblas-pthread" ] &&
  cflags="-isystem $prefix/usr/include/x86_64-linux-gnu/openblas-pthread"
if has configure; then
  note "configure ($build)"
  cmake -S "$here" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DACTORGRAPH_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCAF_ROOT="$prefix" \
    -DCMAKE_PREFIX_PATH="$prefix/usr;$libdir/cmake" \
    -DCMAKE_LIBRARY_PATH="$libdir;$blasdir" \
    -DCMAKE_INCLUDE_PATH="$prefix/usr/include" \
    -DCMAKE_CXX_FLAGS="$cflags" \
    -DBUILD_TESTING=ON >"$out/configure.log" 2>&1
  rc=$?
  grep -E "actorgraph:|Found|Error" "$out/configure.log" | tee -a "$summary"
  if [ $rc -ne 0 ]; then note "configure FAILED (rc $rc), see configure.log"; tail -40 "$out/configure.log"; exit 1; fi
fi
if has build; then
  note "build (-j$jobs)"
  start=$(date +%s)
  # Keep going past a broken target (-k 0): the tests of what did build still run.
  cmake --build "$build" -j "$jobs" -- -k 0 >"$out/build.log" 2>&1
  rc=$?
  note "build rc $rc in $(( $(date +%s) - start )) s"
  if [ $rc -ne 0 ]; then
    status_build=1
    grep -E "error|FAILED" "$out/build.log" | head -40 | tee -a "$summary"
  fi
fi

status=${status_build:-0}
# --- tests ------------------------------------------------------------------------
if has gpu; then
  note "ctest -L gpu"
  (cd "$build" && ctest -L gpu --output-on-failure --timeout 300 "$@") >"$out/ctest-gpu.log" 2>&1 || status=1
  tail -5 "$out/ctest-gpu.log" | tee -a "$summary"
  grep -E "Failed|\*\*\*|Not Run" "$out/ctest-gpu.log" | head -40 | tee -a "$summary"
  # The printed figures of the GPU tests (notify latency, device spec).
  "$build/tests/cuda/test_cuda" --gtest_brief=1 \
    --gtest_filter='CudaDevice.SpecComesFromTheHardware:CudaDevice.NotifyFires*' 2>&1 | grep -E "^cuda0:|^notify" | tee -a "$summary" || true
fi
if has all; then
  note "ctest (every other label)"
  (cd "$build" && ctest -LE gpu --output-on-failure -j "$jobs" --timeout 600) >"$out/ctest-all.log" 2>&1 || status=1
  tail -5 "$out/ctest-all.log" | tee -a "$summary"
  grep -E "\*\*\*Failed|\*\*\*Timeout|Not Run" "$out/ctest-all.log" | head -40 | tee -a "$summary"
fi

# --- benchmarks --------------------------------------------------------------------
if has bench; then
  if [ -x "$build/apps/actorgraph-cuda-bench" ]; then
    note "actorgraph-cuda-bench"
    "$build/apps/actorgraph-cuda-bench" >"$out/cuda-bench.txt" 2>&1 || status=1
    cat "$out/cuda-bench.txt" | tee -a "$summary"
  fi
  if command -v python3 >/dev/null && [ -f scripts/torch_ref_bench.py ]; then
    note "torch_ref_bench.py"
    # PyTorch brings its own libraries: not our unpacked ones.
    LD_LIBRARY_PATH="$orig_ld_path" PYTHONUNBUFFERED=1 timeout 180 python3 scripts/torch_ref_bench.py >"$out/torch-bench.txt" 2>&1 || true
    cat "$out/torch-bench.txt" | tee -a "$summary"
  fi
fi
# --- asan: the sanitizer suite of scripts/dev.sh test on this host's cores (a
# quick check before CI, which runs it on 2 cores; other compiler than CI's) ---
if has asan; then
  asan_build="$here/build-asan-gpu"
  note "asan: configure + build ($asan_build, -j$jobs)"
  start=$(date +%s)
  cmake -S "$here" -B "$asan_build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g1 -DNDEBUG" \
    -DACTORGRAPH_SANITIZER=address,undefined -DACTORGRAPH_CUDA=OFF -DACTORGRAPH_READLINE=OFF \
    -DACTORGRAPH_BUILD_BENCHMARKS=OFF -DACTORGRAPH_BUILD_TESTS=ON \
    -DCAF_ROOT="$prefix" -DCMAKE_PREFIX_PATH="$prefix/usr;$libdir/cmake" \
    -DCMAKE_LIBRARY_PATH="$libdir;$blasdir" -DCMAKE_INCLUDE_PATH="$prefix/usr/include" \
    -DCMAKE_CXX_FLAGS="$cflags" >"$out/asan-configure.log" 2>&1 &&
    cmake --build "$asan_build" -j "$jobs" >"$out/asan-build.log" 2>&1
  rc=$?
  note "asan build rc $rc in $(( $(date +%s) - start )) s"
  if [ $rc -ne 0 ]; then
    status=1
    grep -E "error|FAILED" "$out/asan-configure.log" "$out/asan-build.log" | head -40 | tee -a "$summary"
  else
    (cd "$asan_build" && ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
      UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      ctest --output-on-failure -j "$jobs" --timeout 900) >"$out/ctest-asan.log" 2>&1 || status=1
    tail -5 "$out/ctest-asan.log" | tee -a "$summary"
    grep -E "\*\*\*Failed|\*\*\*Timeout|Not Run|Exception" "$out/ctest-asan.log" | head -40 | tee -a "$summary"
  fi
fi
# --- lanes: auto lanes against one lane on independent small chains (issue 16); step "lanes"
if has lanes && [ -x "$build/apps/actorgraph-lanes-bench" ]; then
  note "actorgraph-lanes-bench --devices cuda:0 (and the sim model of the same graph)"
  "$build/apps/actorgraph-lanes-bench" --devices cuda:0 --jobs 200 >"$out/lanes-bench.txt" 2>&1 || status=1
  "$build/apps/actorgraph-lanes-bench" >>"$out/lanes-bench.txt" 2>&1 || status=1
  cat "$out/lanes-bench.txt" | tee -a "$summary"
fi
# --- end to end through the actor runtime (transformer forward vs PyTorch eager,
# GPU idle time, host completion latency, 2-GPU pipeline); step "e2e" ----------
if has e2e && [ -x "$build/apps/actorgraph-e2e-bench" ]; then
  if command -v python3 >/dev/null; then
    note "torch_e2e_ref.py"
    LD_LIBRARY_PATH="$orig_ld_path" PYTHONUNBUFFERED=1 timeout 240 python3 scripts/torch_e2e_ref.py --sdpa \
      >"$out/torch-e2e.txt" 2>&1 || true
    cat "$out/torch-e2e.txt" | tee -a "$summary"
  fi
  torch_ms=$(awk '/^torch_forward_ms:/{print $2}' "$out/torch-e2e.txt" 2>/dev/null)
  torch_pinned_ms=$(awk '/^torch_forward_pinned_ms:/{print $2}' "$out/torch-e2e.txt" 2>/dev/null)
  note "actorgraph-e2e-bench"
  timeout 300 "$build/apps/actorgraph-e2e-bench" ${torch_ms:+--torch-ms "$torch_ms"} \
    ${torch_pinned_ms:+--torch-pinned-ms "$torch_pinned_ms"} \
    --chrome-trace "$out/e2e-trace.json" >"$out/e2e.txt" 2>&1 || status=1
  cat "$out/e2e.txt" | tee -a "$summary"
fi
note "done, status $status"
exit $status
