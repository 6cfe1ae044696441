#!/usr/bin/env bash
# test_evaluation.sh: Megatron's evaluation across layouts. Every --eval-interval iterations --eval-iters batches of the
# validation split, each evaluation continuing where the last stopped; after the last iteration one more on the
# validation split and one on the test split. Preprocessed documents with --eod-mask-loss (batches of different loss-token
# counts), --eval-global-batch-size 12 in microbatches of 2: DP 2 (distributed optimizer), PP 2, PP 2 interleaved
# with groups of 3 (--microbatch-group-size-per-virtual-pipeline-stage), TP 2 + SP and CP 2 log the validation and test
# losses of one rank (the same lines, in the same order), and --exit-interval ends a run without the last two.
# Usage: test_evaluation.sh path/to/megatrain (from the repository root).
set -u
B=$(realpath "${1:?usage: test_evaluation.sh path/to/megatrain}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fails=0
source "$(dirname "$0")/shakespeare_documents.sh"
make_documents "$B" "$tmp"
M=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2
   --global-batch-size 12 --train-iters 4 --lr 2e-3 --lr-warmup-iters 2 --hidden-dropout 0 --attention-dropout 0 --eval-iters 2
   --eval-interval 2 --eval-global-batch-size 12 --log-interval 1 --seed 7 --adam-eps 1e-4 --make-vocab-size-divisible-by 256
   --tokenizer-type ByteTokenizer --data-path "$tmp/shakespeare_text_document" --split 80,10,10 --eod-mask-loss --device cpu)
run() {  # run NAME RANKS flags...
  local name=$1 np=$2; shift 2
  if [[ $np == 1 ]]; then "$B" "${M[@]}" "$@" >"$tmp/$name.log" 2>&1
  else mpirun --oversubscribe --bind-to none -np "$np" -x OPENBLAS_NUM_THREADS=1 "$B" "${M[@]}" "$@" >"$tmp/$name.log" 2>&1; fi ||
    { echo "FAIL $name"; tail -3 "$tmp/$name.log"; fails=$((fails + 1)); }
}
# "where|loss" per evaluation: the line's place ("iteration 2", "iteration 4 on test set") and its loss
evaluations() { grep -o ' validation loss at [^|]*| lm loss value: [^ ]*' "$tmp/$1.log" | sed 's/ validation loss at //; s/ | lm loss value: /|/'; }
run one 1
run dp2 2 --use-distributed-optimizer
run pp2 2 --pipeline-model-parallel-size 2
run pp2_groups 2 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2 --microbatch-group-size-per-virtual-pipeline-stage 3
run tp2 2 --tensor-model-parallel-size 2 --sequence-parallel
run cp2 2 --context-parallel-size 2
run exit2 1 --exit-interval 2
expected=$'iteration 2\niteration 4\niteration 4 on validation set\niteration 4 on test set'
if [[ "$(evaluations one | cut -d'|' -f1)" == "$expected" ]]; then echo "ok   one rank: evaluations at 2 and 4, then on the validation and test sets"
else echo "FAIL one rank's evaluations:"; evaluations one; fails=$((fails + 1)); fi
# (the model changes between 2 and 4; the validation batches after the last iteration are the next ones: all differ)
if [[ $(evaluations one | cut -d'|' -f2 | sort -u | wc -l) == 4 ]]; then echo "ok   four different losses"
else echo "FAIL repeated evaluation losses: $(evaluations one | tr '\n' ' ')"; fails=$((fails + 1)); fi
for layout in dp2 pp2 pp2_groups tp2 cp2; do
  if paste -d'|' <(evaluations one) <(evaluations "$layout") | awk -F'|' '{d=$2-$4; if (d<0) d=-d; if (NF!=4 || $1!=$3 || d > 1e-5*$2) bad=1} END{exit bad || NR!=4}'; then
    echo "ok   $layout evaluates like one rank"
  else echo "FAIL $layout's evaluations differ from one rank's"; paste <(evaluations one) <(evaluations "$layout"); fails=$((fails + 1)); fi
done
if [[ "$(evaluations exit2 | cut -d'|' -f1)" == "iteration 2" ]]; then echo "ok   --exit-interval: no evaluation after the exit"
else echo "FAIL --exit-interval's evaluations: $(evaluations exit2 | tr '\n' ' ')"; fails=$((fails + 1)); fi
exit $((fails > 0))
