#!/usr/bin/env bash
# Run on the dev machine (Debian, apt): downloads the .deb packages that the
# GPU machine lacks (it has nvcc, cmake, ninja, g++, NCCL, but no apt and no
# network) into .device-deps/debs (git-ignored; `carry` it to the GPU run).
# scripts/gpu-run.sh unpacks them there with dpkg -x.
#   bash scripts/fetch-gpu-deps.sh
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
dest="$here/.device-deps/debs"
mkdir -p "$dest"
packages=(
  # CAF 0.17 (actors, middleman) and its runtime libraries
  libcaf-dev libcaf-core0.17 libcaf-io0.17 libcaf-openssl0.17
  # lock-free queue (header only)
  libconcurrentqueue-dev
  # tests and benchmarks
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
  # OpenBLAS for the cpu backend (the GPU machine only has a plain libblas)
  libopenblas-dev libopenblas0 libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
  # checkpoints and tokenizers (models/): JSON (header only), SentencePiece
  nlohmann-json3-dev libsentencepiece-dev libsentencepiece0
)
cd "$dest"
# apt's sandbox user cannot write into root-owned folders: download as is.
apt-get download -o APT::Sandbox::User=root "${packages[@]}"
ls -la "$dest"
du -sh "$dest"
