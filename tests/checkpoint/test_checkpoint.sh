#!/usr/bin/env bash
# test_checkpoint.sh: checkpoints as a user meets them. Exact resume (1 rank, TP2 x DP2), resharding
# (TP2 x DP2 + distributed optimizer -> 1 rank; TP4 with K/V replication -> 1 rank, TP2; PP2 x TP2 x DP2 -> 1 rank, PP4,
# interleaved, ZB-H1; interleaved -> uneven stages; MoE TP2 x EP4 -> EP2 -> 1 rank; CP2 x DP2 -> 1 rank, CP4), kill -9 during saves, corrupt shards, shape
# mismatches, async save with keep-last, --no-save-optim / --finetune.
# Usage: test_checkpoint.sh path/to/megatrain (from the repository root).
set -u
B=$(realpath "${1:?usage: test_checkpoint.sh path/to/megatrain}")
tmp=$(mktemp -d)
trap 'pkill -KILL -f "$tmp/" 2>/dev/null; rm -rf "$tmp"' EXIT
fails=0
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS=1)
M=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
   --micro-batch-size 2 --global-batch-size 8 --lr 1e-3 --lr-warmup-iters 2 --lr-decay-style cosine --mock-data
   --vocab-size 128 --make-vocab-size-divisible-by 64 --log-interval 1 --eval-iters 0 --train-iters 8 --seed 11)

losses() { grep -o '"lm_loss":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
ok() { echo "ok   $1"; }
bad() { echo "FAIL $1"; fails=$((fails + 1)); }

# 1. Exact resume on one rank (bf16 with fp32 master weights): iterations 5..8 identical bit for bit.
"$B" "${M[@]}" --bf16 --log-dir "$tmp/a" >/dev/null 2>&1
"$B" "${M[@]}" --bf16 --save "$tmp/ck1" --save-interval 100 --exit-interval 4 --log-dir "$tmp/b" >/dev/null 2>&1
"$B" "${M[@]}" --bf16 --load "$tmp/ck1" --log-dir "$tmp/c" >/dev/null 2>&1
if [[ "$(losses "$tmp/a" | tail -4)" == "$(losses "$tmp/c")" && $(losses "$tmp/c" | wc -l) -eq 4 ]]; then ok "exact resume, 1 rank"; else
  bad "exact resume, 1 rank"; paste <(losses "$tmp/a" | tail -4) <(losses "$tmp/c"); fi

# 2. Exact resume on TP2 x DP2 with the distributed optimizer.
L=(--tensor-model-parallel-size 2 --use-distributed-optimizer --sequence-parallel)
"${MPI[@]}" -np 4 "$B" "${M[@]}" "${L[@]}" --log-dir "$tmp/d" >/dev/null 2>&1
"${MPI[@]}" -np 4 "$B" "${M[@]}" "${L[@]}" --save "$tmp/ck2" --save-interval 100 --exit-interval 4 --log-dir "$tmp/e" >/dev/null 2>&1
"${MPI[@]}" -np 4 "$B" "${M[@]}" "${L[@]}" --load "$tmp/ck2" --log-dir "$tmp/f" >/dev/null 2>&1
if [[ "$(losses "$tmp/d" | tail -4)" == "$(losses "$tmp/f")" && $(losses "$tmp/f" | wc -l) -eq 4 ]]; then ok "exact resume, TP2 x DP2 + distributed optimizer"; else
  bad "exact resume, TP2 x DP2"; paste <(losses "$tmp/d" | tail -4) <(losses "$tmp/f"); fi

# 3. Resharding: the TP2 x DP2 checkpoint continues on 1 rank and on DP2 (TP1) like the original layout.
"$B" "${M[@]}" --load "$tmp/ck2" --log-dir "$tmp/g" >/dev/null 2>&1
"${MPI[@]}" -np 2 "$B" "${M[@]}" --load "$tmp/ck2" --log-dir "$tmp/h" >/dev/null 2>&1
for run in g h; do
  if paste <(losses "$tmp/d" | tail -4) <(losses "$tmp/$run") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR!=4}'; then
    ok "reshard TP2 x DP2 (+distributed optimizer) -> $([[ $run == g ]] && echo "1 rank" || echo "DP2")"
  else bad "reshard -> $run"; paste <(losses "$tmp/d" | tail -4) <(losses "$tmp/$run"); fi
