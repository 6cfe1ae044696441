#!/usr/bin/env bash
# test_cli.sh: megatrain as a user types it: errors, exit codes, --print-config round trip, plan.
# Usage: test_cli.sh path/to/megatrain (run from the repository root).
set -u
B=${1:?usage: test_cli.sh path/to/megatrain}
fails=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

expect() {  # expect NAME WANT_RC PATTERN -- command...
  local name=$1 want=$2 pat=$3; shift 4
  local out rc
  out=$("$@" 2>&1); rc=$?
  if [[ $rc -ne $want ]] || ! grep -qE -- "$pat" <<<"$out"; then
    echo "FAIL $name: rc=$rc (want $want), pattern '$pat' in:"; echo "$out" | head -20; fails=$((fails + 1))
  else
    echo "ok   $name"
  fi
}

expect unknown-flag 2 'unknown flag --num-layrs: did you mean --num-layers\?' -- "$B" --num-layrs 2
expect wrong-type 2 "expected an integer, got 'x'" -- "$B" --num-layers x
# Megatron's older commands: the GPT-2 files without --tokenizer-type mean GPT2BPETokenizer.
expect gpt2-files-imply-bpe 0 'using GPT2BPETokenizer' -- "$B" plan --num-layers 2 --hidden-size 64 --num-attention-heads 4 \
  --seq-length 64 --max-position-embeddings 64 --micro-batch-size 1 --vocab-file vocab.json --merge-file merges.txt --world-size 1 --no-groups
expect plan-70b-64 0 'world size 64 = TP 4 x PP 4 x CP 1 x DP 4' -- "$B" plan --config configs/llama3-70b.yaml --world-size 64
expect plan-70b-mem 0 'total +[0-9.]+ GiB' -- "$B" plan --config configs/llama3-70b.yaml --world-size 64
expect plan-70b-12 2 'world size 12 is not divisible by TP\(4\) x PP\(4\) x CP\(1\) = 16' -- "$B" plan --config configs/llama3-70b.yaml --world-size 12
expect plan-mixtral 0 'expert grid: ETP 2 x EP 4 x expert-DP 4 x PP 1' -- "$B" plan --config configs/mixtral-8x7b.yaml --world-size 32
expect plan-405b 0 'layers per pipeline stage: 7 8 8 8 8 8 8 8 8 8 8 8 8 8 8 7' -- "$B" plan --config configs/llama3-405b.yaml --world-size 2048
expect plan-no-fit 0 'WARNING: this layout does not fit' -- "$B" plan --config configs/llama3-70b.yaml --world-size 16 --tensor-model-parallel-size 1 --pipeline-model-parallel-size 1 --gpu-memory-gb 80
expect plan-groups 0 'rank +3: tp 1 cp 0 dp 1 pp 0' -- "$B" plan --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings 64 --micro-batch-size 1 --vocab-size 100 --tensor-model-parallel-size 2 --world-size 8
expect all-errors 2 'hidden-size is required' -- "$B" plan --num-layers 4 --world-size 1
# A plan assumes the batch settings a command leaves out (each with a note); training still requires them.
expect plan-assumes-batch 0 'the plan assumes --micro-batch-size 1' -- "$B" plan --num-layers 4 --hidden-size 64 --num-attention-heads 4 \
  --seq-length 64 --max-position-embeddings 64 --vocab-size 100 --world-size 2 --no-groups
expect train-needs-batch 2 'micro-batch-size is required' -- "$B" --num-layers 4 --hidden-size 64 --num-attention-heads 4 --seq-length 64 \
  --max-position-embeddings 64 --vocab-size 100 --mock-data --train-iters 1 --lr 1e-3
