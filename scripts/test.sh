#!/usr/bin/env bash
# test.sh: the whole test suite on this machine: unit, command-line, SLURM-script and multi-rank
# (mpirun) tests; GPU tests run where a GPU is visible and say that they skip elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
[[ -x "$BUILD_DIR/bin/megatrain" ]] || scripts/setup.sh
cmake --build "$BUILD_DIR" -j "$(nproc)"
ctest --test-dir "$BUILD_DIR" --output-on-failure "$@"
