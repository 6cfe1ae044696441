#!/usr/bin/env bash
# ab_throughput.sh: the benchmark workloads (configs/bench/*.yaml, as train_throughput.sh) with two
# binaries in the same call, alternating A, B, A, B per workload so that both see the same machine state:
# A = $BASE_BIN (a baseline build, e.g. main before a change), B = $BIN (this tree's). Prints one line
# per run and, last, a table of B / A per workload (the mean of each binary's runs).
# Usage: BASE_BIN=/path/to/base/megatrain [BIN=build/bin/megatrain] [ROUNDS=2] scripts/bench/ab_throughput.sh [recipe ...]
# A switch of one build: BASE_BIN=build/bin/megatrain A_ENV="MEGATRAIN_WGRAD_OVERWRITE=0" B_ENV="MEGATRAIN_WGRAD_OVERWRITE=1"
# (each a list of NAME=VALUE words, set for that side's runs only).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin/megatrain}
BASE_BIN=${BASE_BIN:?set BASE_BIN to the baseline binary}
ROUNDS=${ROUNDS:-2}
LOG_DIR=${LOG_DIR:-bench-logs}
mkdir -p "$LOG_DIR"
recipes=("$@")
[[ ${#recipes[@]} -gt 0 ]] || recipes=(configs/bench/gpt2-124m.yaml configs/bench/gpt2-1.5b.yaml configs/bench/llama-1.5b.yaml)
declare -A sum count
for r in "${recipes[@]}"; do
  name=$(basename "$r" .yaml)
  for ((k = 0; k < ROUNDS; ++k)); do
    for which in A B; do
      bin=$BASE_BIN; side_env=${A_ENV:-}
      [[ $which == B ]] && { bin=$BIN; side_env=${B_ENV:-}; }
      log="$LOG_DIR/$name.$which.$k.log"
      # shellcheck disable=SC2086
      if ! env $side_env "$bin" --config "$r" --device cuda --train-iters "${ITERS:-30}" --log-interval 10 >"$log" 2>&1; then
        echo "$name $which: FAILED (see $log)"; tail -3 "$log"; continue
      fi
      line=$(grep "iteration" "$log" | grep "tokens/s" | tail -1)
      tok=$(sed -n 's/.*tokens\/s\/GPU: \([0-9.]*\).*/\1/p' <<<"$line")
      mfu=$(sed -n 's/.*MFU: \([0-9.]*%\).*/\1/p' <<<"$line")
      printf '%-14s %s round %d: %12s tokens/s/GPU  MFU %s\n' "$name" "$which" "$k" "$tok" "$mfu"
      sum[$name.$which]=$(awk -v a="${sum[$name.$which]:-0}" -v b="$tok" 'BEGIN { print a + b }')
      count[$name.$which]=$(( ${count[$name.$which]:-0} + 1 ))
    done
  done
done
printf '\n%-14s %14s %14s %8s\n' workload "A tokens/s" "B tokens/s" "B / A"
for r in "${recipes[@]}"; do
  name=$(basename "$r" .yaml)
  a=$(awk -v s="${sum[$name.A]:-0}" -v n="${count[$name.A]:-0}" 'BEGIN { if (n) printf "%.0f", s / n; else print "-" }')
  b=$(awk -v s="${sum[$name.B]:-0}" -v n="${count[$name.B]:-0}" 'BEGIN { if (n) printf "%.0f", s / n; else print "-" }')
  ratio=$(awk -v a="$a" -v b="$b" 'BEGIN { if (a > 0 && b > 0) printf "%.4f", b / a; else print "-" }')
  printf '%-14s %14s %14s %8s\n' "$name" "$a" "$b" "$ratio"
done
