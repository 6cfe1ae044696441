#!/usr/bin/env bash
# test_bad_input.sh: damaged or absurd input, one case per class: each exits non-zero within 5 s with one
# error line naming the setting or the file, and no signal.
# Usage: test_bad_input.sh path/to/megatrain (run from the repository root).
set -u
B=$(realpath "${1:?usage: test_bad_input.sh path/to/megatrain}")
fails=0
tmp=$(mktemp -d)
trap 'kill %1 2>/dev/null; rm -rf "$tmp"' EXIT

bad() {  # bad NAME PATTERN -- command...: rc 1 or 2 (not a signal), the pattern on the error line, under 5 s
  local name=$1 pat=$2; shift 3
  local out rc start=$SECONDS
  out=$(timeout 10 "$@" 2>&1); rc=$?
  local line
  # (megatrain's own line first: under mpirun, MPI's abort banner, which also says "errorcode", may come before it)
  line=$(grep -m1 'megatrain: error' <<<"$out" || grep -m1 'error' <<<"$out")
  if [[ $rc -ne 1 && $rc -ne 2 ]] || ! grep -qE -- "$pat" <<<"$line" || ((SECONDS - start > 5)); then
    echo "FAIL $name: rc=$rc, $((SECONDS - start)) s, want '$pat' in:"; echo "$out" | tail -5; fails=$((fails + 1))
  else
    echo "ok   $name: $line"
  fi
}

Q=(--config configs/quickstart.yaml --train-iters 2 --eval-iters 0)
# Values outside what Megatron's semantics allow.
bad negative-lr '--lr must be a finite number >= 0' -- "$B" "${Q[@]}" --lr -1e-3
bad beta1 '--adam-beta1 must be in \[0, 1\)' -- "$B" "${Q[@]}" --adam-beta1 2
bad beta2 '--adam-beta2 must be in \[0, 1\)' -- "$B" "${Q[@]}" --adam-beta2 1
bad eps '--adam-eps must be a finite number > 0' -- "$B" "${Q[@]}" --adam-eps 0
bad weight-decay '--weight-decay must be a finite number >= 0' -- "$B" "${Q[@]}" --weight-decay -5
bad clip-grad '--clip-grad must be a finite number >= 0' -- "$B" "${Q[@]}" --clip-grad -1
bad init-std '--init-method-std must be a finite number >= 0' -- "$B" "${Q[@]}" --init-method-std -1
bad dropout '--hidden-dropout must be in \[0, 1\)' -- "$B" "${Q[@]}" --hidden-dropout 1.5
bad min-lr '--min-lr must be a finite number >= 0' -- "$B" "${Q[@]}" --min-lr -1
bad recompute-layernorm '--recompute-modules layernorm is not implemented' -- "$B" "${Q[@]}" --recompute-granularity selective --recompute-modules core_attn layernorm
bad step-batch-with-global 'Cannot specify both --step-batch-size-schedule and --global-batch-size' -- "$B" "${Q[@]}" --step-batch-size-schedule 0:16,1M:32
bad step-batch-entry "step-batch-size-schedule: entry '1M' has no ':'" -- "$B" --num-layers 2 --hidden-size 64 --num-attention-heads 4 \
  --seq-length 32 --max-position-embeddings 32 --vocab-size 100 --mock-data --micro-batch-size 2 --train-iters 2 --step-batch-size-schedule "0:4 1M"
bad nan-split "--split 'nan,1,1'" -- "$B" "${Q[@]}" --split nan,1,1
bad inf-split "--split 'inf,1,1'" -- "$B" "${Q[@]}" --split inf,1,1
bad nan-blend "--data-path: 'nan' is not a weight" -- "$B" --config configs/quickstart.yaml --text-data-path "" --tokenizer-type NullTokenizer \
  --vocab-size 100 --data-path nan "$tmp/a" 1 "$tmp/b"
