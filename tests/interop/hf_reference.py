#!/usr/bin/env python3
"""hf_reference.py: HuggingFace's modeling code for GPT2LMHeadModel, LlamaForCausalLM, MixtralForCausalLM, DeepseekV3ForCausalLM,
Qwen3ForCausalLM, Qwen3MoeForCausalLM, Qwen2MoeForCausalLM, Glm4MoeForCausalLM and GptOssForCausalLM (its sinks, clamped
quick-GELU experts and YaRN; YaRN for the others too) (LLaMA's with RMSNorms of each query and key head before RoPE; Qwen3-MoE's
sparse block: a softmax over the experts, the top k, renormalised with norm_topk_prob),
written out in PyTorch (the distribution's python3-torch; no transformers package), reading an exported directory
by HF's tensor names (config.json, model.safetensors or model.safetensors.index.json) and printing the mean
cross entropy on the token rows of a file (each line S + 1 ids). In float64, so that megatrain's fp32 loss is
the only rounding compared.

usage: hf_reference.py HF_DIR TOKENS_FILE [--mtp]   (--mtp: DeepSeek-V3's multi-token prediction modules' losses instead)
"""
import json
import math
import os
import struct
import sys

import torch

DTYPES = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "U8": torch.uint8, "F8_E4M3": torch.uint8}


def e4m3_values():  # the value of each FP8 E4M3 byte (OCP's, no infinities; 0x7F and 0xFF NaN)
    out = []
    for b in range(256):
        sign, exponent, mantissa = -1.0 if b & 0x80 else 1.0, (b >> 3) & 15, b & 7
        if exponent == 15 and mantissa == 7:
            out.append(float("nan"))
        elif exponent == 0:
            out.append(sign * mantissa / 8 * 2.0 ** -6)
        else:
            out.append(sign * (1 + mantissa / 8) * 2.0 ** (exponent - 7))
    return torch.tensor(out, dtype=torch.float64)
# MXFP4's E2M1 codes (transformers' integrations/mxfp4.py): sign bit 8, then 0, 0.5, 1, 1.5, 2, 3, 4, 6.
E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def dequantize_mxfp4(blocks, scales):  # as transformers' convert_moe_packed_tensors: [E, out, G, 16] + [E, out, G] -> [E, G * 32, out]
    lut = torch.tensor(E2M1, dtype=torch.float64)
    *prefix, groups, nbytes = blocks.shape
    rows = blocks.reshape(-1, nbytes)
    out = torch.empty(rows.shape[0], nbytes * 2, dtype=torch.float64)
    out[:, 0::2] = lut[(rows & 0x0F).long()]
    out[:, 1::2] = lut[(rows >> 4).long()]
    out = torch.ldexp(out, (scales.reshape(-1, 1).to(torch.int32) - 127).to(torch.float64))
    return out.reshape(*prefix, groups * nbytes * 2).transpose(1, 2).contiguous()


def load_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        b, end = e["data_offsets"]
        t = torch.frombuffer(bytearray(data[base + b:base + end]), dtype=DTYPES[e["dtype"]])
        out[name] = t.reshape(e["shape"])
        if e["dtype"] == "F8_E4M3":
            out[name] = e4m3_values()[out[name].long()]
        elif e["dtype"] != "U8":
            out[name] = out[name].to(torch.float64)
    return out


def load_dir(d):
    index = os.path.join(d, "model.safetensors.index.json")
    weights = {}
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
        for fn in files:
            weights.update(load_safetensors(os.path.join(d, fn)))
    else:
        weights = load_safetensors(os.path.join(d, "model.safetensors"))
    with open(os.path.join(d, "config.json")) as f:
        block = json.load(f).get("quantization_config", {}).get("weight_block_size", [128, 128])
    for name in [n for n in weights if n.endswith("_scale_inv")]:  # FP8 weights (quant_method "fp8"): each block times its scale
        base = name[:-len("_scale_inv")]
        w, scale = weights[base], weights.pop(name)
        weights[base] = w * scale.repeat_interleave(block[0], 0)[:w.shape[0]].repeat_interleave(block[1], 1)[:, :w.shape[1]]
    for name in [n for n in weights if n.endswith("_blocks")]:  # MXFP4 experts (quantization_config's quant_method "mxfp4")
        base = name[:-len("_blocks")]
        weights[base] = dequantize_mxfp4(weights.pop(name), weights.pop(base + "_scales"))
    with open(os.path.join(d, "config.json")) as f:
        return json.load(f), weights