done

# 3b. Padded vocabularies differ between TP sizes (100 tokens pad to 144 at TP1, 192 at TP2 with
# --make-vocab-size-divisible-by 48): the saved rows load, the extra padding rows start fresh.
V=(--vocab-size 100 --make-vocab-size-divisible-by 48)
"$B" "${M[@]}" "${V[@]}" --save "$tmp/ck3" --save-interval 100 --exit-interval 4 >/dev/null 2>&1
out=$("${MPI[@]}" -np 2 "$B" "${M[@]}" "${V[@]}" --tensor-model-parallel-size 2 --load "$tmp/ck3" --log-dir "$tmp/k" 2>&1); rc=$?
if [[ $rc -eq 0 && $(losses "$tmp/k" | wc -l) -eq 4 ]] && grep -q "continuing after iteration 4" <<<"$out"; then
  ok "reshard across vocabulary padding (TP1 -> TP2)"; else bad "vocab padding reshard: rc=$rc"; tail -3 <<<"$out"; fi

# 3c. K/V replication (2 query groups on TP4: each group's QKV block on two ranks, written once): the TP4
# checkpoint continues on 1 rank and on TP2 like the uninterrupted TP4 run.
# (--make-vocab-size-divisible-by 32 pads the vocabulary to 128 at TP 1, 2 and 4 alike: the same model.)
Q=(--group-query-attention --num-query-groups 2)
M=("${M[@]/#64/32}")
"${MPI[@]}" -np 4 "$B" "${M[@]}" "${Q[@]}" --tensor-model-parallel-size 4 --log-dir "$tmp/q1" >/dev/null 2>&1
"${MPI[@]}" -np 4 "$B" "${M[@]}" "${Q[@]}" --tensor-model-parallel-size 4 --save "$tmp/ck_kv" --save-interval 100 --exit-interval 4 >/dev/null 2>&1
"$B" "${M[@]}" "${Q[@]}" --load "$tmp/ck_kv" --log-dir "$tmp/q2" >/dev/null 2>&1
"${MPI[@]}" -np 2 "$B" "${M[@]}" "${Q[@]}" --tensor-model-parallel-size 2 --load "$tmp/ck_kv" --log-dir "$tmp/q3" >/dev/null 2>&1
for run in q2 q3; do
  if paste <(losses "$tmp/q1" | tail -4) <(losses "$tmp/$run") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR!=4}'; then
    ok "reshard TP4 with K/V replication -> $([[ $run == q2 ]] && echo "1 rank" || echo "TP2")"
  else bad "K/V replication reshard -> $run"; paste <(losses "$tmp/q1" | tail -4) <(losses "$tmp/$run"); fi
done

# 3d. Pipeline parallelism (tied embeddings across the stages, the last stage's copy not written): exact resume
# on PP2 x TP2 x DP2 (the toy shape of the 70B recipe's TP x PP x DP, 8 ranks), and the PP checkpoint
# continues on 1 rank and on PP4 like the uninterrupted run.
P=(--num-layers 4 --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer)
"${MPI[@]}" -np 8 "$B" "${M[@]}" "${P[@]}" --log-dir "$tmp/p1" >/dev/null 2>&1
"${MPI[@]}" -np 8 "$B" "${M[@]}" "${P[@]}" --save "$tmp/ckp" --save-interval 100 --exit-interval 4 --log-dir "$tmp/p2" >/dev/null 2>&1
"${MPI[@]}" -np 8 "$B" "${M[@]}" "${P[@]}" --load "$tmp/ckp" --log-dir "$tmp/p3" >/dev/null 2>&1
if [[ "$(losses "$tmp/p1" | tail -4)" == "$(losses "$tmp/p3")" && $(losses "$tmp/p3" | wc -l) -eq 4 ]]; then ok "exact resume, PP2 x TP2 x DP2"; else
  bad "exact resume, PP2 x TP2 x DP2"; paste <(losses "$tmp/p1" | tail -4) <(losses "$tmp/p3"); fi
