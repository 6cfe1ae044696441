#!/usr/bin/env bash
# test_gpu.sh: the GPU tests on a machine with GPUs: the CUDA ops (fp32, and the engine's 16-bit kernels in
# bf16 and fp16) against the CPU reference, cuDNN attention and whole training runs against the CPU engine
# (loss curves, recompute, checkpoint resume), NCCL collectives under mpirun and torchrun-style launches, and
# with 2 or more GPUs the TP / TP+SP / DP layouts against the CPU engine (CTest label gpu; without a GPU
# they report SKIP), LLaMA's layouts again in fp16; then a short GPU training run of each model family
# under compute-sanitizer memcheck (bf16, LLaMA in fp16, MoE (in FP8 too), FP8 tensorwise, delayed and blockwise, optimizer offload, documents and dropout too; with 2 GPUs also TP 2 + SP), when
# the tool is installed.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${BUILD_DIR:-build}
export NCCL_NVLS_ENABLE=0
[[ -d "$BUILD_DIR" ]] || cmake -S . -B "$BUILD_DIR" -G Ninja
cmake --build "$BUILD_DIR" -j "$(nproc)"
ctest --test-dir "$BUILD_DIR" -L gpu --output-on-failure "$@"
# The weight gradients overwritten by their iteration's first GEMM (MEGATRAIN_WGRAD_OVERWRITE, on by default for one rank): trainings
# against the CPU engine with the overwritten ranges NaN-filled at each step's start (the variable's check mode).
if nvidia-smi -L >/dev/null 2>&1; then
  MT_GPU_TEST_ONLY=wgrad-overwrite "$BUILD_DIR/tests/test_cuda_engine" >/tmp/megatrain-wgrad-overwrite.log 2>&1 || {
    grep FAIL /tmp/megatrain-wgrad-overwrite.log; echo "FAIL: weight gradient overwrite (log: /tmp/megatrain-wgrad-overwrite.log)"; exit 1; }
  echo "weight gradient overwrite: $(grep -c '^PASS' /tmp/megatrain-wgrad-overwrite.log) checks passed"
fi
# The multi-GPU layouts once more in fp16 (a static loss scale, so neither engine skips): TP collectives in
# fp16, sequence parallelism, data parallelism and the distributed optimizer (LLaMA family).
if [[ $(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true) -ge 2 ]]; then
  PARITY_PRECISION="--fp16 --loss-scale 1024" PARITY_FAMILIES=llama tests/gpu/run_parallel_parity.sh "$BUILD_DIR/bin/megatrain" >/tmp/megatrain-parity-fp16.log 2>&1 || {
    grep FAIL /tmp/megatrain-parity-fp16.log; echo "FAIL: fp16 multi-GPU parity (log: /tmp/megatrain-parity-fp16.log)"; exit 1; }
  echo "fp16 multi-GPU parity: $(grep -c '^PASS' /tmp/megatrain-parity-fp16.log) checks passed"
fi
# --deterministic-mode across processes (each chooses its own GEMM plans and cuDNN engines): two runs of 1,024-token
# sequences, MoE layers and both dropouts, with the same losses and gradient norms to the last bit in metrics.jsonl.
if nvidia-smi -L >/dev/null 2>&1; then
  det=$(mktemp -d)
  for run in a b; do
    "$BUILD_DIR/bin/megatrain" --num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 1024 --max-position-embeddings 1024 \
      --micro-batch-size 2 --global-batch-size 8 --train-iters 6 --lr 1e-3 --mock-data --vocab-size 512 --bf16 --device cuda \
      --normalization RMSNorm --swiglu --disable-bias-linear --position-embedding-type rope --untie-embeddings-and-output-weights \
      --num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --attention-dropout 0.1 --hidden-dropout 0.1 --log-interval 1 \
      --deterministic-mode --log-dir "$det/$run" >"$det/$run.log" 2>&1 || { tail -5 "$det/$run.log"; echo "FAIL: a --deterministic-mode run"; exit 1; }
  done
  if ! cmp -s <(grep -o '"lm_loss":[^,]*\|"grad_norm":[^,]*' "$det/a/metrics.jsonl") <(grep -o '"lm_loss":[^,]*\|"grad_norm":[^,]*' "$det/b/metrics.jsonl") ||
     [[ $(grep -c '"lm_loss"' "$det/a/metrics.jsonl") -lt 6 ]]; then
    echo "FAIL: two --deterministic-mode runs differ"; exit 1
  fi
  echo "deterministic mode: two processes' losses and gradient norms identical"
  rm -rf "$det"
fi
# A model that cannot fit: one clear line naming the allocation and the remedies, and a non-zero exit.
oom=$(timeout 300 "$BUILD_DIR/bin/megatrain" --num-layers 2 --hidden-size 2048 --num-attention-heads 16 --seq-length 4096 \
  --max-position-embeddings 4096 --micro-batch-size 1024 --global-batch-size 1024 --train-iters 1 --mock-data --vocab-size 256 --bf16 \
  --hidden-dropout 0 --attention-dropout 0 --lr 1e-4 --device cuda 2>&1) && { echo "FAIL: an impossible model trained"; exit 1; }