expect sp-warning 0 'warning: --sequence-parallel has no effect' -- "$B" plan --config configs/gpt2-124m.yaml --sequence-parallel --world-size 1
expect old-spelling 0 'note: --use-flash-attn is the old spelling' -- "$B" --config configs/gpt2-124m.yaml --use-flash-attn --print-config
expect help-groups 0 'Mixed precision:' -- "$B" --help
T="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2 --lr 1e-3 --train-iters 2 --mock-data --vocab-size 100"
# --device cuda insists: without a GPU (or, on a GPU machine, for an fp32 run) it says why and exits 2.
expect device-cuda 2 'device cuda: |computes in bf16 or fp16: add --bf16' -- "$B" $T --device cuda
expect recompute-cpu 2 'implemented on the CUDA engine only' -- "$B" $T --device cpu --recompute-granularity full --recompute-method uniform --recompute-num-layers 1
# Megatron-LM's examples/llama/train_llama3_8b_h100_fp8.sh, its flags as written (but --fp8-param-gather, refused by
# name) at toy size on the CPU engine: zero-centred norms, the decoupled rate, the per-token loss, its switches noted.
M3=(--use-mcore-models --num-layers 2 --hidden-size 64 --ffn-hidden-size 128 --num-attention-heads 4 --group-query-attention
    --num-query-groups 2 --kv-channels 16 --seq-length 64 --max-position-embeddings 64 --position-embedding-type rope --rotary-base 1000000
    --rotary-percent 1.0 --attention-dropout 0.0 --hidden-dropout 0.0 --swiglu --init-method-std 0.0134 --attention-backend fused
    --apply-layernorm-1p --untie-embeddings-and-output-weights --disable-bias-linear --micro-batch-size 1 --global-batch-size 4
    --train-samples 16 --lr-decay-samples 16 --lr-warmup-samples 4 --lr 0.00015 --min-lr 0.00001 --decoupled-lr 5.0e-4
    --decoupled-min-lr 4.5e-5 --lr-decay-style cosine --clip-grad 1.0 --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --bf16
    --grad-reduce-in-bf16 --cross-entropy-loss-fusion --calculate-per-token-loss --manual-gc --empty-unused-memory-level 1
    --exit-duration-in-mins 235 --fp8-format hybrid --fp8-amax-history-len 1024 --fp8-amax-compute-algo max --tensor-model-parallel-size 1
    --context-parallel-size 1 --sequence-parallel --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --mock-data
    --tokenizer-type NullTokenizer --vocab-size 256 --data-cache-path "$tmp/cache" --tiktoken-pattern v2 --split 99,1,0
    --no-create-attention-mask-in-dataloader --no-mmap-bin-files --num-workers 1 --log-interval 1 --eval-iters 1 --eval-interval 2
    --save-interval 1000 --log-throughput --profile-step-start 4 --profile-step-end 6 --ckpt-format torch_dist
    --distributed-timeout-minutes 60 --save "$tmp/llama3-ckpt" --load "$tmp/llama3-ckpt" --tensorboard-dir "$tmp/llama3-tb" --device cpu)
expect megatron-llama3-example 0 'decoupled learning rate: 4.500000E-05' -- "$B" "${M3[@]}"
expect megatron-fp8-param-gather 2 'fp8-param-gather' -- "$B" "${M3[@]}" --fp8-param-gather

# The README's first command, shortened: trains and the validation loss falls below the unigram entropy (3.31).
out=$("$B" --config configs/quickstart.yaml --train-iters 60 --eval-interval 60 --log-interval 20 --log-dir "$tmp/logs" 2>&1); rc=$?
vl=$(grep -oE 'lm loss value: [0-9.E+-]+' <<<"$out" | tail -1 | awk '{print $4}')
if [[ $rc -eq 0 ]] && awk -v v="$vl" 'BEGIN{exit !(v < 2.9)}' && grep -q '"lm_loss"' "$tmp/logs/metrics.jsonl" \
   && grep -q 'iteration       60/      60 | consumed samples:          960 |' <<<"$out"; then echo "ok   quickstart trains (validation loss $vl)"; else
  echo "FAIL quickstart: rc=$rc loss=$vl"; echo "$out" | tail -5; fails=$((fails + 1)); fi
# Megatron's flex dispatcher runs as the all-to-all (a note), under Megatron's checks; what it would compute otherwise is refused.
expect flex-one-rank 2 'flex with the deepep backend needs expert-TP x EP > 1' -- "$B" --config configs/quickstart.yaml --num-experts 4 \
  --moe-token-dispatcher-type flex
expect flex-hybridep 0 "flex runs as megatrain's all-to-all dispatch" -- "$B" --config configs/quickstart.yaml --num-experts 4 \
  --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --train-iters 2 --log-interval 1 --eval-iters 0 --device cpu