"$B" "${M[@]}" --num-layers 4 --load "$tmp/ckp" --log-dir "$tmp/p4" >/dev/null 2>&1
"${MPI[@]}" -np 4 "$B" "${M[@]}" --num-layers 4 --pipeline-model-parallel-size 4 --load "$tmp/ckp" --log-dir "$tmp/p5" >/dev/null 2>&1
for run in p4 p5; do
  if paste <(losses "$tmp/p1" | tail -4) <(losses "$tmp/$run") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR!=4}'; then
    ok "reshard PP2 x TP2 x DP2 -> $([[ $run == p4 ]] && echo "1 rank" || echo "PP4")"
  else bad "PP reshard -> $run"; paste <(losses "$tmp/p1" | tail -4) <(losses "$tmp/$run"); fi
done

# 3f. MoE, the toy shape of configs/mixtral-8x7b.yaml (SwiGLU experts, top-2, RMSNorm, RoPE, GQA, untied): exact
# resume on TP2 x EP4 with SP and the distributed optimizer (8 ranks, expert-TP 2), then the experts, stored as global
# tensors, continue on EP2 (4 ranks) and from there on 1 rank like the uninterrupted run: EP 4 -> 2 -> 1.
X=(--num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --moe-aux-loss-coeff 1e-2 --moe-token-dispatcher-type alltoall
   --normalization RMSNorm --swiglu --position-embedding-type rope --group-query-attention --num-query-groups 2
   --untie-embeddings-and-output-weights --disable-bias-linear)
E4=(--tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 4 --use-distributed-optimizer)
"${MPI[@]}" -np 8 "$B" "${M[@]}" "${X[@]}" "${E4[@]}" --log-dir "$tmp/x1" >/dev/null 2>&1
"${MPI[@]}" -np 8 "$B" "${M[@]}" "${X[@]}" "${E4[@]}" --save "$tmp/ckx" --save-interval 100 --exit-interval 4 --log-dir "$tmp/x2" >/dev/null 2>&1
"${MPI[@]}" -np 8 "$B" "${M[@]}" "${X[@]}" "${E4[@]}" --load "$tmp/ckx" --log-dir "$tmp/x3" >/dev/null 2>&1
if [[ "$(losses "$tmp/x1" | tail -4)" == "$(losses "$tmp/x3")" && $(losses "$tmp/x3" | wc -l) -eq 4 ]]; then ok "exact resume, MoE TP2 x EP4 (8 ranks)"; else
  bad "exact resume, MoE TP2 x EP4"; paste <(losses "$tmp/x1" | tail -4) <(losses "$tmp/x3"); fi
"${MPI[@]}" -np 4 "$B" "${M[@]}" "${X[@]}" --expert-model-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel \
  --expert-tensor-parallel-size 1 --load "$tmp/ckx" --save "$tmp/cky" --save-interval 100 --exit-interval 6 --log-dir "$tmp/x4" >/dev/null 2>&1
"$B" "${M[@]}" "${X[@]}" --load "$tmp/cky" --log-dir "$tmp/x5" >/dev/null 2>&1
if paste <(losses "$tmp/x1" | tail -4) <(losses "$tmp/x4"; losses "$tmp/x5") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR!=4}'; then
  ok "reshard MoE EP4 (TP2, expert-TP 2) -> EP2 (expert-TP 1) -> 1 rank"
else bad "MoE reshard EP 4 -> 2 -> 1"; paste <(losses "$tmp/x1" | tail -4) <(losses "$tmp/x4"; losses "$tmp/x5"); fi

