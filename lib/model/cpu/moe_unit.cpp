// moe_unit.cpp: the MoE MLP slot on the CPU engine, computed as Megatron-Core's MoELayer: pre-MLP norm, the
// router (fp32, or fp64 with --moe-router-dtype fp64), top-k and capacity, the load-balancing and z losses, the
// dispatch to the experts over the expert grid, the experts' MLPs, the weighted combine, the shared expert,
// dropout and the residual add. Capacity is counted over the microbatch's tokens (all TP ranks'), so a TP split
// drops what one rank drops (Megatron counts per TP rank's shard; see docs/moe.md).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>

#include "config/moe_pattern.h"
#include "model/context_parallel.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/linear.h"
#include "model/cpu/units.h"
#include "model/fp8_scaling.h"
#include "model/moe_input_jitter.h"
#include "model/moe_random_logits.h"

namespace mt::cpu {

MoeOptions MoeOptions::from(const Config& cfg) {
  const MoeConfig& m = cfg.moe;
  MoeOptions o;
  o.router.experts = m.num_experts.value_or(0);
  o.router.topk = m.moe_router_topk;
  o.router.score = score_function_named(m.moe_router_score_function);
  o.router.pre_softmax = m.moe_router_pre_softmax;
  o.router.scaling = m.moe_router_topk_scaling_factor ? static_cast<float>(*m.moe_router_topk_scaling_factor) : 1.0f;
  o.router.num_groups = m.moe_router_num_groups.value_or(0);
  o.router.group_topk = m.moe_router_group_topk.value_or(0);
  o.router_fp64 = m.moe_router_dtype == "fp64";
  o.capacity_factor = m.moe_expert_capacity_factor;
  o.drop_by_probability = m.moe_token_drop_policy == "probs";
  o.pad_to_capacity = m.moe_pad_expert_input_to_capacity;
  for (size_t i = 0; i < 3; ++i) o.aux_coeff[i] = m.aux_loss_coeff(kAuxLossTypes[i]);
  o.z_coeff = m.moe_z_loss_coeff.value_or(0.0);
  o.alltoall = m.moe_token_dispatcher_type == "alltoall" || m.moe_token_dispatcher_type == "flex";  // (flex: the same all-to-all)
  o.probs_on_input = m.moe_apply_probs_on_input;
  o.force_balance = m.moe_router_force_load_balancing;
  o.sinkhorn = m.load_balancing_is("sinkhorn");
  o.quantile = m.load_balancing_is("quantile_balancing");
  o.jitter_eps = static_cast<float>(m.moe_input_jitter_eps.value_or(0.0));
  if (o.sinkhorn) {  // (Megatron's sinkhorn_load_balancing: no pre-softmax flag, scaling, groups or expert bias)
    o.router.score = o.router.topk == 1 ? ScoreFunction::kSigmoid : ScoreFunction::kSoftmax;
    o.router.pre_softmax = o.router.topk > 1;
    o.router.scaling = 1.0f;
    o.router.num_groups = o.router.group_topk = 0;
  }
  return o;
}

namespace {

// The routed experts' MLPs over their rows (expert-major, per_expert rows each). Under FP8 (the layer's GEMMs in FP8)
// each expert's GEMMs quantise with scales of their own, from the amaxes of that expert's rows, weight and output
// gradient (Transformer Engine's grouped linear: a quantiser per GEMM), reduced over TP (= expert-TP: its weight and
// column shards) and CP (its rows) as a dense layer's (megatrain's choice, so that those layouts compute one rank's
// function: Megatron's experts reduce no amax over TP); every expert takes part, with rows or not, so that those
// reductions meet on every rank.
void experts_forward(const PassContext& c, const LayerParams& ly, MoeUnit::Stash& A, Buf& y) {
  const ModelDims& D = c.D;
  const int64_t h = D.h, F = D.F_moe_local, fc1_out = F * (D.swiglu ? 2 : 1);
  const bool fp8 = D.fp8_layer(ly.layer);
  int64_t N = 0;
  for (int64_t n : A.per_expert) N += n;
  A.fc1.resize(sz(N * fc1_out));
  A.act.resize(sz(N * F));
  y.resize(sz(N * h));
  if (fp8) {
    A.fc1_lin.resize(ly.experts.size());
    A.fc2_lin.resize(ly.experts.size());
  }
  int64_t off = 0;
  for (size_t j = 0; j < ly.experts.size(); ++j) {
    const int64_t n = A.per_expert[j];
    const LayerParams::Expert& ex = ly.experts[j];
    if (n > 0 || fp8) {
      const int fc1_site = fp8_expert_site(static_cast<int64_t>(j), false), fc2_site = fp8_expert_site(static_cast<int64_t>(j), true);
      float* fc1 = A.fc1.data() + off * fc1_out;
      float* act = A.act.data() + off * F;
      if (fp8) linear_unit_forward(c, ly.layer, fc1_site, A.fc1_lin[j], fc1, A.rows.data() + off * h, ex.fc1_w, ex.fc1_b, n, h, fc1_out);
      else linear_forward(fc1, A.rows.data() + off * h, c.P(ex.fc1_w), ex.fc1_b != kNoParam ? c.P(ex.fc1_b) : nullptr, n, h, fc1_out);
      mlp_activation_forward(D, act, fc1, n, F);
      if (fp8) linear_unit_forward(c, ly.layer, fc2_site, A.fc2_lin[j], y.data() + off * h, act, ex.fc2_w, ex.fc2_b, n, F, h);
      else linear_forward(y.data() + off * h, act, c.P(ex.fc2_w), ex.fc2_b != kNoParam ? c.P(ex.fc2_b) : nullptr, n, F, h);
    }
    off += n;
  }
}

// Their backward under FP8: each expert's two GEMMs' backward in the layer's precision (its data gradients, then its
// weight and bias gradients through c.weight_grad, each expert's FP8 operands kept in its stashes until then).
void experts_backward_fp8(const PassContext& c, const LayerParams& ly, MoeUnit::Stash& A, const Buf& dy, Buf& dx) {
  const ModelDims& D = c.D;
  const int64_t h = D.h, F = D.F_moe_local, fc1_out = F * (D.swiglu ? 2 : 1);
  const int64_t N = static_cast<int64_t>(dy.size()) / h;
  Buf dact(sz(N * F)), dfc1(sz(N * fc1_out));
  dx.resize(sz(N * h));
  int64_t off = 0;
  for (size_t j = 0; j < ly.experts.size(); ++j) {
    const int64_t n = A.per_expert[j];
    const LayerParams::Expert& ex = ly.experts[j];
    float* da = dact.data() + off * F;
    float* df = dfc1.data() + off * fc1_out;
    const float* fc1 = A.fc1.data() + off * fc1_out;
    const int fc1_site = fp8_expert_site(static_cast<int64_t>(j), false), fc2_site = fp8_expert_site(static_cast<int64_t>(j), true);
    linear_unit_backward(c, ly.layer, fc2_site, A.fc2_lin[j], da, dy.data() + off * h, ex.fc2_w, ex.fc2_b, A.act.data() + off * F, n, F, h);
    mlp_activation_backward(D, df, da, fc1, n, F);
    linear_unit_backward(c, ly.layer, fc1_site, A.fc1_lin[j], dx.data() + off * h, df, ex.fc1_w, ex.fc1_b, A.rows.data() + off * h, n, h, fc1_out);
    off += n;
  }
}

void experts_backward(const PassContext& c, const LayerParams& ly, MoeUnit::Stash& A, const Buf& dy, Buf& dx) {
  if (c.D.fp8_layer(ly.layer)) {
    experts_backward_fp8(c, ly, A, dy, dx);
    return;
  }
  const ModelDims& D = c.D;
  const int64_t h = D.h, F = D.F_moe_local, fc1_out = F * (D.swiglu ? 2 : 1);
  const int64_t N = static_cast<int64_t>(dy.size()) / h;
  Buf dact(sz(N * F)), dfc1(sz(N * fc1_out));
  dx.resize(sz(N * h));
  int64_t off = 0;
  for (size_t j = 0; j < ly.experts.size(); ++j) {
    const int64_t n = A.per_expert[j];
    if (n > 0) {
      linear_backward_input(dact.data() + off * F, dy.data() + off * h, c.P(ly.experts[j].fc2_w), n, F, h);
      mlp_activation_backward(D, dfc1.data() + off * fc1_out, dact.data() + off * F, A.fc1.data() + off * fc1_out, n, F);
      linear_backward_input(dx.data() + off * h, dfc1.data() + off * fc1_out, c.P(ly.experts[j].fc1_w), n, h, fc1_out);
    }
    off += n;
  }
  const LayerParams* layer = &ly;
  c.weight_grad(dy.data(), N * h, [&c, &A, layer, h, F](const float* g) {
    int64_t at = 0;
    for (size_t j = 0; j < layer->experts.size(); ++j) {
      const int64_t n = A.per_expert[j];
      const LayerParams::Expert& ex = layer->experts[j];
      if (n > 0) linear_backward_weight(c.G(ex.fc2_w), ex.fc2_b != kNoParam ? c.G(ex.fc2_b) : nullptr, g + at * h, A.act.data() + at * F, n, F, h);
      at += n;
    }
  });
  c.weight_grad(dfc1.data(), N * fc1_out, [&c, &A, layer, h, fc1_out](const float* g) {
    int64_t at = 0;
    for (size_t j = 0; j < layer->experts.size(); ++j) {
      const int64_t n = A.per_expert[j];
      const LayerParams::Expert& ex = layer->experts[j];
      if (n > 0) {
        linear_backward_weight(c.G(ex.fc1_w), ex.fc1_b != kNoParam ? c.G(ex.fc1_b) : nullptr, g + at * fc1_out, A.rows.data() + at * h, n, h,
                               fc1_out);
      }
      at += n;
    }
  });
}

void router_logits(const PassContext& c, const LayerParams& ly, const MoeOptions& o, const float* ln, int64_t n, float* logits) {
  const int64_t h = c.D.h, E = c.D.experts;
  const float* w = c.P(ly.router_w);
  const float* b = ly.router_b != kNoParam ? c.P(ly.router_b) : nullptr;
  if (!o.router_fp64) {
    linear_forward(logits, ln, w, b, n, h, E);
    return;
  }
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      double s = b ? b[e] : 0.0;
      for (int64_t i = 0; i < h; ++i) s += static_cast<double>(ln[t * h + i]) * w[e * h + i];
      logits[t * E + e] = static_cast<float>(s);
    }
  }
}