expect not-implemented 2 "per-rank token budget \(HybridEP drops past it\) is not implemented" -- "$B" --config configs/quickstart.yaml \
  --num-experts 4 --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-expert-rank-capacity-factor 1.0
# Megatron's list form: several auxiliary losses, a coefficient each, each logged under its own name.
expect balancing-type-list 0 'load_balancing_loss: [0-9.E+-]+ \| seq_load_balancing_loss: [0-9.E+-]+ \| loss scale' -- "$B" \
  --config configs/quickstart.yaml --num-experts 4 --moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 1e-2 1e-3 \
  --train-iters 2 --log-interval 1 --eval-iters 0 --device cpu
expect balancing-type-list-lengths 2 'gives 2 types and --moe-aux-loss-coeff 1 coefficients' -- "$B" --config configs/quickstart.yaml \
  --num-experts 4 --moe-router-load-balancing-type aux_loss seq_aux_loss --moe-aux-loss-coeff 1e-2 --device cpu
expect sqrtsoftplus-expert-bias 0 'tokens per expert' -- "$B" --config configs/quickstart.yaml --num-experts 4 --moe-router-score-function sqrtsoftplus \
  --moe-router-enable-expert-bias --train-iters 2 --log-interval 1 --eval-iters 0 --device cpu
expect quantile-balancing 0 'tokens per expert' -- "$B" --config configs/quickstart.yaml --num-experts 4 --moe-router-load-balancing-type \
  quantile_balancing --moe-router-quantile-balancing-ema 0.5 --train-iters 2 --log-interval 1 --eval-iters 0 --device cpu
# A list flag given twice: the last occurrence, as argparse's (an empty value stays a value).
expect list-flag-empty-value 0 'data_path: \["a", "b"\]' -- "$B" --config configs/quickstart.yaml --data-path a "" b --print-config
expect list-flag-twice 0 'moe_aux_loss_coeff: \[0.001\]' -- "$B" --config configs/quickstart.yaml --num-experts 4 \
  --moe-aux-loss-coeff 1e-2 5e-2 --moe-aux-loss-coeff 1e-3 --print-config
expect sinkhorn-routing 0 'tokens per expert' -- "$B" --config configs/quickstart.yaml --num-experts 4 --moe-router-load-balancing-type sinkhorn \
  --train-iters 2 --log-interval 1 --eval-iters 0 --device cpu
expect bad-data-file 2 "cannot read --text-data-path '/nonexistent'" -- "$B" --config configs/quickstart.yaml --text-data-path /nonexistent
# Megatron's tokenizer settings for how text becomes ids: accepted with a note (training reads ids); its T5 and metadata
# flags refused by name; Llama 4's layers without RoPE and RoPE's position interpolation train.
expect tokenizer-settings-inert 0 'tokenizer-hf-no-use-fast has no effect' -- "$B" --config configs/quickstart.yaml --tokenizer-hf-no-use-fast \
  --trust-remote-code --tokenizer-hf-no-include-special-tokens --train-iters 1 --eval-iters 0 --device cpu
expect tokenizer-metadata 2 'tokenizer-metadata: megatrain picks the tokenizer' -- "$B" --config configs/quickstart.yaml --tokenizer-metadata m.json
expect vocab-extra-ids 2 "vocab-extra-ids: T5's sentinel tokens" -- "$B" --config configs/quickstart.yaml --vocab-extra-ids 100
expect no-rope-interpolation 0 'iteration +2/' -- "$B" --config configs/quickstart.yaml --no-rope-freq [1,0] --rotary-seq-len-interpolation-factor 4 \
  --train-iters 2 --log-interval 1 --eval-iters 0 --device cpu
expect no-rope-bad 2 'no-rope-freq 3 must divide --num-layers 2' -- "$B" --config configs/quickstart.yaml --no-rope-freq 3
# The embedding's rows as given: checked against the vocabulary and TP after the tokenizer's vocabulary is known.
expect padded-vocab-below 2 'padded-vocab-size 50 is below the vocabulary.s 100 ids' -- "$B" plan --num-layers 2 --hidden-size 64 \
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --vocab-size 100 --padded-vocab-size 50 --world-size 1
expect no-pad-odd-vocab 2 'no-pad-vocab-size: the embedding.s 101 rows do not split over TP 2' -- "$B" plan --num-layers 2 --hidden-size 64 \
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --vocab-size 101 --no-pad-vocab-size --tensor-model-parallel-size 2 --world-size 2
# Megatron's deprecated flags stop with its own directions; its other names of --num-layers / --seq-length map.
expect deprecated-batch-size 2 'batch-size: no longer valid \(as in Megatron\): use --micro-batch-size' -- "$B" --config configs/quickstart.yaml --batch-size 4
expect encoder-names 0 'encoder-seq-length is --seq-length' -- "$B" plan --encoder-num-layers 4 --hidden-size 64 --num-attention-heads 4 \
  --encoder-seq-length 32 --max-position-embeddings 32 --vocab-size 100 --world-size 1