# The expert bias (aux-loss-free balancing) is model state outside the optimizer: saved, and resumed exactly.
XB=("${X[@]}" --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.01 --expert-model-parallel-size 2)
"${MPI[@]}" -np 2 "$B" "${M[@]}" "${XB[@]}" --log-dir "$tmp/xb1" >/dev/null 2>&1
"${MPI[@]}" -np 2 "$B" "${M[@]}" "${XB[@]}" --save "$tmp/ckxb" --save-interval 100 --exit-interval 4 --log-dir "$tmp/xb2" >/dev/null 2>&1
"${MPI[@]}" -np 2 "$B" "${M[@]}" "${XB[@]}" --load "$tmp/ckxb" --log-dir "$tmp/xb3" >/dev/null 2>&1
if [[ "$(losses "$tmp/xb1" | tail -4)" == "$(losses "$tmp/xb3")" && $(losses "$tmp/xb3" | wc -l) -eq 4 ]]; then ok "exact resume, MoE EP2 with the expert bias"; else
  bad "exact resume with the expert bias"; paste <(losses "$tmp/xb1" | tail -4) <(losses "$tmp/xb3"); fi

# Quantile balancing's qb_beta likewise (EP 2 x DP 2: its mean over DP at each iteration).
XQ=("${X[@]}" --moe-router-load-balancing-type quantile_balancing --moe-router-quantile-balancing-ema 0.5 --expert-model-parallel-size 2)
"${MPI[@]}" -np 2 "$B" "${M[@]}" "${XQ[@]}" --log-dir "$tmp/xq1" >/dev/null 2>&1
"${MPI[@]}" -np 2 "$B" "${M[@]}" "${XQ[@]}" --save "$tmp/ckxq" --save-interval 100 --exit-interval 4 --log-dir "$tmp/xq2" >/dev/null 2>&1
"${MPI[@]}" -np 2 "$B" "${M[@]}" "${XQ[@]}" --load "$tmp/ckxq" --log-dir "$tmp/xq3" >/dev/null 2>&1
if [[ "$(losses "$tmp/xq1" | tail -4)" == "$(losses "$tmp/xq3")" && $(losses "$tmp/xq3" | wc -l) -eq 4 ]]; then ok "exact resume, MoE EP2 with quantile balancing"; else
  bad "exact resume with quantile balancing"; paste <(losses "$tmp/xq1" | tail -4) <(losses "$tmp/xq3"); fi

# 3g. Checkpoints do not depend on context parallelism: a CP2 x DP2 run's checkpoint continues on 1 rank and on CP4
# like the uninterrupted CP2 run.
C=(--context-parallel-size 2 --use-distributed-optimizer)
"${MPI[@]}" -np 4 "$B" "${M[@]}" "${C[@]}" --log-dir "$tmp/c1" >/dev/null 2>&1
"${MPI[@]}" -np 4 "$B" "${M[@]}" "${C[@]}" --save "$tmp/ckc" --save-interval 100 --exit-interval 4 --log-dir "$tmp/c2" >/dev/null 2>&1
"$B" "${M[@]}" --load "$tmp/ckc" --log-dir "$tmp/c3" >/dev/null 2>&1
"${MPI[@]}" -np 4 "$B" "${M[@]}" --context-parallel-size 4 --cp-comm-type a2a --load "$tmp/ckc" --log-dir "$tmp/c4" >/dev/null 2>&1
for run in c3 c4; do
  if paste <(losses "$tmp/c1" | tail -4) <(losses "$tmp/$run") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR!=4}'; then
    ok "reshard CP2 x DP2 -> $([[ $run == c3 ]] && echo "1 rank" || echo "CP4 (a2a)")"
  else bad "CP reshard -> $run"; paste <(losses "$tmp/c1" | tail -4) <(losses "$tmp/$run"); fi
done

# 3h. The data order does not depend on where the data lies: a run resumed after its data directory moved (to local
# disk, say) gives the uninterrupted run's losses.
mkdir -p "$tmp/data_a"
head -c 200000 tests/data/tinyshakespeare.txt >"$tmp/data_a/corpus.txt"
"$B" preprocess --input "$tmp/data_a/corpus.txt" --output-prefix "$tmp/data_a/shk" --tokenizer-type ByteTokenizer --append-eod --workers 1 >/dev/null 2>&1
D=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
   --global-batch-size 8 --lr 1e-3 --lr-warmup-iters 2 --log-interval 1 --eval-iters 0 --train-iters 8 --seed 11 --tokenizer-type ByteTokenizer
   --make-vocab-size-divisible-by 1 --split 100,0,0)
