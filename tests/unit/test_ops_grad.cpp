// test_ops_grad.cpp: every CPU op's backward against finite differences, on random odd shapes.
#include <cmath>
#include <cstring>
#include <vector>

#include "catch.h"
#include "grad_check.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cross_entropy.h"
#include "kernels/cpu/dropout.h"
#include "kernels/cpu/embedding.h"
#include "kernels/cpu/linear.h"
#include "kernels/cpu/norm.h"
#include "kernels/cpu/rope.h"

using namespace mt;
using namespace mt::test;
using Vec = std::vector<float>;

namespace {

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += static_cast<double>(a[i]) * b[i];
  return s;
}

// Checks analytic gradient `g` of scalar f with respect to every element of x.
void check_all(const std::function<double()>& f, Vec& x, const Vec& g, const char* what, double atol = 2e-3,
               double rtol = 1e-2) {
  std::vector<double> a, n;
  for (size_t i = 0; i < x.size(); ++i) {
    n.push_back(numeric_grad(f, &x[i]));
    a.push_back(g[i]);
  }
  INFO(what);
  CHECK(worst_ratio(a, n, atol, rtol) <= 1.0);
}

}  // namespace

TEST_CASE("layernorm and rmsnorm backward") {
  for (auto [N, h] : {std::pair<int64_t, int64_t>{3, 7}, {5, 16}}) {
    Vec x(static_cast<size_t>(N * h)), w(static_cast<size_t>(h)), b(static_cast<size_t>(h)), R(x.size());
    fill_normal(x, 1);
    fill_normal(w, 2);
    fill_normal(b, 3);
    fill_normal(R, 4);
    Vec out(x.size()), mean(static_cast<size_t>(N)), rstd(static_cast<size_t>(N));
    auto f_ln = [&] {
      cpu::layernorm_forward(out.data(), mean.data(), rstd.data(), x.data(), w.data(), b.data(), N, h, 1e-5f);
      return dot(out, R);
    };
    f_ln();
    Vec dx(x.size()), dw(w.size(), 0), db(b.size(), 0);
    cpu::layernorm_backward(dx.data(), dw.data(), db.data(), R.data(), x.data(), w.data(), mean.data(), rstd.data(), N, h);
    check_all(f_ln, x, dx, "layernorm dx");
    check_all(f_ln, w, dw, "layernorm dw");
    check_all(f_ln, b, db, "layernorm db");
    auto f_rms = [&] {
      cpu::rmsnorm_forward(out.data(), rstd.data(), x.data(), w.data(), N, h, 1e-5f);
      return dot(out, R);
    };
    f_rms();
    Vec dx2(x.size()), dw2(w.size(), 0);
    cpu::rmsnorm_backward(dx2.data(), dw2.data(), R.data(), x.data(), w.data(), rstd.data(), N, h);
    check_all(f_rms, x, dx2, "rmsnorm dx");
    check_all(f_rms, w, dw2, "rmsnorm dw");
  }
}

TEST_CASE("linear backward (with and without bias)") {
  const int64_t N = 5, in = 7, out = 3;
  Vec x(static_cast<size_t>(N * in)), w(static_cast<size_t>(out * in)), b(static_cast<size_t>(out)), R(static_cast<size_t>(N * out));
  fill_normal(x, 5);
  fill_normal(w, 6);
  fill_normal(b, 7);
  fill_normal(R, 8);
  Vec y(R.size());
  for (bool bias : {true, false}) {
    auto f = [&] {
      cpu::linear_forward(y.data(), x.data(), w.data(), bias ? b.data() : nullptr, N, in, out);
      return dot(y, R);
    };
    Vec dx(x.size()), dw(w.size(), 0), db(b.size(), 0);
    cpu::linear_backward(dx.data(), dw.data(), bias ? db.data() : nullptr, R.data(), x.data(), w.data(), N, in, out);
    check_all(f, x, dx, "linear dx");
    check_all(f, w, dw, "linear dw");
    if (bias) check_all(f, b, db, "linear db");
  }
}

