#!/usr/bin/env bash
# run_parallel_parity.sh: multi-GPU layouts of the CUDA engine against the CPU reference engine (one rank,
# the oracle) at bf16 tolerance: tiny GPT-2-style and LLaMA-style models, 10 iterations on mock data, the
# same seed and global batch: one GPU, TP 2, TP 2 + sequence parallel, DP 2 (and TP 2 x DP 2 with 4 GPUs),
# DP 2 with the distributed optimizer (also with the parameter gather overlapped), TP 2 + SP with the split
# layers (micro batch 4), and TP 2 / TP 2 + SP of a LLaMA with one K/V head (replicated over
# the TP ranks), must give the same loss per iteration, the same gradient norm and, from the final parameters, the same
# validation loss. The distributed optimizer's sharded checkpoint must resume on the GPUs and on the CPU
# engine. Context parallelism: CP 2 (with 4 GPUs also CP 2 x DP 2 + distributed optimizer, CP 2 x TP 2 + SP). Pipeline
# parallelism: PP 2 with 1F1B, ZB-H1 and interleaved (with 4 GPUs also PP 2 x DP 2 + distributed optimizer, PP 2 x TP 2 + SP).
# Mixture of experts (LLaMA): DP 2, with the distributed optimizer, the expert bias and a capacity factor, with the
# overlaps (the experts' buckets after the backward); expert parallelism EP 2 (with 4 GPUs also EP 2 x expert-DP 2, and
# EP 4), with the distributed optimizer, and with the overlaps. FP8 (LLaMA): tensorwise under TP 2 and TP 2 + SP, delayed
# under TP 2 + SP and DP 2, against the CPU engine's emulation.
# Needs at least 2 visible GPUs (exit 77, skipped, otherwise).
# Usage: run_parallel_parity.sh path/to/megatrain
set -u
BIN=${1:?usage: run_parallel_parity.sh path/to/megatrain}
export NCCL_NVLS_ENABLE=0 OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
n=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [[ ${n:-0} -lt 2 ]]; then echo "SKIP: multi-GPU parity needs 2 GPUs ($n visible): run scripts/test_gpu.sh on the 2-GPU machine"; exit 77; fi
# PARITY_WORK=dir keeps the runs' logs and metrics there; PARITY_PRECISION replaces --bf16 (e.g. "--fp16 --loss-scale 1024").
if [[ -n ${PARITY_WORK:-} ]]; then
  work=$PARITY_WORK
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
COMMON="--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 2
  --global-batch-size 16 --train-iters 10 --log-interval 1 --eval-interval 10 --eval-iters 2 --mock-data --vocab-size 256 ${PARITY_PRECISION:---bf16}
  --hidden-dropout 0 --attention-dropout 0 --lr 3e-3 --lr-warmup-iters 2 --seed 7"
GPT="--ffn-hidden-size 512"
LLAMA="--normalization RMSNorm --swiglu --ffn-hidden-size 256 --position-embedding-type rope --group-query-attention --num-query-groups 2
  --untie-embeddings-and-output-weights --disable-bias-linear"
fails=0
# The CUDA features refused by name until these runs pass on several GPUs (lib/train/capabilities.cpp).
export MEGATRAIN_CUDA_UNVERIFIED=${MEGATRAIN_CUDA_UNVERIFIED:-context-parallel,pipeline-parallel,moe-data-parallel,expert-parallel,moe-tensor-parallel,qkv-bias-tensor-parallel,fp8-tensor-parallel,fp8-amax-data-parallel,fp8-expert-parallel,expert-tensor-parallel}