def attention(q, k, v, window=None, sinks=None, scale=None):  # [B, H, S, d]; window W: HF's sliding window (keys kv > q - W only)
    B, H, S = q.shape[0], q.shape[1], q.shape[2]
    scores = q @ k.transpose(-1, -2) * (scale if scale is not None else 1.0 / math.sqrt(q.shape[-1]))
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), 1)
    if window:
        mask = mask | torch.tril(torch.ones(S, S, dtype=torch.bool), -window)
    scores = scores.masked_fill(mask, float("-inf"))
    if sinks is not None:  # GPT-OSS: a logit per head beside every row's scores, dropped after the softmax
        combined = torch.cat([scores, sinks.reshape(1, H, 1, 1).expand(B, H, S, 1)], -1)
        return torch.softmax(combined, -1)[..., :-1] @ v
    return torch.softmax(scores, -1) @ v


def layer_norm(x, w, b, eps):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def rms_norm(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


def gpt2(cfg, W, tokens):
    B, S = tokens.shape
    h, nh = cfg["n_embd"], cfg["n_head"]
    d = h // nh
    eps = cfg["layer_norm_epsilon"]
    x = W["transformer.wte.weight"][tokens] + W["transformer.wpe.weight"][torch.arange(S)][None]
    for l in range(cfg["n_layer"]):
        p = f"transformer.h.{l}."
        a = layer_norm(x, W[p + "ln_1.weight"], W[p + "ln_1.bias"], eps)
        qkv = a @ W[p + "attn.c_attn.weight"] + W[p + "attn.c_attn.bias"]
        q, k, v = (t.reshape(B, S, nh, d).transpose(1, 2) for t in qkv.split(h, -1))
        o = attention(q, k, v).transpose(1, 2).reshape(B, S, h)
        x = x + o @ W[p + "attn.c_proj.weight"] + W[p + "attn.c_proj.bias"]
        m = layer_norm(x, W[p + "ln_2.weight"], W[p + "ln_2.bias"], eps)
        m = m @ W[p + "mlp.c_fc.weight"] + W[p + "mlp.c_fc.bias"]
        if cfg.get("activation_function", "gelu_new") == "gelu":  # (HF's exact GELU)
            m = torch.nn.functional.gelu(m)
        else:
            m = 0.5 * m * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (m + 0.044715 * m ** 3)))  # gelu_new
        x = x + m @ W[p + "mlp.c_proj.weight"] + W[p + "mlp.c_proj.bias"]
    x = layer_norm(x, W["transformer.ln_f.weight"], W["transformer.ln_f.bias"], eps)
    head = W["transformer.wte.weight"] if cfg.get("tie_word_embeddings", True) else W["lm_head.weight"]
    return x @ head.T


def rope_scaled(inv, scaling):  # HF's rope types: linear (positions / factor) and llama3 (LLaMA 3.1's wavelength bands)
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "linear":
        return inv / scaling["factor"]
    if kind == "llama3":
        factor, low, high, old = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"], scaling["original_max_position_embeddings"]
        wavelength = 2 * math.pi / inv
        scaled = torch.where(wavelength > old / low, inv / factor, inv)
        smooth = (old / wavelength - low) / (high - low)
        medium = (wavelength >= old / high) & (wavelength <= old / low)
        return torch.where(medium, (1 - smooth) * scaled / factor + smooth * scaled, scaled)
    assert kind == "default", kind
    return inv


