#!/usr/bin/env bash
# parallel_throughput.sh: multi-GPU scaling of the CUDA engine on this machine's GPUs (shared/ANCHORS.md:
# LLaMA-1.5B, DP 2 >= 97% and TP 2 >= 90% of one GPU's tokens/s/GPU). The recipe runs on one GPU, then in
# each layout on NGPU ranks under mpirun with the same micro batch; each line gives the steady-state
# tokens/s/GPU (last log interval) and its ratio to the 1-GPU figure. Data parallel runs keep the micro
# batch per GPU (global batch = micro batch x DP); tensor parallel runs split one micro batch's model over
# the GPUs (global batch = micro batch x NGPU / TP).
# Usage: scripts/bench/parallel_throughput.sh [recipe] [extra flags for every multi-GPU run]
#   LAYOUTS="dp dp-do dp-dog tp tp-sp" (default: dp tp tp-sp; dp-do: data parallel with the distributed optimizer,
#   dp-dog: the same with the parameter gather overlapped with the next forward),
#   NGPU (default: the visible GPUs), ITERS, LOG_DIR, ONE_GPU (the 1-GPU tokens/s/GPU measured before: not run again),
#   CONCURRENT=0: skip the second baseline: the recipe on every GPU at once, one independent process each.
#   GPUs of one machine differ by a percent or two when all run (a synchronous layout keeps the slowest one's
#   pace), so each layout's ratio is also given against the slowest GPU of that run.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN=${BIN:-build/bin/megatrain}
LOG_DIR=${LOG_DIR:-bench-logs}
ITERS=${ITERS:-30}
NGPU=${NGPU:-$(nvidia-smi -L | wc -l)}
LAYOUTS=${LAYOUTS:-dp tp tp-sp}
recipe=${1:-configs/bench/llama-1.5b.yaml}
shift || true
mkdir -p "$LOG_DIR"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
envs=(-x NCCL_NVLS_ENABLE)
[[ -n ${CUDA_DEVICE_MAX_CONNECTIONS:-} ]] && envs+=(-x CUDA_DEVICE_MAX_CONNECTIONS)
# e.g. MEGATRAIN_PROFILE_ITER, NCCL_ALGO
for v in $(compgen -e | grep -E '^(MEGATRAIN|NCCL)_' | grep -v '^NCCL_NVLS_ENABLE$' || true); do envs+=(-x "$v"); done
mbs=$(sed -n 's/^micro_batch_size: *//p' "$recipe")
tok() { grep "iteration" "$1" | grep "tokens/s" | tail -1 | sed -n 's/.*tokens\/s\/GPU: \([0-9.]*\).*/\1/p'; }
if [[ -n ${ONE_GPU:-} ]]; then
  one=$ONE_GPU
else
  "$BIN" --config "$recipe" --device cuda --train-iters "$ITERS" --log-interval 10 --global-batch-size "$mbs" >"$LOG_DIR/1gpu.log" 2>&1
  one=$(tok "$LOG_DIR/1gpu.log")
fi
echo "1 GPU: $one tokens/s/GPU"
slowest=""
if [[ ${CONCURRENT:-1} != 0 && $NGPU -gt 1 ]]; then
  pids=()
  for ((g = 0; g < NGPU; ++g)); do
    CUDA_VISIBLE_DEVICES=$g "$BIN" --config "$recipe" --device cuda --train-iters "$ITERS" --log-interval 10 --global-batch-size "$mbs" \
      >"$LOG_DIR/1gpu-concurrent$g.log" 2>&1 &
    pids+=($!)
  done
  figs=()
  for ((g = 0; g < NGPU; ++g)); do
    wait "${pids[$g]}" || { echo "1 GPU on GPU $g (concurrent): FAILED (see $LOG_DIR/1gpu-concurrent$g.log)"; exit 1; }
    figs+=("$(tok "$LOG_DIR/1gpu-concurrent$g.log")")
  done
  slowest=$(printf '%s\n' "${figs[@]}" | sort -g | head -1)
  echo "1 GPU on each GPU at once: ${figs[*]} tokens/s/GPU (slowest $slowest)"
fi
for layout in $LAYOUTS; do
  case $layout in
    dp) flags=(--global-batch-size $((mbs * NGPU)) --overlap-grad-reduce) ;;
    dp-do) flags=(--global-batch-size $((mbs * NGPU)) --overlap-grad-reduce --use-distributed-optimizer) ;;
    dp-dog) flags=(--global-batch-size $((mbs * NGPU)) --overlap-grad-reduce --use-distributed-optimizer --overlap-param-gather) ;;
    tp) flags=(--tensor-model-parallel-size "$NGPU" --global-batch-size "$mbs") ;;
    tp-sp) flags=(--tensor-model-parallel-size "$NGPU" --sequence-parallel --global-batch-size "$mbs") ;;
    *) echo "unknown layout $layout (dp, dp-do, dp-dog, tp, tp-sp)"; exit 2 ;;
  esac
  log="$LOG_DIR/$layout$NGPU.log"
  if ! mpirun -np "$NGPU" --bind-to none "${envs[@]}" "$BIN" --config "$recipe" --device cuda --train-iters "$ITERS" --log-interval 10 \
    "${flags[@]}" "$@" >"$log" 2>&1; then
    echo "$layout $NGPU: FAILED (see $log)"; tail -5 "$log"; continue
  fi
  many=$(tok "$log")
  pct() { awk -v a="$many" -v b="$1" 'BEGIN{printf "%.1f", 100*a/b}'; }
  echo "$layout $NGPU: $many tokens/s/GPU ($(pct "$one")% of 1 GPU${slowest:+; $(pct "$slowest")% of the slowest GPU at once})"
done