# Recipes.
printf 'num_layers: 2\nnum_layers: 4\n' >"$tmp/dup.yaml"
bad yaml-duplicate "key 'num_layers' .* is given twice" -- "$B" --config "$tmp/dup.yaml" --print-config
bad yaml-directory "recipe '$tmp' is a directory" -- "$B" --config "$tmp" --print-config
head -c 2000000 /dev/zero | tr '\0' '#' >"$tmp/big.yaml"
bad yaml-oversized "is 2000000 bytes: a recipe is a small YAML mapping" -- "$B" --config "$tmp/big.yaml" --print-config
{
  echo 'a: &a ["x","x","x","x","x","x","x","x","x"]'
  prev=a
  for n in b c d e f g h i; do echo "$n: &$n [*$prev,*$prev,*$prev,*$prev,*$prev,*$prev,*$prev,*$prev,*$prev]"; prev=$n; done
} >"$tmp/bomb.yaml"
bad yaml-alias-bomb 'YAML nodes once aliases are expanded' -- "$B" --config "$tmp/bomb.yaml" --print-config
# Checkpoint directories: a file as --load; committed iterations without their tracker; two runs in one --save.
bad load-file "is a file, not a checkpoint directory" -- "$B" "${Q[@]}" --load "$tmp/dup.yaml"
"$B" "${Q[@]}" --save "$tmp/ck" --save-interval 1 >/dev/null 2>&1
rm -f "$tmp/ck/latest_checkpointed_iteration.txt"
bad load-no-tracker 'holds committed iterations \(1, 2\) but no latest_checkpointed_iteration.txt: resume one of them with --ckpt-step 2' -- \
  "$B" "${Q[@]}" --load "$tmp/ck"
bad other-model 'holds another model \(--num-attention-heads: checkpoint 4, this run 8; --kv-channels: checkpoint 32, this run 16\)' -- \
  "$B" "${Q[@]}" --load "$tmp/ck" --ckpt-step 2 --num-attention-heads 8
# Damaged metadata: edited (its checksum no longer matches), or edited with the checksum removed (each field
# checked before use: a range outside the shard, an absurd iteration, a shard rank beyond its count).
cp -r "$tmp/ck" "$tmp/ck_edit" && echo 2 >"$tmp/ck_edit/latest_checkpointed_iteration.txt"
sed -i 's/"iteration": 2/"iteration": 3/' "$tmp/ck_edit/iter_0000002/metadata.json"
bad metadata-edited 'does not match the checksum written with it' -- "$B" "${Q[@]}" --load "$tmp/ck_edit"
vandal() {  # vandal NAME PERL-SUBSTITUTION (on the first match: the first piece of the first tensor, keys sorted)
  cp -r "$tmp/ck" "$tmp/ck_$1" && echo 2 >"$tmp/ck_$1/latest_checkpointed_iteration.txt" && rm -f "$tmp/ck_$1/iter_0000002/metadata.json.checksum"
  perl -0pi -e "$2" "$tmp/ck_$1/iter_0000002/metadata.json"
}
vandal range 's/"range": \[\s*0,\s*\d+/"range": [0, 1000000000000/'
bad metadata-range "'range' \[0, 1000000000000\) lies outside the shard" -- "$B" "${Q[@]}" --load "$tmp/ck_range"
bad inspect-verify-range "'range' \[0, 1000000000000\) lies outside the shard" -- "$B" checkpoint inspect "$tmp/ck_range" --verify
vandal iteration 's/"iteration": 2/"iteration": 1e30/'
bad metadata-iteration "'iteration' is not an integer" -- "$B" "${Q[@]}" --load "$tmp/ck_iteration"
vandal rank 's/"shard_rank": 0/"shard_rank": 7/'
bad metadata-shard-rank "'shard_rank' is 7, outside \[0, 0\]" -- "$B" "${Q[@]}" --load "$tmp/ck_rank"
vandal schedule 's/"decay_samples":\s*\d+/"decay_samples": "many"/'
bad metadata-schedule "'decay_samples' is not an integer" -- "$B" "${Q[@]}" --load "$tmp/ck_schedule"
# Tokenizer files and launcher environments.
printf 'hello world\n' >"$tmp/corpus.txt"
printf '{"a": -5, "<|endoftext|>": 2}' >"$tmp/vocab.json"
printf '#version: 0.2\na b\n' >"$tmp/merges.txt"
bad vocab-negative-id "--vocab-file '.*vocab.json': id -5 of 'a' is outside" -- \
  "$B" preprocess --input "$tmp/corpus.txt" --output-prefix "$tmp/pp" --tokenizer-type GPT2BPETokenizer --vocab-file "$tmp/vocab.json" --merge-file "$tmp/merges.txt"