// Which of this rank's top-k choices fit their expert's capacity, decided over the microbatch's tokens (every TP
// and CP rank's, in Megatron's token order); and, padding to capacity, the extra tokens each expert receives
// (this rank's, local indices).
void apply_capacity(const PassContext& c, const MoeOptions& o, MoeUnit::Stash& A, std::vector<std::vector<int64_t>>& pads) {
  const ModelDims& D = c.D;
  const int64_t Tl = c.Tl, T = c.T, k = D.topk, E = D.experts, cp = D.cp, all_tokens = T * cp;
  A.keep.assign(sz(Tl * k), 1);
  pads.assign(sz(E), {});
  if (!o.capacity_factor) return;
  const int64_t capacity = expert_capacity(*o.capacity_factor, all_tokens, k, E);
  if (capacity > all_tokens) return;  // Megatron: no dropping when every token fits
  // Gathered rank-major: CP rank, then TP rank (under SP), then the rank's rows.
  std::vector<float> top_f(sz(Tl * k)), weight(A.weight);
  for (int64_t i = 0; i < Tl * k; ++i) top_f[sz(i)] = static_cast<float>(A.top[sz(i)]);
  auto gather = [&](Communicator& g, std::vector<float>& v) {
    std::vector<float> all(v.size() * sz(g.size()));
    g.all_gather(v.data(), all.data(), static_cast<int64_t>(v.size()));
    v = std::move(all);
  };
  if (D.sequence_parallel) {
    gather(*c.groups.tp, top_f);
    gather(*c.groups.tp, weight);
  }
  if (cp > 1) {
    gather(*c.groups.cp, top_f);
    gather(*c.groups.cp, weight);
  }
  std::vector<int32_t> top(top_f.size());
  for (size_t i = 0; i < top.size(); ++i) top[i] = static_cast<int32_t>(top_f[i]);
  // Megatron's order: place in the sequence, then sequence.
  const int64_t S = c.mb.S, chunk = S / 2;
  std::vector<int64_t> order(sz(all_tokens));
  std::vector<std::pair<int64_t, int64_t>> key(sz(all_tokens));
  for (int64_t g = 0; g < all_tokens; ++g) {
    const int64_t rank = g / T, t = g % T, s = t % S;
    const int64_t pos = cp > 1 ? context_parallel_position(s, rank, cp, chunk) : s;
    key[sz(g)] = {pos, t / S};
    order[sz(g)] = g;
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key[sz(a)] < key[sz(b)]; });
  std::vector<uint8_t> keep(sz(all_tokens * k));
  capacity_keep(top.data(), weight.data(), order, k, E, capacity, o.drop_by_probability, keep.data());
  const int64_t mine = c.groups.cp->rank() * T + c.t0;  // this rank's first row in the gathered order
  std::copy(keep.begin() + mine * k, keep.begin() + (mine + Tl) * k, A.keep.begin());
  if (!o.pad_to_capacity) return;
  const auto all_pads = capacity_padding(top.data(), keep.data(), order, k, E, capacity);
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t t : all_pads[sz(e)]) {
      if (t >= mine && t < mine + Tl) pads[sz(e)].push_back(t - mine);
    }
  }
}