def yarn(theta, d, scaling, max_positions):  # HF's yarn rope type: the blended frequencies and the attention factor cos and sin are scaled by
    factor = scaling["factor"]
    original = scaling.get("original_max_position_embeddings") or max_positions
    beta_fast, beta_slow = scaling.get("beta_fast", 32.0), scaling.get("beta_slow", 1.0)

    def mscale(s, m=1.0):
        return 1.0 if s <= 1 else 0.1 * m * math.log(s) + 1.0

    if scaling.get("attention_factor") is not None:
        attention = scaling["attention_factor"]
    elif scaling.get("mscale") and scaling.get("mscale_all_dim"):
        attention = mscale(factor, scaling["mscale"]) / mscale(factor, scaling["mscale_all_dim"])
    else:
        attention = mscale(factor)

    def correction_dim(rotations):
        return d * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = correction_dim(beta_fast), correction_dim(beta_slow)
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, d - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extrapolation = 1 - ramp
    base = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    return (base / factor) * (1 - extrapolation) + base * extrapolation, attention


def rope(x, theta, partial=1.0, scaling=None, max_positions=None):  # [B, H, S, d], HF's rotate_half on the first int(d x partial) dims (GLM-4.5's partial_rotary_factor)
    S = x.shape[2]
    d = int(x.shape[-1] * partial)
    rot, rest = x[..., :d], x[..., d:]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    attention = 1.0
    if scaling and scaling.get("rope_type", scaling.get("type")) == "yarn":
        inv, attention = yarn(theta, d, scaling, max_positions)
    elif scaling:
        inv = rope_scaled(inv, scaling)
    freqs = torch.arange(S, dtype=torch.float64)[:, None] * inv[None]
    emb = torch.cat([freqs, freqs], -1)
    x1, x2 = rot[..., : d // 2], rot[..., d // 2:]
    return torch.cat([rot * emb.cos() * attention + torch.cat([-x2, x1], -1) * emb.sin() * attention, rest], -1)


def deepseek_v3_attention(cfg, a, W, p, theta):
    """DeepSeek-V3's DeepseekV3Attention (multi-latent attention): the queries through q_a_proj, q_a_layernorm (eps 1e-6) and
    q_b_proj (or q_proj), per head [nope | rope]; kv_a_proj_with_mqa's [latent | k_rope], the latent through kv_a_layernorm and
    kv_b_proj to per head [k_nope | v]; RoPE (rope_interleave: each rope part's pairs (2i, 2i + 1) gathered to halves first) on
    q_rope and on k_rope, one head that every head shares; the softmax scale qk_head_dim^-0.5 times yarn's mscale(factor,
    mscale_all_dim)^2."""
    B, S, _ = a.shape
    nh, dn, dr, dv = cfg["num_attention_heads"], cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"]
    if cfg.get("q_lora_rank") is None:
        q = linear(a, W, p + "self_attn.q_proj")
    else:
        q = linear(rms_norm(linear(a, W, p + "self_attn.q_a_proj"), W[p + "self_attn.q_a_layernorm.weight"], 1e-6), W, p + "self_attn.q_b_proj")
    q = q.reshape(B, S, nh, dn + dr).transpose(1, 2)
    q_pass, q_rot = q[..., :dn], q[..., dn:]
    compressed = linear(a, W, p + "self_attn.kv_a_proj_with_mqa")
    latent, k_rot = compressed[..., :cfg["kv_lora_rank"]], compressed[..., cfg["kv_lora_rank"]:]
    kv = linear(rms_norm(latent, W[p + "self_attn.kv_a_layernorm.weight"], 1e-6), W, p + "self_attn.kv_b_proj")
    kv = kv.reshape(B, S, nh, dn + dv).transpose(1, 2)
    k_pass, v = kv[..., :dn], kv[..., dn:]
    k_rot = k_rot.reshape(B, 1, S, dr)
    if cfg.get("rope_interleave", True):
        def halves(t):
            return t.reshape(*t.shape[:-1], dr // 2, 2).transpose(-1, -2).reshape(t.shape)
        q_rot, k_rot = halves(q_rot), halves(k_rot)
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    q_rot = rope(q_rot, theta, 1.0, scaling, cfg["max_position_embeddings"])
    k_rot = rope(k_rot, theta, 1.0, scaling, cfg["max_position_embeddings"]).expand(B, nh, S, dr)
    scale = (dn + dr) ** -0.5
    if scaling and scaling.get("mscale_all_dim"):
        factor, m = scaling["factor"], scaling["mscale_all_dim"]
        mscale = 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0
        scale = scale * mscale * mscale
    o = attention(torch.cat([q_pass, q_rot], -1), torch.cat([k_pass, k_rot], -1), v, scale=scale)
    return linear(o.transpose(1, 2).reshape(B, S, nh * dv), W, p + "self_attn.o_proj")


def gpt_oss_moe(cfg, m, W, p):
    """GPT-OSS's GptOssMLP: the router's logits (with its bias), the top k softmaxed; each expert's gate_up_proj ([in, out],
    gate and up interleaved in its columns) plus bias, the gate clamped above and up both ways at swiglu_limit,
    gate sigmoid(alpha gate) (up + 1), then down_proj plus bias."""
    k, alpha, limit = cfg["num_experts_per_tok"], cfg.get("swiglu_alpha", 1.702), cfg.get("swiglu_limit", 7.0)
    logits = m @ W[p + "mlp.router.weight"].T + W[p + "mlp.router.bias"]
    top_v, top_i = torch.topk(logits, k, -1)
    top_w = torch.softmax(top_v, -1)
    out = torch.zeros_like(m)
    q = p + "mlp.experts."
    for e in range(cfg["num_local_experts"]):
        gate_up = m @ W[q + "gate_up_proj"][e] + W[q + "gate_up_proj_bias"][e]
        gate, up = gate_up[..., ::2].clamp(max=limit), gate_up[..., 1::2].clamp(min=-limit, max=limit)
        y = ((up + 1) * gate * torch.sigmoid(gate * alpha)) @ W[q + "down_proj"][e] + W[q + "down_proj_bias"][e]
        out = out + (top_w * (top_i == e)).sum(-1, keepdim=True) * y
    return out


def swiglu_mlp(m, W, q):
    return (torch.nn.functional.silu(m @ W[q + "gate_proj.weight"].T) * (m @ W[q + "up_proj.weight"].T)) @ W[q + "down_proj.weight"].T


def glm4_moe(cfg, m, W, p):
    """GLM-4.5's Glm4MoeMoE: sigmoid scores, e_score_correction_bias added for the choice, groups scored by their best two
    experts (the other groups' scores 0), the top k renormalised and scaled by routed_scaling_factor; plus the shared experts."""
    E, k = cfg["n_routed_experts"], cfg["num_experts_per_tok"]
    G, TG = cfg.get("n_group", 1), cfg.get("topk_group", 1)
    scores = torch.sigmoid(m @ W[p + "mlp.gate.weight"].T)
    choice = scores + W[p + "mlp.gate.e_score_correction_bias"]
    flat = choice.reshape(-1, E)
    group_scores = flat.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
    group_idx = torch.topk(group_scores, k=TG, dim=-1)[1]
    mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    mask = mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
    top_i = torch.topk(flat.masked_fill(~mask.bool(), 0.0), k=k, dim=-1)[1]
    top_w = scores.reshape(-1, E).gather(1, top_i)
    if cfg.get("norm_topk_prob", True):
        top_w = top_w / (top_w.sum(-1, keepdim=True) + 1e-20)
    top_w = top_w * cfg.get("routed_scaling_factor", 1.0)
    top_i, top_w = top_i.reshape(*m.shape[:-1], k), top_w.reshape(*m.shape[:-1], k)
    out = torch.zeros_like(m)
    for e in range(E):
        out = out + (top_w * (top_i == e)).sum(-1, keepdim=True) * swiglu_mlp(m, W, f"{p}mlp.experts.{e}.")
    if cfg.get("n_shared_experts", 1) > 0:
        out = out + swiglu_mlp(m, W, p + "mlp.shared_experts.")
    return out


def linear(x, W, name):
    y = x @ W[name + ".weight"].T
    return y + W[name + ".bias"] if name + ".bias" in W else y


def sparse_moe(m, W, block, names, experts, k, renormalise):
    """A softmax over the experts, the top k (renormalised over them or not), each a SwiGLU MLP: gate, up, down."""
    probs = torch.softmax(m @ W[block + "gate.weight"].T, -1)
    top_w, top_i = torch.topk(probs, k, -1)
    if renormalise:
        top_w = top_w / top_w.sum(-1, keepdim=True)
    out = torch.zeros_like(m)
    for e in range(experts):
        q = f"{block}experts.{e}."
        y = (torch.nn.functional.silu(m @ W[q + names[0] + ".weight"].T) * (m @ W[q + names[1] + ".weight"].T)) @ W[q + names[2] + ".weight"].T
        out = out + (top_w * (top_i == e)).sum(-1, keepdim=True) * y
    return out


def layer_window(cfg, l):  # HF's sliding window of layer l: by layer_types; else Qwen's use_sliding_window from max_window_layers on; else every layer (Mistral, Mixtral)
    W = cfg.get("sliding_window")
    arch = cfg["architectures"][0]
    if arch == "GptOssForCausalLM":  # (its layer_types; by default the even layers windowed, sliding_window 128)
        types = cfg.get("layer_types") or ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(cfg["num_hidden_layers"])]
        return (W or 128) if types[l] == "sliding_attention" else None
    if not W or arch in ("LlamaForCausalLM", "Glm4MoeForCausalLM"):
        return None
    if arch.startswith("Qwen"):  # (only with use_sliding_window; Qwen3-MoE: every layer; else layer_types, or from max_window_layers on)
        if not cfg.get("use_sliding_window"):
            return None
        if arch == "Qwen3MoeForCausalLM":
            return W
        if cfg.get("layer_types"):
            return W if cfg["layer_types"][l] == "sliding_attention" else None
        return W if l >= cfg.get("max_window_layers", 0) else None
    return W


def decoder_layer(cfg, W, x, l, theta, eps, gpt_oss):  # HF's decoder layer l (model.layers.{l}), its residual stream x in and out
    p = f"model.layers.{l}."
    a = rms_norm(x, W[p + "input_layernorm.weight"], eps)
    glm = cfg["architectures"][0] in ("Glm4MoeForCausalLM", "DeepseekV3ForCausalLM")
    if cfg["architectures"][0] == "DeepseekV3ForCausalLM":
        x = x + deepseek_v3_attention(cfg, a, W, p, theta)
    else:
        x = x + standard_attention(cfg, a, W, p, l, theta, gpt_oss)
    m = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
    if gpt_oss:
        x = x + gpt_oss_moe(cfg, m, W, p)
    elif glm and l >= cfg.get("first_k_dense_replace", 1) and p + "mlp.gate.weight" in W:  # GLM-4.5's and DeepSeek-V3's MoE layers
        x = x + glm4_moe(cfg, m, W, p)
    elif p + "block_sparse_moe.gate.weight" in W:  # Mixtral: softmax, top-k, renormalised
        x = x + sparse_moe(m, W, p + "block_sparse_moe.", ("w1", "w3", "w2"), cfg["num_local_experts"], cfg["num_experts_per_tok"], True)
    elif p + "mlp.gate.weight" in W:  # Qwen3-MoE / Qwen2-MoE: renormalised with norm_topk_prob
        x = x + sparse_moe(m, W, p + "mlp.", ("gate_proj", "up_proj", "down_proj"), cfg["num_experts"], cfg["num_experts_per_tok"],
                           cfg.get("norm_topk_prob", False))
        if p + "mlp.shared_expert.gate_proj.weight" in W:  # Qwen2-MoE: the shared expert times sigmoid(its gate)
            q = p + "mlp.shared_expert."
            y = (torch.nn.functional.silu(m @ W[q + "gate_proj.weight"].T) * (m @ W[q + "up_proj.weight"].T)) @ W[q + "down_proj.weight"].T
            x = x + torch.sigmoid(m @ W[p + "mlp.shared_expert_gate.weight"].T) * y
    else:
        g = linear(m, W, p + "mlp.gate_proj")
        u = linear(m, W, p + "mlp.up_proj")
        x = x + linear(torch.nn.functional.silu(g) * u, W, p + "mlp.down_proj")
    return x


def llama(cfg, W, tokens):  # the logits, and the final norm's output (multi-token prediction's first input)
    gpt_oss = cfg["architectures"][0] == "GptOssForCausalLM"
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 150000.0 if gpt_oss else 10000.0)
    x = W["model.embed_tokens.weight"][tokens]
    for l in range(cfg["num_hidden_layers"]):
        x = decoder_layer(cfg, W, x, l, theta, eps, gpt_oss)
    x = rms_norm(x, W["model.norm.weight"], eps)
    head = W["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings", False) else W["lm_head.weight"]
    return x @ head.T, x


