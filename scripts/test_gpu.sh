#!/usr/bin/env bash
# test_gpu.sh: the GPU tests (CTest label gpu) on a machine with GPUs: NCCL collectives under mpirun
# and torchrun-style launches. Without a GPU they report SKIP.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
export NCCL_NVLS_ENABLE=0
[[ -d "$BUILD_DIR" ]] || cmake -S . -B "$BUILD_DIR" -G Ninja
cmake --build "$BUILD_DIR" -j "$(nproc)"
ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure "$@"
