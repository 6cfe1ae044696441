#!/usr/bin/env bash
# test_distopt_instances.sh: checkpoints of Megatron's partial distributed optimizer (--num-distributed-optimizer-instances):
# 4 ranks in 2 instances save (the first instance writes the optimizer state, sharded over its 2 ranks) and the run
# resumes from iteration 2 with one instance on 4 ranks, and on 1 rank, logging iterations 3 and 4 as the uninterrupted run.
# Usage: test_distopt_instances.sh path/to/megatrain
set -u
B=$(realpath "${1:?usage: test_distopt_instances.sh path/to/megatrain}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fails=0
M=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 8 --train-iters 4 --lr 1e-3 --lr-decay-style constant --mock-data --vocab-size 128 --eval-iters 0 --log-interval 1
   --use-distributed-optimizer --device cpu)
run() {  # run NAME RANKS flags...
  local name=$1 np=$2; shift 2
  if [[ $np == 1 ]]; then "$B" "${M[@]}" --log-dir "$tmp/$name" "$@" >"$tmp/$name.log" 2>&1
  else mpirun --oversubscribe --bind-to none -np "$np" -x OPENBLAS_NUM_THREADS=1 "$B" "${M[@]}" --log-dir "$tmp/$name" "$@" >"$tmp/$name.log" 2>&1; fi ||
    { echo "FAIL $name"; tail -3 "$tmp/$name.log"; fails=$((fails + 1)); }
}
late() { grep -E '"iteration":(3|4),' "$tmp/$1/metrics.jsonl" | grep -o '"lm_loss":[^,]*' | cut -d: -f2; }
run whole 4 --num-distributed-optimizer-instances 2 --save "$tmp/ck" --save-interval 2
run one_instance 4 --load "$tmp/ck" --ckpt-step 2
run one_rank 1 --load "$tmp/ck" --ckpt-step 2
for name in one_instance one_rank; do
  if paste <(late whole) <(late "$name") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-6*$1) bad=1} END{exit bad || NR!=2}'; then
    echo "ok   resumed as $name: iterations 3 and 4 as the uninterrupted run"
  else echo "FAIL resumed as $name"; paste <(late whole) <(late "$name"); fails=$((fails + 1)); fi
done
exit $((fails > 0))