"$B" "${D[@]}" --data-path "$tmp/data_a/shk_text_document" --log-dir "$tmp/m1" >/dev/null 2>&1
"$B" "${D[@]}" --data-path "$tmp/data_a/shk_text_document" --save "$tmp/ckm" --save-interval 100 --exit-interval 4 --log-dir "$tmp/m2" >/dev/null 2>&1
mv "$tmp/data_a" "$tmp/data_b"
"$B" "${D[@]}" --data-path "$tmp/data_b/shk_text_document" --load "$tmp/ckm" --log-dir "$tmp/m3" >/dev/null 2>&1
if [[ "$(losses "$tmp/m1" | tail -4)" == "$(losses "$tmp/m3")" && $(losses "$tmp/m3" | wc -l) -eq 4 ]]; then ok "resume after the data moved: the same samples"; else
  bad "resume after the data moved"; paste <(losses "$tmp/m1" | tail -4) <(losses "$tmp/m3"); fi

# 3e. Across pipeline schedules and splits: the PP2 x TP2 x DP2 checkpoint continues under interleaved 1F1B
# (2 virtual stages per rank) and under ZB-H1; an interleaved run's checkpoint continues on uneven stages
# (1 and 3 layers) like the uninterrupted interleaved run.
IL=(--num-layers 4 --pipeline-model-parallel-size 2 --num-virtual-stages-per-pipeline-rank 2)
"${MPI[@]}" -np 2 "$B" "${M[@]}" "${IL[@]}" --load "$tmp/ckp" --log-dir "$tmp/s1" >/dev/null 2>&1
"${MPI[@]}" -np 2 "$B" "${M[@]}" --num-layers 4 --pipeline-model-parallel-size 2 --pipeline-schedule zb-h1 --load "$tmp/ckp" --log-dir "$tmp/s2" >/dev/null 2>&1
for run in s1 s2; do
  if paste <(losses "$tmp/p1" | tail -4) <(losses "$tmp/$run") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR!=4}'; then
    ok "reshard PP2 x TP2 x DP2 -> PP2 $([[ $run == s1 ]] && echo "interleaved (V = 2)" || echo "zb-h1")"
  else bad "PP schedule reshard -> $run"; paste <(losses "$tmp/p1" | tail -4) <(losses "$tmp/$run"); fi
done
"${MPI[@]}" -np 4 "$B" "${M[@]}" --num-layers 4 --tensor-model-parallel-size 2 --sequence-parallel --load "$tmp/ckp" --log-dir "$tmp/s5" >/dev/null 2>&1
if paste <(losses "$tmp/p1" | tail -4) <(losses "$tmp/s5") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR!=4}'; then
  ok "reshard PP2 x TP2 x DP2 -> TP2 x DP2"
else bad "PP2 x TP2 x DP2 -> TP2 x DP2"; paste <(losses "$tmp/p1" | tail -4) <(losses "$tmp/s5"); fi
# One rank's checkpoint continues on PP 4 like the uninterrupted run on one rank.
"$B" "${M[@]}" --num-layers 4 --log-dir "$tmp/s6" >/dev/null 2>&1
"$B" "${M[@]}" --num-layers 4 --save "$tmp/ck_one" --save-interval 100 --exit-interval 4 >/dev/null 2>&1
"${MPI[@]}" -np 4 "$B" "${M[@]}" --num-layers 4 --pipeline-model-parallel-size 4 --load "$tmp/ck_one" --log-dir "$tmp/s7" >/dev/null 2>&1
if paste <(losses "$tmp/s6" | tail -4) <(losses "$tmp/s7") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR!=4}'; then
  ok "reshard 1 rank -> PP4"
else bad "1 rank -> PP4"; paste <(losses "$tmp/s6" | tail -4) <(losses "$tmp/s7"); fi
"${MPI[@]}" -np 2 "$B" "${M[@]}" "${IL[@]}" --log-dir "$tmp/s3" >/dev/null 2>&1
"${MPI[@]}" -np 2 "$B" "${M[@]}" "${IL[@]}" --save "$tmp/ck_il" --save-interval 100 --exit-interval 4 >/dev/null 2>&1
"${MPI[@]}" -np 2 "$B" "${M[@]}" --num-layers 4 --pipeline-model-parallel-size 2 --decoder-first-pipeline-num-layers 1 --load "$tmp/ck_il" \
  --log-dir "$tmp/s4" >/dev/null 2>&1
