#!/usr/bin/env bash
# fp8_recipes.sh: each benchmark recipe in bf16 and then with each FP8 recipe (tensorwise, delayed, blockwise) in the
# same call, on this machine's GPU, and each FP8 run's tokens/s as a ratio to bf16's (docs/PERF.md, "FP8 training").
# Usage: scripts/bench/fp8_recipes.sh [recipe ...]   (default: LLaMA-1.5B and the LLaMA-3 8B shape)
#        FP8_RECIPES="delayed blockwise" FP8_FORMAT=hybrid ITERS=30 scripts/bench/fp8_recipes.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin/megatrain}
LOG_DIR=${LOG_DIR:-bench-logs}
ITERS=${ITERS:-30}
FP8_FORMAT=${FP8_FORMAT:-hybrid}
read -r -a fp8_recipes <<<"${FP8_RECIPES:-tensorwise delayed blockwise}"
mkdir -p "$LOG_DIR"
recipes=("$@")
[[ ${#recipes[@]} -gt 0 ]] || recipes=(configs/bench/llama-1.5b.yaml configs/bench/llama3-8b-shape.yaml)
printf '%-22s %-11s %12s %9s %10s %8s\n' workload precision tokens/s/GPU ms/iter "peak GiB" "/ bf16"
for r in "${recipes[@]}"; do
  name=$(basename "$r" .yaml)
  base=""
  for precision in bf16 "${fp8_recipes[@]}"; do
    log="$LOG_DIR/$name.$precision.log"
    flags=()
    [[ $precision == bf16 ]] || flags=(--fp8-format "$FP8_FORMAT" --fp8-recipe "$precision")
    if ! "$BIN" --config "$r" --device cuda --train-iters "$ITERS" --log-interval 10 "${flags[@]}" >"$log" 2>&1; then
      echo "$name $precision: FAILED (see $log)"; tail -3 "$log"; continue
    fi
    line=$(grep "iteration" "$log" | grep "tokens/s" | tail -1)
    tok=$(sed -n 's/.*tokens\/s\/GPU: \([0-9.]*\).*/\1/p' <<<"$line")
    ms=$(sed -n 's/.*elapsed time per iteration (ms): \([0-9.]*\).*/\1/p' <<<"$line")
    peak=$(sed -n 's/.*device peak \([0-9.]*\).*/\1/p' <<<"$line")
    [[ $precision == bf16 ]] && base=$tok
    ratio=$(awk -v a="$base" -v b="$tok" 'BEGIN { if (a > 0) printf "%.3f", b / a; else print "-" }')
    printf '%-22s %-11s %12s %9s %10s %8s\n' "$name" "$precision" "$tok" "$ms" "${peak:--}" "$ratio"
  done
done