# Megatron's --moe-layer-recompute: selective recompute of the MoE blocks (the plan names it), refused with full.
expect moe-layer-recompute 0 'recompute selective of core_attn moe, \+ [0-9.]+ GiB of MLP buffers shared' -- "$B" plan --num-layers 4 --hidden-size 64 \
  --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --vocab-size 100 --num-experts 4 --moe-router-topk 2 --moe-layer-recompute --world-size 1
expect moe-layer-recompute-full 2 'moe-layer-recompute with --recompute-granularity full' -- "$B" plan --config configs/mixtral-8x7b.yaml --world-size 32 \
  --moe-layer-recompute
# Megatron's --step-batch-size-schedule: 4 samples a step, then 8 from 1K tokens (31 samples at 32 a sample) on; and its
# --log-num-zeros-in-grad after the grad norm.
expect step-batch-schedule 0 'iteration +12/ +12 \| consumed samples: +64 .*global batch size: +8 .*grad norm: [0-9.]+ \| num zeros: [0-9]+\.0 \|' -- \
  "$B" --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --vocab-size 100 --mock-data \
  --micro-batch-size 2 --lr 1e-3 --eval-iters 0 --log-interval 4 --device cpu --train-samples 60 --step-batch-size-schedule "0:4 1K:8" \
  --untie-embeddings-and-output-weights --log-num-zeros-in-grad
# --recompute-modules moe_act: the experts' activations of one layer kept, the plan says so.
expect moe-act-recompute 0 'recompute selective of moe_act, \+ [0-9.]+ GiB of the experts. activations the layers share' -- "$B" plan --num-layers 4 \
  --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --vocab-size 100 --num-experts 4 --moe-router-topk 2 \
  --moe-grouped-gemm --recompute-granularity selective --recompute-modules moe_act --world-size 1

# Multi-rank training under mpirun: one log line per iteration (rank 0), TP x DP layout announced.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(mpirun --oversubscribe --bind-to none -np 4 -x OPENBLAS_NUM_THREADS=1 "$B" --config configs/quickstart.yaml --train-iters 4 \
      --log-interval 1 --eval-iters 0 --tensor-model-parallel-size 2 --sequence-parallel --use-distributed-optimizer 2>&1); rc=$?
if [[ $rc -eq 0 ]] && [[ $(grep -c "lm loss" <<<"$out") -eq 4 ]] && grep -q "4 ranks (Open MPI): TP 2 x DP 2" <<<"$out"; then
  echo "ok   mpirun TP2 x DP2 + SP + distributed optimizer"; else echo "FAIL mpirun: rc=$rc"; echo "$out" | tail -5; fails=$((fails + 1)); fi
expect mpirun-bad-world 2 'world size 3 is not divisible by TP\(2\)' -- mpirun --oversubscribe -np 3 "$B" --config configs/quickstart.yaml --tensor-model-parallel-size 2

# --print-config loads back to the same config, for every recipe.
for r in configs/*.yaml configs/bench/*.yaml; do
  "$B" --config "$r" --print-config >"$tmp/a.yaml" 2>/dev/null || { echo "FAIL print $r"; fails=$((fails + 1)); continue; }
  "$B" --config "$tmp/a.yaml" --print-config >"$tmp/b.yaml" 2>/dev/null
  if cmp -s "$tmp/a.yaml" "$tmp/b.yaml"; then echo "ok   print-config round trip $r"; else
    echo "FAIL print-config round trip $r"; diff "$tmp/a.yaml" "$tmp/b.yaml" | head; fails=$((fails + 1)); fi
done

echo "$fails failure(s)"
[[ $fails -eq 0 ]]