// --moe-input-jitter-eps: f(i, factor) for element i of this rank's [Tl, h] router input, the factor its token's noise.
template <typename F>
void for_each_jitter(const PassContext& c, const LayerParams& ly, const MoeOptions& o, F f) {
  const int64_t h = c.D.h;
  const uint64_t key = moe_input_jitter_key(c.seed);
  for (int64_t t = 0; t < c.Tl; ++t) {
    const int64_t sample = c.mb.first_sample + (c.t0 + t) / c.mb.S, position = sequence_position(c.mb, c.t0 + t);
    for (int64_t i = 0; i < h; ++i) f(t * h + i, moe_input_jitter(key, o.jitter_eps, ly.layer, sample, position, c.D.S, h, i));
  }
}

// rows (this rank's tokens' rows) replaced by every rank's of the microbatch: gathered over TP (under SP), then CP
// (Megatron's tp_cp group), in rank order.
void gather_microbatch_rows(const PassContext& c, std::vector<float>& rows) {
  auto gather = [&](Communicator& g) {
    std::vector<float> all(rows.size() * sz(g.size()));
    g.all_gather(rows.data(), all.data(), static_cast<int64_t>(rows.size()));
    rows = std::move(all);
  };
  if (c.D.sequence_parallel && c.groups.tp->size() > 1) gather(*c.groups.tp);
  if (c.D.cp > 1) gather(*c.groups.cp);
}