TEST_CASE("gelu and swiglu backward") {
  Vec x(23), R(23), y(23);
  fill_normal(x, 9, 2.0f);
  fill_normal(R, 10);
  auto f = [&] {
    cpu::gelu_forward(y.data(), x.data(), 23);
    return dot(y, R);
  };
  Vec dx(23);
  cpu::gelu_backward(dx.data(), R.data(), x.data(), 23);
  check_all(f, x, dx, "gelu");
  // The exact erf form (Megatron's F.gelu): its values (x Phi(x): 0.8413447, -0.1586553 at +-1) and its gradient.
  float v[2] = {1.0f, -1.0f}, gv[2];
  cpu::gelu_erf_forward(gv, v, 2);
  CHECK(gv[0] == Approx(0.8413447460685429).epsilon(1e-6));
  CHECK(gv[1] == Approx(-0.15865525393145707).epsilon(1e-6));
  cpu::gelu_forward(gv, v, 1);
  CHECK(std::abs(gv[0] - 0.8413447460685429) > 1e-4);  // (the tanh form differs: 0.841192)
  auto fe = [&] {
    cpu::gelu_erf_forward(y.data(), x.data(), 23);
    return dot(y, R);
  };
  cpu::gelu_erf_backward(dx.data(), R.data(), x.data(), 23);
  check_all(fe, x, dx, "gelu erf");
  const int64_t N = 3, F = 5;
  Vec xs(static_cast<size_t>(N * 2 * F)), Rs(static_cast<size_t>(N * F)), ys(Rs.size());
  fill_normal(xs, 11, 2.0f);
  fill_normal(Rs, 12);
  auto fs = [&] {
    cpu::swiglu_forward(ys.data(), xs.data(), N, F);
    return dot(ys, Rs);
  };
  Vec dxs(xs.size());
  cpu::swiglu_backward(dxs.data(), Rs.data(), xs.data(), N, F);
  check_all(fs, xs, dxs, "swiglu");
}

TEST_CASE("gated units: quick GeGLU (GPT-OSS's), the linear offset and the clamp, values and gradients") {
  // Megatron's quick_geglu: quick_gelu(g) (u + offset), quick_gelu(g) = g sigmoid(1.702 g); the clamp first (g <= c,
  // -c <= u <= c).
  const GatedActivation quick{.alpha = kQuickGeluAlpha, .linear_offset = 1.0f, .clamp = 0.0f};
  float row[2] = {1.0f, 0.5f}, out = 0;
  cpu::gated_forward(&out, row, 1, 1, quick);
  CHECK(out == Approx(1.0 / (1.0 + std::exp(-1.702)) * 1.5).epsilon(1e-6));
  const GatedActivation clamped{.alpha = kQuickGeluAlpha, .linear_offset = 1.0f, .clamp = 0.75f};
  float big[2] = {3.0f, -2.0f};  // (gate clamped to 0.75, linear to -0.75)
  cpu::gated_forward(&out, big, 1, 1, clamped);
  CHECK(out == Approx(0.75 / (1.0 + std::exp(-1.702 * 0.75)) * 0.25).epsilon(1e-6));
  float grad[2];
  const float one = 1.0f;
  cpu::gated_backward(grad, &one, big, 1, 1, clamped);
  CHECK(grad[0] == 0.0f);  // (both inputs held at a bound: no gradient)
  CHECK(grad[1] == 0.0f);
  const int64_t N = 4, F = 6;
  Vec x(static_cast<size_t>(N * 2 * F)), R(static_cast<size_t>(N * F)), y(R.size()), y_swiglu(R.size());
  fill_normal(x, 21, 2.0f);
  fill_normal(R, 22);
  for (float& v : x) {  // (no input within the finite difference's step of a clamp bound: the kink is not differentiable)
    if (std::abs(std::abs(v) - 1.5f) < 0.05f) v += 0.2f;
  }
  // The default unit is SwiGLU itself.
  cpu::gated_forward(y.data(), x.data(), N, F, GatedActivation{});
  cpu::swiglu_forward(y_swiglu.data(), x.data(), N, F);
  for (size_t i = 0; i < y.size(); ++i) CHECK(y[i] == Approx(y_swiglu[i]).epsilon(1e-6));
  for (const GatedActivation& a : {GatedActivation{.alpha = kQuickGeluAlpha}, GatedActivation{.alpha = kQuickGeluAlpha, .linear_offset = 1.0f, .clamp = 1.5f},
                                   GatedActivation{.alpha = 1.0f, .linear_offset = 0.0f, .clamp = 1.5f}}) {
    auto f = [&] {
      cpu::gated_forward(y.data(), x.data(), N, F, a);
      return dot(y, R);
    };
    Vec dx(x.size());
    cpu::gated_backward(dx.data(), R.data(), x.data(), N, F, a);
    INFO("alpha " << a.alpha << " offset " << a.linear_offset << " clamp " << a.clamp);
    check_all(f, x, dx, "gated unit");
  }
}

