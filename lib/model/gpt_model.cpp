// gpt_model.cpp: the CPU engine's stage: its units over the shared layout, the per-microbatch stash, and
// the per-layer reductions and grads-ready hook that follow each layer's backward.
#include "model/gpt_model.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>

#include "model/cpu/units.h"

namespace mt {

struct GPTModel::Units {
  cpu::EmbeddingUnit embedding;
  std::vector<cpu::AttentionUnit> attention;
  std::vector<cpu::MlpUnit> mlp;
  std::vector<cpu::MoeUnit> moe;  // per layer; used where the layer is an MoE layer
  cpu::OutputUnit output;
  // Multi-token prediction's modules (the last stage): the shifted tokens' embedding (the model's tables), the input
  // projection, the transformer layer, and its norm with the model's output layer and loss.
  struct Mtp {
    cpu::EmbeddingUnit embedding;
    cpu::MtpUnit combine;
    cpu::AttentionUnit attention;
    cpu::MlpUnit mlp;
    cpu::MoeUnit moe;
    cpu::OutputUnit output;
  };
  std::vector<Mtp> mtp;
};

// One microbatch in flight: its inputs, the pass context its queued work refers to, and each unit's stash.
struct GPTModel::Record {
  Microbatch mb;
  std::unique_ptr<cpu::PassContext> ctx;
  std::vector<cpu::AttentionUnit::Stash> attention;
  std::vector<cpu::MlpUnit::Stash> mlp;
  std::vector<cpu::MoeUnit::Stash> moe;
  cpu::OutputUnit::Stash output;
  cpu::WeightGradQueue deferred;
  // Multi-token prediction (training forwards): each module's shifted microbatch and the pass context its embedding and
  // loss read (its layer reads the model's), and its units' stashes.
  struct Mtp {
    cpu::MtpUnit::Stash combine;
    cpu::AttentionUnit::Stash attention;
    cpu::MlpUnit::Stash mlp;
    cpu::MoeUnit::Stash moe;
    cpu::OutputUnit::Stash output;
  };
  std::vector<Microbatch> mtp_mb;
  std::vector<std::unique_ptr<cpu::PassContext>> mtp_ctx;
  std::vector<Mtp> mtp;
};

GPTModel::GPTModel(const Config& cfg, ProcessGroups groups)
    : dims_(model_dims(cfg, groups.tp->rank(), groups.tp->size(), groups.ep->rank(), groups.ep->size(), groups.expert_tp->rank(),
                       groups.expert_tp->size())),
      groups_(std::move(groups)),
      seed_(static_cast<uint64_t>(cfg.training.seed)),
      moe_options_(std::make_unique<cpu::MoeOptions>(cpu::MoeOptions::from(cfg))) {
  const ModelDims& D = dims_;
  // K/V replication (query groups below TP, as Megatron): the ranks of a group hold the same QKV shard.
  if (D.kv_rep > 1) {
    kv_group_ = groups_.tp->sub_group(static_cast<int>(D.tp_rank / D.kv_rep), static_cast<int>(D.tp_rank), "kv-replica");
  }
  LayoutCoordinates at;
  at.tp_rank = D.tp_rank;
  at.tp_size = D.tp;
  at.pp_rank = groups_.pp->rank();
  at.pp_size = groups_.pp->size();
  at.ep_rank = D.ep_rank;
  at.ep_size = D.ep;
  at.etp_rank = D.etp_rank;
  at.etp_size = D.etp;
  layouts_ = build_model_chunks(cfg, at, params_);
  for (const ModelLayout& layout : layouts_) {
    auto u = std::make_unique<Units>();
    u->embedding.word = layout.word_embeddings;
    u->embedding.position = layout.position_embeddings;
    for (const LayerParams& ly : layout.layers) {
      u->attention.push_back(cpu::AttentionUnit{&ly});
      u->mlp.push_back(cpu::MlpUnit{&ly});
      u->moe.push_back(cpu::MoeUnit{&ly, moe_options_.get()});
    }
    u->output.norm_w = layout.final_norm_w;
    u->output.norm_b = layout.final_norm_b;
    u->output.weight = layout.output_w;
    for (const MtpParams& mp : layout.mtp) {
      Units::Mtp m;
      m.embedding.word = layout.mtp_embedding;
      m.embedding.position = layout.position_embeddings;  // (learned positions: one stage only, refused with pipeline parallelism)
      m.embedding.dropout_layer = mp.layer.layer;
      m.embedding.sums_positions = false;  // (the model's embedding sums them, after every module's part)
      m.combine.p = &mp;
      m.attention = cpu::AttentionUnit{&mp.layer};
      m.mlp = cpu::MlpUnit{&mp.layer};
      m.moe = cpu::MoeUnit{&mp.layer, moe_options_.get()};
      m.output.norm_w = mp.final_norm_w;
      m.output.norm_b = mp.final_norm_b;
      m.output.weight = layout.output_w;
      u->mtp.push_back(m);
    }
    units_.push_back(std::move(u));
  }
  if (D.fp8_delayed) {
    std::vector<int64_t> fp8_layers, experts;  // (an MoE layer's experts: scaling slots of their own)
    for (const ModelLayout& layout : layouts_) {
      for (const LayerParams& ly : layout.layers) {
        if (!D.fp8_layer(ly.layer)) continue;
        if (!ly.experts.empty() && static_cast<int64_t>(ly.experts.size()) != D.experts) {  // (train/capabilities refuses it by name)
          throw std::runtime_error("FP8 delayed scaling in MoE layers with expert parallelism is not implemented: use --fp8-recipe tensorwise");
        }
        fp8_layers.push_back(ly.layer);
        experts.push_back(static_cast<int64_t>(ly.experts.size()));
      }
    }
    fp8_ = std::make_unique<Fp8ScalingState>(fp8_delayed_recipe(D), std::move(fp8_layers), std::move(experts));
    fp8_weights_due_.assign(layouts_.size(), true);
  }
}

void GPTModel::fp8_update(int first_kind, int last_kind) {
  const int64_t n = fp8_->slots();
  if (n == 0) return;
  float* acc = fp8_->amax_accumulator(first_kind);  // (the kinds' accumulators are contiguous)
  const int64_t count = (last_kind - first_kind + 1) * n;
  if (groups_.tp->size() > 1) groups_.tp->all_reduce(acc, count, ReduceOp::kMax);
  Communicator& rest = dims_.fp8_amax_over_dp ? *groups_.dp_cp : *groups_.cp;  // (--tp-only-amax-red: TP x CP only)
  if (rest.size() > 1) rest.all_reduce(acc, count, ReduceOp::kMax);
  fp8_->update(first_kind, last_kind);
}

GPTModel::~GPTModel() = default;

std::unique_ptr<GPTModel::Record> GPTModel::take_record() {
  if (spare_.empty()) return std::make_unique<Record>();
  auto r = std::move(spare_.back());
  spare_.pop_back();
  return r;
}

void GPTModel::release(std::pair<int64_t, int64_t> key) {
  auto it = stash_.find(key);
  it->second->deferred.clear();
  spare_.push_back(std::move(it->second));
  stash_.erase(it);
}

float GPTModel::forward(const Microbatch& mb, int64_t step, bool training) {
  if (layouts_.size() != 1 || !layouts_[0].pre_process || !layouts_[0].post_process) {
    throw std::logic_error("GPTModel::forward: this stage is not the whole model");
  }
  return forward_stage(0, mb, step, training, {}, nullptr);
}

void GPTModel::backward(float scale, bool last_microbatch) { backward_stage(0, scale, last_microbatch, {}, nullptr, false); }

float GPTModel::forward_stage(int64_t id, const Microbatch& mb, int64_t step, bool training, Activations input, Activations* output,
                              int64_t chunk) {
  const ModelDims& D = dims_;
  const ModelLayout& layout = this->layout(chunk);
  Units& units = *units_[static_cast<size_t>(chunk)];
  const std::pair<int64_t, int64_t> key{chunk, id};
  const int64_t T = mb.B * mb.S;
  if (mb.S > D.max_pos) throw std::runtime_error("sequence longer than --max-position-embeddings");
  if (D.sequence_parallel && T % D.tp != 0) {
    throw std::runtime_error("sequence parallelism needs micro-batch-size x seq-length divisible by TP");
  }
  auto found = stash_.find(key);
  if (found != stash_.end() && !found->second->deferred.empty()) {
    throw std::logic_error("GPTModel::forward_stage: microbatch " + std::to_string(id) + "'s weight gradients are still due");
  }
  std::unique_ptr<Record> rec = found != stash_.end() ? std::move(found->second) : take_record();
  if (found != stash_.end()) stash_.erase(found);
  Record& R = *rec;
  R.mb = mb;
  R.ctx = std::make_unique<cpu::PassContext>(D, params_, groups_, seed_, R.mb, step, training);
  R.ctx->moe_stats = training ? &moe_stats_ : nullptr;
  if (fp8_) {
    R.ctx->fp8 = fp8_.get();
    R.ctx->fp8_record = training;
    R.ctx->fp8_cast_weights = training && fp8_weights_due_[static_cast<size_t>(chunk)];
  }
  R.deferred.clear();
  const cpu::PassContext& c = *R.ctx;
  const size_t n = layout.layers.size();
  R.attention.resize(n);
  R.mlp.resize(n);
  R.moe.resize(n);
  Activations x;
  if (layout.pre_process) {
    units.embedding.forward(c, x);
  } else {
    if (static_cast<int64_t>(input.size()) != c.Tl * D.h) throw std::logic_error("GPTModel::forward_stage: input of the wrong size");
    x = std::move(input);
  }
  for (size_t l = 0; l < n; ++l) {
    units.attention[l].forward(c, x, R.attention[l]);
    if (layout.layers[l].moe) units.moe[l].forward(c, x, R.moe[l]);
    else units.mlp[l].forward(c, x, R.mlp[l]);
  }
  float loss = 0;
  if (layout.post_process) loss = units.output.forward(c, x, R.output);
  else if (output) *output = std::move(x);
  if (layout.post_process && (training || mtp_in_evaluation_)) mtp_forward(R, units, step, training);
  stash_[key] = std::move(rec);
  if (!training) release(key);  // no backward follows (evaluation)
  if (fp8_ && training) {  // the forward scales of the stage (TE: at the fp8_autocast's exit)
    fp8_weights_due_[static_cast<size_t>(chunk)] = false;
    fp8_update(kFp8Input, kFp8Weight);
  }
  return loss;
}

void GPTModel::layer_finished(Record& r, const LayerParams& ly) const {
  const cpu::PassContext& c = *r.ctx;
  c.after_weight_grads([this, &c, &ly] {
    c.sum_replicated_grads(ly.first, ly.end);
    if (kv_group_ && c.finishing) {
      // Every replica of the group's QKV block gets the sum: its own query heads' rows from their owner,
      // and the K/V rows from all the group's query heads.
      kv_group_->all_reduce(c.G(ly.qkv_w), params_.info(ly.qkv_w).numel, ReduceOp::kSum);
      if (ly.qkv_b != kNoParam) kv_group_->all_reduce(c.G(ly.qkv_b), params_.info(ly.qkv_b).numel, ReduceOp::kSum);
    }
    if (grads_ready_ && c.finishing) grads_ready_(ly.first);
  });
}

void GPTModel::backward_stage(int64_t id, float scale, bool last_microbatch, Activations output_grad, Activations* input_grad,
                              bool defer_weight_grads, int64_t chunk) {
  const ModelLayout& layout = this->layout(chunk);
  Units& units = *units_[static_cast<size_t>(chunk)];
  const std::pair<int64_t, int64_t> key{chunk, id};
  auto found = stash_.find(key);
  if (found == stash_.end()) throw std::logic_error("GPTModel::backward_stage: microbatch " + std::to_string(id) + " was not forwarded");
  Record& R = *found->second;
  cpu::PassContext& c = *R.ctx;
  c.finishing = last_microbatch;
  c.fp8_record = true;
  c.loss_grad_scale = scale * static_cast<float>(dims_.cp);  // CP: as the lm loss's (output_unit.cpp)
  c.deferred = defer_weight_grads ? &R.deferred : nullptr;
  Activations dx, dmid;
  if (layout.post_process) {
    const Activations dln = mtp_backward(R, layout, units, scale);  // (the model's normed output's gradient from module 1)
    units.output.backward(c, scale, dx, R.output, dln.empty() ? nullptr : &dln);
    c.sum_replicated_grads(layout.final_norm_w, layout.mtp.empty() ? params_.size() : layout.mtp.front().first);
    // With tied embeddings on one stage the output layer's gradient is not final until the embedding's backward.
    if (layout.output_w != layout.word_embeddings) {
      const size_t lowest = layout.final_norm_w;
      c.after_weight_grads([this, &c, lowest] {
        if (grads_ready_ && c.finishing) grads_ready_(lowest);
      });
    }
  } else {
    if (static_cast<int64_t>(output_grad.size()) != c.Tl * dims_.h) throw std::logic_error("GPTModel::backward_stage: gradient of the wrong size");
    dx = std::move(output_grad);
  }
  for (size_t l = layout.layers.size(); l-- > 0;) {
    if (layout.layers[l].moe) units.moe[l].backward(c, dx, dmid, R.moe[l]);
    else units.mlp[l].backward(c, dx, dmid, R.mlp[l]);
    units.attention[l].backward(c, dmid, dx, R.attention[l]);
    layer_finished(R, layout.layers[l]);
  }
  if (layout.pre_process) {
    units.embedding.backward(c, dx);
    c.after_weight_grads([this, &c] {
      if (grads_ready_ && c.finishing) grads_ready_(0);
    });
  } else if (input_grad) {
    *input_grad = std::move(dx);
  }
  if (!defer_weight_grads) release(key);
  if (fp8_) {  // the gradient scales (TE: at the end of the microbatch's backward); the next iteration casts the weights anew
    fp8_update(kFp8GradOutput, kFp8GradOutput);
    if (last_microbatch) fp8_weights_due_[static_cast<size_t>(chunk)] = true;
  }
}

// Every MoE layer of the stage: the decoder's and multi-token prediction's modules' (Megatron updates every router with a bias).
std::vector<const LayerParams*> GPTModel::all_layers() const {
  std::vector<const LayerParams*> out;
  for (const ModelLayout& layout : layouts_) {
    for (const LayerParams& ly : layout.layers) out.push_back(&ly);
    for (const MtpParams& mp : layout.mtp) out.push_back(&mp.layer);
  }
  return out;
}

void GPTModel::update_expert_biases(double rate) {
  for (const LayerParams* layer : all_layers()) {
    const LayerParams& ly = *layer;
    if (ly.expert_bias == kNoParam) continue;
    std::vector<double> counts = moe_stats_[ly.layer].tokens;
    counts.resize(static_cast<size_t>(dims_.experts), 0.0);
    groups_.tp->all_reduce(counts.data(), dims_.experts, ReduceOp::kSum);
    groups_.dp_cp->all_reduce(counts.data(), dims_.experts, ReduceOp::kSum);
    double mean = 0;
    for (double n : counts) mean += n;
    mean /= static_cast<double>(dims_.experts);
    float* bias = params_.param(ly.expert_bias);
    for (int64_t e = 0; e < dims_.experts; ++e) {
      const double offset = mean - counts[static_cast<size_t>(e)];
      bias[e] += static_cast<float>(rate * (offset > 0 ? 1.0 : offset < 0 ? -1.0 : 0.0));
    }
  }
}

void GPTModel::update_quantile_biases(double ema) {
  for (const LayerParams* layer : all_layers()) {
    const LayerParams& ly = *layer;
    if (ly.quantile_bias == kNoParam) continue;
    // Megatron's _update_router_qb_beta: this rank's mean quantile over its microbatches, averaged over DP x CP, blended
    // with the bias, re-centred to mean 0.
    const cpu::MoeLayerStats& st = moe_stats_[ly.layer];
    std::vector<double> mean(static_cast<size_t>(dims_.experts), 0.0);
    for (size_t e = 0; e < st.quantile_sum.size() && e < mean.size(); ++e) {
      mean[e] = st.quantile_sum[e] / static_cast<double>(std::max<int64_t>(1, st.quantile_count));
    }
    groups_.dp_cp->all_reduce(mean.data(), dims_.experts, ReduceOp::kAvg);
    float* beta = params_.param(ly.quantile_bias);
    std::vector<double> blended(mean.size());
    double centre = 0;
    for (size_t e = 0; e < mean.size(); ++e) {
      blended[e] = ema * beta[e] + (1.0 - ema) * mean[e];
      centre += blended[e] / static_cast<double>(mean.size());
    }
    for (size_t e = 0; e < mean.size(); ++e) beta[e] = static_cast<float>(blended[e] - centre);
  }
}

// A microbatch's loss tokens over the whole sequences (summed over CP: the loss's own count).
double GPTModel::sequence_tokens(const Microbatch& mb) const {
  double tokens = 0;
  for (float m : mb.loss_mask) tokens += m;
  if (dims_.cp > 1) groups_.cp->all_reduce(&tokens, 1, ReduceOp::kSum);
  return tokens;
}

std::vector<double> GPTModel::take_mtp_losses() {
  std::vector<double> out = std::exchange(mtp_losses_, {});
  for (double& v : out) v /= static_cast<double>(std::max<int64_t>(1, mtp_microbatches_));
  mtp_microbatches_ = 0;
  return out;
}

void GPTModel::backward_weights(int64_t id, bool last, int64_t chunk) {
  const std::pair<int64_t, int64_t> key{chunk, id};
  auto found = stash_.find(key);
  if (found == stash_.end()) throw std::logic_error("GPTModel::backward_weights: microbatch " + std::to_string(id) + " is not in flight");
  found->second->ctx->finishing = last;
  for (auto& work : found->second->deferred) work();
  release(key);
  if (fp8_ && last) fp8_weights_due_[static_cast<size_t>(chunk)] = true;
}

// Multi-token prediction's modules after the model's output (a training forward, or an evaluation one where asked): module k
// (1-based) embeds the tokens k
// places ahead, projects them with the previous module's normed output (the model's for k = 1), runs its transformer layer
// (with the model's pass context: positions, documents, dropout keys by its layer) and its norm, and takes the model's
// output layer's loss against the labels k places further on. The losses are kept for the log, not returned.
void GPTModel::mtp_forward(Record& R, Units& units, int64_t step, bool training) {
  const size_t N = units.mtp.size();
  if (N == 0) return;
  const cpu::PassContext& c = *R.ctx;
  R.mtp_mb.assign(N, {});
  R.mtp_ctx.clear();
  R.mtp.resize(N);
  if (dims_.cp > 1 && R.mb.mtp.size() != N) throw std::logic_error("GPTModel: multi-token prediction under CP without the shifted slices");
  for (size_t k = 0; k < N; ++k) {
    // (under CP the engine shifted the whole sequences before slicing them: Microbatch::mtp)
    R.mtp_mb[k] = R.mb.mtp.size() == N ? R.mb.mtp[k] : cpu::mtp_shifted(R.mb, static_cast<int64_t>(k + 1));
    R.mtp_ctx.push_back(std::make_unique<cpu::PassContext>(dims_, params_, groups_, seed_, R.mtp_mb[k], step, training));
  }
  mtp_losses_.resize(N, 0.0);
  const Activations* h = &R.output.ln;
  for (size_t k = 0; k < N; ++k) {
    Units::Mtp& u = units.mtp[k];
    Record::Mtp& st = R.mtp[k];
    const cpu::PassContext& ck = *R.mtp_ctx[k];
    Activations e, x;
    u.embedding.forward(ck, e);
    u.combine.forward(c, std::move(e), *h, x, st.combine);
    u.attention.forward(c, x, st.attention);
    if (u.combine.p->layer.moe) u.moe.forward(c, x, st.moe);
    else u.mlp.forward(c, x, st.mlp);
    const float loss = u.output.forward(ck, x, st.output);
    // (the log's value: the mean over the shifted tokens, also under --calculate-per-token-loss, whose forward gives the sum)
    mtp_losses_[k] += dims_.per_token_loss ? loss / std::max(sequence_tokens(R.mtp_mb[k]), 1.0) : loss;
    h = &st.output.ln;
  }
  ++mtp_microbatches_;
}

// Their backward, last module first: each module's loss at scale x --mtp-loss-scaling-factor / --mtp-num-layers (Megatron's
// MTPLossAutoScaler: the lm loss's gradient scale; under --calculate-per-token-loss also x the microbatch's tokens over the
// module's, as Megatron's), its layer, its projection, the embedding's gradient into the model's tables; the gradient of
// each module's normed output from the next one. Returns that of the model's normed output (empty without MTP).
GPTModel::Activations GPTModel::mtp_backward(Record& R, const ModelLayout& layout, Units& units, float scale) {
  const size_t N = units.mtp.size();
  if (N == 0 || R.mtp.size() != N) return {};
  cpu::PassContext& c = *R.ctx;
  const double tokens = dims_.per_token_loss ? sequence_tokens(R.mb) : 0.0;  // (counted only where the scale needs them: a CP collective)
  Activations dnext;  // the gradient of module k's normed output from module k + 1
  for (size_t k = N; k-- > 0;) {
    Units::Mtp& u = units.mtp[k];
    Record::Mtp& st = R.mtp[k];
    cpu::PassContext& ck = *R.mtp_ctx[k];
    ck.finishing = c.finishing;
    ck.fp8_record = c.fp8_record;
    ck.loss_grad_scale = c.loss_grad_scale;
    ck.deferred = c.deferred;
    const double per_token = dims_.per_token_loss ? tokens / std::max(sequence_tokens(R.mtp_mb[k]), 1.0) : 1.0;
    Activations dx, dmid, de, dh;
    u.output.backward(ck, static_cast<float>(scale * dims_.mtp_loss_scale * per_token), dx, st.output, dnext.empty() ? nullptr : &dnext);
    if (u.combine.p->layer.moe) u.moe.backward(c, dx, dmid, st.moe);
    else u.mlp.backward(c, dx, dmid, st.mlp);
    u.attention.backward(c, dmid, dx, st.attention);
    u.combine.backward(c, dx, de, dh, st.combine);
    u.embedding.backward(ck, de);
    dnext = std::move(dh);
    const MtpParams& mp = layout.mtp[k];
    c.after_weight_grads([this, &c, &mp] {
      c.sum_replicated_grads(mp.first, mp.end);
      if (kv_group_ && c.finishing) {  // (the module's layer's QKV replicas, as layer_finished's)
        kv_group_->all_reduce(c.G(mp.layer.qkv_w), params_.info(mp.layer.qkv_w).numel, ReduceOp::kSum);
        if (mp.layer.qkv_b != kNoParam) kv_group_->all_reduce(c.G(mp.layer.qkv_b), params_.info(mp.layer.qkv_b).numel, ReduceOp::kSum);
      }
      if (grads_ready_ && c.finishing) grads_ready_(mp.first);
    });
  }
  return dnext;
}

}  // namespace mt