if paste <(losses "$tmp/s3" | tail -4) <(losses "$tmp/s4") | awk '{d=$1-$2; if (d<0) d=-d; if (NF!=2 || d > 1e-5*$1) bad=1} END{exit bad || NR!=4}'; then
  ok "reshard PP2 interleaved -> PP2 uneven (1 + 3 layers)"
else bad "interleaved -> uneven reshard"; paste <(losses "$tmp/s3" | tail -4) <(losses "$tmp/s4"); fi

# 4. kill -9 during saves, repeatedly: the directory always loads (and verifies).
BIG=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32
     --micro-batch-size 1 --global-batch-size 1 --lr 1e-4 --mock-data --vocab-size 512 --log-interval 1 --eval-iters 0
     --train-iters 100000 --save "$tmp/ck4" --save-interval 1 --load "$tmp/ck4")
# The kills land after each run's first save of its own (a slow machine's start-up can outlast any fixed
# sleep: then every kill fell before the first commit and the resume had nothing to continue from).
survived=0 mid_save=0
for k in 1 2 3 4 5 6 7 8; do
  "$B" "${BIG[@]}" >"$tmp/kill.log" 2>&1 &
  pid=$!
  for ((w = 0; w < 600; ++w)); do grep -q "saved checkpoint" "$tmp/kill.log" && break; kill -0 $pid 2>/dev/null || break; sleep 0.1; done
  sleep 0.$((RANDOM % 10))$((RANDOM % 10))
  kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
  compgen -G "$tmp/ck4/iter_*.tmp" >/dev/null && mid_save=$((mid_save + 1))
  if [[ -f "$tmp/ck4/latest_checkpointed_iteration.txt" ]]; then
    if "$B" checkpoint inspect "$tmp/ck4" --verify >/dev/null 2>"$tmp/inspect.err"; then survived=$((survived + 1)); else
      bad "after kill -9 #$k the checkpoint does not load:"; cat "$tmp/inspect.err"; fi
  else
    survived=$((survived + 1))  # killed before the first commit: nothing to load, nothing claimed
  fi
done
last=$(cat "$tmp/ck4/latest_checkpointed_iteration.txt" 2>/dev/null || echo 0)
if [[ $survived -eq 8 ]] && "$B" "${BIG[@]}" --exit-interval $((last + 1)) >"$tmp/resume.log" 2>&1 && grep -q "continuing after iteration $last" "$tmp/resume.log"; then
  ok "kill -9 x8 ($mid_save of them mid-save): $survived/8 loadable, resumed after iteration $last"
else bad "resume after kills"; tail -3 "$tmp/resume.log"; fi

# 5. A flipped byte in a shard is refused, naming the file.
cp -r "$tmp/ck1" "$tmp/ck5"
f="$tmp/ck5/iter_0000004/rank_00000.bin"
printf '\x55' | dd of="$f" bs=1 seek=1000 conv=notrunc status=none
out=$("$B" "${M[@]}" --bf16 --load "$tmp/ck5" 2>&1); rc=$?
if [[ $rc -ne 0 && $rc -lt 128 ]] && grep -q "checksum mismatch in $f" <<<"$out"; then ok "corrupt shard refused: $(grep -o 'checksum mismatch in [^ ]*' <<<"$out" | head -1)"; else
  bad "corrupt shard: rc=$rc $out"; fi

# 6. Another model says which settings differ (before any tensor shape: the settings name the cause).
out=$("$B" "${M[@]}" --hidden-size 64 --load "$tmp/ck1" 2>&1); rc=$?
if [[ $rc -ne 0 ]] && grep -q "holds another model (--hidden-size: checkpoint 32, this run 64; --ffn-hidden-size: checkpoint 128, this run 256" <<<"$out"; then
  ok "other hidden size named"; else bad "shape mismatch: $out"; fi
