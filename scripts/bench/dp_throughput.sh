#!/usr/bin/env bash
# dp_throughput.sh: data-parallel scaling of the CUDA engine on this machine's GPUs (shared/ANCHORS.md:
# LLaMA-1.5B, DP 2 >= 97% of one GPU): the recipe on one GPU, then on NGPU ranks under mpirun with the same
# micro batch per GPU, and the ratio of their steady-state tokens/s/GPU (last log interval).
# Usage: scripts/bench/dp_throughput.sh [recipe] [extra flags for the DP run, e.g. --grad-reduce-in-bf16]
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin/megatrain}
LOG_DIR=${LOG_DIR:-bench-logs}
ITERS=${ITERS:-30}
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
recipe=${1:-configs/bench/llama-1.5b.yaml}
shift || true
mkdir -p "$LOG_DIR"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
mbs=$(sed -n 's/^micro_batch_size: *//p' "$recipe")
tok() { grep "iteration" "$1" | grep "tokens/s" | tail -1 | sed -n 's/.*tokens\/s\/GPU: \([0-9.]*\).*/\1/p'; }
"$BIN" --config "$recipe" --device cuda --train-iters "$ITERS" --log-interval 10 --global-batch-size "$mbs" >"$LOG_DIR/dp1.log" 2>&1
mpirun -np "$NGPU" --bind-to none -x NCCL_NVLS_ENABLE "$BIN" --config "$recipe" --device cuda --train-iters "$ITERS" --log-interval 10 \
  --global-batch-size $((mbs * NGPU)) --overlap-grad-reduce "$@" >"$LOG_DIR/dp$NGPU.log" 2>&1
one=$(tok "$LOG_DIR/dp1.log"); many=$(tok "$LOG_DIR/dp$NGPU.log")
echo "1 GPU: $one tokens/s/GPU; DP $NGPU: $many tokens/s/GPU ($(awk -v a="$many" -v b="$one" 'BEGIN{printf "%.1f", 100*a/b}')% of 1 GPU)"
