#!/usr/bin/env bash
# train_throughput.sh: the shared/ANCHORS.md workloads on this machine's GPU (configs/bench/*.yaml):
# steady-state tokens/s/GPU, TFLOP/s and MFU from the training log (the last log interval, after the
# first interval's warm-up), one line per workload, plus the full logs under $LOG_DIR.
# Usage: scripts/bench/train_throughput.sh [recipe ...]   (default: all three benchmark recipes)
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin/megatrain}
LOG_DIR=${LOG_DIR:-bench-logs}
ITERS=${ITERS:-30}
mkdir -p "$LOG_DIR"
recipes=("$@")
[[ ${#recipes[@]} -gt 0 ]] || recipes=(configs/bench/gpt2-124m.yaml configs/bench/gpt2-1.5b.yaml configs/bench/llama-1.5b.yaml)
printf '%-28s %14s %10s %8s %10s\n' workload tokens/s/GPU TFLOP/s MFU ms/iter
for r in "${recipes[@]}"; do
  name=$(basename "$r" .yaml)
  log="$LOG_DIR/$name.log"
  if ! "$BIN" --config "$r" --device cuda --train-iters "$ITERS" --log-interval 10 ${EXTRA_FLAGS:-} >"$log" 2>&1; then
    echo "$name: FAILED (see $log)"; tail -5 "$log"; continue
  fi
  line=$(grep "iteration" "$log" | grep "tokens/s" | tail -1)
  tok=$(sed -n 's/.*tokens\/s\/GPU: \([0-9.]*\).*/\1/p' <<<"$line")
  tfl=$(sed -n "s/.*(TFLOP\/s\/GPU): \([0-9.]*\).*/\1/p" <<<"$line")
  mfu=$(sed -n 's/.*MFU: \([0-9.]*%\).*/\1/p' <<<"$line")
  ms=$(sed -n 's/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1/p' <<<"$line")
  printf '%-28s %14s %10s %8s %10s\n' "$name" "$tok" "$tfl" "$mfu" "$ms"
done
