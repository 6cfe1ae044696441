#!/usr/bin/env bash
# test_per_token_loss.sh: --calculate-per-token-loss on preprocessed documents with --eod-mask-loss, so microbatches
# hold different numbers of loss tokens: with one microbatch it trains as without it (a sum over a count is the mean);
# with four its gradients differ from the mean of the microbatches' means; DP 2 (distributed optimizer), PP 2, CP 2
# and TP 2 + SP train like one rank (the tokens counted over the whole global batch and whole sequences, the losses
# summed over the stages). The loss reported is Megatron's either way (the token losses summed over the global batch's
# loss tokens): the first iterations agree, and without the flag DP 2 and PP 2 report like one rank too. MoE layers'
# aux and z losses with the flag: below.
# Usage: test_per_token_loss.sh path/to/megatrain (from the repository root).
set -u
B=$(realpath "${1:?usage: test_per_token_loss.sh path/to/megatrain}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fails=0
source "$(dirname "$0")/shakespeare_documents.sh"
make_documents "$B" "$tmp"
# (the vocabulary padded to 512 alike at TP 1 and TP 2)
M=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2
   --train-iters 6 --lr 2e-3 --lr-warmup-iters 2 --hidden-dropout 0 --attention-dropout 0 --eval-iters 0 --log-interval 1 --seed 7
   --adam-eps 1e-4 --make-vocab-size-divisible-by 256 --tokenizer-type ByteTokenizer --data-path "$tmp/shakespeare_text_document"
   --split 100,0,0 --eod-mask-loss --device cpu)
