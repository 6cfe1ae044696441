#!/usr/bin/env bash
# test_hf_export.sh: megatrain checkpoint export and import against HuggingFace's modeling code. Tiny GPT-2, LLaMA (GQA),
# Qwen3 (QK norms), Mixtral-, Qwen3-MoE- and GLM-4.5-style models train 3 iterations under TP 2 (Mixtral: EP 2; LLaMA also PP 2 with interleaved
# RoPE, and CP 2 x DP 2 with the distributed optimizer) and are exported; tests/interop/hf_reference.py (HF's GPT2LMHeadModel / LlamaForCausalLM /
# MixtralForCausalLM in PyTorch, by HF's tensor names) computes the loss on a batch that megatrain's one-rank
# model computes too: equal within 1e-5 (fp32 export; bf16 within bf16's rounding). Import of the export
# and export again give the same safetensors bytes; the imported checkpoint fine-tunes with the losses of the
# original (same layout). Also: sharding with its index, bad arguments, a model the families cannot express.
# DeepSeek-V3 (multi-latent attention) against HF's DeepseekV3ForCausalLM's modeling too.
# usage: test_hf_export.sh MEGATRAIN HF_LOSS
set -u
BIN=$1
HF_LOSS=$2
HERE=$(cd "$(dirname "$0")" && pwd)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
MPI=(mpirun --oversubscribe --bind-to none -x OPENBLAS_NUM_THREADS=1)
PY=""
for p in python3 /usr/bin/python3; do
  if "$p" -c "import torch" 2>/dev/null; then PY=$p; break; fi
done
if [[ -z "$PY" ]]; then
  echo "FAIL: python3-torch is missing (scripts/setup.sh installs it: apt-get install python3-torch)"
  exit 1
fi
W=$(mktemp -d)
trap 'rm -rf "$W"' EXIT
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
COMMON="--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 32 --max-position-embeddings 32 --micro-batch-size 2
        --global-batch-size 4 --train-iters 3 --lr 3e-3 --lr-warmup-iters 0 --mock-data --vocab-size 256 --save-interval 3 --eval-iters 0
        --device cpu --log-interval 1 --init-method-std 0.3"
GPT="$COMMON"
LLAMA_TIED="$COMMON --normalization RMSNorm --swiglu --ffn-hidden-size 96 --position-embedding-type rope --group-query-attention
            --num-query-groups 2 --disable-bias-linear --rotary-base 10000"
LLAMA="$LLAMA_TIED --untie-embeddings-and-output-weights"
MIXTRAL="$LLAMA --num-experts 4 --moe-ffn-hidden-size 48 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2"
"$PY" - "$W/tokens.txt" <<'PY'
import random, sys
random.seed(5)
with open(sys.argv[1], "w") as f:
    for _ in range(3):
        f.write(" ".join(str(random.randrange(200)) for _ in range(25)) + "\n")
PY