// --moe-router-load-balancing-type sinkhorn (training): the choice scores of this rank's tokens, Sinkhorn-normalised over
// the microbatch's tokens. The logits are gathered over TP (under SP) and CP and placed in the batch's order (sample,
// then position), so that every layout normalises the same matrix as one rank. (Megatron normalises each rank's own
// tokens: under TP + SP or CP its choice depends on the layout.)
std::vector<float> sinkhorn_choice(const PassContext& c, const float* logits) {
  const ModelDims& D = c.D;
  const int64_t Tl = c.Tl, E = D.experts, row = E + 1;
  std::vector<float> rows(sz(Tl * row));  // each row: its place in the microbatch, then its logits
  std::vector<int64_t> place(sz(Tl));
  for (int64_t t = 0; t < Tl; ++t) {
    place[sz(t)] = (c.t0 + t) / c.mb.S * D.S + sequence_position(c.mb, c.t0 + t);
    rows[sz(t * row)] = static_cast<float>(place[sz(t)]);  // (exact: a microbatch holds far fewer than 2^24 tokens)
    std::copy(logits + t * E, logits + (t + 1) * E, rows.begin() + t * row + 1);
  }
  gather_microbatch_rows(c, rows);
  const int64_t n = static_cast<int64_t>(rows.size()) / row;
  std::vector<float> ordered(sz(n * E));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t at = static_cast<int64_t>(rows[sz(i * row)]);
    if (at < 0 || at >= n) throw std::logic_error("sinkhorn: a token's place outside the microbatch");
    std::copy(rows.begin() + i * row + 1, rows.begin() + (i + 1) * row, ordered.begin() + at * E);
  }
  const std::vector<float> normalised = sinkhorn_normalize(ordered.data(), n, E);
  std::vector<float> mine(sz(Tl * E));
  for (int64_t t = 0; t < Tl; ++t) std::copy(normalised.begin() + place[sz(t)] * E, normalised.begin() + (place[sz(t)] + 1) * E, mine.begin() + t * E);
  return mine;
}

// Sums over the ranks holding the rest of the microbatch's tokens: TP (under SP) and CP (Megatron's tp_cp group).
void sum_over_microbatch(const PassContext& c, double* v, int64_t n) {
  if (c.groups.tp->size() > 1) c.groups.tp->all_reduce(v, n, ReduceOp::kSum);
  if (c.D.cp > 1) c.groups.cp->all_reduce(v, n, ReduceOp::kSum);
}

// seq_aux_loss: the aux loss per sequence, averaged over the microbatch's sequences. Returns its value (without the
// coefficient, over the TP group's tokens) and adds d(coeff * loss)/d(scores) to dscores.
double sequence_balance_loss(const PassContext& c, const Buf& scores, double coeff, std::vector<float>& dscores) {
  const ModelDims& D = c.D;
  const int64_t Tl = c.Tl, E = D.experts, k = D.topk;
  const int64_t B = c.mb.B, S = c.mb.S * D.cp;  // the whole sequence's length (CP: every rank's share)
  std::vector<double> counts(sz(B * E), 0.0), probs(sz(B * E), 0.0);
  for (int64_t t = 0; t < Tl; ++t) {
    const int64_t b = (c.t0 + t) / c.mb.S;
    std::vector<double> one(sz(E), 0.0);
    aux_topk_counts(&scores[sz(t * E)], 1, E, k, one.data());
    for (int64_t e = 0; e < E; ++e) {
      counts[sz(b * E + e)] += one[sz(e)];
      probs[sz(b * E + e)] += scores[sz(t * E + e)];
    }
  }
  sum_over_microbatch(c, counts.data(), B * E);
  sum_over_microbatch(c, probs.data(), B * E);
  const double C = static_cast<double>(E) / (static_cast<double>(k) * S * S) / static_cast<double>(B);
  double value = 0;
  for (int64_t i = 0; i < B * E; ++i) value += probs[sz(i)] * counts[sz(i)];
  for (int64_t t = 0; t < Tl; ++t) {
    const int64_t b = (c.t0 + t) / c.mb.S;
    for (int64_t e = 0; e < E; ++e) dscores[sz(t * E + e)] += static_cast<float>(coeff * C * counts[sz(b * E + e)]);
  }
  return C * value;
}