TEST_CASE("rope backward, full and partial rotary") {
  const int64_t T = 5, H = 3, d = 8;
  std::vector<int32_t> pos = {0, 1, 2, 7, 3};
  for (int64_t rot : {int64_t{8}, int64_t{4}}) {
    Vec x(static_cast<size_t>(T * H * d)), R(x.size()), y(x.size());
    fill_normal(x, 13);
    fill_normal(R, 14);
    auto f = [&] {
      y = x;
      cpu::rope_forward(y.data(), pos.data(), T, H, d, rot, 10000.0f);
      return dot(y, R);
    };
    Vec dx = R;
    cpu::rope_backward(dx.data(), pos.data(), T, H, d, rot, 10000.0f);
    check_all(f, x, dx, "rope");
  }
}

TEST_CASE("causal GQA attention backward, with and without dropout") {
  const int64_t B = 2, S = 5, nh = 4, ng = 2, d = 3;
  for (float p : {0.0f, 0.3f}) {
    cpu::AttentionShape s{B, S, nh, ng, d, 1.0f / std::sqrt(3.0f), p, 77, 10, 0};
    Vec q(static_cast<size_t>(B * S * nh * d)), k(static_cast<size_t>(B * S * ng * d)), v(k.size()), R(q.size());
    fill_normal(q, 15);
    fill_normal(k, 16);
    fill_normal(v, 17);
    fill_normal(R, 18);
    Vec out(q.size()), probs(static_cast<size_t>(B * nh * S * S));
    auto f = [&] {
      cpu::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s);
      return dot(out, R);
    };
    f();
    Vec dq(q.size()), dk(k.size()), dv(v.size()), scratch(static_cast<size_t>(S * S));
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), R.data(), probs.data(), q.data(), k.data(), v.data(), s, scratch.data());
    check_all(f, q, dq, "attention dq");
    check_all(f, k, dk, "attention dk");
    check_all(f, v, dv, "attention dv");
  }
  // Causality: the first position's output depends on the first key/value only.
  cpu::AttentionShape s{1, 3, 1, 1, 2, 1.0f, 0.0f, 0, 0, 0};
  Vec q = {1, 2, 3, 4, 5, 6}, k = {1, 0, 0, 1, 1, 1}, v = {7, 8, 1, 1, 2, 2}, out(6), probs(9);
  cpu::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s);
  CHECK(out[0] == Approx(7.0f));
  CHECK(out[1] == Approx(8.0f));
}