# name, ranks, flags
check() {
  local name=$1 np=$2
  shift 2
  local ck="$W/$name-ckpt" hf="$W/$name-hf"
  # shellcheck disable=SC2086,SC2068
  if ! "${MPI[@]}" -np "$np" "$BIN" $@ --save "$ck" >"$W/$name-train.log" 2>&1; then
    tail -5 "$W/$name-train.log"; fail "$name: training"; return
  fi
  if ! "$BIN" checkpoint export "$ck" --hf "$hf" --dtype fp32 ${EXPORT_FLAGS:-} >"$W/$name-export.log" 2>&1; then
    cat "$W/$name-export.log"; fail "$name: export"; return
  fi
  local mine theirs
  mine=$("$HF_LOSS" "$ck" "$W/tokens.txt") || { fail "$name: hf_loss"; return; }
  theirs=$("$PY" "$HERE/hf_reference.py" "$hf" "$W/tokens.txt") || { fail "$name: hf_reference.py"; return; }
  if "$PY" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)" "$mine" "$theirs"; then
    echo "PASS $name: megatrain $mine, HF $("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['architectures'][0])" "$hf/config.json") $theirs"
  else
    fail "$name: megatrain's loss $mine, HuggingFace's $theirs"
  fi
  # Import, export again: the same bytes.
  if ! "$BIN" checkpoint import --hf "$hf" --save "$ck-imported" >"$W/$name-import.log" 2>&1; then
    cat "$W/$name-import.log"; fail "$name: import"; return
  fi
  "$BIN" checkpoint export "$ck-imported" --hf "$hf-again" --dtype fp32 ${EXPORT_FLAGS:-} >/dev/null 2>&1 || { fail "$name: export of the import"; return; }
  local f same=1
  for f in "$hf"/*.safetensors; do cmp -s "$f" "$hf-again/$(basename "$f")" || same=0; done
  if [[ $same == 1 ]]; then echo "PASS $name: import then export gives the same safetensors bytes"; else fail "$name: import then export changed the weights"; fi
  # bf16: the same weights rounded; the loss within bf16's reach of the fp32 one.
  "$BIN" checkpoint export "$ck" --hf "$hf-bf16" >/dev/null 2>&1 || { fail "$name: bf16 export"; return; }
  local b16
  b16=$("$PY" "$HERE/hf_reference.py" "$hf-bf16" "$W/tokens.txt") || { fail "$name: bf16 hf_reference.py"; return; }
  "$PY" -c "import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-2 * abs(b) and a != b else 1)" "$b16" "$theirs" ||
    fail "$name: bf16 export's loss $b16 against fp32's $theirs"
}

check gpt2_tp2 2 $GPT --tensor-model-parallel-size 2
# GELU's exact erf form (Megatron without the bias-GELU fusion): HF's activation_function "gelu", PyTorch's F.gelu.
check gpt2_gelu_erf 1 $GPT --no-bias-gelu-fusion
check llama_tp2_sp 2 $LLAMA --tensor-model-parallel-size 2 --sequence-parallel
check llama_pp2_rotary_interleaved 2 $LLAMA --pipeline-model-parallel-size 2 --rotary-interleaved
# Context parallelism with the distributed optimizer (each DP x CP rank holds a shard of the optimizer state).
check llama_cp2_dp2_distopt 4 $LLAMA --context-parallel-size 2 --use-distributed-optimizer
# Qwen's QKV biases alone: HF's attention_bias with o_proj's bias zeros (and back to --add-qkv-bias on import).
check llama_qkv_bias_tp2 2 $LLAMA --add-qkv-bias --tensor-model-parallel-size 2
# The same model as Qwen2 writes it (Qwen2ForCausalLM: no attention_bias key, no o_proj bias tensors, a sliding window
# that use_sliding_window leaves off): imported, it exports the same bytes as the LLaMA form.
"$PY" - "$W/llama_qkv_bias_tp2-hf" "$W/qwen2-hf" <<'PYQ'
import json, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
c = json.load(open(os.path.join(src, "config.json")))
c["architectures"], c["model_type"] = ["Qwen2ForCausalLM"], "qwen2"
c.pop("attention_bias", None); c.pop("mlp_bias", None)
c.update(use_sliding_window=False, sliding_window=8, max_window_layers=1)
json.dump(c, open(os.path.join(dst, "config.json"), "w"))
data = open(os.path.join(src, "model.safetensors"), "rb").read()
(n,) = struct.unpack("<Q", data[:8]); header = json.loads(data[8:8 + n]); body = data[8 + n:]
out, blobs, at = {}, [], 0
for name, e in header.items():
    if name == "__metadata__" or name.endswith("o_proj.bias"):
        continue
    b, end = e["data_offsets"]
    out[name] = dict(e, data_offsets=[at, at + end - b]); blobs.append(body[b:end]); at += end - b
h = json.dumps(out).encode(); h += b" " * (-len(h) % 8)
open(os.path.join(dst, "model.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PYQ
if "$BIN" checkpoint import --hf "$W/qwen2-hf" --save "$W/qwen2-ckpt" >"$W/qwen2-import.log" 2>&1 &&
   grep -q -- "--add-qkv-bias" "$W/qwen2-import.log" &&
   "$BIN" checkpoint export "$W/qwen2-ckpt" --hf "$W/qwen2-again" --dtype fp32 >/dev/null 2>&1 &&
   cmp -s "$W/llama_qkv_bias_tp2-hf/model.safetensors" "$W/qwen2-again/model.safetensors"; then
  echo "PASS qwen2: Qwen2ForCausalLM's form imports as --add-qkv-bias, the same weights"
else
  cat "$W/qwen2-import.log"; fail "qwen2: the Qwen2 form's import"
fi
# Its sliding window on (use_sliding_window) covers the layers from max_window_layers on: none of the 2 at 2 (no window),
# the second at 1 (HF's sliding_window 8: keys i - 7 .. i, megatrain's --window-size 7,0 in the second layer).
for mwl in 2 1; do
  cp -r "$W/qwen2-hf" "$W/qwen2-window$mwl"
  "$PY" -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c.update(use_sliding_window=True, max_window_layers=int(sys.argv[2])); json.dump(c, open(p, 'w'))" \
    "$W/qwen2-window$mwl/config.json" "$mwl"
  out=$("$BIN" checkpoint import --hf "$W/qwen2-window$mwl" --save "$W/qwen2-window$mwl-ckpt" 2>&1); rc=$?
  ok=0
  if [[ $mwl == 2 ]]; then [[ $rc == 0 ]] && ! grep -q -- "--window-size" <<<"$out" && ok=1
  elif [[ $rc == 0 ]] && grep -q -- "--window-size 7,0 --window-attn-skip-freq \[0,1\]" <<<"$out"; then ok=1; fi
  if [[ $ok == 1 ]]; then
    echo "PASS qwen2 with use_sliding_window and max_window_layers $mwl: imported$([[ $mwl == 1 ]] && echo ' with --window-size 7,0 in layer 2')"
  else
    fail "qwen2 with use_sliding_window and max_window_layers $mwl: rc $rc, $out"
  fi
done
# Sliding-window attention exported: a LLaMA-shaped model windowed in every layer as MistralForCausalLM (sliding_window
# 6 for --window-size 5,0), a Qwen3-shaped one in one layer of two by layer_types; HF's masks give megatrain's loss.
check mistral_window_tp2 2 $LLAMA --window-size 5,0 --tensor-model-parallel-size 2
check qwen3_window_layer_types 1 $LLAMA --qk-layernorm --window-size 3,0 --window-attn-skip-freq [0,1]
check qwen3_moe_window 1 $MIXTRAL --qk-layernorm --window-size 4,0
# (the imports give the windows back: the re-exports' equal bytes above would not see a window dropped)
for pair in "mistral_window_tp2:--window-size 5,0" "qwen3_window_layer_types:--window-size 3,0 --window-attn-skip-freq \[0,1\]" \
            "qwen3_moe_window:--window-size 4,0"; do
  if grep -q -- "${pair#*:}" "$W/${pair%%:*}-import.log" && grep -q '"sliding_window"' "$W/${pair%%:*}-hf/config.json"; then
    echo "PASS ${pair%%:*}: imported with ${pair#*:}"
  else
    fail "${pair%%:*}: the import's flags lack ${pair#*:}"
  fi
done
# YaRN (--position-embedding-type yarn): HF's yarn rope type, with the correction range rounded and Megatron's default
# attention factor; with DeepSeek's mscale / mscale_all_dim ratio; with an attention factor of its own (--mscale alone).
check llama_yarn 1 $LLAMA --position-embedding-type yarn --rotary-scaling-factor 8 --yarn-original-max-position-embeddings 16
check llama_yarn_mscale 1 $LLAMA --position-embedding-type yarn --rotary-scaling-factor 4 --yarn-original-max-position-embeddings 8 --mscale 0.8 \
  --mscale-all-dim 0.5 --no-yarn-correction-range-round-to-int
check llama_yarn_attention_factor 1 $LLAMA --position-embedding-type yarn --rotary-scaling-factor 4 --yarn-original-max-position-embeddings 8 --mscale 2
# GPT-OSS's layers (GptOssForCausalLM): learned attention sinks, quick-GELU experts with the offset 1 and a clamp the model
# reaches, biases everywhere (the router's and experts' too), windows in the even layers, YaRN unrounded; TP 2 x EP 2.
GPT_OSS="$COMMON --normalization RMSNorm --ffn-hidden-size 96 --group-query-attention --num-query-groups 2 --untie-embeddings-and-output-weights
         --position-embedding-type yarn --rotary-base 150000 --rotary-scaling-factor 4 --yarn-original-max-position-embeddings 8
         --no-yarn-correction-range-round-to-int --quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 0.5 --softmax-type learnable
         --num-experts 4 --moe-ffn-hidden-size 64 --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --window-size 5,0 --window-attn-skip-freq 2"
check gpt_oss_tp2_ep2 4 $GPT_OSS --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 --expert-tensor-parallel-size 1 \
  --moe-token-dispatcher-type alltoall
if grep -q -- "--softmax-type learnable" "$W/gpt_oss_tp2_ep2-import.log" && grep -q -- "--window-size 5,0 --window-attn-skip-freq \[1,0\]" "$W/gpt_oss_tp2_ep2-import.log" &&
   grep -q -- "--position-embedding-type yarn" "$W/gpt_oss_tp2_ep2-import.log"; then
  echo "PASS gpt_oss_tp2_ep2: the import gives back the sinks, the windows and YaRN"
else
  fail "gpt_oss_tp2_ep2: the import's flags: $(cat "$W/gpt_oss_tp2_ep2-import.log")"
fi
# The released GPT-OSS checkpoints' form: the experts' weights in MXFP4 (quantization_config's quant_method "mxfp4"; blocks of
# 32 E2M1 codes along the input with a power-of-two scale). The export quantized here; its import against HF's
# dequantization (hf_reference.py, transformers' convert_moe_packed_tensors) on the same batch.
if "$PY" - "$W/gpt_oss_tp2_ep2-hf" "$W/gpt_oss_mxfp4-hf" <<'PYM'
import json, os, struct, sys
import torch
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
c = json.load(open(os.path.join(src, "config.json")))
c["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
json.dump(c, open(os.path.join(dst, "config.json"), "w"))
data = open(os.path.join(src, "model.safetensors"), "rb").read()
(n,) = struct.unpack("<Q", data[:8]); header = json.loads(data[8:8 + n]); body = data[8 + n:]
lut = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
def quantize(w):  # [E, in, out] -> blocks [E, out, in / 32, 16], scales [E, out, in / 32]
    g = w.transpose(1, 2).reshape(w.shape[0], w.shape[2], w.shape[1] // 32, 32)
    amax = g.abs().amax(-1, keepdim=True)
    e = torch.where(amax > 0, torch.ceil(torch.log2(amax / 6)), torch.zeros_like(amax)).clamp(-127, 127)
    q = g / torch.pow(2.0, e)
    code = (q.abs().unsqueeze(-1) - lut).abs().argmin(-1) + 8 * (q < 0)
    code = code.to(torch.uint8)
    return (code[..., 0::2] | (code[..., 1::2] << 4)).contiguous(), (e.squeeze(-1) + 127).to(torch.uint8)
out, blobs, at = {}, [], 0
def put(name, dtype, shape, raw):
    global at
    out[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(raw)]}; blobs.append(raw); at += len(raw)
quantized = 0
for name, e in header.items():
    if name == "__metadata__":
        continue
    b, end = e["data_offsets"]
    if name.endswith("mlp.experts.gate_up_proj") or name.endswith("mlp.experts.down_proj"):
        w = torch.frombuffer(bytearray(body[b:end]), dtype=torch.float32).reshape(e["shape"])
        blocks, scales = quantize(w)
        put(name + "_blocks", "U8", blocks.shape, blocks.numpy().tobytes()); put(name + "_scales", "U8", scales.shape, scales.numpy().tobytes())
        quantized += 1
    else:
        put(name, e["dtype"], e["shape"], body[b:end])
h = json.dumps(out).encode(); h += b" " * (-len(h) % 8)
open(os.path.join(dst, "model.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
sys.exit(0 if quantized == 4 else 1)
PYM
then
  if "$BIN" checkpoint import --hf "$W/gpt_oss_mxfp4-hf" --save "$W/gpt_oss_mxfp4-ckpt" >"$W/gpt_oss_mxfp4-import.log" 2>&1 &&
     grep -q "4 MXFP4 tensor(s)" "$W/gpt_oss_mxfp4-import.log"; then
    mine=$("$HF_LOSS" "$W/gpt_oss_mxfp4-ckpt" "$W/tokens.txt")
    theirs=$("$PY" "$HERE/hf_reference.py" "$W/gpt_oss_mxfp4-hf" "$W/tokens.txt")
    fp32=$("$PY" "$HERE/hf_reference.py" "$W/gpt_oss_tp2_ep2-hf" "$W/tokens.txt")
    if "$PY" -c "import sys; a, b, f = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) and b != f else 1)" "$mine" "$theirs" "$fp32"; then
      echo "PASS gpt_oss_mxfp4: the MXFP4 experts dequantized, megatrain $mine, HF $theirs (unquantized $fp32)"
    else
      fail "gpt_oss_mxfp4: megatrain's loss $mine, HF's dequantized $theirs (unquantized $fp32)"
    fi
  else
    cat "$W/gpt_oss_mxfp4-import.log"; fail "gpt_oss_mxfp4: import"
  fi
else
  fail "gpt_oss_mxfp4: quantizing the export"
fi
# DeepSeek-V3's layers (DeepseekV3ForCausalLM): multi-latent attention (the queries' latent and the keys' and values' one, each
# RMS-normed; YaRN on the shared RoPE key part with mscale and mscale_all_dim, which scale the softmax too; value heads
# narrower than the query / key heads), a dense first layer, then GLM-4.5-style sigmoid routing with the expert bias and a
# shared expert; TP 2 x EP 2 with SP.
DEEPSEEK="$COMMON --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --ffn-hidden-size 96 --position-embedding-type rope --multi-latent-attention
          --q-lora-rank 24 --kv-lora-rank 16 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 12 --qk-layernorm --rotary-scaling-factor 4
          --mscale 1 --mscale-all-dim 1 --yarn-original-max-position-embeddings 8 --untie-embeddings-and-output-weights --disable-bias-linear
          --num-experts 4 --moe-ffn-hidden-size 32 --moe-router-topk 2 --moe-layer-freq [0,1] --moe-router-score-function sigmoid
          --moe-router-enable-expert-bias --moe-shared-expert-intermediate-size 32 --moe-aux-loss-coeff 1e-2"
check deepseek_v3_tp2_ep2 4 $DEEPSEEK --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 --expert-tensor-parallel-size 1
if grep -q -- "--multi-latent-attention --q-lora-rank 24 --kv-lora-rank 16 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 12 --qk-layernorm --rope-type yarn" \
     "$W/deepseek_v3_tp2_ep2-import.log"; then
  echo "PASS deepseek_v3_tp2_ep2: the import gives back multi-latent attention"
else
  fail "deepseek_v3_tp2_ep2: the import's flags: $(cat "$W/deepseek_v3_tp2_ep2-import.log")"
fi
# Learned positions beside MLA (Megatron's default position embedding): no DeepseekV3ForCausalLM form, refused by name.
# shellcheck disable=SC2086
if "$BIN" $DEEPSEEK --position-embedding-type learned_absolute --train-iters 1 --eval-iters 0 --save "$W/ds_learned-ckpt" --save-interval 1 \
     --device cpu >/dev/null 2>&1; then
  out=$("$BIN" checkpoint export "$W/ds_learned-ckpt" --hf "$W/ds_learned-hf" 2>&1) && fail "deepseek_v3: learned positions exported"
  grep -q "has no learned position embeddings" <<<"$out" && echo "PASS deepseek_v3: learned positions beside MLA refused by name" ||
    fail "deepseek_v3: the learned-positions refusal does not say why: $out"
else
  fail "deepseek_v3: training MLA with learned positions"
fi
# DeepSeek-V3's multi-token prediction (--mtp-num-layers 2: its checkpoints' model.layers.{L + k}, an MoE layer each here, with
# enorm, hnorm, eh_proj, shared_head and copies of the embedding and the output layer): the export's modules' losses against
# hf_reference.py's DeepSeek-style modules (the embedding of the tokens k ahead and the previous module's output, each normed,
# [embedding | hidden] through eh_proj, the layer, shared_head), and the import gives the flag back.
check deepseek_v3_mtp_tp2_ep2 4 $DEEPSEEK --mtp-num-layers 2 --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 \
  --expert-tensor-parallel-size 1
mine=$("$HF_LOSS" "$W/deepseek_v3_mtp_tp2_ep2-ckpt" "$W/tokens.txt" --mtp) || fail "deepseek_v3_mtp: hf_loss --mtp"
theirs=$("$PY" "$HERE/hf_reference.py" "$W/deepseek_v3_mtp_tp2_ep2-hf" "$W/tokens.txt" --mtp) || fail "deepseek_v3_mtp: hf_reference.py --mtp"
if "$PY" -c "import sys; a, b = sys.argv[1].split(), sys.argv[2].split(); sys.exit(0 if len(a) == len(b) == 2 and all(abs(float(x) - float(y)) <= 1e-5 * abs(float(y)) for x, y in zip(a, b)) else 1)" "$mine" "$theirs" &&
   grep -q -- "--mtp-num-layers 2" "$W/deepseek_v3_mtp_tp2_ep2-import.log"; then
  echo "PASS deepseek_v3_mtp: the modules' losses, megatrain $mine, DeepSeek-style reference $theirs; the import gives --mtp-num-layers back"
else
  fail "deepseek_v3_mtp: megatrain's modules' losses $mine, the reference's $theirs; import: $(cat "$W/deepseek_v3_mtp_tp2_ep2-import.log")"
fi
# (a module's copy of the embedding that is not the model's: refused, megatrain shares it; and HF's own saves, which leave the
# modules out under num_nextn_predict_layers 2: imported without them)
rm -rf "$W/ds_mtp_copy-hf" "$W/ds_mtp_none-hf"; cp -r "$W/deepseek_v3_mtp_tp2_ep2-hf" "$W/ds_mtp_copy-hf"; cp -r "$W/deepseek_v3_mtp_tp2_ep2-hf" "$W/ds_mtp_none-hf"
if "$PY" - "$W/ds_mtp_copy-hf/model.safetensors" "$W/ds_mtp_none-hf/model.safetensors" <<'PYF'
import json, struct, sys
def rewrite(path, keep, change):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8]); header = json.loads(data[8:8 + n]); body = data[8 + n:]
    out, blobs, at = {}, [], 0
    for name, e in header.items():
        if name == "__metadata__" or not keep(name):
            continue
        b, end = e["data_offsets"]; raw = bytearray(body[b:end])
        if change(name): raw[0:4] = struct.pack("<f", 0.5)
        out[name] = dict(e, data_offsets=[at, at + len(raw)]); blobs.append(bytes(raw)); at += len(raw)
    h = json.dumps(out).encode(); h += b" " * (-len(h) % 8)
    open(path, "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
rewrite(sys.argv[1], lambda n: True, lambda n: n == "model.layers.2.embed_tokens.weight")
rewrite(sys.argv[2], lambda n: not (n.startswith("model.layers.2.") or n.startswith("model.layers.3.")), lambda n: False)
PYF
then
  out=$("$BIN" checkpoint import --hf "$W/ds_mtp_copy-hf" --save "$W/ds_mtp_copy-ckpt" 2>&1) && fail "deepseek_v3_mtp: a differing embedding copy imported"
  grep -q "differs from the model's own" <<<"$out" && echo "PASS deepseek_v3_mtp: a module's differing embedding copy refused" ||
    fail "deepseek_v3_mtp: the refusal does not say why: $out"
  if out=$("$BIN" checkpoint import --hf "$W/ds_mtp_none-hf" --save "$W/ds_mtp_none-ckpt" 2>&1) && ! grep -q -- "--mtp-num-layers" <<<"$out"; then
    echo "PASS deepseek_v3_mtp: a checkpoint without the modules' tensors imports without them"
  else
    fail "deepseek_v3_mtp: without the modules' tensors: $out"
  fi
else
  fail "deepseek_v3_mtp: rewriting the export"
fi
# DeepSeek-V3's released form: the layers' linear weights FP8 E4M3 in blocks (quant_method fp8, weight_block_size 16 x 32
# here so that the small matrices have several blocks and cut edges), each block times its weight_scale_inv. The export
# quantized here (every byte chosen as the nearest E4M3 value); its import against hf_reference.py's dequantization.
if "$PY" - "$W/deepseek_v3_tp2_ep2-hf" "$W/deepseek_fp8-hf" <<'PYF'
import json, os, struct, sys
import torch
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
c = json.load(open(os.path.join(src, "config.json")))
c["quantization_config"] = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [16, 32]}
json.dump(c, open(os.path.join(dst, "config.json"), "w"))
data = open(os.path.join(src, "model.safetensors"), "rb").read()
(n,) = struct.unpack("<Q", data[:8]); header = json.loads(data[8:8 + n]); body = data[8 + n:]
table = []
for b in range(256):
    s, e, m = -1.0 if b & 0x80 else 1.0, (b >> 3) & 15, b & 7
    table.append(float("nan") if e == 15 and m == 7 else s * (m / 8 * 2.0 ** -6 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)))
table = torch.tensor(table, dtype=torch.float64)
finite = torch.nonzero(~torch.isnan(table)).flatten()
def quantize(w):  # [rows, cols] -> E4M3 bytes, scale_inv [ceil(rows / 16), ceil(cols / 32)] (DeepSeek's: the block's amax / 448)
    rows, cols = w.shape
    sr, sc = -(-rows // 16), -(-cols // 32)
    scale = torch.zeros(sr, sc, dtype=torch.float64)
    q = torch.zeros(rows, cols, dtype=torch.uint8)
    for i in range(sr):
        for j in range(sc):
            blk = w[16 * i:16 * (i + 1), 32 * j:32 * (j + 1)].double()
            scale[i, j] = max(blk.abs().max().item(), 1e-12) / 448.0
            x = blk / scale[i, j]
            pick = (x.unsqueeze(-1) - table[finite]).abs().argmin(-1)
            q[16 * i:16 * (i + 1), 32 * j:32 * (j + 1)] = finite[pick].to(torch.uint8)
    return q, scale.float()
out, blobs, at = {}, [], 0
def put(name, dtype, shape, raw):
    global at
    out[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [at, at + len(raw)]}; blobs.append(raw); at += len(raw)
quantized = 0
for name, e in header.items():
    if name == "__metadata__":
        continue
    b, end = e["data_offsets"]
    if name.startswith("model.layers.") and name.endswith("proj.weight") and len(e["shape"]) == 2:
        w = torch.frombuffer(bytearray(body[b:end]), dtype=torch.float32).reshape(e["shape"])
        q, scale = quantize(w)
        put(name, "F8_E4M3", q.shape, q.numpy().tobytes()); put(name + "_scale_inv", "F32", scale.shape, scale.numpy().tobytes())
        quantized += 1
    else:
        put(name, e["dtype"], e["shape"], body[b:end])
h = json.dumps(out).encode(); h += b" " * (-len(h) % 8)
open(os.path.join(dst, "model.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
print(quantized)
PYF
then
  if "$BIN" checkpoint import --hf "$W/deepseek_fp8-hf" --save "$W/deepseek_fp8-ckpt" >"$W/deepseek_fp8-import.log" 2>&1 &&
     grep -q "FP8 tensor(s)" "$W/deepseek_fp8-import.log"; then
    mine=$("$HF_LOSS" "$W/deepseek_fp8-ckpt" "$W/tokens.txt")
    theirs=$("$PY" "$HERE/hf_reference.py" "$W/deepseek_fp8-hf" "$W/tokens.txt")
    fp32=$("$PY" "$HERE/hf_reference.py" "$W/deepseek_v3_tp2_ep2-hf" "$W/tokens.txt")
    if "$PY" -c "import sys; a, b, f = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) and b != f else 1)" "$mine" "$theirs" "$fp32"; then
      echo "PASS deepseek_fp8: the FP8 weights dequantized by their blocks' scales, megatrain $mine, HF $theirs (unquantized $fp32)"
    else
      fail "deepseek_fp8: megatrain's loss $mine, HF's dequantized $theirs (unquantized $fp32)"
    fi
  else
    cat "$W/deepseek_fp8-import.log"; fail "deepseek_fp8: import"
  fi
else
  fail "deepseek_fp8: quantizing the export"
fi
check mixtral_ep2 2 $MIXTRAL --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
check mixtral_tp2_ep2 4 $MIXTRAL --tensor-model-parallel-size 2 --expert-model-parallel-size 2 --sequence-parallel --moe-token-dispatcher-type alltoall
EXPORT_FLAGS="--max-shard-size 20KB" check llama_tied_sharded 1 $LLAMA_TIED
# RoPE's scaling as HF's rope_scaling: linear position interpolation (--rotary-seq-len-interpolation-factor), and
# LLaMA 3.1's wavelength bands (--use-rope-scaling; at rotary dimension 16 and base 1e4 both bands past the kept one).
check llama_rope_linear_tp2 2 $LLAMA --rotary-seq-len-interpolation-factor 4 --tensor-model-parallel-size 2
check llama_rope_llama3 1 $LLAMA --use-rope-scaling --rope-scaling-factor 8
# transformers 5's form (the scaling inside rope_parameters) imports the same; a linear factor that is not whole is refused.
for form in llama3-parameters linear-2.5; do
  cp -r "$W/llama_rope_$([[ $form == llama3-parameters ]] && echo llama3 || echo linear_tp2)-hf" "$W/rope-$form"
  "$PY" -c "
import json, sys
p, form = sys.argv[1], sys.argv[2]
c = json.load(open(p))
if form == 'linear-2.5':
    c['rope_scaling']['factor'] = 2.5
else:
    c['rope_parameters'] = dict(c.pop('rope_scaling'), rope_theta=c.pop('rope_theta'))
json.dump(c, open(p, 'w'))" "$W/rope-$form/config.json" "$form"
  out=$("$BIN" checkpoint import --hf "$W/rope-$form" --save "$W/rope-$form-ckpt" 2>&1); rc=$?
  if [[ $form == llama3-parameters ]]; then
    if [[ $rc == 0 ]] && grep -q -- "--use-rope-scaling --rope-scaling-factor 8" <<<"$out" &&
       "$BIN" checkpoint export "$W/rope-$form-ckpt" --hf "$W/rope-$form-again" --dtype fp32 >/dev/null 2>&1 &&
       cmp -s "$W/llama_rope_llama3-hf/model.safetensors" "$W/rope-$form-again/model.safetensors"; then
      echo "PASS rope_parameters with rope_type llama3: imported as --use-rope-scaling, the same weights"
    else
      fail "rope_parameters with rope_type llama3: rc $rc, $out"
    fi
  elif [[ $rc != 0 ]] && grep -q "rotary-seq-len-interpolation-factor" <<<"$out"; then
    echo "PASS rope_scaling linear with factor 2.5: refused, naming the flag"
  else
    fail "rope_scaling linear with factor 2.5: rc $rc, $out"
  fi
done
# Qwen3: --qk-layernorm's RMSNorms of each query and key head before RoPE (Qwen3ForCausalLM), also with interleaved RoPE
# (the norms' weights then in HF's rotate-half order) and QKV biases; Qwen3-MoE (Qwen3MoeForCausalLM): a dense first
# layer (mlp_only_layers), the top-k weights renormalised (norm_topk_prob) or not (--moe-router-pre-softmax).
check qwen3_tp2_sp 2 $LLAMA --qk-layernorm --tensor-model-parallel-size 2 --sequence-parallel
check qwen3_interleaved_qkv_bias 1 $LLAMA --qk-layernorm --rotary-interleaved --add-qkv-bias
check qwen3_moe_tp2_ep2 4 $MIXTRAL --qk-layernorm --moe-layer-freq [0,1] --tensor-model-parallel-size 2 --expert-model-parallel-size 2 \
  --sequence-parallel --moe-token-dispatcher-type alltoall
check qwen3_moe_pre_softmax_ep2 2 $MIXTRAL --qk-layernorm --moe-router-pre-softmax --expert-model-parallel-size 2 --moe-token-dispatcher-type alltoall
# Qwen2-MoE (Qwen2MoeForCausalLM): QKV biases, a shared expert with its sigmoid gate, a dense first layer; and a model
# trained with sinkhorn routing, exported as Qwen3-MoE without renormalising the top k.
check qwen2_moe_tp2_ep2 4 $MIXTRAL --add-qkv-bias --moe-shared-expert-intermediate-size 32 --moe-shared-expert-gate --moe-layer-freq [0,1] \
  --tensor-model-parallel-size 2 --expert-model-parallel-size 2 --sequence-parallel --moe-token-dispatcher-type alltoall
check qwen3_moe_sinkhorn 1 $MIXTRAL --qk-layernorm --moe-router-load-balancing-type sinkhorn --moe-aux-loss-coeff 0
# GLM-4.5 (Glm4MoeForCausalLM): sigmoid routers with the expert bias (its e_score_correction_bias), scaled, ungated shared
# experts, a dense first layer, partial RoPE, QKV biases; and with group-limited routing and QK norms (without the bias:
# HF masks the other groups' experts with 0 where Megatron masks them with -inf, the same choice while every biased score
# is positive, as sigmoid scores are without a bias).
GLM="$MIXTRAL --moe-router-score-function sigmoid --rotary-percent 0.5 --moe-layer-freq [0,1]"
check glm4_moe_tp2_ep2 4 $GLM --moe-router-enable-expert-bias --moe-router-bias-update-rate 0.05 --moe-router-topk-scaling-factor 2.5 \
  --add-qkv-bias --moe-shared-expert-intermediate-size 96 --tensor-model-parallel-size 2 --sequence-parallel --expert-model-parallel-size 2 \
  --expert-tensor-parallel-size 1 --moe-token-dispatcher-type alltoall
check glm4_moe_groups_qk_norm 1 $GLM --qk-layernorm --num-experts 8 --moe-router-topk 2 --moe-router-num-groups 2 --moe-router-group-topk 1 \
  --moe-shared-expert-intermediate-size 48
# (groups that mask nothing, every group kept: HF's one group)
check glm4_moe_groups_all_kept 1 $GLM --num-experts 8 --moe-router-topk 4 --moe-router-num-groups 2 --moe-router-group-topk 2

# The imported checkpoint fine-tunes like the original (same flags, same layout: the same losses).
finetune_losses() { grep -o 'lm loss: [0-9.E+-]*' "$1" | cut -d' ' -f3 | tr '\n' ' '; }
# shellcheck disable=SC2086
"${MPI[@]}" -np 2 "$BIN" $LLAMA --tensor-model-parallel-size 2 --sequence-parallel --load "$W/llama_tp2_sp-ckpt" --finetune --train-iters 2 >"$W/ft-a.log" 2>&1 || fail "fine-tuning the original"
# shellcheck disable=SC2086
"${MPI[@]}" -np 2 "$BIN" $LLAMA --tensor-model-parallel-size 2 --sequence-parallel --load "$W/llama_tp2_sp-ckpt-imported" --finetune --train-iters 2 >"$W/ft-b.log" 2>&1 || {
  tail -3 "$W/ft-b.log"; fail "fine-tuning the imported checkpoint"; }
a=$(finetune_losses "$W/ft-a.log"); b=$(finetune_losses "$W/ft-b.log")
if [[ -n "$a" && "$a" == "$b" ]]; then echo "PASS the imported checkpoint fine-tunes with the original's losses ($a)"; else fail "fine-tuning: original $a, imported $b"; fi
# GPT-2's own files name the base model's tensors without "transformer." (wte.weight, h.0.attn.c_attn.weight):
# HF's loader takes both, and so does import.
mkdir -p "$W/gpt2-hub"
cp "$W/gpt2_tp2-hf/config.json" "$W/gpt2-hub/"
"$PY" - "$W/gpt2_tp2-hf/model.safetensors" "$W/gpt2-hub/model.safetensors" <<'PYX'
import json, struct, sys
data = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", data[:8])
header = json.loads(data[8:8 + n])
renamed = {(k[len("transformer."):] if k.startswith("transformer.") else k): v for k, v in header.items()}
text = json.dumps(renamed).encode()
text += b" " * ((8 - len(text) % 8) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(text)) + text + data[8 + n:])
PYX
if "$BIN" checkpoint import --hf "$W/gpt2-hub" --save "$W/gpt2-hub-ck" >/dev/null 2>&1 &&
   "$BIN" checkpoint export "$W/gpt2-hub-ck" --hf "$W/gpt2-hub-again" --dtype fp32 >/dev/null 2>&1 &&
   cmp -s "$W/gpt2_tp2-hf/model.safetensors" "$W/gpt2-hub-again/model.safetensors"; then
  echo "PASS GPT-2 tensors named without transformer. (as GPT-2's own files) import to the same weights"
else fail "GPT-2 tensors without the transformer. prefix"; fi
sed 's/"scale_attn_weights": true/"scale_attn_weights": true, "scale_attn_by_inverse_layer_idx": true/' "$W/gpt2_tp2-hf/config.json" >"$W/gpt2-hub/config.json"
out=$("$BIN" checkpoint import --hf "$W/gpt2-hub" --save "$W/bad-ck2" 2>&1) && fail "scale_attn_by_inverse_layer_idx imported"
grep -q "scale_attn_by_inverse_layer_idx" <<<"$out" || fail "scale_attn_by_inverse_layer_idx: $out"
# Import's refusals: an architecture it does not know, a config.json that disagrees with the weights.
mkdir -p "$W/bad-hf" && cp "$W/llama_tp2_sp-hf/model.safetensors" "$W/bad-hf/"
sed 's/LlamaForCausalLM/FalconForCausalLM/' "$W/llama_tp2_sp-hf/config.json" >"$W/bad-hf/config.json"
out=$("$BIN" checkpoint import --hf "$W/bad-hf" --save "$W/bad-ck" 2>&1) && fail "a FalconForCausalLM imported"
grep -q "FalconForCausalLM" <<<"$out" || fail "unknown architecture: $out"
sed 's/"intermediate_size": 96/"intermediate_size": 80/' "$W/llama_tp2_sp-hf/config.json" >"$W/bad-hf/config.json"
out=$("$BIN" checkpoint import --hf "$W/bad-hf" --save "$W/bad-ck" 2>&1) && fail "a config.json that disagrees with the weights imported"
grep -q "gate_proj.weight has shape" <<<"$out" || fail "shape mismatch: $out"
head -c 100 "$W/llama_tp2_sp-hf/model.safetensors" >"$W/bad-hf/model.safetensors"
cp "$W/llama_tp2_sp-hf/config.json" "$W/bad-hf/config.json"
out=$("$BIN" checkpoint import --hf "$W/bad-hf" --save "$W/bad-ck" 2>&1) && fail "a truncated safetensors file imported"
grep -q "model.safetensors" <<<"$out" || fail "truncated safetensors: $out"
[[ -e "$W/bad-ck" ]] && fail "a failed import left a checkpoint"
# A top-1 Mixtral (its one weight renormalised to 1): no Megatron form (Megatron refuses softmax after a top-1 choice).
mkdir -p "$W/top1-hf" && cp "$W/mixtral_ep2-hf/model.safetensors" "$W/top1-hf/"
sed 's/"num_experts_per_tok": 2/"num_experts_per_tok": 1/' "$W/mixtral_ep2-hf/config.json" >"$W/top1-hf/config.json"
out=$("$BIN" checkpoint import --hf "$W/top1-hf" --save "$W/top1-ck" 2>&1) && fail "a top-1 Mixtral imported"
grep -q "has no Megatron form" <<<"$out" && echo "PASS a top-1 Mixtral: refused by name" || fail "top-1 Mixtral: $out"

# Damaged safetensors files and config.json: 150 mutants (flipped bytes in the header length, the header and the
# data; truncations; config values changed), each imported: an import or one error line, never a signal or a hang.
"$PY" - "$W/llama_tp2_sp-hf" "$W/mutants" <<'PYM'
import json, os, random, shutil, sys
src, out = sys.argv[1], sys.argv[2]
random.seed(11)
data = open(os.path.join(src, "model.safetensors"), "rb").read()
cfg = open(os.path.join(src, "config.json")).read()
n = int.from_bytes(data[:8], "little")
for k in range(150):
    d = os.path.join(out, f"m{k:03d}")
    os.makedirs(d)
    b, c = bytearray(data), cfg
    kind = k % 5
    if kind == 0:    # the header length
        b[random.randrange(8)] = random.randrange(256)
    elif kind == 1:  # the JSON header
        for _ in range(random.randint(1, 4)):
            b[8 + random.randrange(n)] = random.choice(b'0123456789{}[]",:-eE .')
    elif kind == 2:  # truncated
        b = b[:random.randrange(len(b))]
    elif kind == 3:  # data bytes (may import: the weights are only values)
        for _ in range(20):
            b[8 + n + random.randrange(len(b) - 8 - n)] = random.randrange(256)
    else:            # config.json values
        j = json.loads(cfg)
        key = random.choice(["hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "num_hidden_layers", "vocab_size", "head_dim"])
        j[key] = random.choice([0, -1, 1, 3, 10**12, None, "x", 2.5])
        c = json.dumps(j)
    open(os.path.join(d, "model.safetensors"), "wb").write(b)
    open(os.path.join(d, "config.json"), "w").write(c)
PYM
signals=0 slow=0 imported=0
for d in "$W"/mutants/m*; do
  start=$SECONDS
  timeout 20 "$BIN" checkpoint import --hf "$d" --save "$d-ck" >"$d.log" 2>&1
  rc=$?
  ((SECONDS - start > 5)) && slow=$((slow + 1))
  if [[ $rc == 0 ]]; then imported=$((imported + 1))
  elif [[ $rc != 1 && $rc != 2 ]]; then signals=$((signals + 1)); echo "mutant $(basename "$d"): rc $rc"; tail -2 "$d.log"
  elif [[ $(grep -c 'error' "$d.log") != 1 ]]; then signals=$((signals + 1)); echo "mutant $(basename "$d"): not one error line"; cat "$d.log"; fi
done
if [[ $signals == 0 && $slow == 0 ]]; then echo "PASS 150 damaged imports: $imported imported (data bytes only), the rest one error line each, no signal, none slow"
else fail "damaged imports: $signals crashed or unclear, $slow slow"; fi

# Sharding: the index names every tensor's file, and the files hold what it says.
idx="$W/llama_tied_sharded-hf/model.safetensors.index.json"
if [[ -f "$idx" ]] && "$PY" - "$idx" <<'PY'
import json, os, struct, sys
idx = json.load(open(sys.argv[1]))
d = os.path.dirname(sys.argv[1])
files = set(idx["weight_map"].values())
assert len(files) > 1, "one shard only"
seen = {}
for fn in files:
    data = open(os.path.join(d, fn), "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    for k in json.loads(data[8:8 + n]):
        if k != "__metadata__":
            seen[k] = fn
assert seen == idx["weight_map"], "the index and the files disagree"
assert "lm_head.weight" not in seen, "tied embeddings exported twice"
PY
then echo "PASS sharded export: $("$PY" -c "import json,sys; print(len(set(json.load(open(sys.argv[1]))['weight_map'].values())))" "$idx") files and an index that agrees"
else fail "sharded export: no index, or it disagrees with the files"; fi

# Bad input: one line naming the problem, non-zero exit.
out=$("$BIN" checkpoint export "$W/nowhere" --hf "$W/x" 2>&1) && fail "export of a missing checkpoint succeeded"
grep -q "nowhere" <<<"$out" || fail "missing checkpoint: the message does not name it: $out"
out=$("$BIN" checkpoint export "$W/gpt2_tp2-ckpt" --hf "$W/x" --max-shard-size lots 2>&1) && fail "--max-shard-size lots accepted"
grep -q "max-shard-size" <<<"$out" || fail "--max-shard-size lots: $out"
# (GPT-2 with QK norms: no family has both)
# shellcheck disable=SC2086
"$BIN" $GPT --qk-layernorm --train-iters 1 --save "$W/qk" --save-interval 1 >/dev/null 2>&1 || fail "qk-layernorm training"
out=$("$BIN" checkpoint export "$W/qk" --hf "$W/qk-hf" 2>&1) && fail "a GPT-2 shaped --qk-layernorm model exported"
grep -q "qk-layernorm" <<<"$out" || fail "--qk-layernorm: the refusal does not say why: $out"
# (a Mixtral-shaped model with an ungated shared expert: Qwen2-MoE's has a gate; top-1 sinkhorn: a sigmoid's weights)
refused_export() {  # name text flags...
  local name=$1 text=$2; shift 2
  # shellcheck disable=SC2086,SC2068
  "$BIN" $@ --train-iters 1 --save "$W/$name" --save-interval 1 >/dev/null 2>&1 || { fail "$name: training"; return; }
  out=$("$BIN" checkpoint export "$W/$name" --hf "$W/$name-hf" 2>&1) && { fail "$name: exported"; return; }
  grep -q -- "$text" <<<"$out" && echo "PASS $name: refused" || fail "$name: the refusal does not say why: $out"
}
refused_export ungated_shared_expert "moe-shared-expert-gate" $MIXTRAL --add-qkv-bias --moe-shared-expert-intermediate-size 32
refused_export sinkhorn_top1 "sigmoid" $MIXTRAL --qk-layernorm --moe-router-load-balancing-type sinkhorn --moe-aux-loss-coeff 0 --moe-router-topk 1
# GLM-4.5 as its hub checkpoints write it: RoPE's settings in rope_parameters (transformers 5) and a multi-token-prediction
# layer after the last (model.layers.L.*, which HF's modeling skips): imported with a note, the same weights exported.
cat >"$W/glm_form.py" <<'PYG'
import json, os, struct, sys
src, dst = sys.argv[1], sys.argv[2]
os.makedirs(dst, exist_ok=True)
c = json.load(open(os.path.join(src, "config.json")))
c["rope_parameters"] = {"rope_type": "default", "rope_theta": c.pop("rope_theta")}
assert c.pop("partial_rotary_factor") == 0.5  # (left out: HF's Glm4MoeConfig default)
c.pop("rms_norm_eps")  # (likewise: 1e-5, the test's)
c["num_nextn_predict_layers"] = 1
json.dump(c, open(os.path.join(dst, "config.json"), "w"))
data = open(os.path.join(src, "model.safetensors"), "rb").read()
(n,) = struct.unpack("<Q", data[:8]); header = json.loads(data[8:8 + n]); body = data[8 + n:]
out, blobs, at = {}, [], 0
for name, e in header.items():
    if name == "__metadata__":
        continue
    b, end = e["data_offsets"]
    out[name] = dict(e, data_offsets=[at, at + end - b]); blobs.append(body[b:end]); at += end - b
L = c["num_hidden_layers"]
extra = struct.pack("<4f", 1, 2, 3, 4)
out[f"model.layers.{L}.eh_proj.weight"] = {"dtype": "F32", "shape": [2, 2], "data_offsets": [at, at + len(extra)]}; blobs.append(extra)
at += len(extra)
if len(sys.argv) > 3:  # (a layer past the MTP ones: refused as unused)
    out[f"model.layers.{L + 1}.eh_proj.weight"] = {"dtype": "F32", "shape": [2, 2], "data_offsets": [at, at + len(extra)]}; blobs.append(extra)
h = json.dumps(out).encode(); h += b" " * (-len(h) % 8)
open(os.path.join(dst, "model.safetensors"), "wb").write(struct.pack("<Q", len(h)) + h + b"".join(blobs))
PYG
"$PY" "$W/glm_form.py" "$W/glm4_moe_tp2_ep2-hf" "$W/glm-mtp-hf"
if "$BIN" checkpoint import --hf "$W/glm-mtp-hf" --save "$W/glm-mtp-ckpt" >"$W/glm-mtp-import.log" 2>&1 &&
   grep -q -- "--rotary-percent 0.5" "$W/glm-mtp-import.log" && grep -q "multi-token-prediction" "$W/glm-mtp-import.log" &&
   "$BIN" checkpoint export "$W/glm-mtp-ckpt" --hf "$W/glm-mtp-again" --dtype fp32 >/dev/null 2>&1 &&
   cmp -s "$W/glm4_moe_tp2_ep2-hf/model.safetensors" "$W/glm-mtp-again/model.safetensors"; then
  echo "PASS glm-mtp: rope_parameters and an MTP layer import, the same weights"
else
  cat "$W/glm-mtp-import.log"; fail "glm-mtp: GLM-4.5's hub form's import"
fi
"$PY" "$W/glm_form.py" "$W/glm4_moe_tp2_ep2-hf" "$W/glm-extra-hf" extra
out=$("$BIN" checkpoint import --hf "$W/glm-extra-hf" --save "$W/glm-extra-ckpt" 2>&1) && fail "glm-extra: a layer past the MTP ones imported"
grep -q "no place for" <<<"$out" && echo "PASS glm-extra: a layer past the MTP ones refused" || fail "glm-extra: $out"
# the bf16 export keeps the expert bias in fp32
"$PY" -c "
import json, struct, sys
d = open(sys.argv[1], 'rb').read(); (n,) = struct.unpack('<Q', d[:8]); h = json.loads(d[8:8 + n])
bias = [v['dtype'] for k, v in h.items() if k.endswith('e_score_correction_bias')]
w = [v['dtype'] for k, v in h.items() if k.endswith('gate.weight')]
sys.exit(0 if bias and set(bias) == {'F32'} and set(w) == {'BF16'} else 1)" "$W/glm4_moe_tp2_ep2-hf-bf16/model.safetensors" &&
  echo "PASS glm bf16: e_score_correction_bias in fp32" || fail "glm bf16: e_score_correction_bias not fp32"
check glm4_moe_top1 1 $GLM --moe-router-topk 1 --moe-router-topk-scaling-factor 1.5 --moe-shared-expert-intermediate-size 48
refused_export glm_dense_last "first_k_dense_replace" $MIXTRAL --moe-router-score-function sigmoid --moe-layer-freq [1,0]
# Multi-latent attention without the query latent (its HF form would norm the keys' latent alone), and without the latents' norms
refused_export mla_no_q_lora "q-lora-rank" $COMMON --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --ffn-hidden-size 96 \
  --position-embedding-type rope --multi-latent-attention --kv-lora-rank 16 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 12 \
  --disable-bias-linear
refused_export mla_no_norms "qk-layernorm" $COMMON --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --ffn-hidden-size 96 \
  --position-embedding-type rope --multi-latent-attention --q-lora-rank 24 --kv-lora-rank 16 --qk-head-dim 16 --qk-pos-emb-head-dim 8 \
  --v-head-dim 12 --disable-bias-linear
# DeepSeek-V3 configs megatrain cannot express, refused on import by name: no q_lora_rank (V2-Lite's form), rope_interleave false
for variant in "q_lora_rank:null:q_lora_rank" "rope_interleave:false:rope_interleave"; do
  key=${variant%%:*}; rest=${variant#*:}; value=${rest%%:*}; text=${rest#*:}
  rm -rf "$W/ds_$key-hf"; cp -r "$W/deepseek_v3_tp2_ep2-hf" "$W/ds_$key-hf"
  "$PY" -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); c[sys.argv[2]]=json.loads(sys.argv[3]); json.dump(c,open(p,'w'))" \
    "$W/ds_$key-hf/config.json" "$key" "$value"
  out=$("$BIN" checkpoint import --hf "$W/ds_$key-hf" --save "$W/ds_$key-ckpt" 2>&1) && { fail "deepseek $key $value: imported"; continue; }
  grep -q -- "$text" <<<"$out" && echo "PASS deepseek $key $value: refused" || fail "deepseek $key $value: the refusal does not say why: $out"
done
[[ $failures == 0 ]] && echo "all HuggingFace export checks passed"
exit $((failures > 0))