// aux_loss over the microbatch's tokens, or global_aux_loss (global: the counts over DP too, averaged over the
// iteration's microbatches so far; its value summed over DP, as Megatron logs it). Returns the value without the
// coefficient and adds d(coeff * loss)/d(scores) to dscores.
double batch_balance_loss(const PassContext& c, const Buf& scores, double coeff, bool global, std::vector<float>& dscores, MoeLayerStats& st) {
  const ModelDims& D = c.D;
  const int64_t Tl = c.Tl, T = c.T, E = D.experts, k = D.topk;
  std::vector<double> counts(sz(E), 0.0), probs(sz(E), 0.0);
  aux_topk_counts(scores.data(), Tl, E, k, counts.data());
  for (int64_t t = 0; t < Tl; ++t) {
    for (int64_t e = 0; e < E; ++e) probs[sz(e)] += scores[sz(t * E + e)];
  }
  sum_over_microbatch(c, counts.data(), E);
  double tokens = static_cast<double>(T * D.cp);
  if (global) {
    c.groups.dp->all_reduce(counts.data(), E, ReduceOp::kSum);
    st.global_counts.resize(sz(E), 0.0);
    for (int64_t e = 0; e < E; ++e) st.global_counts[sz(e)] += counts[sz(e)];
    ++st.global_steps;
    for (int64_t e = 0; e < E; ++e) counts[sz(e)] = st.global_counts[sz(e)] / static_cast<double>(st.global_steps);
    tokens *= static_cast<double>(c.groups.dp->size());
  }
  const double C = static_cast<double>(E) / (static_cast<double>(k) * tokens * tokens);
  for (int64_t t = 0; t < Tl; ++t) {
    for (int64_t e = 0; e < E; ++e) dscores[sz(t * E + e)] += static_cast<float>(coeff * C * counts[sz(e)]);
  }
  double value = 0;
  for (int64_t e = 0; e < E; ++e) value += probs[sz(e)] * counts[sz(e)];
  value *= C;
  sum_over_microbatch(c, &value, 1);
  if (global) c.groups.dp->all_reduce(&value, 1, ReduceOp::kSum);
  return value;
}

// The load-balancing losses chosen (one, or Megatron's list form: several, a coefficient each): each value (without
// its coefficient) added to st.aux at its type's index, and the sum of d(coeff * loss)/d(scores) in A.aux_dscores.
void balance_losses(const PassContext& c, const MoeOptions& o, MoeUnit::Stash& A, MoeLayerStats& st) {
  const int64_t Tl = c.Tl, E = c.D.experts;
  Buf scores(sz(Tl * E));
  aux_scores(A.logits.data(), Tl, E, o.router.score, scores.data());
  A.aux_dscores.assign(sz(Tl * E), 0.0f);
  if (o.aux_coeff[0] > 0) st.aux[0] += batch_balance_loss(c, scores, o.aux_coeff[0], false, A.aux_dscores, st);
  if (o.aux_coeff[1] > 0) st.aux[1] += sequence_balance_loss(c, scores, o.aux_coeff[1], A.aux_dscores);
  if (o.aux_coeff[2] > 0) st.aux[2] += batch_balance_loss(c, scores, o.aux_coeff[2], true, A.aux_dscores, st);
}

