#!/usr/bin/env bash
# checkpoint_io.sh: save / load throughput of a recipe's full training state (default: the LLaMA-1.5B
# benchmark model). Usage: scripts/bench/checkpoint_io.sh [RECIPE] [DIR]
set -euo pipefail
cd "$(dirname "$0")/../.."
RECIPE=${1:-configs/bench/llama-1.5b.yaml}
DIR=${2:-/tmp/megatrain-ckpt-bench}
BUILD_DIR=${BUILD_DIR:-build}
cmake --build "$BUILD_DIR" --target bench_checkpoint -j "$(nproc)" >/dev/null
"$BUILD_DIR/tests/bench_checkpoint" "$RECIPE" "$DIR"
