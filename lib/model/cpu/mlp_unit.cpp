// mlp_unit.cpp: the dense MLP slot of a transformer layer on the CPU engine: pre-MLP norm, column-parallel fc1
// (SwiGLU: gate and up shards side by side), GELU or SwiGLU, row-parallel fc2, dropout and the residual add.
#include "kernels/cpu/activation.h"
#include "kernels/cpu/linear.h"
#include "model/cpu/units.h"

namespace mt::cpu {
void MlpUnit::forward(const PassContext& c, Buf& x, Stash& A) const {
  const ModelDims& D = c.D;
  const LayerParams& ly = *p;
  const int64_t T = c.T, Tl = c.Tl, h = D.h;
  const int64_t fc1_out = D.F_local * (D.swiglu ? 2 : 1);
  A.x = std::move(x);
  A.ln.resize(sz(Tl * h));
  A.mean.resize(sz(Tl));
  A.rstd.resize(sz(Tl));
  c.norm_forward(A.ln.data(), A.mean.data(), A.rstd.data(), A.x.data(), ly.mlp_norm_w, ly.mlp_norm_b, Tl, h);
  A.ln_full.resize(sz(T * h));
  c.gather_tokens(A.ln.data(), A.ln_full.data());
  A.fc1.resize(sz(T * fc1_out));
  linear_forward(A.fc1.data(), A.ln_full.data(), c.P(ly.fc1_w), D.bias ? c.P(ly.fc1_b) : nullptr, T, h, fc1_out);
  A.act.resize(sz(T * D.F_local));
  if (D.swiglu) swiglu_forward(A.act.data(), A.fc1.data(), T, D.F_local);
  else gelu_forward(A.act.data(), A.fc1.data(), T * D.F_local);
  Buf fc2(sz(T * h)), fc2_local(sz(Tl * h));
  linear_forward(fc2.data(), A.act.data(), c.P(ly.fc2_w), nullptr, T, D.F_local, h);
  c.reduce_tokens(fc2.data(), fc2_local.data());
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
  const int64_t T = c.T, Tl = c.Tl, h = D.h, F = D.F_local;
  const int64_t fc1_out = F * (D.swiglu ? 2 : 1);
  Buf branch = dout, full(sz(T * h)), local(sz(Tl * h));
  c.dropout_tokens(branch.data(), ly.layer, kDropMlpOut, true);
  if (D.bias) {
    for (int64_t i = 0; i < Tl * h; ++i) c.G(ly.fc2_b)[i % h] += branch[sz(i)];
  }
  c.gather_tokens(branch.data(), full.data());
  Buf dact(sz(T * F));
  linear_backward_input(dact.data(), full.data(), c.P(ly.fc2_w), T, F, h);
  c.weight_grad(full.data(), T * h, [&c, &A, &ly, T, F, h](const float* dy) {
    linear_backward_weight(c.G(ly.fc2_w), nullptr, dy, A.act.data(), T, F, h);
  });
  Buf dfc1(sz(T * fc1_out));
  if (D.swiglu) swiglu_backward(dfc1.data(), dact.data(), A.fc1.data(), T, F);
  else gelu_backward(dfc1.data(), dact.data(), A.fc1.data(), T * F);
  linear_backward_input(full.data(), dfc1.data(), c.P(ly.fc1_w), T, h, fc1_out);
  c.weight_grad(dfc1.data(), T * fc1_out, [&c, &A, &ly, T, h, fc1_out](const float* dy) {
    linear_backward_weight(c.G(ly.fc1_w), c.D.bias ? c.G(ly.fc1_b) : nullptr, dy, A.ln_full.data(), T, h, fc1_out);
  });
  c.reduce_tokens(full.data(), local.data());
  dx.resize(sz(Tl * h));
  c.norm_backward(dx.data(), local.data(), A.x.data(), A.mean.data(), A.rstd.data(), ly.mlp_norm_w, ly.mlp_norm_b, Tl, h);
  for (int64_t i = 0; i < Tl * h; ++i) dx[sz(i)] += dout[sz(i)];
}

}  // namespace mt::cpu