TEST_CASE("attention with --reset-attention-mask: no attention across documents, gradients still exact") {
  const int64_t B = 1, S = 6, nh = 2, ng = 1, d = 3;
  std::vector<int32_t> starts = {0, 0, 0, 3, 3, 5};  // documents [0,2], [3,4], [5]
  cpu::AttentionShape s{B, S, nh, ng, d, 0.5f, 0.0f, 0, 0, 0, starts.data()};
  Vec q(static_cast<size_t>(S * nh * d)), k(static_cast<size_t>(S * ng * d)), v(k.size()), R(q.size());
  fill_normal(q, 31);
  fill_normal(k, 32);
  fill_normal(v, 33);
  fill_normal(R, 34);
  Vec out(q.size()), probs(static_cast<size_t>(nh * S * S));
  auto f = [&] {
    cpu::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s);
    return dot(out, R);
  };
  f();
  for (int64_t i = 3; i < S; ++i) {
    for (int64_t j = 0; j < starts[static_cast<size_t>(i)]; ++j) CHECK(probs[static_cast<size_t>(i * S + j)] == 0.0f);
  }
  Vec dq(q.size()), dk(k.size()), dv(v.size()), scratch(static_cast<size_t>(S * S));
  cpu::attention_backward(dq.data(), dk.data(), dv.data(), R.data(), probs.data(), q.data(), k.data(), v.data(), s, scratch.data());
  check_all(f, q, dq, "masked attention dq");
  check_all(f, k, dk, "masked attention dk");
  check_all(f, v, dv, "masked attention dv");
  // The last document's output ignores everything before it: changing earlier values changes nothing.
  f();
  const Vec before = out;
  for (size_t e = 0; e < static_cast<size_t>(5 * d); ++e) v[e] += 1.0f;
  f();
  for (size_t e = static_cast<size_t>(5 * nh * d); e < out.size(); ++e) CHECK(out[e] == before[e]);
}

TEST_CASE("sliding-window attention (--window-size): keys i - w .. i only, with documents and dropout, gradients exact") {
  const int64_t B = 2, S = 7, nh = 2, ng = 1, d = 3, w = 2;
  std::vector<int32_t> starts = {0, 0, 0, 0, 0, 5, 5, 0, 0, 0, 0, 0, 0, 0};  // sample 0: documents [0,4], [5,6]
  for (const float p : {0.0f, 0.3f}) {
    cpu::AttentionShape s{B, S, nh, ng, d, 0.5f, p, 77, 10, 0, starts.data(), w};
    Vec q(static_cast<size_t>(B * S * nh * d)), k(static_cast<size_t>(B * S * ng * d)), v(k.size()), R(q.size());
    fill_normal(q, 41);
    fill_normal(k, 42);
    fill_normal(v, 43);
    fill_normal(R, 44);
    Vec out(q.size()), probs(static_cast<size_t>(B * nh * S * S));
    auto f = [&] {
      cpu::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s);
      return dot(out, R);
    };
    f();
    int64_t outside = 0, inside = 0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t h = 0; h < nh; ++h) {
        for (int64_t i = 0; i < S; ++i) {
          const int64_t lo = std::max<int64_t>(i - w, starts[static_cast<size_t>(b * S + i)]);
          double sum = 0;
          for (int64_t j = 0; j < S; ++j) {
            const float x = probs[static_cast<size_t>(((b * nh + h) * S + i) * S + j)];
            if (j < lo || j > i) outside += x != 0.0f;
            else inside += x > 0.0f;
            sum += x;
          }
          CHECK(sum == Approx(1.0).epsilon(1e-6));
        }
      }
    }
    CHECK(outside == 0);
    CHECK(inside == B * nh * (S * (w + 1) - 3) - nh * 3);  // (rows 0, 1 see fewer keys; sample 0's row 5 one, row 6 two)
    Vec dq(q.size()), dk(k.size()), dv(v.size()), scratch(static_cast<size_t>(S * S));
    cpu::attention_backward(dq.data(), dk.data(), dv.data(), R.data(), probs.data(), q.data(), k.data(), v.data(), s, scratch.data());
    check_all(f, q, dq, "windowed attention dq");
    check_all(f, k, dk, "windowed attention dk");
    check_all(f, v, dv, "windowed attention dv");
  }
  // A window as long as the sequence is plain causal attention, to the bit.
  cpu::AttentionShape wide{1, 5, 2, 1, 3, 0.5f, 0.0f, 0, 0, 0, nullptr, 4}, plain{1, 5, 2, 1, 3, 0.5f, 0.0f, 0, 0, 0};
  Vec q(30), k(15), v(15), a(30), b(30), pa(50), pb(50);
  fill_normal(q, 51);
  fill_normal(k, 52);
  fill_normal(v, 53);
  cpu::attention_forward(a.data(), pa.data(), q.data(), k.data(), v.data(), wide);
  cpu::attention_forward(b.data(), pb.data(), q.data(), k.data(), v.data(), plain);
  CHECK(a == b);
}