out=$("$B" "${M[@]}" --num-layers 1 --load "$tmp/ck1" 2>&1); rc=$?
[[ $rc -ne 0 ]] && grep -q "holds another model (--num-layers: checkpoint 2, this run 1)" <<<"$out" && ok "fewer layers than saved: refused" || bad "partial load: $out"
out=$("$B" "${M[@]}" --optimizer sgd --load "$tmp/ck1" 2>&1); rc=$?
[[ $rc -ne 0 ]] && grep -q "holds adam optimizer state, this run uses --optimizer sgd" <<<"$out" && ok "other optimizer's state: refused" || bad "optimizer kind: $out"
# ... unless --use-checkpoint-args takes the shape from the checkpoint.
"$B" "${M[@]}" --bf16 --hidden-size 64 --use-checkpoint-args --load "$tmp/ck1" --log-dir "$tmp/i" >/dev/null 2>&1 && \
  [[ "$(losses "$tmp/i")" == "$(losses "$tmp/c")" ]] && ok "--use-checkpoint-args" || bad "--use-checkpoint-args"

# 7. Async save with keep-last 2: the same checkpoints as a synchronous save, only the newest two kept.
"$B" "${M[@]}" --save "$tmp/ck7" --save-interval 1 --async-save --ckpt-keep-last 2 >/dev/null 2>&1
"$B" "${M[@]}" --save "$tmp/ck7s" --save-interval 1 >/dev/null 2>&1
kept=$(ls "$tmp/ck7" | grep -c '^iter_')
if [[ $kept -eq 2 && -d "$tmp/ck7/iter_0000008" && -d "$tmp/ck7/iter_0000007" ]] && \
   cmp -s "$tmp/ck7/iter_0000008/rank_00000.bin" "$tmp/ck7s/iter_0000008/rank_00000.bin" && \
   "$B" checkpoint inspect "$tmp/ck7" --verify >/dev/null 2>&1; then ok "async save + keep-last 2"; else bad "async save: kept $kept"; ls "$tmp/ck7"; fi

# 7b. Megatron's --save-retain-interval 4 with --save-interval 2: each save deletes the one before unless a multiple of 4,
# so iterations 4 and 6 remain after 6; resumed to 8, the save at 8 deletes 6; what remains loads.
"$B" "${M[@]}" --exit-interval 6 --save "$tmp/ck7r" --save-interval 2 --save-retain-interval 4 >/dev/null 2>&1
first=$(ls "$tmp/ck7r" | grep '^iter_' | tr '\n' ' ')
"$B" "${M[@]}" --load "$tmp/ck7r" --save "$tmp/ck7r" --save-interval 2 --save-retain-interval 4 >/dev/null 2>&1
second=$(ls "$tmp/ck7r" | grep '^iter_' | tr '\n' ' ')
if [[ "$first" == "iter_0000004 iter_0000006 " && "$second" == "iter_0000004 iter_0000008 " ]] && \
   "$B" checkpoint inspect "$tmp/ck7r" --verify >/dev/null 2>&1 && "$B" "${M[@]}" --load "$tmp/ck7r" --ckpt-step 4 --exit-interval 5 >/dev/null 2>&1; then
  ok "--save-retain-interval"; else bad "--save-retain-interval: after 6 [$first], after 8 [$second]"; fi

# 8. --no-save-optim: loading needs --no-load-optim or --finetune (which restarts at iteration 0).
"$B" "${M[@]}" --save "$tmp/ck8" --save-interval 100 --exit-interval 4 --no-save-optim >/dev/null 2>&1
out=$("$B" "${M[@]}" --load "$tmp/ck8" 2>&1); rc=$?
[[ $rc -ne 0 ]] && grep -q "saved without optimizer state" <<<"$out" && ok "--no-save-optim needs --no-load-optim" || bad "no-save-optim: $out"
out=$("$B" "${M[@]}" --load "$tmp/ck8" --finetune --log-dir "$tmp/j" 2>&1)
grep -q "weights only" <<<"$out" && [[ $(losses "$tmp/j" | wc -l) -eq 8 ]] && ok "--finetune starts at iteration 0" || bad "--finetune"