# name ranks device model flags...: one run, its metrics in $work/name/metrics.jsonl
run() {
  local name=$1 np=$2 dev=$3 model=$4
  shift 4
  mkdir -p "$work/$name"
  local xs=(-x NCCL_NVLS_ENABLE) v
  for v in $(compgen -e | grep '^MEGATRAIN_' || true); do xs+=(-x "$v"); done  # e.g. MEGATRAIN_TEST_GATHER_DELAY_US
  # shellcheck disable=SC2086
  if [[ $np -eq 1 ]]; then
    "$BIN" $COMMON $model --device "$dev" --log-dir "$work/$name" "$@" >"$work/$name/log" 2>&1
  else
    mpirun --oversubscribe --bind-to none -np "$np" "${xs[@]}" "$BIN" $COMMON $model --device "$dev" --log-dir "$work/$name" "$@" \
      >"$work/$name/log" 2>&1
  fi || { echo "FAIL $name: the run failed"; tail -5 "$work/$name/log"; fails=$((fails + 1)); return 1; }
}

# family name: the layouts meant to split their layers say so at start-up, and the plain ones do not.
expect_split() {
  local want=""
  case $2 in
    *whole | tp2sp | tp2spdrop | tp2dp2 | tp2dp2do) want=no ;;
    tp2 | tp2f32res | tp2rc* | tp2drop | tp2sp4* | tp2dp2sp4 | tp2dp2split) [[ $1 != mqa ]] && want=yes ;;
  esac
  local said=no
  grep -q "layers split in two halves" "$work/$1-$2/log" && said=yes
  if [[ -n $want && $said != "$want" ]]; then
    echo "FAIL $1-$2: the layers $([[ $want == yes ]] && echo "did not split" || echo split)"; fails=$((fails + 1))
  fi
  # The split layers under SP sum with all-to-alls, unless told otherwise (the *rs layouts).
  if [[ $said == yes && $2 == *sp* ]]; then
    local a2a=no want_a2a=yes
    grep -q "(all-to-all" "$work/$1-$2/log" && a2a=yes
    [[ $2 == *rs ]] && want_a2a=no
    if [[ $a2a != "$want_a2a" ]]; then
      echo "FAIL $1-$2: the split SP layers $([[ $want_a2a == yes ]] && echo "did not sum with all-to-alls" || echo "summed with all-to-alls")"
      fails=$((fails + 1))
    fi
  fi
}

# field file: one value per line, in iteration order
field() { sed -n "s/.*\"$1\":\([-0-9.eE+]*\).*/\1/p" "$2/metrics.jsonl"; }

# name reference field tolerance: max relative difference per line
compare() {
  local name=$1 ref=$2 f=$3 tol=$4
  local got want
  got=$(field "$f" "$work/$name"); want=$(field "$f" "$work/$ref")
  if [[ -z $got || $(wc -l <<<"$got") -ne $(wc -l <<<"$want") ]]; then
    echo "FAIL $name: $f missing or of another length than $ref's"; fails=$((fails + 1)); return
  fi
  local worst
  worst=$(paste <(echo "$got") <(echo "$want") | awk '{d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r} END {printf "%.2e", m}')
  if awk -v w="$worst" -v t="$tol" 'BEGIN{exit !(w <= t)}'; then
    echo "PASS $name: $f within $worst of $ref (tolerance $tol)"
  else
    echo "FAIL $name: $f differs from $ref by $worst (tolerance $tol)"; paste <(echo "$got") <(echo "$want") | head -10; fails=$((fails + 1))
  fi
}

# name reference field tolerance: as compare, against the reference's last lines (a resumed run)
compare_tail() {
  local name=$1 ref=$2 f=$3 tol=$4
  local got want worst
  got=$(field "$f" "$work/$name"); want=$(field "$f" "$work/$ref" | tail -n "$(wc -l <<<"$got")")
  if [[ -z $got ]]; then echo "FAIL $name: no $f"; fails=$((fails + 1)); return; fi
  worst=$(paste <(echo "$got") <(echo "$want") | awk '{d = $1 - $2; if (d < 0) d = -d; r = d / ($2 < 0 ? -$2 : $2); if (r > m) m = r} END {printf "%.2e", m}')
  if awk -v w="$worst" -v t="$tol" 'BEGIN{exit !(w <= t)}'; then
    echo "PASS $name: $f within $worst of $ref's last iterations (tolerance $tol)"
  else
    echo "FAIL $name: $f differs from $ref's last iterations by $worst (tolerance $tol)"; fails=$((fails + 1))
  fi
}

