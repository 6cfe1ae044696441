// test_context_parallel.cpp: Megatron's load-balanced split of a sequence over CP ranks, and the block attention
// that context parallelism is built from (explicit places in the sequence, causal and document masks, GQA, dropout):
// blocks merged by their log-sum-exp equal one attention over all keys, and the blocks' backward from the merged
// output matches central differences of the merged forward.
#include <cmath>
#include <limits>

#include "catch.h"
#include "config/resolve.h"
#include "config/validate.h"
#include "grad_check.h"
#include "kernels/cpu/attention_blocks.h"
#include "model/context_parallel.h"

using namespace mt;
using namespace mt::cpu;
using namespace mt::test;

TEST_CASE("context parallelism: rank r holds chunks r and 2 CP - 1 - r of every sequence") {
  Microbatch mb;
  mb.B = 2;
  mb.S = 8;
  for (int32_t b = 0; b < 2; ++b) {
    for (int32_t s = 0; s < 8; ++s) {
      mb.tokens.push_back(100 * b + s);
      mb.labels.push_back(100 * b + s + 1);
      mb.positions.push_back(s);
      mb.loss_mask.push_back(1.0f);
    }
  }
  const Microbatch r0 = context_parallel_slice(mb, 0, 2), r1 = context_parallel_slice(mb, 1, 2);
  CHECK(r0.S == 4);
  CHECK(r0.seq_total == 8);
  CHECK(r0.seq_pos == std::vector<int32_t>{0, 1, 6, 7, 0, 1, 6, 7});
  CHECK(r1.seq_pos == std::vector<int32_t>{2, 3, 4, 5, 2, 3, 4, 5});
  CHECK(r1.tokens == std::vector<int32_t>{2, 3, 4, 5, 102, 103, 104, 105});
  CHECK(r0.positions == std::vector<int32_t>{0, 1, 6, 7, 0, 1, 6, 7});
  const Microbatch q3 = context_parallel_slice(mb, 3, 4);  // chunks of 1: 3 and 4
  CHECK(q3.seq_pos == std::vector<int32_t>{3, 4, 3, 4});
}