// --moe-router-load-balancing-type quantile_balancing (Megatron's qb_dual_update): the choice scores of this rank's tokens,
// logits - qb_beta (route_topk takes their top k; the weights stay the score function's). In training, alpha is each
// token's (k + 1)-th largest choice score, and each expert's quantile the (m k / E + 1)-th largest of logits - alpha over
// the microbatch's m tokens (gathered over TP under SP, and CP: Megatron's tp_cp group); it is added to st.quantile_sum.
std::vector<float> quantile_choice(const PassContext& c, const LayerParams& ly, const float* logits, bool training, MoeLayerStats& st) {
  const ModelDims& D = c.D;
  const int64_t Tl = c.Tl, E = D.experts, k = D.topk;
  std::vector<float> choice(sz(Tl * E)), shifted(sz(Tl * E));
  quantile_choice_scores(logits, c.P(ly.quantile_bias), Tl, E, k, choice.data(), shifted.data());
  if (!training) return choice;
  gather_microbatch_rows(c, shifted);
  std::vector<float> quantile(sz(E));
  column_quantiles(shifted.data(), static_cast<int64_t>(shifted.size()) / E, E, k, quantile.data());
  st.quantile_sum.resize(sz(E), 0.0);
  for (int64_t e = 0; e < E; ++e) st.quantile_sum[sz(e)] += quantile[sz(e)];
  ++st.quantile_count;
  return choice;
}

// A 24-bit hash of one routing choice (splitmix64 of its fields).
double choice_hash(int64_t sample, int64_t position, int64_t expert, bool kept) {
  uint64_t z = static_cast<uint64_t>(sample) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(position) << 20 ^ static_cast<uint64_t>(expert) << 40 ^
               (kept ? 0x5bd1e995ull : 0ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return static_cast<double>(z >> 40);
}

// (in the layer's precision: under FP8 its GEMMs too, as Megatron's shared expert's Transformer Engine linear layers)
MlpBody shared_body(const PassContext& c, const LayerParams& ly) {
  return MlpBody{ly.shared_fc1_w, ly.shared_fc1_b, ly.shared_fc2_w, c.D.F_shared_local, ly.layer};
}

}  // namespace

