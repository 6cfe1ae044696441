// context_attention.cpp: see context_attention.h. Places in the sequence travel as floats (exact below 2^24).
#include "model/cpu/context_attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>

#include "kernels/cpu/attention_blocks.h"

namespace mt::cpu {
namespace {

std::vector<int32_t> starts_of(const Microbatch& mb) { return mb.row_start; }

// head0: the global index of the block's first head; layer: the dropout site's.
BlockAttention shape(const PassContext& c, int64_t Sq, int64_t Sk, int64_t nh, int64_t ng, int64_t head0, int64_t layer) {
  BlockAttention s;
  s.dropout = c.training ? c.D.attention_dropout : 0.0f;
  s.dropout_key = dropout_key(c.seed, c.step, 0, layer, kDropAttnProbs);
  s.sample0 = c.mb.first_sample;
  s.head0 = head0;
  s.seq_total = c.mb.seq_total;
  s.B = c.mb.B;
  s.Sq = Sq;
  s.Sk = Sk;
  s.nh = nh;
  s.ng = ng;
  s.d = c.D.d;
  s.scale = c.D.softmax_scale;
  s.window = c.D.window_in(layer);
  return s;
}

// The ring's block: keys, values and their places (as floats), and in the backward their gradients.
struct RingBlock {
  Buf data;  // [k | v | pos | dk | dv]
  int64_t nk = 0, npos = 0;
  float* k() { return data.data(); }
  float* v() { return data.data() + nk; }
  float* pos() { return data.data() + 2 * nk; }
  float* dk() { return data.data() + 2 * nk + npos; }
  float* dv() { return data.data() + 3 * nk + npos; }
};

RingBlock own_block(const PassContext& c, const Buf& k, const Buf& v, bool with_grads) {
  RingBlock b;
  b.nk = static_cast<int64_t>(k.size());
  b.npos = c.mb.B * c.mb.S;
  b.data.assign(sz(2 * b.nk + b.npos + (with_grads ? 2 * b.nk : 0)), 0.0f);
  std::copy(k.begin(), k.end(), b.k());
  std::copy(v.begin(), v.end(), b.v());
  for (int64_t t = 0; t < b.npos; ++t) b.pos()[t] = static_cast<float>(c.mb.seq_pos[sz(t)]);
  return b;
}

// Posts the send of `cur` to the next rank of the ring and the receive of the previous rank's block into `next`;
// the caller computes on `cur` (read only) meanwhile and waits before it swaps.
std::unique_ptr<CommRequest> pass_on(const PassContext& c, RingBlock& cur, RingBlock& next) {
  Communicator& ring = *c.groups.cp;
  const int n = ring.size(), r = ring.rank();
  next.nk = cur.nk;
  next.npos = cur.npos;
  next.data.resize(cur.data.size());
  const int64_t len = static_cast<int64_t>(cur.data.size());
  return ring.send_recv_batch_async({P2POp::send(cur.data.data(), len, (r + 1) % n), P2POp::recv(next.data.data(), len, (r + n - 1) % n)});
}

std::vector<int32_t> as_positions(const float* p, int64_t n) {
  std::vector<int32_t> out(sz(n));
  for (int64_t i = 0; i < n; ++i) out[sz(i)] = static_cast<int32_t>(p[i]);
  return out;
}

// a2a: rows [B, S, heads, d] of this rank's tokens <-> [B, n S, heads / n, d] of every rank's tokens (rank-major
// in each sequence) for this rank's share of the heads.
void heads_to_sequence(const PassContext& c, const Buf& local, int64_t heads, Buf& whole) {
  Communicator& cp = *c.groups.cp;
  const int64_t n = cp.size(), B = c.mb.B, S = c.mb.S, d = c.D.d, hp = heads / n;
  const int64_t block = B * S * hp * d;
  Buf send(sz(n * block)), recv(sz(n * block));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t t = 0; t < B * S; ++t) {
      std::memcpy(&send[sz(j * block + t * hp * d)], &local[sz((t * heads + j * hp) * d)], sz(hp * d) * sizeof(float));
    }
  }
  cp.all_to_all(send.data(), recv.data(), block);
  whole.resize(sz(n * block));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t s = 0; s < S; ++s) {
        std::memcpy(&whole[sz(((b * n * S) + i * S + s) * hp * d)], &recv[sz(i * block + (b * S + s) * hp * d)], sz(hp * d) * sizeof(float));
      }
    }
  }
}