TEST_CASE("attention sinks (--softmax-type): Megatron's SoftmaxOne, gradients exact for q, k, v and the sink logits") {
  const int64_t B = 2, S = 6, nh = 2, ng = 1, d = 3;
  std::vector<int32_t> starts = {0, 0, 0, 3, 3, 3, 0, 0, 0, 0, 0, 0};  // sample 0: documents [0,2], [3,5]
  for (const float p : {0.0f, 0.3f}) {
    for (const int64_t window : {int64_t{-1}, int64_t{1}}) {
      Vec sink = {0.7f, -1.3f}, sink_grad(2, 0.0f), sink_probs(static_cast<size_t>(B * nh * S));
      cpu::AttentionShape s{B, S, nh, ng, d, 0.5f, p, 77, 10, 0, starts.data(), window, sink.data(), nullptr, sink_probs.data()};
      Vec q(static_cast<size_t>(B * S * nh * d)), k(static_cast<size_t>(B * S * ng * d)), v(k.size()), R(q.size());
      fill_normal(q, 61);
      fill_normal(k, 62);
      fill_normal(v, 63);
      fill_normal(R, 64);
      Vec out(q.size()), probs(static_cast<size_t>(B * nh * S * S));
      auto f = [&] {
        cpu::attention_forward(out.data(), probs.data(), q.data(), k.data(), v.data(), s);
        return dot(out, R);
      };
      f();
      if (p == 0.0f && window < 0) {  // row 0 of head h: one key at score q0.k0 / 2 beside the sink: p = 1 / (1 + exp(sink - score))
        for (int64_t h = 0; h < nh; ++h) {
          double score = 0;
          for (int64_t c = 0; c < d; ++c) score += 0.5 * q[static_cast<size_t>(h * d + c)] * k[static_cast<size_t>(c)];
          CHECK(probs[static_cast<size_t>(h * S * S)] == Approx(1.0 / (1.0 + std::exp(sink[static_cast<size_t>(h)] - score))).epsilon(1e-5));
          CHECK(sink_probs[static_cast<size_t>(h * S)] == Approx(1.0 / (1.0 + std::exp(score - sink[static_cast<size_t>(h)]))).epsilon(1e-5));
        }
      }
      Vec dq(q.size()), dk(k.size()), dv(v.size()), scratch(static_cast<size_t>(S * S));
      cpu::AttentionShape sb = s;
      sb.sink_grad = sink_grad.data();
      cpu::attention_backward(dq.data(), dk.data(), dv.data(), R.data(), probs.data(), q.data(), k.data(), v.data(), sb, scratch.data());
      INFO("dropout " << p << " window " << window);
      check_all(f, q, dq, "attention with sinks dq");
      check_all(f, k, dk, "attention with sinks dk");
      check_all(f, v, dv, "attention with sinks dv");
      check_all(f, sink, sink_grad, "the sink logits' gradient");
    }
  }
}