for family in ${PARITY_FAMILIES:-gpt llama mqa}; do  # PARITY_FAMILIES: a subset, for a quick check
  model=$GPT
  [[ $family == llama ]] && model=$LLAMA
  [[ $family == mqa ]] && model="${LLAMA/--num-query-groups 2/--num-query-groups 1}"  # one K/V head: replicated on both TP ranks
  run "$family-cpu" 1 cpu "$model" || continue
  layouts=("tp2 2 --tensor-model-parallel-size 2" "tp2sp 2 --tensor-model-parallel-size 2 --sequence-parallel")
  if [[ $family != mqa ]]; then
    layouts+=("gpu1 1" "dp2 2 --overlap-grad-reduce" "dp2do 2 --use-distributed-optimizer --overlap-grad-reduce"
              "dp2bf16 2 --overlap-grad-reduce --grad-reduce-in-bf16"
              "dp2dobf16 2 --use-distributed-optimizer --overlap-grad-reduce --grad-reduce-in-bf16")
    ((n >= 4)) && layouts+=("tp2dp2 4 --tensor-model-parallel-size 2 --sequence-parallel --overlap-grad-reduce"
                            "tp2dp2do 4 --tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce"
                            "tp2dp2split 4 --tensor-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"
                            "tp2dp2sp4 4 --tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 4 --overlap-grad-reduce")
  fi
  # Context parallelism (ring attention over NCCL; refused by name until these pass: the gate is lifted for them
  # at the top): CP 2, and with 4 GPUs CP 2 x DP 2 with the distributed optimizer and CP 2 x TP 2 + SP.
  if [[ $family != mqa ]]; then
    layouts+=("cp2 2 --context-parallel-size 2" "cp2a2a 2 --context-parallel-size 2 --cp-comm-type a2a")
    ((n >= 4)) && layouts+=("cp2dp2do 4 --context-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce"
                            "cp2tp2sp 4 --context-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel")
  fi
  # Pipeline parallelism (the stages' activations and gradients over NCCL; refused by name until these pass: the gate
  # is lifted for them at the top): PP 2 with 1F1B and with ZB-H1 (GPT's tied embedding: the last stage's copy summed
  # with the first's), and with 4 GPUs PP 2 x DP 2 with the distributed optimizer and PP 2 x TP 2 + SP. Interleaving
  # (more layers) below.
  if [[ $family != mqa ]]; then
    layouts+=("pp2 2 --pipeline-model-parallel-size 2" "pp2zb 2 --pipeline-model-parallel-size 2 --pipeline-schedule zb-h1")
    ((n >= 4)) && layouts+=("pp2dp2do 4 --pipeline-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce"
                            "pp2tp2sp 4 --pipeline-model-parallel-size 2 --tensor-model-parallel-size 2 --sequence-parallel")
  fi
  # TP 2 runs its forward as two interleaved halves of the micro batch (the all-reduces overlapped); tp2whole:
  # the plain forward.
  [[ $family != mqa ]] && layouts+=("tp2whole 2 --tensor-model-parallel-size 2")
  # The split forward with full recompute (layers that share the recompute record between halves).
  [[ $family != mqa ]] && layouts+=("tp2rc 2 --tensor-model-parallel-size 2 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
                                    "tp2rcb 2 --tensor-model-parallel-size 2 --recompute-granularity full --recompute-method block --recompute-num-layers 1")
  # and with an fp32 residual stream (4-byte rows in the halves' offsets).
  [[ $family != mqa ]] && layouts+=("tp2f32res 2 --tensor-model-parallel-size 2 --fp32-residual-connection")
  # The split layers under SP need a micro batch of a multiple of 2 TP (each rank's piece of a half whole
  # sequences): micro batch 4, against the CPU engine's 2 (the same global batch) and the plain SP layers.
  [[ $family != mqa ]] && layouts+=("tp2sp4 2 --tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 4"
                                    "tp2sp4whole 2 --tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 4"
                                    "tp2sp4rs 2 --tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 4"
                                    "tp2sp4f32res 2 --tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 4 --fp32-residual-connection")
  for l in "${layouts[@]}"; do
    read -r name np extra <<<"$l"
    split=1 a2a=1
    [[ $name == *whole ]] && split=0
    [[ $name == *rs ]] && a2a=0  # the split SP layers' sums as reduce-scatters instead of all-to-alls
    # shellcheck disable=SC2086
    MEGATRAIN_TP_SPLIT_FORWARD=$split MEGATRAIN_TP_SP_ALLTOALL=$a2a run "$family-$name" "$np" cuda "$model" $extra || continue
    expect_split "$family" "$name"

    compare "$family-$name" "$family-cpu" lm_loss 5e-3
    compare "$family-$name" "$family-cpu" grad_norm 3e-2
    compare "$family-$name" "$family-cpu" validation_lm_loss 5e-3
  done
  # The split forward against the plain one directly (the same operations per row; GEMMs of half the rows
  # may take other algorithms, so not bit for bit).
  [[ $family != mqa ]] && compare "$family-tp2" "$family-tp2whole" lm_loss 2e-3
  [[ $family != mqa ]] && compare "$family-tp2" "$family-tp2whole" grad_norm 2e-2
  [[ $family != mqa ]] && compare "$family-tp2sp4" "$family-tp2sp4whole" lm_loss 2e-3
  [[ $family != mqa ]] && compare "$family-tp2sp4" "$family-tp2sp4whole" grad_norm 2e-2
  # The all-to-all and the norm's sum against the reduce-scatter: the same rounding at TP 2.
  [[ $family != mqa ]] && compare "$family-tp2sp4" "$family-tp2sp4rs" lm_loss 1e-4
  [[ $family != mqa ]] && compare "$family-tp2sp4" "$family-tp2sp4rs" grad_norm 1e-3
  [[ $family == mqa ]] && continue
  # Interleaved 1F1B: two virtual stages a rank (4 layers, one a chunk), and the same with 4 layers on two plain
  # stages, against the CPU engine's 4-layer run.
  if run "$family-cpu4" 1 cpu "$model" --num-layers 4; then
    for l in "pp2v2 2 --pipeline-model-parallel-size 2 --num-layers-per-virtual-pipeline-stage 1" "pp2l4 2 --pipeline-model-parallel-size 2"; do
      read -r name np extra <<<"$l"
      # shellcheck disable=SC2086
      run "$family-$name" "$np" cuda "$model" --num-layers 4 $extra || continue
      compare "$family-$name" "$family-cpu4" lm_loss 5e-3
      compare "$family-$name" "$family-cpu4" grad_norm 3e-2
      compare "$family-$name" "$family-cpu4" validation_lm_loss 5e-3
    done
  fi
  # FP8 (LLaMA; refused by name until these pass: fp8-tensor-parallel and fp8-amax-data-parallel, lifted at the top) against
  # the CPU engine's emulation on one rank, with a small learning rate (the CUDA engine runs Adam only, and Adam turns a
  # value rounded the other way in another layout into a full step; the CPU parity tests train FP8 with SGD): tensorwise
  # under TP 2 and TP 2 + SP (each shard's amax over TP before its cast), delayed under TP 2 + SP (the amax accumulators
  # over TP at each update) and DP 2 (over DP: the amax group); with 4 GPUs both under TP 2 + SP x DP 2 with the
  # distributed optimizer. (FP8 under TP with PP is refused on the CUDA engine.)
  if [[ $family == llama ]]; then
    F8="--lr 1e-4 --fp8-format hybrid --fp8-recipe"
    F8D="--fp8-amax-history-len 3 --fp8-amax-compute-algo max"
    # shellcheck disable=SC2086
    if run "$family-cpu-f8" 1 cpu "$model" $F8 tensorwise && run "$family-cpu-f8d" 1 cpu "$model" $F8 delayed $F8D; then
      for l in "f8tp2 f8 2 tensorwise --tensor-model-parallel-size 2" "f8tp2sp f8 2 tensorwise --tensor-model-parallel-size 2 --sequence-parallel" \
               "f8dtp2sp f8d 2 delayed $F8D --tensor-model-parallel-size 2 --sequence-parallel" "f8ddp2 f8d 2 delayed $F8D --use-distributed-optimizer" \
               "f8dtp2dp2 f8d 4 delayed $F8D --tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer" \
               "f8tp2dp2 f8 4 tensorwise --tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer"; do
        read -r name ref np recipe extra <<<"$l"
        ((np <= n)) || continue
        # shellcheck disable=SC2086
        run "$family-$name" "$np" cuda "$model" $F8 $recipe $extra || continue
        compare "$family-$name" "$family-cpu-$ref" lm_loss 1e-2
        compare "$family-$name" "$family-cpu-$ref" grad_norm 5e-2
        compare "$family-$name" "$family-cpu-$ref" validation_lm_loss 1e-2
      done
    fi
  fi
  # Mixture of experts with data parallelism (every expert on every rank; refused by name until these pass: the gate is
  # lifted for them at the top): DP 2, with the distributed optimizer (the experts' shards before the dense ones), with
  # the expert bias (its counts summed over DP) and with a capacity factor (each rank's tokens); the MoE statistics of the
  # log (summed over the replicas: the mean tokens per expert exactly the CPU engine's, the aux and z losses averaged);
  # the distributed optimizer's checkpoints resumed on the GPUs and by the CPU engine on one rank (one writer of the
  # experts; the expert bias from the device). With pipeline parallelism (a layer a stage; with 4 GPUs EP 2 in each
  # stage) the log's MoE statistics are summed over the stages; with context parallelism over the CP ranks. TP 2 + SP:
  # the experts split over expert-TP = TP, the capacity's drops decided over the gathered rows. Expert-TP other than TP
  # (Megatron's folding, gated as expert-tensor-parallel): TP 2 = expert-TP 1 x EP 2 (each TP rank's slice of the rows to
  # the experts), and with 4 GPUs that with DP 2 (expert-DP 2), TP 4 = expert-TP 2 x EP 2 (the rows gathered over
  # expert-TP), and expert-TP 2 over DP 2 without TP.
  if [[ $family == llama ]]; then
    MOE="--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --moe-token-dispatcher-type alltoall"
    for variant in "moe" "moebias --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-2" \
                   "moecap --moe-expert-capacity-factor 1.0"; do
      read -r tag vflags <<<"$variant"
      # shellcheck disable=SC2086
      run "$family-cpu$tag" 1 cpu "$model" $MOE $vflags || continue
      layouts=("gpu1$tag 1" "dp2$tag 2" "dp2do$tag 2 --use-distributed-optimizer"
               "dp2ov$tag 2 --overlap-grad-reduce" "dp2doov$tag 2 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"
               "ep2do$tag 2 --expert-model-parallel-size 2 --use-distributed-optimizer"
               "ep2doov$tag 2 --expert-model-parallel-size 2 --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather"
               "pp2$tag 2 --pipeline-model-parallel-size 2" "tp2sp$tag 2 --tensor-model-parallel-size 2 --sequence-parallel"
               "tp2etp1ep2$tag 2 --tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 1 --expert-model-parallel-size 2"
               "etp2dp2do$tag 2 --expert-tensor-parallel-size 2 --use-distributed-optimizer")
      ((n >= 4)) && layouts+=("ep2dp4do$tag 4 --expert-model-parallel-size 2 --use-distributed-optimizer"
                              "ep4do$tag 4 --expert-model-parallel-size 4 --use-distributed-optimizer"
                              "pp2ep2do$tag 4 --pipeline-model-parallel-size 2 --expert-model-parallel-size 2 --use-distributed-optimizer"
                              "tp2ep2do$tag 4 --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 --use-distributed-optimizer"
                              "tp2etp1ep2dp2do$tag 4 --tensor-model-parallel-size 2 --sequence-parallel --expert-tensor-parallel-size 1 --expert-model-parallel-size 2 --use-distributed-optimizer"
                              "tp4etp2ep2$tag 4 --tensor-model-parallel-size 4 --sequence-parallel --expert-tensor-parallel-size 2 --expert-model-parallel-size 2")
      # (context parallelism: the aux and z statistics over the CP group; capacity factors with it are refused on the GPUs)
      [[ $tag != moecap ]] && layouts+=("cp2$tag 2 --context-parallel-size 2" "cp2a2a$tag 2 --context-parallel-size 2 --cp-comm-type a2a")
      [[ $tag != moecap ]] && ((n >= 4)) && layouts+=("cp2dp2do$tag 4 --context-parallel-size 2 --use-distributed-optimizer")
      for l in "${layouts[@]}"; do
        read -r name np extra <<<"$l"
        # shellcheck disable=SC2086
        run "$family-$name" "$np" cuda "$model" $MOE $vflags $extra || continue
        compare "$family-$name" "$family-cpu$tag" lm_loss 5e-3
        compare "$family-$name" "$family-cpu$tag" grad_norm 3e-2
        compare "$family-$name" "$family-cpu$tag" validation_lm_loss 5e-3
        compare "$family-$name" "$family-cpu$tag" load_balancing_loss 1e-2
        compare "$family-$name" "$family-cpu$tag" z_loss 1e-2
        [[ $tag != moecap ]] && compare "$family-$name" "$family-cpu$tag" expert_tokens_mean 1e-6
        [[ $tag == moecap ]] && compare "$family-$name" "$family-cpu$tag" dropped_fraction 5e-2
      done
      [[ $tag == moecap ]] && continue
      # shellcheck disable=SC2086
      if run "$family-dp2do$tag-save" 2 cuda "$model" $MOE $vflags --use-distributed-optimizer --save "$work/$family-$tag-ckpt" --save-interval 5 \
        --exit-interval 5; then
        # shellcheck disable=SC2086
        run "$family-dp2do$tag-resume" 2 cuda "$model" $MOE $vflags --use-distributed-optimizer --load "$work/$family-$tag-ckpt" &&
          compare_tail "$family-dp2do$tag-resume" "$family-dp2do$tag" lm_loss 5e-4
        # shellcheck disable=SC2086
        run "$family-cpu$tag-resume" 1 cpu "$model" $MOE $vflags --load "$work/$family-$tag-ckpt" &&
          compare_tail "$family-cpu$tag-resume" "$family-cpu$tag" lm_loss 5e-3
      fi
      # Expert parallelism's checkpoints: each EP rank's experts written by its expert-DP rank 0, resumed on EP 2 and by
      # the CPU engine on one rank.
      # shellcheck disable=SC2086
      if run "$family-ep2do$tag-save" 2 cuda "$model" $MOE $vflags --expert-model-parallel-size 2 --use-distributed-optimizer \
        --save "$work/$family-$tag-ep-ckpt" --save-interval 5 --exit-interval 5; then
        # shellcheck disable=SC2086
        run "$family-ep2do$tag-resume" 2 cuda "$model" $MOE $vflags --expert-model-parallel-size 2 --use-distributed-optimizer \
          --load "$work/$family-$tag-ep-ckpt" && compare_tail "$family-ep2do$tag-resume" "$family-ep2do$tag" lm_loss 5e-4
        # shellcheck disable=SC2086
        run "$family-cpu$tag-epresume" 1 cpu "$model" $MOE $vflags --load "$work/$family-$tag-ep-ckpt" &&
          compare_tail "$family-cpu$tag-epresume" "$family-cpu$tag" lm_loss 5e-3
      fi
    done
    # FP8 in MoE layers under expert parallelism (tensorwise and blockwise; refused by name until these pass:
    # fp8-expert-parallel, lifted at the top): each expert's rows padded to 16 where routed, the padded blocks crossing
    # the ranks; against the CPU engine's emulation on one rank, Adam at a small rate as the dense FP8 layouts.
    for recipe in tensorwise blockwise; do
      # shellcheck disable=SC2086
      run "$family-cpu-moef8$recipe" 1 cpu "$model" $MOE --lr 1e-4 --fp8-format hybrid --fp8-recipe $recipe || continue
      layouts=("ep2f8$recipe 2 --expert-model-parallel-size 2 --use-distributed-optimizer")
      ((n >= 4)) && layouts+=("ep4f8$recipe 4 --expert-model-parallel-size 4 --use-distributed-optimizer")
      for l in "${layouts[@]}"; do
        read -r name np extra <<<"$l"
        # shellcheck disable=SC2086
        run "$family-$name" "$np" cuda "$model" $MOE --lr 1e-4 --fp8-format hybrid --fp8-recipe $recipe $extra || continue
        compare "$family-$name" "$family-cpu-moef8$recipe" lm_loss 1e-2
        compare "$family-$name" "$family-cpu-moef8$recipe" grad_norm 5e-2
        compare "$family-$name" "$family-cpu-moef8$recipe" validation_lm_loss 1e-2
        compare "$family-$name" "$family-cpu-moef8$recipe" load_balancing_loss 2e-2
      done
    done
  fi
  # Hidden dropout (0.1): both engines draw the same masks (dropout_key per sample and site), so the layouts
  # follow the CPU engine's dropped-out run as closely as the runs without dropout follow theirs.
  if run "$family-cpudrop" 1 cpu "$model" --hidden-dropout 0.1; then
    for l in "gpu1drop 1" "tp2drop 2 --tensor-model-parallel-size 2" "tp2spdrop 2 --tensor-model-parallel-size 2 --sequence-parallel" \
             "tp2sp4drop 2 --tensor-model-parallel-size 2 --sequence-parallel --micro-batch-size 4" \
             "dp2drop 2 --use-distributed-optimizer --overlap-grad-reduce"; do
      read -r name np extra <<<"$l"
      # shellcheck disable=SC2086
      run "$family-$name" "$np" cuda "$model" --hidden-dropout 0.1 $extra || continue
      expect_split "$family" "$name"
      compare "$family-$name" "$family-cpudrop" lm_loss 5e-3
      compare "$family-$name" "$family-cpudrop" validation_lm_loss 5e-3
    done
    # and the masks matter: the dropped-out run differs from the plain one
    d=$(paste <(field lm_loss "$work/$family-cpudrop") <(field lm_loss "$work/$family-cpu") |
      awk '{r = ($1 - $2) / $2; if (r < 0) r = -r; if (r > m) m = r} END {printf "%.2e", m}')
    if awk -v d="$d" 'BEGIN{exit !(d > 1e-3)}'; then echo "PASS $family-cpudrop: differs from $family-cpu by $d";
    else echo "FAIL $family-cpudrop: hidden dropout changed the loss by only $d"; fails=$((fails + 1)); fi
  fi
  # --add-qkv-bias alone (Qwen's QKV biases; LLaMA's families, which have no other bias): the bias split with the QKV
  # columns, its own gradient kernel, and for MQA the K/V replicas' bias sums over TP (refused by name until these pass).
  if [[ $family != gpt ]] && run "$family-cpuqkvb" 1 cpu "$model" --add-qkv-bias; then
    for l in "gpu1qkvb 1" "tp2qkvb 2 --tensor-model-parallel-size 2" "tp2spqkvb 2 --tensor-model-parallel-size 2 --sequence-parallel"; do
      read -r name np extra <<<"$l"
      # shellcheck disable=SC2086
      run "$family-$name" "$np" cuda "$model" --add-qkv-bias $extra || continue
      compare "$family-$name" "$family-cpuqkvb" lm_loss 5e-3
      compare "$family-$name" "$family-cpuqkvb" grad_norm 3e-2
    done
  fi
  # --qk-layernorm: the per-head norms' shared weights summed over the TP ranks (and, under SP, with the
  # other replicated parameters), against the CPU engine's run with the same flag.
  if run "$family-cpuqk" 1 cpu "$model" --qk-layernorm; then
    for l in "gpu1qk 1" "tp2qk 2 --tensor-model-parallel-size 2" "tp2spqk 2 --tensor-model-parallel-size 2 --sequence-parallel" \
             "dp2qk 2 --use-distributed-optimizer --overlap-grad-reduce"; do
      read -r name np extra <<<"$l"
      # shellcheck disable=SC2086
      run "$family-$name" "$np" cuda "$model" --qk-layernorm $extra || continue
      compare "$family-$name" "$family-cpuqk" lm_loss 5e-3
      compare "$family-$name" "$family-cpuqk" grad_norm 3e-2
      compare "$family-$name" "$family-cpuqk" validation_lm_loss 5e-3
    done
  fi
  # The parameter gather overlapped with the next forward, in buckets of about 30k parameters (one per
  # parameter or so here, where the default 40M would make one), each bucket's gather made 3 ms late on
  # purpose: a forward that does not wait for the buckets it reads sees last step's weights; with the waits
  # it is the same arithmetic as without the overlap. Logged every 5 iterations: a log line drains the
  # device, which would hide a missing wait.
  DO="--use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 30000"
  # shellcheck disable=SC2086
  run "$family-dp2do5" 2 cuda "$model" $DO --log-interval 5 &&
    MEGATRAIN_TEST_GATHER_DELAY_US=3000 run "$family-dp2dog" 2 cuda "$model" $DO --overlap-param-gather --log-interval 5 && {
    compare "$family-dp2dog" "$family-dp2do5" lm_loss 1e-6
    compare "$family-dp2dog" "$family-dp2do5" validation_lm_loss 1e-6; }
  # The same with the gradients reduced in bf16 (each bucket's rounding queued on the communicator's stream,
  # behind the gathers).
  # shellcheck disable=SC2086
  run "$family-dp2do5bf16" 2 cuda "$model" $DO --grad-reduce-in-bf16 --log-interval 5 &&
    MEGATRAIN_TEST_GATHER_DELAY_US=3000 run "$family-dp2dogbf16" 2 cuda "$model" $DO --grad-reduce-in-bf16 --overlap-param-gather --log-interval 5 && {
    compare "$family-dp2dogbf16" "$family-dp2do5bf16" lm_loss 1e-6
    compare "$family-dp2dogbf16" "$family-dp2do5bf16" validation_lm_loss 1e-6; }
  # The distributed optimizer's sharded checkpoint, saved at iteration 5 (--exit-interval) with the gather
  # overlapped (and late) for GPT, after the step for LLaMA; resumed on the GPUs with the overlap (must
  # continue like the uninterrupted run: the saved parameters are the first resumed step's weights) and by
  # the CPU engine on one rank (like the CPU run).
  SAVE_DO=$DO
  [[ $family == gpt ]] && SAVE_DO="$DO --overlap-param-gather"
  DO="$DO --overlap-param-gather"
  # shellcheck disable=SC2086
  if MEGATRAIN_TEST_GATHER_DELAY_US=3000 run "$family-dp2do-save" 2 cuda "$model" $SAVE_DO --save "$work/$family-ckpt" --save-interval 5 --exit-interval 5; then
    # shellcheck disable=SC2086
    run "$family-dp2do-resume" 2 cuda "$model" $DO --load "$work/$family-ckpt" && {
      compare_tail "$family-dp2do-resume" "$family-dp2do" lm_loss 5e-4
      compare "$family-dp2do-resume" "$family-dp2do" validation_lm_loss 5e-4; }
    run "$family-cpu-resume" 1 cpu "$model" --load "$work/$family-ckpt" && compare_tail "$family-cpu-resume" "$family-cpu" lm_loss 5e-3
  fi
done
echo "$fails failure(s)"
[[ $fails -eq 0 ]]