void sequence_to_heads(const PassContext& c, const Buf& whole, int64_t heads, Buf& local) {
  Communicator& cp = *c.groups.cp;
  const int64_t n = cp.size(), B = c.mb.B, S = c.mb.S, d = c.D.d, hp = heads / n;
  const int64_t block = B * S * hp * d;
  Buf send(sz(n * block)), recv(sz(n * block));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t s = 0; s < S; ++s) {
        std::memcpy(&send[sz(i * block + (b * S + s) * hp * d)], &whole[sz(((b * n * S) + i * S + s) * hp * d)], sz(hp * d) * sizeof(float));
      }
    }
  }
  cp.all_to_all(send.data(), recv.data(), block);
  local.resize(sz(B * S * heads * d));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t t = 0; t < B * S; ++t) {
      std::memcpy(&local[sz((t * heads + j * hp) * d)], &recv[sz(j * block + t * hp * d)], sz(hp * d) * sizeof(float));
    }
  }
}

// a2a: the whole sequence's places (and document starts) in the rank-major order of heads_to_sequence.
std::vector<int32_t> gather_positions(const PassContext& c, const std::vector<int32_t>& mine) {
  Communicator& cp = *c.groups.cp;
  const int64_t n = cp.size(), B = c.mb.B, S = c.mb.S;
  std::vector<float> f(mine.begin(), mine.end()), all(sz(n * B * S));
  cp.all_gather(f.data(), all.data(), B * S);
  std::vector<int32_t> out(sz(n * B * S));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t s = 0; s < S; ++s) out[sz(b * n * S + i * S + s)] = static_cast<int32_t>(all[sz(i * B * S + b * S + s)]);
    }
  }
  return out;
}

bool use_a2a(const PassContext& c) { return c.D.cp_a2a; }

}  // namespace

void context_attention_forward(const PassContext& c, int64_t layer, const Buf& q, const Buf& k, const Buf& v, Buf& ctx, ContextAttentionStash& st,
                               const float* sink) {
  const ModelDims& D = c.D;
  const int64_t B = c.mb.B, S = c.mb.S, nh = D.nh_local, ng = D.ng_local, d = D.d;
  if (use_a2a(c)) {
    const int64_t n = c.groups.cp->size();
    heads_to_sequence(c, q, nh, st.q);
    heads_to_sequence(c, k, ng, st.k);
    heads_to_sequence(c, v, ng, st.v);
    st.pos = gather_positions(c, c.mb.seq_pos);
    st.start = c.mb.row_start.empty() ? std::vector<int32_t>{} : gather_positions(c, c.mb.row_start);
    BlockAttention s = shape(c, n * S, n * S, nh / n, ng / n, D.tp_rank * nh + c.groups.cp->rank() * (nh / n), layer);
    s.q_pos = st.pos.data();
    s.k_pos = st.pos.data();
    s.q_start = st.start.empty() ? nullptr : st.start.data();
    st.out.assign(st.q.size(), 0.0f);
    st.lse.assign(sz(B * (nh / n) * n * S), 0.0f);
    block_attention_forward(st.out.data(), st.lse.data(), st.q.data(), st.k.data(), st.v.data(), s);
    if (sink) merge_attention_sink(st.out.data(), st.lse.data(), sink + c.groups.cp->rank() * (nh / n), B, n * S, nh / n, d);  // (this rank's heads)
    sequence_to_heads(c, st.out, nh, ctx);
    return;
  }
  const int64_t n = c.groups.cp->size();
  st.out.assign(sz(B * S * nh * d), 0.0f);
  st.lse.assign(sz(B * nh * S), -std::numeric_limits<float>::infinity());
  Buf part(st.out.size()), part_lse(st.lse.size());
  RingBlock cur = own_block(c, k, v, false), next;
  const std::vector<int32_t> q_start = starts_of(c.mb);
  for (int64_t step = 0; step < n; ++step) {
    // The next block travels while this one is computed (the send only reads it).
    std::unique_ptr<CommRequest> moving = step + 1 < n ? pass_on(c, cur, next) : nullptr;
    const std::vector<int32_t> k_pos = as_positions(cur.pos(), cur.npos);
    BlockAttention s = shape(c, S, S, nh, ng, D.tp_rank * nh, layer);
    s.q_pos = c.mb.seq_pos.data();
    s.k_pos = k_pos.data();
    s.q_start = q_start.empty() ? nullptr : q_start.data();
    block_attention_forward(part.data(), part_lse.data(), q.data(), cur.k(), cur.v(), s);
    merge_attention_block(st.out.data(), st.lse.data(), part.data(), part_lse.data(), B, S, nh, d);
    if (moving) {
      moving->wait();
      std::swap(cur, next);
    }
  }
  if (sink) merge_attention_sink(st.out.data(), st.lse.data(), sink, B, S, nh, d);
  ctx = st.out;
}