TEST_CASE("QKV split and merge are inverse, in Megatron's grouped layout") {
  const int64_t T = 3, nh = 4, ng = 2, d = 2;
  Vec qkv(static_cast<size_t>(T * (nh + 2 * ng) * d));
  for (size_t i = 0; i < qkv.size(); ++i) qkv[i] = static_cast<float>(i);
  Vec q(static_cast<size_t>(T * nh * d)), k(static_cast<size_t>(T * ng * d)), v(k.size()), back(qkv.size());
  cpu::qkv_split(q.data(), k.data(), v.data(), qkv.data(), T, nh, ng, d);
  CHECK(q[0] == 0);   // group 0: q heads 0,1 then k, v
  CHECK(k[0] == 4);
  CHECK(v[0] == 6);
  CHECK(q[4] == 8);   // head 2 is the first query head of group 1
  cpu::qkv_merge(back.data(), q.data(), k.data(), v.data(), T, nh, ng, d);
  CHECK(back == qkv);
}

TEST_CASE("cross-entropy backward and value") {
  const int64_t N = 4, V = 9;
  Vec logits(static_cast<size_t>(N * V)), w = {0.5f, 1.0f, 0.0f, 2.0f}, losses(static_cast<size_t>(N)), lse(static_cast<size_t>(N));
  fill_normal(logits, 19, 3.0f);
  std::vector<int32_t> t = {0, 8, 3, 3};
  auto f = [&] {
    cpu::cross_entropy_forward(losses.data(), lse.data(), logits.data(), t.data(), N, V);
    return dot(losses, w);
  };
  f();
  Vec d(logits.size());
  cpu::cross_entropy_backward(d.data(), logits.data(), lse.data(), t.data(), w.data(), N, V);
  check_all(f, logits, d, "cross entropy");
  Vec u(static_cast<size_t>(V), 0.0f);
  std::vector<int32_t> t0 = {2};
  float l, s;
  cpu::cross_entropy_forward(&l, &s, u.data(), t0.data(), 1, V);
  CHECK(l == Approx(std::log(9.0)));
}

TEST_CASE("embedding backward, vocab-parallel shard, learned positions") {
  const int64_t T = 5, h = 3, V = 6;
  std::vector<int32_t> tok = {1, 4, 1, 5, 0}, pos = {0, 1, 2, 3, 4};
  Vec wte(static_cast<size_t>(V * h)), wpe(static_cast<size_t>(5 * h)), R(static_cast<size_t>(T * h)), out(R.size());
  fill_normal(wte, 20);
  fill_normal(wpe, 21);
  fill_normal(R, 22);
  // Shard holding rows [3, 6): tokens 1 and 0 give zeros.
  auto f = [&] {
    cpu::embedding_forward(out.data(), tok.data(), pos.data(), wte.data() + 3 * h, wpe.data(), T, h, 3, 3);
    return dot(out, R);
  };
  Vec dwte(wte.size(), 0), dwpe(wpe.size(), 0);
  cpu::embedding_backward(dwte.data() + 3 * h, dwpe.data(), R.data(), tok.data(), pos.data(), T, h, 3, 3);
  check_all(f, wte, dwte, "embedding dwte");
  check_all(f, wpe, dwpe, "embedding dwpe");
}

TEST_CASE("dropout: counter-based mask, scaled, backward applies the same mask") {
  Vec x(1000, 1.0f), y(1000), dy(1000, 1.0f), dx(1000);
  cpu::dropout_forward(y.data(), x.data(), 1000, 0.25f, 42, 7);
  cpu::dropout_backward(dx.data(), dy.data(), 1000, 0.25f, 42, 7);
  int zeros = 0;
  for (int i = 0; i < 1000; ++i) {
    CHECK(dx[static_cast<size_t>(i)] == y[static_cast<size_t>(i)]);
    if (y[static_cast<size_t>(i)] == 0) ++zeros;
    else CHECK(y[static_cast<size_t>(i)] == Approx(1.0f / 0.75f));
  }
  CHECK(zeros > 200);
  CHECK(zeros < 300);
  // The same element index gives the same decision whatever the offset split.
  Vec y2(500);
  cpu::dropout_forward(y2.data(), x.data(), 500, 0.25f, 42, 507);
  CHECK(std::memcmp(y2.data(), y.data() + 500, 500 * sizeof(float)) == 0);
}