grep -q "out of GPU memory allocating .* MiB for .*megatrain plan" <<<"$oom" || { echo "$oom" | tail -5; echo "FAIL: no clear out-of-memory message"; exit 1; }
echo "out-of-memory message: ok"
if command -v compute-sanitizer >/dev/null && command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1; then
  S="--num-layers 2 --hidden-size 128 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 4
     --global-batch-size 8 --train-iters 3 --log-interval 1 --mock-data --vocab-size 256 --hidden-dropout 0
     --attention-dropout 0 --device cuda --lr 1e-3"
  L0="--normalization RMSNorm --swiglu --ffn-hidden-size 256 --position-embedding-type rope --group-query-attention
      --num-query-groups 2 --untie-embeddings-and-output-weights --disable-bias-linear"
  L="$L0 --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
  # (and the MoE layer, its routing and expert GEMMs, recomputed)
  M="--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --moe-shared-expert-intermediate-size 192
     --moe-router-num-groups 2 --moe-router-group-topk 1"
  # (and FP8's casts and GEMMs, tensorwise, GPT's biases and GELU apart from the GEMM)
  F8="--fp8-format hybrid --fp8-recipe tensorwise"
  # (and delayed scaling: the scaled casts gathering their amaxes, the update kernel, the recompute's snapshots)
  F8D="--fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 4 --fp8-amax-compute-algo max"
  # (and the optimizer offloaded by half: pinned staging, the copy streams, the host update)
  OFF="--optimizer-cpu-offload --optimizer-offload-fraction 0.5"
  # (and blockwise FP8: the tile quantisation, the block-scaled GEMMs)
  F8B="--fp8-format hybrid --fp8-recipe blockwise"
  # (and the document masks of --reset-attention-mask: the bias kernel, cuDNN's attention with it)
  DOC="--reset-attention-mask --reset-position-ids"
  # (and dropout: attention dropout's generator state and masks inside cuDNN's graphs, hidden dropout's fused masks)
  DROP="--attention-dropout 0.1 --hidden-dropout 0.1"
  # (and squared ReLU, interleaved RoPE, seq_aux_loss and global_aux_loss, the expert bias, capacity factors padded to capacity, and Llama 4's
  # routing weight on the experts' inputs, PROBS. A feature written but refused until its GPU tests pass joins these runs
  # through MEGATRAIN_CUDA_UNVERIFIED=<name>, exported here while it is refused.)
  PROBS="--num-experts 4 --moe-router-topk 1 --moe-router-score-function sigmoid --moe-apply-probs-on-input --moe-aux-loss-coeff 1e-2
         --moe-expert-capacity-factor 1.0 --moe-token-dispatcher-type alltoall"
  CAP="--num-experts 4 --moe-router-topk 2 --moe-expert-capacity-factor 0.75 --moe-token-dispatcher-type alltoall --moe-aux-loss-coeff 1e-2
       --moe-pad-expert-input-to-capacity"
  BIAS="--num-experts 4 --moe-router-topk 2 --moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-2"
  SQ="--squared-relu --recompute-granularity full --recompute-method uniform --recompute-num-layers 1"
  # (and MoE with GPT's biases, the router's and the experts', and squared ReLU experts; and Qwen's QKV biases alone, recomputed; and MoE in fp16;
  # and FP8 in MoE layers, tensorwise, blockwise and delayed: the experts' casts, padding rows and FP8 GEMMs, their scaling slots, a shared expert, recomputed)
  MOEB="--num-experts 8 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --squared-relu"
  SEQ="--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --moe-router-load-balancing-type seq_aux_loss"
  GLOBAL="--num-experts 4 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --moe-router-load-balancing-type global_aux_loss"
  for extra in "--bf16" "--bf16 $L" "--fp16 --initial-loss-scale 1024 $L" "--bf16 $L $M" "--bf16 $L $F8" "--bf16 $F8" "--bf16 $L $F8D" "--bf16 $L $OFF" \
               "--bf16 $L $F8B" "--bf16 $L $DOC" "--bf16 $L $DROP" "--bf16 $SQ $F8" "--bf16 $L $SEQ --rotary-interleaved" "--bf16 $L $GLOBAL" \
               "--bf16 $L $BIAS" "--bf16 $L $CAP" "--bf16 $MOEB" "--bf16 $L --add-qkv-bias" "--fp16 --initial-loss-scale 1024 $L $M" \
               "--bf16 $L $M $F8" "--bf16 $L $M $F8B" "--bf16 $L $M $F8D" "--bf16 $L $PROBS"; do
    # shellcheck disable=SC2086
    out=$(compute-sanitizer --tool memcheck --error-exitcode 1 "$BUILD_DIR/bin/megatrain" $S $extra 2>&1) || {
      echo "$out" | tail -20; echo "FAIL: compute-sanitizer memcheck"; exit 1; }
    grep "ERROR SUMMARY" <<<"$out"
  done
  # The split TP layers under SP on 2 GPUs (each half's all-to-all, norm and gather on the TP stream). NCCL
  # probes its kernels with API calls that fail by design: memory errors are reported, API errors not.
  if [[ $(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true) -ge 2 ]]; then
    # shellcheck disable=SC2086
    out=$(OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 mpirun -np 2 --bind-to none -x NCCL_NVLS_ENABLE compute-sanitizer --tool memcheck \
      --report-api-errors no --error-exitcode 1 "$BUILD_DIR/bin/megatrain" $S --bf16 $L0 --tensor-model-parallel-size 2 --sequence-parallel 2>&1) || {
      echo "$out" | tail -20; echo "FAIL: compute-sanitizer memcheck (TP 2 + SP, split layers)"; exit 1; }
    grep -q "layers split in two halves" <<<"$out" || { echo "FAIL: the memcheck's TP 2 + SP layers did not split"; exit 1; }
    grep "ERROR SUMMARY" <<<"$out"
  fi
fi
