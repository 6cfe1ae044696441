// mlp_unit.cpp: the dense MLP slot of a transformer layer on the CPU engine: pre-MLP norm, column-parallel fc1
// (a gated unit: gate and up shards side by side), GELU, squared ReLU or a gated unit (SwiGLU, quick GeGLU), row-parallel fc2, dropout and the residual add.
#include "kernels/cpu/activation.h"
#include "model/cpu/linear_gemms.h"
#include "model/cpu/units.h"

namespace mt::cpu {

void mlp_activation_forward(const ModelDims& D, float* act, const float* fc1, int64_t n, int64_t F) {
  if (D.swiglu) gated_forward(act, fc1, n, F, D.glu);
  else if (D.squared_relu) squared_relu_forward(act, fc1, n * F);
  else if (D.gelu_erf) gelu_erf_forward(act, fc1, n * F);
  else gelu_forward(act, fc1, n * F);
}

void mlp_activation_backward(const ModelDims& D, float* dfc1, const float* dact, const float* fc1, int64_t n, int64_t F) {
  if (D.swiglu) gated_backward(dfc1, dact, fc1, n, F, D.glu);
  else if (D.squared_relu) squared_relu_backward(dfc1, dact, fc1, n * F);
  else if (D.gelu_erf) gelu_erf_backward(dfc1, dact, fc1, n * F);
  else gelu_backward(dfc1, dact, fc1, n * F);
}

void MlpBody::forward(const PassContext& c, const float* ln, Buf& out, Stash& A) const {
  const ModelDims& D = c.D;
  const int64_t T = c.T, Tl = c.Tl, h = D.h, F = F_local;
  const int64_t fc1_out = F * (D.swiglu ? 2 : 1);
  A.ln_full.resize(sz(T * h));
  c.gather_tokens(ln, A.ln_full.data());
  A.fc1.resize(sz(T * fc1_out));
  linear_unit_forward(c, layer, kLinearFc1, A.fc1_lin, A.fc1.data(), A.ln_full.data(), fc1_w, fc1_b, T, h, fc1_out);
  A.act.resize(sz(T * F));
  mlp_activation_forward(D, A.act.data(), A.fc1.data(), T, F);
  Buf fc2(sz(T * h));
  linear_unit_forward(c, layer, kLinearFc2, A.fc2_lin, fc2.data(), A.act.data(), fc2_w, kNoParam, T, F, h);
  out.resize(sz(Tl * h));
  c.reduce_tokens(fc2.data(), out.data());
}

void MlpBody::backward(const PassContext& c, const float* dy, Buf& dln, Stash& A) const {
  const ModelDims& D = c.D;
  const int64_t T = c.T, Tl = c.Tl, h = D.h, F = F_local;
  const int64_t fc1_out = F * (D.swiglu ? 2 : 1);
  Buf full(sz(T * h));
  c.gather_tokens(dy, full.data());
  Buf dact(sz(T * F));
  linear_unit_backward(c, layer, kLinearFc2, A.fc2_lin, dact.data(), full.data(), fc2_w, kNoParam, A.act.data(), T, F, h);
  Buf dfc1(sz(T * fc1_out));
  mlp_activation_backward(D, dfc1.data(), dact.data(), A.fc1.data(), T, F);
  linear_unit_backward(c, layer, kLinearFc1, A.fc1_lin, full.data(), dfc1.data(), fc1_w, fc1_b, A.ln_full.data(), T, h, fc1_out);
  dln.resize(sz(Tl * h));
  c.reduce_tokens(full.data(), dln.data());
}

namespace {
MlpBody body_of(const PassContext& c, const LayerParams& ly) {
  return MlpBody{ly.fc1_w, c.D.bias ? ly.fc1_b : kNoParam, ly.fc2_w, c.D.F_local, ly.layer};
}
}  // namespace

void MlpUnit::forward(const PassContext& c, Buf& x, Stash& A) const {
  const ModelDims& D = c.D;
  const LayerParams& ly = *p;
  const int64_t Tl = c.Tl, h = D.h;
  A.x = std::move(x);
  A.ln.resize(sz(Tl * h));
  A.mean.resize(sz(Tl));
  A.rstd.resize(sz(Tl));
  c.norm_forward(A.ln.data(), A.mean.data(), A.rstd.data(), A.x.data(), ly.mlp_norm_w, ly.mlp_norm_b, Tl, h);
  Buf fc2_local;
  body_of(c, ly).forward(c, A.ln.data(), fc2_local, A.body);
  if (D.bias) {
    for (int64_t i = 0; i < Tl * h; ++i) fc2_local[sz(i)] += c.P(ly.fc2_b)[i % h];
  }
  c.dropout_tokens(fc2_local.data(), ly.layer, kDropMlpOut, false);
  x.resize(sz(Tl * h));
  for (int64_t i = 0; i < Tl * h; ++i) x[sz(i)] = A.x[sz(i)] + fc2_local[sz(i)];
}

void MlpUnit::backward(const PassContext& c, const Buf& dout, Buf& dx, Stash& A) const {
  const ModelDims& D = c.D;
  const LayerParams& ly = *p;
  const int64_t Tl = c.Tl, h = D.h;
  Buf branch = dout, local;
  c.dropout_tokens(branch.data(), ly.layer, kDropMlpOut, true);
  if (D.bias) {
    for (int64_t i = 0; i < Tl * h; ++i) c.G(ly.fc2_b)[i % h] += branch[sz(i)];
  }
  body_of(c, ly).backward(c, branch.data(), local, A.body);
  dx.resize(sz(Tl * h));
  c.norm_backward(dx.data(), local.data(), A.x.data(), A.mean.data(), A.rstd.data(), ly.mlp_norm_w, ly.mlp_norm_b, Tl, h);
  for (int64_t i = 0; i < Tl * h; ++i) dx[sz(i)] += dout[sz(i)];
}

}  // namespace mt::cpu
