#!/usr/bin/env bash
# test_upcycling.sh: --moe-use-upcycling as a user runs it (Megatron's upcycling: a dense model's checkpoint becomes
# an MoE model, saved before training). The upcycled model computes the dense model's loss (granularity 1, dropless
# top-2); its saved checkpoint (alone, with --train-iters 0) trains on as the upcycling run did, bit for bit, in fp32 and
# in bf16 on EP2 x DP2 with the distributed optimizer; granular upcycling (granularity 2 with the softmax over all
# experts) trains alike on one rank and on TP2 x EP2, EP2 x DP2 with the distributed optimizer, expert-TP 2 and PP2,
# from a dense checkpoint saved on TP2; and the refusals, each a one-line error.
# Usage: test_upcycling.sh path/to/megatrain (from the repository root).
set -u
B=$(realpath "${1:?usage: test_upcycling.sh path/to/megatrain}")
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS=1)
M=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 8 --lr 1e-3 --lr-warmup-iters 2 --mock-data --vocab-size 128 --make-vocab-size-divisible-by 64 --log-interval 1
   --eval-iters 0 --seed 11 --swiglu --normalization RMSNorm --disable-bias-linear --position-embedding-type rope --hidden-dropout 0
   --attention-dropout 0 --train-iters 12)
MOE=(--num-experts 4 --moe-router-topk 2 --moe-token-dispatcher-type alltoall)

