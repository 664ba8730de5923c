#!/usr/bin/env bash
# Pipeline efficiency under several CAF scheduler settings, side by side
# (GPU machine, repository root, after `scripts/gpu-run.sh` has built build-gpu):
#   bash scripts/gpu-pipeline-sweep.sh OUTDIR [RUNS] ["MT/STEAL_US ..."]
# Each setting is runtime_options::scheduler_max_throughput /
# scheduler_idle_steal_us (0: CAF's default); each process measures
# pipeline_efficiency_n2_m32 RUNS times (--pipeline-runs) and prints every run,
# the median and the diagnostics of its worst run.
set -uo pipefail
out="${1:?usage: gpu-pipeline-sweep.sh OUTDIR [RUNS] [\"MT/STEAL_US ...\"]}"
runs="${2:-6}"
settings="${3:-0/0 1/1000 4/1000 0/1000}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mkdir -p "$out"
lib="$here/.device-deps/prefix/usr/lib/x86_64-linux-gnu"
export LD_LIBRARY_PATH="$lib:$lib/openblas-pthread${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=0
bench="${AG_BUILD_DIR:-$here/build-gpu}/apps/actorgraph-e2e-bench"
for s in $settings; do
  mt="${s%/*}" steal="${s#*/}"
  f="$out/pipeline_mt${mt}_steal${steal}.txt"
  timeout 300 "$bench" --devices=cuda:0,1 --skip-forward --skip-idle --skip-completion \
    --pipeline-runs="$runs" --sched-max-throughput="$mt" --sched-idle-steal-us="$steal" >"$f" 2>&1
  echo "== max throughput $mt, idle steal $steal us (rc $?)"
  grep -E "each run|longest gap|gaps >|pipeline_efficiency" "$f" | cut -c1-600
done