printf '{"a": 1,' >"$tmp/broken.json"
bad vocab-broken-json "is not valid JSON \(a GPT-2 vocab.json / encoder.json\): parse error at line 1" -- \
  "$B" preprocess --input "$tmp/corpus.txt" --output-prefix "$tmp/pp" --tokenizer-type GPT2BPETokenizer --vocab-file "$tmp/broken.json" --merge-file "$tmp/merges.txt"
printf '{"model": {"type": 5}}' >"$tmp/tokenizer.json"
bad tokenizer-json-shape "--tokenizer-model '.*tokenizer.json' is not a HuggingFace tokenizer.json megatrain can read: type must be string" -- \
  "$B" preprocess --input "$tmp/corpus.txt" --output-prefix "$tmp/pp" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/tokenizer.json"
# A pre-tokenizer pattern that backtracks catastrophically: an error after ICU's time limit, not a hang.
mkdir -p "$tmp/slowtok"
printf '{"model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "</s>": 2}, "merges": []}, "added_tokens": [{"id": 2, "content": "</s>", "special": true}], "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated"}, {"type": "ByteLevel", "use_regex": false}]}}' >"$tmp/slowtok/tokenizer.json"
printf '{"eos_token": "</s>"}' >"$tmp/slowtok/tokenizer_config.json"
printf '{"text": "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaab"}\n' >"$tmp/slow.jsonl"
bad regex-time-limit "pre-tokenizer pattern ran past its time limit" -- \
  "$B" preprocess --input "$tmp/slow.jsonl" --output-prefix "$tmp/slow" --tokenizer-type HuggingFaceTokenizer --tokenizer-model "$tmp/slowtok"
bad master-port 'MASTER_PORT 99999 is not a TCP port' -- env MASTER_PORT=99999 RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 "$B" "${Q[@]}" --device cpu
bad world-size 'reports a world size of 100000000' -- env MASTER_PORT=29500 RANK=0 WORLD_SIZE=100000000 MASTER_ADDR=127.0.0.1 "$B" "${Q[@]}" --device cpu
out=$("$B" preprocess --input "$tmp/corpus.txt" --output-prefix "$tmp/pp" --tokenizer-type ByteTokenizer --workers 100000 2>&1); rc=$?
if [[ $rc -eq 0 ]] && grep -q "note: --workers 100000 is more than this machine's" <<<"$out"; then echo "ok   workers capped"; else
  echo "FAIL workers: rc=$rc"; echo "$out" | tail -3; fails=$((fails + 1)); fi
# Dataset index caches: a damaged one is rebuilt with a note, a dataset rewritten in place gets a fresh one.
for i in $(seq 1 100); do printf 'line %d of a document long enough for a few samples\n\n' "$i"; done >"$tmp/docs.txt"
"$B" preprocess --input "$tmp/docs.txt" --output-prefix "$tmp/ds" --tokenizer-type ByteTokenizer >/dev/null 2>&1
D=(--num-layers 1 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --global-batch-size 4
   --lr 1e-3 --train-iters 2 --eval-iters 0 --data-path "$tmp/ds_text_document" --tokenizer-type ByteTokenizer --device cpu)
"$B" "${D[@]}" >/dev/null 2>&1
for part in doc sample shuffle; do
  f=$(ls "$tmp"/ds_text_document-train-*-"$part".bin)
  head -c "$(stat -c %s "$f")" /dev/zero >"$f"  # zero-filled
  out=$("$B" "${D[@]}" 2>&1); rc=$?
  if [[ $rc -eq 0 ]] && grep -q "note: rebuilding the index cache .*: not a megatrain index cache" <<<"$out"; then echo "ok   zero-filled $part cache rebuilt"; else
    echo "FAIL zero-filled $part cache: rc=$rc"; echo "$out" | tail -3; fails=$((fails + 1)); fi
