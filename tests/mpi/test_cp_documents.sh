#!/usr/bin/env bash
# test_cp_documents.sh: context parallelism on preprocessed multi-document data, documents kept apart inside each
# sequence (--reset-attention-mask, --reset-position-ids, --eod-mask-loss): CP 2 (ring, and a2a) trains like one rank.
# Usage: test_cp_documents.sh path/to/megatrain (from the repository root).
set -u
B=$(realpath "${1:?usage: test_cp_documents.sh path/to/megatrain}")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fails=0
source "$(dirname "$0")/shakespeare_documents.sh"
make_documents "$B" "$tmp"
docs=$(grep -oE 'documents [0-9]+' "$tmp/pre.log" | tail -1)
M=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2
   --global-batch-size 8 --train-iters 6 --lr 2e-3 --lr-warmup-iters 2 --hidden-dropout 0 --attention-dropout 0 --eval-iters 0
   --log-interval 1 --seed 7 --adam-eps 1e-4 --make-vocab-size-divisible-by 1 --tokenizer-type ByteTokenizer
   --data-path "$tmp/shakespeare_text_document" --split 100,0,0 --reset-attention-mask --reset-position-ids --eod-mask-loss --device cpu)
losses() { grep -o '"lm_loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
"$B" "${M[@]}" --log-dir "$tmp/one" >"$tmp/one.log" 2>&1 || { echo "FAIL one rank"; tail -3 "$tmp/one.log"; exit 1; }
for comm in p2p a2a; do
  mpirun --oversubscribe --bind-to none -np 2 -x OPENBLAS_NUM_THREADS=1 "$B" "${M[@]}" --context-parallel-size 2 --cp-comm-type "$comm" \
    --log-dir "$tmp/$comm" >"$tmp/$comm.log" 2>&1 || { echo "FAIL CP 2 $comm"; tail -3 "$tmp/$comm.log"; fails=$((fails + 1)); continue; }
  if paste <(losses "$tmp/one") <(losses "$tmp/$comm") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR!=6}'; then
    echo "ok   CP 2 ($comm) with documents in the sequences ($docs) trains like one rank"
  else echo "FAIL CP 2 ($comm) with documents"; paste <(losses "$tmp/one") <(losses "$tmp/$comm"); fails=$((fails + 1)); fi
done
echo "$fails failure(s)"
exit $((fails > 0))