losses() { grep -o '"lm_loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }
# close A B: every loss of run B within 1e-5 (relative) of run A's, and as many.
close() { paste <(losses "$1") <(losses "$2") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR<12}'; }

# 1. The dense model: 8 of 12 iterations saved, and its uninterrupted continuation.
"$B" "${M[@]}" --ffn-hidden-size 64 --save "$tmp/dense" --save-interval 8 --exit-interval 8 >/dev/null 2>&1
"$B" "${M[@]}" --ffn-hidden-size 64 --load "$tmp/dense" --log-dir "$tmp/dense_more" >/dev/null 2>&1

# 2. Granularity 1: every expert the dense MLP; the softmax over the top 2 sums to 1, so the first iteration's loss
# (before its update, on the samples after the dense run's) is the dense model's.
out=$("$B" "${M[@]}" --ffn-hidden-size 64 "${MOE[@]}" --load "$tmp/dense" --save "$tmp/up1" --save-interval 100 --moe-use-upcycling \
        --log-dir "$tmp/up1_log" 2>&1); rc=$?
first_dense=$(losses "$tmp/dense_more" | head -1); first_moe=$(losses "$tmp/up1_log" | head -1)
if [[ $rc -eq 0 && -n "$first_moe" ]] && awk -v a="$first_dense" -v b="$first_moe" 'BEGIN{d=a-b; if (d<0) d=-d; exit !(d <= 1e-6*a)}' &&
   grep -q "saved the upcycled model at iteration 0" <<<"$out" && [[ $(losses "$tmp/up1_log" | wc -l) -eq 12 ]]; then
  ok "granularity 1: the upcycled model's first loss is the dense model's ($first_moe)"
else bad "granularity 1: rc=$rc dense $first_dense upcycled $first_moe"; tail -3 <<<"$out"; fi

# 3. Upcycling alone (--train-iters 0), then training from the saved model without --moe-use-upcycling: the upcycling
# run's losses bit for bit (fresh optimizer state, the schedule's start and the data position in the checkpoint); in fp32
# on one rank, and in bf16 on EP2 x DP2 with the distributed optimizer (each rank's working copy the rounding of every
# loaded weight, as a fresh run's).
resumes() {  # name np flags...
  local name=$1 np=$2; shift 2
  "${MPI[@]}" -np "$np" "$B" "${M[@]}" --ffn-hidden-size 64 "${MOE[@]}" "$@" --load "$tmp/dense" --save "$tmp/${name}_run" --save-interval 100 \
    --moe-use-upcycling --log-dir "$tmp/${name}_run_log" >/dev/null 2>&1
  "${MPI[@]}" -np "$np" "$B" "${M[@]}" --ffn-hidden-size 64 "${MOE[@]}" "$@" --load "$tmp/dense" --save "$tmp/${name}_only" --save-interval 100 \
    --moe-use-upcycling --train-iters 0 >/dev/null 2>&1
  out=$("${MPI[@]}" -np "$np" "$B" "${M[@]}" --ffn-hidden-size 64 "${MOE[@]}" "$@" --load "$tmp/${name}_only" --log-dir "$tmp/${name}_later" 2>&1)
  if [[ "$(losses "$tmp/${name}_run_log")" == "$(losses "$tmp/${name}_later")" && $(losses "$tmp/${name}_later" | wc -l) -eq 12 ]]; then
    ok "the upcycled model saved alone trains on as the upcycling run ($name)"
  else bad "the upcycled model saved alone ($name)"; tail -3 <<<"$out"; paste <(losses "$tmp/${name}_run_log") <(losses "$tmp/${name}_later"); fi
}
resumes fp32 1
resumes bf16_ep2_dp2_distopt 4 --bf16 --expert-model-parallel-size 2 --use-distributed-optimizer --moe-upcycling-granularity 2 --moe-ffn-hidden-size 32

# 4. Granular upcycling (2 slices of the dense MLP, --moe-router-pre-softmax: Megatron's weight scale) from a dense
# checkpoint saved on TP2, on one rank and in four layouts.
"${MPI[@]}" -np 2 "$B" "${M[@]}" --ffn-hidden-size 64 --tensor-model-parallel-size 2 --sequence-parallel --save "$tmp/dense_tp2" \
  --save-interval 8 --exit-interval 8 >/dev/null 2>&1
G=("${M[@]}" --ffn-hidden-size 64 "${MOE[@]}" --moe-ffn-hidden-size 32 --moe-upcycling-granularity 2 --moe-router-pre-softmax
   --moe-aux-loss-coeff 1e-2 --load "$tmp/dense_tp2" --moe-use-upcycling --save-interval 100)
"$B" "${G[@]}" --save "$tmp/g1" --log-dir "$tmp/g1_log" >/dev/null 2>&1
if [[ $(losses "$tmp/g1_log" | wc -l) -eq 12 ]]; then ok "granularity 2 on one rank"; else bad "granularity 2 on one rank"; fi
layout() {  # name np flags...
  local name=$1 np=$2; shift 2
  out=$("${MPI[@]}" -np "$np" "$B" "${G[@]}" "$@" --save "$tmp/$name" --log-dir "$tmp/${name}_log" 2>&1); rc=$?
  if [[ $rc -eq 0 ]] && close "$tmp/g1_log" "$tmp/${name}_log"; then ok "granularity 2 on $name: the losses of one rank"; else
    bad "granularity 2 on $name: rc=$rc"; tail -3 <<<"$out"; paste <(losses "$tmp/g1_log") <(losses "$tmp/${name}_log"); fi
}
layout tp2_ep2 4 --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 --expert-tensor-parallel-size 1
layout ep2_dp2_distopt 4 --expert-model-parallel-size 2 --use-distributed-optimizer
layout etp2 2 --tensor-model-parallel-size 2 --sequence-parallel
layout pp2 2 --pipeline-model-parallel-size 2

# 5. Refusals, each one line naming the fix: the same --save again, an MoE checkpoint in --load, another dense model,
# no --load, a granularity that does not divide the experts.
refused() {  # description expected-text flags...
  local what=$1 text=$2; shift 2
  out=$("$B" "$@" 2>&1); rc=$?
  if [[ $rc -ne 0 ]] && grep -q -- "$text" <<<"$out" && [[ $(grep -c "error" <<<"$out") -eq 1 ]]; then ok "refused: $what"; else
    bad "refused: $what: rc=$rc"; tail -3 <<<"$out"; fi
}
U=("${M[@]}" --ffn-hidden-size 64 "${MOE[@]}" --save-interval 100 --moe-use-upcycling)
refused "a --save that holds a checkpoint" "first run only" "${U[@]}" --load "$tmp/dense" --save "$tmp/up1"
refused "an MoE checkpoint" "holds an MoE model already" "${U[@]}" --load "$tmp/up1" --save "$tmp/x1"
refused "another dense model" "moe-upcycling-granularity" "${U[@]}" --moe-ffn-hidden-size 16 --load "$tmp/dense" --save "$tmp/x2"
refused "no --load" "needs --load" "${U[@]}" --save "$tmp/x3"
refused "a granularity that does not divide the experts" "positive divisor of --num-experts" "${U[@]}" --moe-upcycling-granularity 3 \
  --load "$tmp/dense" --save "$tmp/x4"
refused "an empty --load" "no checkpoint in --load" "${U[@]}" --load "$tmp/empty" --save "$tmp/x5"

echo "$fails failure(s)"
exit $((fails > 0))