def mtp_losses(cfg, W, ids, hidden):
    """DeepSeek-V3's multi-token prediction modules (its checkpoints' model.layers.{L + k - 1}, as DeepSeek's and vLLM's
    inference code reads them): module k takes the embedding of the tokens k places ahead (its own embed_tokens copy) and the
    previous module's output (the main model's normed hidden state for k = 1), each RMS-normed (enorm, hnorm), concatenated
    [embedding | hidden] through eh_proj, then a decoder layer of its own over the positions that have a token k places
    ahead (causal: the positions after them change nothing before), shared_head.norm and shared_head.head; its cross entropy
    against the labels k places further on, averaged over those positions."""
    L, eps, theta = cfg["num_hidden_layers"], cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    S = ids.shape[1] - 1
    out = []
    for k in range(1, cfg.get("num_nextn_predict_layers", 0) + 1):
        p = f"model.layers.{L + k - 1}."
        e = W[p + "embed_tokens.weight"][ids[:, k:S]]
        x = torch.cat((rms_norm(e, W[p + "enorm.weight"], eps), rms_norm(hidden[:, :S - k], W[p + "hnorm.weight"], eps)), -1)
        x = decoder_layer(cfg, W, x @ W[p + "eh_proj.weight"].T, L + k - 1, theta, eps, False)
        hidden = rms_norm(x, W[p + "shared_head.norm.weight"], eps)
        logits = hidden @ W[p + "shared_head.head.weight"].T
        out.append(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), ids[:, k + 1:].reshape(-1)).item())
    return out