void MoeUnit::forward(const PassContext& c, Buf& x, Stash& A) const {
  const ModelDims& D = c.D;
  const LayerParams& ly = *p;
  const MoeOptions& o = *opt;
  const int64_t Tl = c.Tl, h = D.h, E = D.experts, k = D.topk;
  A.x = std::move(x);
  A.ln.resize(sz(Tl * h));
  A.mean.resize(sz(Tl));
  A.rstd.resize(sz(Tl));
  c.norm_forward(A.ln.data(), A.mean.data(), A.rstd.data(), A.x.data(), ly.mlp_norm_w, ly.mlp_norm_b, Tl, h);
  A.logits.resize(sz(Tl * E));
  if (o.jitter_eps > 0) {  // (Megatron's apply_input_jitter: the router's input only, in training and evaluation)
    A.jittered.resize(sz(Tl * h));
    for_each_jitter(c, ly, o, [&](int64_t i, float factor) { A.jittered[sz(i)] = A.ln[sz(i)] * factor; });
  }
  router_logits(c, ly, o, o.jitter_eps > 0 ? A.jittered.data() : A.ln.data(), Tl, A.logits.data());
  if (o.force_balance) {  // (the backward then takes them for the router's: the gradient straight through)
    const uint64_t key = moe_random_logits_key(c.seed);
    for (int64_t t = 0; t < Tl; ++t) {
      const int64_t sample = c.mb.first_sample + (c.t0 + t) / c.mb.S, position = sequence_position(c.mb, c.t0 + t);
      for (int64_t e = 0; e < E; ++e) A.logits[sz(t * E + e)] = moe_random_logit(key, ly.layer, sample, position, D.S, E, e);
    }
  }
  MoeLayerStats scratch;
  MoeLayerStats& st = c.moe_stats ? (*c.moe_stats)[ly.layer] : scratch;
  const bool training = c.training;
  A.z_scale = 0;
  if (training && o.z_coeff > 0) {  // Megatron: coeff / (TP x CP) times the mean over this rank's tokens
    double z = z_loss_sum(A.logits.data(), Tl, E);
    sum_over_microbatch(c, &z, 1);
    const double all_tokens = static_cast<double>(c.T * D.cp);
    st.z += z / all_tokens;
    A.z_scale = static_cast<float>(o.z_coeff / all_tokens);
  }
  A.top.resize(sz(Tl * k));
  A.weight.resize(sz(Tl * k));
  const std::vector<float> choice = o.sinkhorn && training ? sinkhorn_choice(c, A.logits.data())
                                   : o.quantile           ? quantile_choice(c, ly, A.logits.data(), training, st)
                                                          : std::vector<float>();
  route_topk(o.router, A.logits.data(), ly.expert_bias != kNoParam ? c.P(ly.expert_bias) : nullptr, Tl, A.top.data(), A.weight.data(),
             choice.empty() ? nullptr : choice.data());
  std::vector<std::vector<int64_t>> pads;
  apply_capacity(c, o, A, pads);
  std::vector<Assignment> mine;
  st.tokens.resize(sz(E), 0.0);
  for (int64_t t = 0; t < Tl; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      const size_t i = sz(t * k + j);
      st.routed += 1;
      st.routing_digest += choice_hash(c.mb.first_sample + (c.t0 + t) / c.mb.S, sequence_position(c.mb, c.t0 + t), A.top[i], A.keep[i] != 0);
      if (!A.keep[i]) {
        A.weight[i] = 0;  // Megatron: the dropped choices' probabilities masked out
        st.dropped += 1;
        continue;
      }
      mine.push_back({t, A.top[i], static_cast<int32_t>(j), A.weight[i]});
      st.tokens[sz(A.top[i])] += 1;
    }
  }
  for (int64_t e = 0; e < E; ++e) {
    for (int64_t t : pads[sz(e)]) mine.push_back({t, static_cast<int32_t>(e), -1, 0.0f});
  }
  std::stable_sort(mine.begin(), mine.end(), [](const Assignment& a, const Assignment& b) {
    return a.expert < b.expert || (a.expert == b.expert && a.token < b.token);
  });
  A.aux_dscores.clear();
  if (training && o.aux_enabled()) balance_losses(c, o, A, st);
  if (training) ++st.microbatches;

  A.dispatcher = TokenDispatcher(o.alltoall);
  if (o.probs_on_input) {
    // Megatron's moe_apply_probs_on_input (top-1): the expert's input row is the token's norm output times its routing
    // weight, and the combine adds the expert's output unweighted (the weights sent with the rows are 1).
    A.scaled_ln.assign(sz(Tl * h), 0.0f);
    for (Assignment& a : mine) {
      const float w = a.weight;
      for (int64_t i = 0; i < h; ++i) A.scaled_ln[sz(a.token * h + i)] = w * A.ln[sz(a.token * h + i)];
      a.weight = 1.0f;
    }
  }
  A.dispatcher.dispatch(c, mine, o.probs_on_input ? A.scaled_ln.data() : A.ln.data(), A.rows, A.per_expert);
  Buf y, out;
  experts_forward(c, ly, A, y);
  A.dispatcher.combine(c, y, out);
  if (ly.shared_fc1_w != kNoParam) {
    Buf shared;
    shared_body(c, ly).forward(c, A.ln.data(), shared, A.shared);
    if (ly.shared_gate_w != kNoParam) {  // (Megatron's shared expert gate: the output times sigmoid(ln . g) per token)
      const float* g = c.P(ly.shared_gate_w);
      A.shared_gate.resize(sz(Tl));
      for (int64_t t = 0; t < Tl; ++t) {
        double logit = 0;
        for (int64_t i = 0; i < h; ++i) logit += static_cast<double>(A.ln[sz(t * h + i)]) * g[i];
        A.shared_gate[sz(t)] = static_cast<float>(1.0 / (1.0 + std::exp(-logit)));
      }
      A.shared_out = shared;
      for (int64_t i = 0; i < Tl * h; ++i) shared[sz(i)] *= A.shared_gate[sz(i / h)];
    }
    for (int64_t i = 0; i < Tl * h; ++i) out[sz(i)] += shared[sz(i)];
  }
  c.dropout_tokens(out.data(), ly.layer, kDropMlpOut, false);
  x.resize(sz(Tl * h));
  for (int64_t i = 0; i < Tl * h; ++i) x[sz(i)] = A.x[sz(i)] + out[sz(i)];
}