# 8b. --no-load-optim on a checkpoint with optimizer state: as Megatron (no opt_param_scheduler loaded), the learning-rate
# schedule starts again at the load (warmup included) while the iterations continue; a resume from what it saves keeps that.
lrs() { grep -o '"learning_rate":[^,]*' "$1/metrics.jsonl" | cut -d: -f2; }
out=$("$B" "${M[@]}" --bf16 --load "$tmp/ck1" --no-load-optim --save "$tmp/ck8b" --save-interval 6 --exit-interval 6 --log-dir "$tmp/n" 2>&1)
"$B" "${M[@]}" --bf16 --load "$tmp/ck8b" --log-dir "$tmp/n2" >/dev/null 2>&1
if grep -q "schedule (warmup included) starts again at iteration 5" <<<"$out" && [[ "$(lrs "$tmp/a" | head -4 | tr '\n' ' ')" == "$(cat <(lrs "$tmp/n") <(lrs "$tmp/n2") | tr '\n' ' ')" ]]; then
  ok "--no-load-optim restarts the learning-rate schedule, and its resume continues it"
else bad "--no-load-optim's schedule: $(lrs "$tmp/a" | head -4 | tr '\n' ' ') against $(cat <(lrs "$tmp/n") <(lrs "$tmp/n2") | tr '\n' ' ')"; fi

# 8c. A resume with another learning-rate schedule (Megatron's OptimizerParamScheduler check): refused by default, naming
# the setting and both flags; --override-opt_param-scheduler trains with the command's, --use-checkpoint-opt_param-scheduler
# (or its other spelling) with the checkpoint's; both at once refused; a longer --train-iters moves the decay, refused too.
out=$("$B" "${M[@]}" --bf16 --lr 2e-3 --load "$tmp/ck1" 2>&1); rc=$?
[[ $rc -ne 0 ]] && grep -q "learning rate (--lr) is 0.001, this command's 0.002.*--override-opt_param-scheduler.*--use-checkpoint-opt_param-scheduler" <<<"$out" \
  && ok "another --lr at a resume: refused, both flags named" || bad "schedule check: $out"
M12=(); prev=""; for a in "${M[@]}"; do [[ $prev == --train-iters ]] && a=12; M12+=("$a"); prev=$a; done
out=$("$B" "${M12[@]}" --bf16 --load "$tmp/ck1" 2>&1); rc=$?
[[ $rc -ne 0 ]] && grep -q "its decay .* is 64 samples, this command's 96 samples" <<<"$out" && ok "a longer --train-iters at a resume: refused" || bad "decay check: $out"
"$B" "${M[@]}" --bf16 --lr 2e-3 --load "$tmp/ck1" --override-opt_param-scheduler --log-dir "$tmp/ov" >/dev/null 2>&1
"$B" "${M[@]}" --bf16 --lr 2e-3 --log-dir "$tmp/ov0" >/dev/null 2>&1
"$B" "${M[@]}" --bf16 --lr 2e-3 --load "$tmp/ck1" --use-checkpoint-opt-param-scheduler --log-dir "$tmp/uc" >/dev/null 2>&1
if [[ "$(lrs "$tmp/ov")" == "$(lrs "$tmp/ov0" | tail -4)" && "$(lrs "$tmp/uc")" == "$(lrs "$tmp/a" | tail -4)" && $(lrs "$tmp/uc" | wc -l) -eq 4 ]]; then
  ok "--override-opt_param-scheduler takes the command's schedule, --use-checkpoint-opt_param-scheduler the checkpoint's"
else bad "override / use-checkpoint: $(lrs "$tmp/ov" | tr '\n' ' ') / $(lrs "$tmp/uc" | tr '\n' ' ')"; fi
out=$("$B" "${M[@]}" --load "$tmp/ck1" --override-opt_param-scheduler --use-checkpoint-opt_param-scheduler 2>&1); rc=$?
[[ $rc -ne 0 ]] && grep -q "contradict each other" <<<"$out" && ok "both scheduler flags: refused" || bad "both scheduler flags: $out"

# 9. inspect prints iteration, layout, tensors and sizes.
"$B" checkpoint inspect "$tmp/ck2" | grep -q '"tensor_model_parallel_size":2' && ok "checkpoint inspect" || bad "inspect"

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