def standard_attention(cfg, a, W, p, l, theta, gpt_oss):  # LLaMA's and the others' (GQA, Qwen3's norms, GLM's partial RoPE, GPT-OSS's sinks)
    B, S, h = a.shape
    nh, ng = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, eps = cfg.get("head_dim", h // nh), cfg["rms_norm_eps"]
    q = linear(a, W, p + "self_attn.q_proj").reshape(B, S, nh, d).transpose(1, 2)
    k = linear(a, W, p + "self_attn.k_proj").reshape(B, S, ng, d).transpose(1, 2)
    v = linear(a, W, p + "self_attn.v_proj").reshape(B, S, ng, d).transpose(1, 2)
    if p + "self_attn.q_norm.weight" in W:  # Qwen3: per head, over the head dimension, before RoPE
        q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
        k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
    glm = cfg["architectures"][0] == "Glm4MoeForCausalLM"
    partial = cfg.get("partial_rotary_factor", cfg.get("rope_parameters", {}).get("partial_rotary_factor", 0.5 if glm else 1.0))
    scaling = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if gpt_oss and not scaling:  # (GptOssConfig's default)
        scaling = {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False,
                   "original_max_position_embeddings": 4096}
    q, k = rope(q, theta, partial, scaling, cfg["max_position_embeddings"]), rope(k, theta, partial, scaling, cfg["max_position_embeddings"])
    k, v = k.repeat_interleave(nh // ng, 1), v.repeat_interleave(nh // ng, 1)
    o = attention(q, k, v, layer_window(cfg, l), W.get(p + "self_attn.sinks")).transpose(1, 2).reshape(B, S, nh * d)
    return linear(o, W, p + "self_attn.o_proj")


def main():
    cfg, W = load_dir(sys.argv[1])
    with open(sys.argv[2]) as f:
        rows = [[int(t) for t in line.split()] for line in f if line.strip()]
    ids = torch.tensor(rows)
    tokens, labels = ids[:, :-1], ids[:, 1:]
    arch = cfg["architectures"][0]
    logits, hidden = (gpt2(cfg, W, tokens), None) if arch == "GPT2LMHeadModel" else llama(cfg, W, tokens)
    if len(sys.argv) > 3 and sys.argv[3] == "--mtp":  # (each multi-token prediction module's loss instead)
        print(" ".join(f"{v:.9g}" for v in mtp_losses(cfg, W, ids, hidden)))
        return
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    print(f"{loss.item():.9g}")


if __name__ == "__main__":
    main()