void MoeUnit::backward(const PassContext& c, const Buf& dout, Buf& dx, Stash& A) const {
  const ModelDims& D = c.D;
  const LayerParams& ly = *p;
  const MoeOptions& o = *opt;
  const int64_t Tl = c.Tl, h = D.h, E = D.experts;
  Buf branch = dout, dln(sz(Tl * h), 0.0f);
  c.dropout_tokens(branch.data(), ly.layer, kDropMlpOut, true);
  if (ly.shared_fc1_w != kNoParam && ly.shared_gate_w != kNoParam) {
    // The gate: the shared expert's output gradient times the gate; the gate's logit gradient (the output gradient's dot
    // with the ungated output, times s (1 - s)) into its weight (a partial sum over this rank's tokens, as a norm's) and
    // into the norm output's gradient.
    const float* g = c.P(ly.shared_gate_w);
    float* dg = c.G(ly.shared_gate_w);
    Buf dshared(sz(Tl * h)), dlogit(sz(Tl));
    for (int64_t t = 0; t < Tl; ++t) {
      const float s = A.shared_gate[sz(t)];
      double dot = 0;
      for (int64_t i = 0; i < h; ++i) {
        dot += static_cast<double>(branch[sz(t * h + i)]) * A.shared_out[sz(t * h + i)];
        dshared[sz(t * h + i)] = branch[sz(t * h + i)] * s;
      }
      dlogit[sz(t)] = static_cast<float>(dot * s * (1.0 - s));
    }
    shared_body(c, ly).backward(c, dshared.data(), dln, A.shared);
    for (int64_t i = 0; i < h; ++i) {
      double sum = 0;
      for (int64_t t = 0; t < Tl; ++t) sum += static_cast<double>(dlogit[sz(t)]) * A.ln[sz(t * h + i)];
      dg[i] += static_cast<float>(sum);
    }
    for (int64_t t = 0; t < Tl; ++t) {
      for (int64_t i = 0; i < h; ++i) dln[sz(t * h + i)] += dlogit[sz(t)] * g[i];
    }
  } else if (ly.shared_fc1_w != kNoParam) {
    shared_body(c, ly).backward(c, branch.data(), dln, A.shared);
  }
  Buf dy, dweight, drows;
  A.dispatcher.combine_backward(c, branch, dy, dweight);
  experts_backward(c, ly, A, dy, drows);
  if (o.probs_on_input) {
    // Through the scaled input instead: each kept choice's weight gradient is its input gradient's dot with the token's
    // norm output, and the norm output's gradient takes the weight (the combine's weights were constants).
    Buf dscaled(sz(Tl * h), 0.0f);
    A.dispatcher.dispatch_backward(c, drows, dscaled);
    for (int64_t t = 0; t < Tl; ++t) {
      const size_t i = sz(t * D.topk);
      dweight[i] = 0;
      if (!A.keep[i]) continue;
      double dot = 0;
      for (int64_t j = 0; j < h; ++j) {
        dot += static_cast<double>(dscaled[sz(t * h + j)]) * A.ln[sz(t * h + j)];
        dln[sz(t * h + j)] += A.weight[i] * dscaled[sz(t * h + j)];
      }
      dweight[i] = static_cast<float>(dot);
    }
  } else {
    A.dispatcher.dispatch_backward(c, drows, dln);
  }
  // The router: through the routing weights, plus the auxiliary losses' gradients (scaled as the lm loss's). With
  // --calculate-per-token-loss the gradients are divided by the global batch's loss tokens at the step, so the aux and z
  // losses are multiplied by the microbatch's tokens, as Megatron's router does (its intent: the same scale as without
  // the flag when every token counts). Megatron multiplies by the rank's own routed tokens, which under SP is T / TP with
  // the TP ranks' gradients summed; the microbatch's tokens (the TP group's, and under CP every CP rank's through the
  // lm loss's CP factor) keep every layout equal to one rank (docs/moe.md).
  const float aux_scale = c.loss_grad_scale * (c.D.per_token_loss ? static_cast<float>(c.T * c.D.cp) : 1.0f);
  Buf dlogits(sz(Tl * E));
  route_topk_backward(o.router, A.logits.data(), A.top.data(), dweight.data(), Tl, dlogits.data());
  if (!A.aux_dscores.empty()) {
    Buf scaled(A.aux_dscores.size());
    for (size_t i = 0; i < scaled.size(); ++i) scaled[i] = A.aux_dscores[i] * aux_scale;
    aux_scores_backward(A.logits.data(), scaled.data(), Tl, E, o.router.score, dlogits.data());
  }
  if (A.z_scale > 0) z_loss_backward(A.logits.data(), Tl, E, A.z_scale * aux_scale, dlogits.data());
  Buf dln_router(sz(Tl * h));
  linear_backward_input(dln_router.data(), dlogits.data(), c.P(ly.router_w), Tl, h, E);
  if (o.jitter_eps > 0) {  // (through the noise: the router's input was the norm output times it)
    for_each_jitter(c, ly, o, [&](int64_t i, float factor) { dln_router[sz(i)] *= factor; });
  }
  for (int64_t i = 0; i < Tl * h; ++i) dln[sz(i)] += dln_router[sz(i)];
  const size_t rw = ly.router_w, rb = ly.router_b;
  const bool jittered = o.jitter_eps > 0;
  c.weight_grad(dlogits.data(), Tl * E, [&c, &A, jittered, rw, rb, Tl, h, E](const float* g) {
    linear_backward_weight(c.G(rw), rb != kNoParam ? c.G(rb) : nullptr, g, jittered ? A.jittered.data() : A.ln.data(), Tl, h, E);
  });
  dx.resize(sz(Tl * h));
  c.norm_backward(dx.data(), dln.data(), A.x.data(), A.mean.data(), A.rstd.data(), ly.mlp_norm_w, ly.mlp_norm_b, Tl, h);
  for (int64_t i = 0; i < Tl * h; ++i) dx[sz(i)] += dout[sz(i)];
}

}  // namespace mt::cpu