done
sleep 1 && touch "$tmp/ds_text_document.bin"
out=$("$B" "${D[@]}" 2>&1)
if ! grep -q "(cached index)" <<<"$out"; then echo "ok   a dataset rewritten in place does not reuse its old cache"; else
  echo "FAIL stale cache reused"; fails=$((fails + 1)); fi
# A model beyond this machine's memory: said before allocating, with the bytes and the remedies.
bad host-memory 'parameters need [0-9.]+ GiB of host memory for weights and gradients, more than the' -- "$B" --num-layers 100 --hidden-size 16384 \
  --num-attention-heads 128 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 1 --lr 1e-4 --train-iters 1 --mock-data --vocab-size 1000 --device cpu
# A full disk under metrics.jsonl: one warning, training goes on.
mkdir -p "$tmp/full" && ln -sf /dev/full "$tmp/full/metrics.jsonl"
out=$("$B" "${Q[@]}" --log-interval 1 --log-dir "$tmp/full" 2>&1); rc=$?
if [[ $rc -eq 0 ]] && [[ $(grep -c "warning: a metrics.jsonl line could not be written" <<<"$out") -eq 1 ]]; then echo "ok   metrics on a full disk: warned once"; else
  echo "FAIL metrics full disk: rc=$rc"; echo "$out" | tail -3; fails=$((fails + 1)); fi
# A silent client at the torchrun-style rendezvous is dropped after a few seconds; the ranks go on.
P=$((29000 + RANDOM % 1000)); t0=$SECONDS
(MASTER_ADDR=127.0.0.1 MASTER_PORT=$P RANK=0 WORLD_SIZE=2 "$B" "${Q[@]}" --device cpu >"$tmp/rdv0.log" 2>&1; echo "rc=$?" >>"$tmp/rdv0.log") &
rdv=$!
sleep 1
(exec 3<>"/dev/tcp/127.0.0.1/$P" && sleep 30) 2>/dev/null &
silent=$!
sleep 1
MASTER_ADDR=127.0.0.1 MASTER_PORT=$P RANK=1 WORLD_SIZE=2 timeout 40 "$B" "${Q[@]}" --device cpu >"$tmp/rdv1.log" 2>&1; rc1=$?
wait $rdv; kill $silent 2>/dev/null
if [[ $rc1 -eq 0 ]] && grep -q "rc=0" "$tmp/rdv0.log" && ((SECONDS - t0 < 25)); then echo "ok   silent client at the rendezvous dropped ($((SECONDS - t0)) s)"; else
  echo "FAIL silent client: rc1=$rc1, $((SECONDS - t0)) s"; tail -2 "$tmp/rdv0.log"; fails=$((fails + 1)); fi
# Ranks launched with different flags (an MPI app context): every rank ends, naming the settings.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
bad ranks-disagree 'the ranks were launched with different configurations .*rank 1: --seed 5 \(rank 0: 1234\); --lr 0.002 \(rank 0: 0.001\)' -- \
  mpirun --oversubscribe --bind-to none -np 1 "$B" "${Q[@]}" --lr 1e-3 : -np 1 "$B" "${Q[@]}" --lr 2e-3 --seed 5
"$B" --config configs/quickstart.yaml --eval-iters 0 --train-iters 100000 --save "$tmp/ck_lock" --save-interval 100000 >"$tmp/holder.log" 2>&1 &
for ((w = 0; w < 100; ++w)); do grep -q "iteration" "$tmp/holder.log" && break; sleep 0.1; done
bad save-locked "another run \(pid $! on .*\) is saving into $tmp/ck_lock" -- "$B" "${Q[@]}" --save "$tmp/ck_lock" --save-interval 1
kill %1 2>/dev/null; wait 2>/dev/null

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