losses() { grep -o '"lm_loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
run() {  # run NAME [mpirun ranks] -- flags...
  local name=$1 np=$2; shift 3
  if [[ $np == 1 ]]; then "$B" "${M[@]}" "$@" --log-dir "$tmp/$name" >"$tmp/$name.log" 2>&1
  else mpirun --oversubscribe --bind-to none -np "$np" -x OPENBLAS_NUM_THREADS=1 "$B" "${M[@]}" "$@" --log-dir "$tmp/$name" >"$tmp/$name.log" 2>&1; fi ||
    { echo "FAIL $name"; tail -3 "$tmp/$name.log"; fails=$((fails + 1)); }
}
same() {  # same A B TOLERANCE: six losses each, equal within the relative tolerance
  paste <(losses "$tmp/$1") <(losses "$tmp/$2") | awk -v t="$3" '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > t*$1) bad=1} END{exit bad || NR!=6}'
}
run mean1 1 -- --global-batch-size 2
run token1 1 -- --global-batch-size 2 --calculate-per-token-loss
run mean4 1 -- --global-batch-size 8
run token4 1 -- --global-batch-size 8 --calculate-per-token-loss
run dp2 2 -- --global-batch-size 8 --calculate-per-token-loss --use-distributed-optimizer
run pp2 2 -- --global-batch-size 8 --calculate-per-token-loss --pipeline-model-parallel-size 2
run cp2 2 -- --global-batch-size 8 --calculate-per-token-loss --context-parallel-size 2
run tp2 2 -- --global-batch-size 8 --calculate-per-token-loss --tensor-model-parallel-size 2 --sequence-parallel
run mean_dp2 2 -- --global-batch-size 8 --use-distributed-optimizer
run mean_pp2 2 -- --global-batch-size 8 --pipeline-model-parallel-size 2
if same mean1 token1 1e-6; then echo "ok   one microbatch: the per-token loss is the mean"; else echo "FAIL one microbatch differs"; paste <(losses "$tmp/mean1") <(losses "$tmp/token1"); fails=$((fails + 1)); fi
if ! same mean4 token4 1e-6; then echo "ok   four microbatches with different token counts: the per-token gradients are not the mean of the means"
else echo "FAIL --calculate-per-token-loss changed nothing with four microbatches"; fails=$((fails + 1)); fi
# The reported loss is Megatron's with or without the flag (the token losses summed over the loss tokens): the first
# iteration, before any update, reports the same loss; the flag changes the gradients only.
first() { losses "$tmp/$1" | head -1; }
if awk -v a="$(first mean4)" -v b="$(first token4)" 'BEGIN{d=a-b; if (d<0) d=-d; exit !(a != "" && d <= 1e-6*a)}'; then
  echo "ok   the first reported loss is the sum over the loss tokens with and without the flag ($(first mean4))"
else echo "FAIL the first reported losses differ: $(first mean4) without the flag, $(first token4) with it"; fails=$((fails + 1)); fi
for layout in dp2 pp2 cp2 tp2; do
  if same token4 "$layout" 1e-5; then echo "ok   $layout trains like one rank with the per-token loss"
  else echo "FAIL $layout differs from one rank"; paste <(losses "$tmp/token4") <(losses "$tmp/$layout"); fails=$((fails + 1)); fi
done
for layout in mean_dp2 mean_pp2; do
  if same mean4 "$layout" 1e-5; then echo "ok   $layout reports and trains like one rank without the flag"
  else echo "FAIL $layout differs from one rank without the flag"; paste <(losses "$tmp/mean4") <(losses "$tmp/$layout"); fails=$((fails + 1)); fi
done
# MoE (aux and z losses): with the flag their gradients are multiplied by the microbatch's tokens, so that when every
# token counts (mock data, no masked tokens) the per-token run trains as the mean's (a missing or rank-local factor moves
# the router's gradients by the tokens per microbatch), and every layout, EP 2 and PP 2 among them, like one rank; with masked
# document ends (the aux weight then the microbatch's tokens over the loss tokens) DP 2, CP 2 and TP 2 + SP like one rank.
MOE=(--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 1e-1 --moe-z-loss-coeff 1e-2 --moe-token-dispatcher-type alltoall --disable-bias-linear)
MOCK=(--mock-data --vocab-size 256 --tokenizer-type NullTokenizer)
mock() {  # mock NAME RANKS -- flags: the model on mock data (every token counts)
  local name=$1 np=$2; shift 3
  local flags=() skip=0
  for f in "${M[@]}"; do  # (M without its data flags)
    if ((skip)); then skip=0; continue; fi
    case $f in --data-path|--tokenizer-type|--split) skip=1; continue ;; --eod-mask-loss) continue ;; esac
    flags+=("$f")
  done
  if [[ $np == 1 ]]; then "$B" "${flags[@]}" "${MOCK[@]}" "$@" --log-dir "$tmp/$name" >"$tmp/$name.log" 2>&1
  else mpirun --oversubscribe --bind-to none -np "$np" -x OPENBLAS_NUM_THREADS=1 "$B" "${flags[@]}" "${MOCK[@]}" "$@" --log-dir "$tmp/$name" >"$tmp/$name.log" 2>&1; fi ||
    { echo "FAIL $name"; tail -3 "$tmp/$name.log"; fails=$((fails + 1)); }
}
mock moe_mean4 1 -- --global-batch-size 8 "${MOE[@]}"
mock moe_token4 1 -- --global-batch-size 8 --calculate-per-token-loss "${MOE[@]}"
mock moe_dp2 2 -- --global-batch-size 8 --calculate-per-token-loss --use-distributed-optimizer "${MOE[@]}"
mock moe_ep2 2 -- --global-batch-size 8 --calculate-per-token-loss --use-distributed-optimizer --expert-model-parallel-size 2 "${MOE[@]}"
mock moe_cp2 2 -- --global-batch-size 8 --calculate-per-token-loss --context-parallel-size 2 "${MOE[@]}"
mock moe_tp2 2 -- --global-batch-size 8 --calculate-per-token-loss --tensor-model-parallel-size 2 --sequence-parallel "${MOE[@]}"
mock moe_pp2 2 -- --global-batch-size 8 --calculate-per-token-loss --pipeline-model-parallel-size 2 "${MOE[@]}"
if same moe_mean4 moe_token4 1e-5; then echo "ok   MoE, every token counting: the per-token run trains as the mean's (the aux and z losses at the same scale)"
else echo "FAIL MoE: the per-token run differs from the mean's with every token counting"; paste <(losses "$tmp/moe_mean4") <(losses "$tmp/moe_token4"); fails=$((fails + 1)); fi
for layout in moe_dp2 moe_ep2 moe_cp2 moe_tp2 moe_pp2; do
  if same moe_token4 "$layout" 1e-5; then echo "ok   $layout trains like one rank with the per-token loss"
  else echo "FAIL $layout differs from one rank"; paste <(losses "$tmp/moe_token4") <(losses "$tmp/$layout"); fails=$((fails + 1)); fi
done
run moe_doc4 1 -- --global-batch-size 8 --calculate-per-token-loss "${MOE[@]}"
run moe_doc_dp2 2 -- --global-batch-size 8 --calculate-per-token-loss --use-distributed-optimizer "${MOE[@]}"
run moe_doc_cp2 2 -- --global-batch-size 8 --calculate-per-token-loss --context-parallel-size 2 "${MOE[@]}"
run moe_doc_tp2 2 -- --global-batch-size 8 --calculate-per-token-loss --tensor-model-parallel-size 2 --sequence-parallel "${MOE[@]}"
for layout in moe_doc_dp2 moe_doc_cp2 moe_doc_tp2; do
  if same moe_doc4 "$layout" 1e-5; then echo "ok   $layout (masked document ends) trains like one rank with the per-token loss"
  else echo "FAIL $layout differs from one rank"; paste <(losses "$tmp/moe_doc4") <(losses "$tmp/$layout"); fails=$((fails + 1)); fi
done
echo "$fails failure(s)"
exit $((fails > 0))