namespace {

struct Case {
  int64_t B = 1, Sq = 6, nh = 4, ng = 2, d = 3;
  std::vector<int32_t> q_pos = {0, 1, 2, 3, 4, 5}, start = {0, 0, 0, 3, 3, 3};
  // Two blocks of keys in the load-balanced order, their places in the sequence.
  std::vector<std::vector<int32_t>> k_pos = {{0, 5, 1}, {3, 2, 4}};
  float dropout = 0;
};

BlockAttention shape(const Case& c, size_t block, bool docs) {
  BlockAttention s;
  s.B = c.B;
  s.Sq = c.Sq;
  s.Sk = static_cast<int64_t>(c.k_pos[block].size());
  s.nh = c.nh;
  s.ng = c.ng;
  s.d = c.d;
  s.scale = 0.7f;
  s.q_pos = c.q_pos.data();
  s.k_pos = c.k_pos[block].data();
  s.q_start = docs ? c.start.data() : nullptr;
  s.dropout = c.dropout;
  s.dropout_key = 99;
  s.seq_total = 6;
  return s;
}

void check_blocks(const Case& c, bool docs) {
  const int64_t nq = c.B * c.Sq * c.nh * c.d, nk = 3 * c.ng * c.d;
  std::vector<float> q(static_cast<size_t>(nq)), w(static_cast<size_t>(nq));
  std::vector<std::vector<float>> k(2, std::vector<float>(static_cast<size_t>(nk))), v(2, std::vector<float>(static_cast<size_t>(nk)));
  fill_normal(q, 1);
  fill_normal(w, 2);
  for (size_t b = 0; b < 2; ++b) {
    fill_normal(k[b], 3 + static_cast<unsigned>(b));
    fill_normal(v[b], 5 + static_cast<unsigned>(b));
  }
  auto forward = [&](std::vector<float>& out, std::vector<float>& lse) {
    out.assign(static_cast<size_t>(nq), 0.0f);
    lse.assign(static_cast<size_t>(c.B * c.nh * c.Sq), -std::numeric_limits<float>::infinity());
    std::vector<float> part(out.size()), part_lse(lse.size());
    for (size_t b = 0; b < 2; ++b) {
      block_attention_forward(part.data(), part_lse.data(), q.data(), k[b].data(), v[b].data(), shape(c, b, docs));
      merge_attention_block(out.data(), lse.data(), part.data(), part_lse.data(), c.B, c.Sq, c.nh, c.d);
    }
  };
  auto objective = [&] {
    std::vector<float> out, lse;
    forward(out, lse);
    double s = 0;
    for (size_t i = 0; i < out.size(); ++i) s += static_cast<double>(out[i]) * w[i];
    return s;
  };
  // The merged blocks equal one block of all the keys.
  if (c.dropout == 0) {
    std::vector<float> out, lse, whole(static_cast<size_t>(nq)), whole_lse(static_cast<size_t>(c.B * c.nh * c.Sq));
    forward(out, lse);
    Case all = c;
    all.k_pos = {{0, 5, 1, 3, 2, 4}};
    std::vector<float> k_all(k[0]), v_all(v[0]);
    k_all.insert(k_all.end(), k[1].begin(), k[1].end());
    v_all.insert(v_all.end(), v[1].begin(), v[1].end());
    block_attention_forward(whole.data(), whole_lse.data(), q.data(), k_all.data(), v_all.data(), shape(all, 0, docs));
    double worst = 0;
    for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(out[i] - whole[i])));
    CHECK(worst < 1e-6);
  }
  std::vector<float> out, lse;
  forward(out, lse);
  std::vector<float> dq(q.size(), 0.0f);
  std::vector<std::vector<float>> dk(2, std::vector<float>(static_cast<size_t>(nk), 0.0f)), dv = dk;
  for (size_t b = 0; b < 2; ++b) {
    block_attention_backward(dq.data(), dk[b].data(), dv[b].data(), w.data(), out.data(), lse.data(), q.data(), k[b].data(), v[b].data(),
                             shape(c, b, docs));
  }
  std::vector<double> a, n;
  for (size_t i = 0; i < q.size(); ++i) {
    a.push_back(dq[i]);
    n.push_back(numeric_grad(objective, &q[i]));
  }
  for (size_t b = 0; b < 2; ++b) {
    for (size_t i = 0; i < k[b].size(); ++i) {
      a.push_back(dk[b][i]);
      n.push_back(numeric_grad(objective, &k[b][i]));
      a.push_back(dv[b][i]);
      n.push_back(numeric_grad(objective, &v[b][i]));
    }
  }
  CHECK(worst_ratio(a, n, 1e-4, 1e-3) <= 1.0);
}

}  // namespace

TEST_CASE("block attention: merged blocks equal one attention; the backward matches finite differences") {
  Case c;
  SECTION("causal, GQA") { check_blocks(c, false); }
  SECTION("causal, GQA, documents") { check_blocks(c, true); }
  SECTION("with attention dropout") {
    c.dropout = 0.3f;
    check_blocks(c, true);
  }
}

TEST_CASE("context parallelism: the sequence and a2a's heads must divide") {
  Config c;
  c.model.num_layers = 2;
  c.model.hidden_size = 64;
  c.model.num_attention_heads = 4;
  c.model.max_position_embeddings = 30;
  c.data.seq_length = 30;
  c.training.micro_batch_size = 1;
  c.training.train_iters = 1;
  c.training.lr = 1e-3;
  c.data.mock_data = true;
  c.parallel.context_parallel_size = 4;
  auto errors = [](const Diagnostics& d) {
    std::string all;
    for (const auto& e : d.errors) all += e + "\n";
    return all;
  };
  CHECK(errors(validate(c, 4, Purpose::kTrain)).find("--seq-length 30 is not divisible by 2 x CP(4) = 8") != std::string::npos);
  c.data.seq_length = 32;
  c.model.max_position_embeddings = 32;
  CHECK(validate(c, 4, Purpose::kTrain).ok());
  c.parallel.cp_comm_type = "a2a";
  c.parallel.context_parallel_size = 8;
  c.data.seq_length = 64;
  c.model.max_position_embeddings = 64;
  CHECK(errors(validate(c, 8, Purpose::kTrain)).find("--cp-comm-type a2a needs each TP rank's attention heads (4)") != std::string::npos);
}