void context_attention_backward(const PassContext& c, int64_t layer, const Buf& dctx, const Buf& q, const Buf& k, const Buf& v, Buf& dq, Buf& dk, Buf& dv,
                                ContextAttentionStash& st, const float* sink, float* sink_grad) {
  const ModelDims& D = c.D;
  const int64_t B = c.mb.B, S = c.mb.S, nh = D.nh_local, ng = D.ng_local, d = D.d;
  if (use_a2a(c)) {
    const int64_t n = c.groups.cp->size();
    Buf dout;
    heads_to_sequence(c, dctx, nh, dout);
    Buf dq_all(st.q.size(), 0.0f), dk_all(st.k.size(), 0.0f), dv_all(st.v.size(), 0.0f);
    BlockAttention s = shape(c, n * S, n * S, nh / n, ng / n, D.tp_rank * nh + c.groups.cp->rank() * (nh / n), layer);
    s.q_pos = st.pos.data();
    s.k_pos = st.pos.data();
    s.q_start = st.start.empty() ? nullptr : st.start.data();
    block_attention_backward(dq_all.data(), dk_all.data(), dv_all.data(), dout.data(), st.out.data(), st.lse.data(), st.q.data(), st.k.data(),
                             st.v.data(), s);
    if (sink && sink_grad) {
      const int64_t first = c.groups.cp->rank() * (nh / n);
      attention_sink_grad(sink_grad + first, dout.data(), st.out.data(), st.lse.data(), sink + first, B, n * S, nh / n, d);
    }
    sequence_to_heads(c, dq_all, nh, dq);
    sequence_to_heads(c, dk_all, ng, dk);
    sequence_to_heads(c, dv_all, ng, dv);
    return;
  }
  const int64_t n = c.groups.cp->size();
  if (sink && sink_grad) attention_sink_grad(sink_grad, dctx.data(), st.out.data(), st.lse.data(), sink, B, S, nh, d);
  dq.assign(q.size(), 0.0f);
  RingBlock cur = own_block(c, k, v, true), next;
  const std::vector<int32_t> q_start = starts_of(c.mb);
  for (int64_t step = 0; step < n; ++step) {
    const std::vector<int32_t> k_pos = as_positions(cur.pos(), cur.npos);
    BlockAttention s = shape(c, S, S, nh, ng, D.tp_rank * nh, layer);
    s.q_pos = c.mb.seq_pos.data();
    s.k_pos = k_pos.data();
    s.q_start = q_start.empty() ? nullptr : q_start.data();
    block_attention_backward(dq.data(), cur.dk(), cur.dv(), dctx.data(), st.out.data(), st.lse.data(), q.data(), cur.k(), cur.v(), s);
    // On to the next rank with the gradients gathered so far (they travel with the block, so the pass follows the
    // block's compute); after the last step every block is home.
    pass_on(c, cur, next)->wait();
    std::swap(cur, next);
  }
  dk.assign(cur.dk(), cur.dk() + cur.nk);
  dv.assign(cur.dv(), cur.dv() + cur.nk);
}

}  // namespace mt::cpu
