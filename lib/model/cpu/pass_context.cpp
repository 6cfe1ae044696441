// pass_context.cpp: the token collectives, dropout, norms and the weight-gradient queue of the CPU units.
#include "model/cpu/pass_context.h"

#include <cstring>
#include <memory>

#include "kernels/cpu/dropout.h"
#include "kernels/cpu/norm.h"
#include "model/context_parallel.h"

namespace mt::cpu {

PassContext::PassContext(const ModelDims& dims, ParamStore& p, const ProcessGroups& g, uint64_t seed_, const Microbatch& m, int64_t step_,
                         bool training_)
    : D(dims), params(p), groups(g), seed(seed_), mb(m), step(step_), training(training_) {
  T = mb.B * mb.S;
  Tl = D.sequence_parallel ? T / D.tp : T;
  t0 = D.sequence_parallel ? D.tp_rank * Tl : 0;
}

void PassContext::gather_tokens(const float* local, float* full) const {
  if (D.sequence_parallel) groups.tp->all_gather(local, full, Tl * D.h);
  else if (local != full) std::memcpy(full, local, static_cast<size_t>(Tl * D.h) * sizeof(float));
}

void PassContext::reduce_tokens(float* full_partial, float* local) const {
  if (D.sequence_parallel) {
    groups.tp->reduce_scatter(full_partial, local, Tl * D.h, ReduceOp::kSum);
  } else {
    groups.tp->all_reduce(full_partial, Tl * D.h, ReduceOp::kSum);
    if (local != full_partial) std::memcpy(local, full_partial, static_cast<size_t>(Tl * D.h) * sizeof(float));
  }
}

void PassContext::dropout_tokens(float* x, int64_t layer, int site, bool backward) const {
  const float p = training ? D.hidden_dropout : 0.0f;
  if (p <= 0) return;
  const int64_t S = mb.S, h = D.h;
  for (int64_t i = 0; i < Tl; ++i) {
    const int64_t t = t0 + i;
    const uint64_t key = dropout_key(seed, step, mb.first_sample + t / S, layer, site);
    float* row = x + i * h;
    const auto at = static_cast<uint64_t>(sequence_position(mb, t)) * static_cast<uint64_t>(h);  // CP: the place in the sequence
    if (backward) dropout_backward(row, row, h, p, key, at);
    else dropout_forward(row, row, h, p, key, at);
  }
}

// The scale a norm multiplies by: its weight, or 1 + weight under --apply-layernorm-1p (the weight's gradient is the
// scale's: the kernels' weight gradient does not read the weight).
const float* PassContext::norm_scale(size_t w, int64_t width, std::vector<float>& buf) const {
  if (!D.norm_1p) return P(w);
  buf.resize(static_cast<size_t>(width));
  for (int64_t i = 0; i < width; ++i) buf[static_cast<size_t>(i)] = 1.0f + P(w)[i];
  return buf.data();
}

void PassContext::norm_forward(float* out, float* mean, float* rstd, const float* x, size_t w, size_t b, int64_t n, int64_t width) const {
  std::vector<float> buf;
  const float* scale = norm_scale(w, width, buf);
  if (D.rms) rmsnorm_forward(out, rstd, x, scale, n, width, D.eps);
  else layernorm_forward(out, mean, rstd, x, scale, P(b), n, width, D.eps);
}

void PassContext::norm_backward(float* dx, const float* dout, const float* x, const float* mean, const float* rstd, size_t w, size_t b, int64_t n,
                                int64_t width) const {
  std::vector<float> buf;
  const float* scale = norm_scale(w, width, buf);
  if (D.rms) rmsnorm_backward(dx, G(w), dout, x, scale, rstd, n, width);
  else layernorm_backward(dx, G(w), G(b), dout, x, scale, mean, rstd, n, width);
}

void PassContext::sum_replicated_grads(size_t first, size_t last) const {
  if (!D.sequence_parallel || !finishing) return;
  for (size_t i = first; i < last; ++i) {
    const ParamInfo& p = params.info(i);
    if (p.tp_replicated()) groups.tp->all_reduce(params.grad(i), p.numel, ReduceOp::kSum);
  }
}

void PassContext::weight_grad(const float* dy, int64_t n, std::function<void(const float* dy)> work) const {
  if (!deferred) {
    work(dy);
    return;
  }
  auto kept = std::make_shared<Buf>(dy, dy + n);
  deferred->push_back([kept, work = std::move(work)] { work(kept->data()); });
}

void PassContext::after_weight_grads(std::function<void()> work) const {
  if (deferred) deferred->push_back(std::move(work));
  else work();
}

}  // namespace mt::cpu
