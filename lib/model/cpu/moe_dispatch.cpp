// moe_dispatch.cpp: see moe_dispatch.h. Counts travel as floats (exact below 2^24 rows).
#include "model/cpu/moe_dispatch.h"

#include <algorithm>
#include <cstring>

#include "model/regroup_rows.h"

namespace mt::cpu {
namespace {

// Blocks of rows ordered (a, b) with a the outer index, block (a, b) counts[a][b] rows of h: copied into the
// order with b outer (or back with inverse).
void regroup(const float* in, float* out, const std::vector<std::vector<int64_t>>& counts, int64_t h, bool inverse) {
  for (const RowBlockMove& m : regroup_moves(counts, inverse)) std::memcpy(out + m.to * h, in + m.from * h, sz(m.rows * h) * sizeof(float));
}

int64_t total(const std::vector<int64_t>& v) {
  int64_t s = 0;
  for (int64_t x : v) s += x;
  return s;
}

}  // namespace

void TokenDispatcher::dispatch(const PassContext& c, const std::vector<Assignment>& mine, const float* ln, Buf& rows,
                               std::vector<int64_t>& per_expert) {
  const ModelDims& D = c.D;
  Communicator& ep = *c.groups.ep;
  const int64_t El = D.experts_local, nep = ep.size(), me = ep.rank(), h = D.h;
  Tl_ = c.Tl;
  h_ = h;
  mine_ = mine;
  local_per_expert_.assign(sz(El), 0);
  Buf local_rows;
  if (alltoall_) {
    std::vector<float> count(sz(D.experts), 0.0f), received(sz(D.experts), 0.0f);
    for (const Assignment& a : mine) count[sz(a.expert)] += 1;
    ep.all_to_all(count.data(), received.data(), El);
    from_source_.assign(sz(nep), std::vector<int64_t>(sz(El)));
    send_counts_.assign(sz(nep), 0);
    recv_counts_.assign(sz(nep), 0);
    for (int64_t r = 0; r < nep; ++r) {
      for (int64_t j = 0; j < El; ++j) {
        const int64_t got = static_cast<int64_t>(received[sz(r * El + j)]);
        from_source_[sz(r)][sz(j)] = got;
        local_per_expert_[sz(j)] += got;
        send_counts_[sz(r)] += static_cast<int64_t>(count[sz(r * El + j)]) * h;
        recv_counts_[sz(r)] += got * h;
      }
    }
    Buf owner(mine.size() * sz(h));
    for (size_t a = 0; a < mine.size(); ++a) std::memcpy(&owner[a * sz(h)], ln + mine[a].token * h, sz(h) * sizeof(float));
    owners_to_experts(c, owner, local_rows);
  } else {
    Buf tokens(sz(nep * Tl_ * h));
    ep.all_gather(ln, tokens.data(), Tl_ * h);
    float n_mine = static_cast<float>(mine.size());
    std::vector<float> n_all(sz(nep));
    ep.all_gather(&n_mine, n_all.data(), 1);
    std::vector<int64_t> meta_counts(sz(nep));
    for (int64_t r = 0; r < nep; ++r) meta_counts[sz(r)] = static_cast<int64_t>(n_all[sz(r)]) * 4;
    std::vector<float> meta(mine.size() * 4), meta_all(sz(total(meta_counts)));
    for (size_t a = 0; a < mine.size(); ++a) {
      meta[a * 4] = static_cast<float>(mine[a].token);
      meta[a * 4 + 1] = static_cast<float>(mine[a].expert);
      meta[a * 4 + 2] = static_cast<float>(mine[a].slot);
      meta[a * 4 + 3] = mine[a].weight;
    }
    ep.all_gather_v_async(meta.data(), meta_all.data(), meta_counts)->wait();
    picked_.clear();
    std::vector<std::vector<Picked>> by_expert(sz(El));
    size_t at = 0;
    for (int64_t r = 0; r < nep; ++r) {
      for (int64_t i = 0; i < meta_counts[sz(r)] / 4; ++i, at += 4) {
        const int64_t e = static_cast<int64_t>(meta_all[at + 1]) - me * El;
        if (e < 0 || e >= El) continue;
        by_expert[sz(e)].push_back({r, static_cast<int64_t>(meta_all[at]), static_cast<int32_t>(meta_all[at + 2]), meta_all[at + 3]});
      }
    }
    for (int64_t j = 0; j < El; ++j) {
      local_per_expert_[sz(j)] = static_cast<int64_t>(by_expert[sz(j)].size());
      picked_.insert(picked_.end(), by_expert[sz(j)].begin(), by_expert[sz(j)].end());
    }
    local_rows.resize(picked_.size() * sz(h));
    for (size_t i = 0; i < picked_.size(); ++i) {
      std::memcpy(&local_rows[i * sz(h)], &tokens[sz((picked_[i].source * Tl_ + picked_[i].token) * h)], sz(h) * sizeof(float));
    }
  }
  // Expert-TP: every rank of the group computes its slice of each local expert for the group's rows.
  Communicator& etp = *c.groups.expert_tp;
  etp_counts_.assign(sz(etp.size()), std::vector<int64_t>(sz(El)));
  if (etp.size() == 1) {
    etp_counts_[0] = local_per_expert_;
  } else {
    std::vector<float> mine_counts(sz(El)), all(sz(El * etp.size()));
    for (int64_t j = 0; j < El; ++j) mine_counts[sz(j)] = static_cast<float>(local_per_expert_[sz(j)]);
    etp.all_gather(mine_counts.data(), all.data(), El);
    for (int64_t q = 0; q < etp.size(); ++q) {
      for (int64_t j = 0; j < El; ++j) etp_counts_[sz(q)][sz(j)] = static_cast<int64_t>(all[sz(q * El + j)]);
    }
  }
  per_expert.assign(sz(El), 0);
  for (const auto& q : etp_counts_) {
    for (int64_t j = 0; j < El; ++j) per_expert[sz(j)] += q[sz(j)];
  }
  gather_expert_tp(c, local_rows, rows);
}

void TokenDispatcher::gather_expert_tp(const PassContext& c, const Buf& local_rows, Buf& rows) const {
  Communicator& etp = *c.groups.expert_tp;
  if (etp.size() == 1) {
    rows = local_rows;
    return;
  }
  std::vector<int64_t> counts;
  for (const auto& q : etp_counts_) counts.push_back(total(q) * h_);
  Buf full(sz(total(counts)));
  etp.all_gather_v_async(local_rows.data(), full.data(), counts)->wait();
  rows.resize(full.size());
  regroup(full.data(), rows.data(), etp_counts_, h_, false);
}

void TokenDispatcher::scatter_expert_tp(const PassContext& c, const Buf& rows, Buf& local_rows) const {
  Communicator& etp = *c.groups.expert_tp;
  if (etp.size() == 1) {
    local_rows = rows;
    return;
  }
  std::vector<int64_t> counts;
  for (const auto& q : etp_counts_) counts.push_back(total(q) * h_);
  Buf by_rank(rows.size());
  regroup(rows.data(), by_rank.data(), etp_counts_, h_, true);
  local_rows.resize(sz(counts[sz(etp.rank())]));
  etp.reduce_scatter_v_async(by_rank.data(), local_rows.data(), counts, ReduceOp::kSum)->wait();
}

void TokenDispatcher::owners_to_experts(const PassContext& c, const Buf& owner_rows, Buf& expert_rows) const {
  Buf received(sz(total(recv_counts_)));
  c.groups.ep->all_to_all_v(owner_rows.data(), send_counts_, received.data(), recv_counts_);
  expert_rows.resize(received.size());
  regroup(received.data(), expert_rows.data(), from_source_, h_, false);
}

void TokenDispatcher::experts_to_owners(const PassContext& c, const Buf& expert_rows, Buf& owner_rows) const {
  Buf by_source(expert_rows.size());
  regroup(expert_rows.data(), by_source.data(), from_source_, h_, true);
  owner_rows.resize(sz(total(send_counts_)));
  c.groups.ep->all_to_all_v(by_source.data(), recv_counts_, owner_rows.data(), send_counts_);
}

void TokenDispatcher::combine(const PassContext& c, const Buf& y, Buf& out) {
  const int64_t h = h_;
  Buf local;
  scatter_expert_tp(c, y, local);
  out.assign(sz(Tl_ * h), 0.0f);
  if (alltoall_) {
    experts_to_owners(c, local, owner_y_);
    for (size_t a = 0; a < mine_.size(); ++a) {
      float* o = &out[sz(mine_[a].token * h)];
      const float* r = &owner_y_[a * sz(h)];
      for (int64_t i = 0; i < h; ++i) o[i] += mine_[a].weight * r[i];
    }
    return;
  }
  picked_y_ = std::move(local);
  Communicator& ep = *c.groups.ep;
  Buf sum(sz(ep.size() * Tl_ * h), 0.0f);
  for (size_t i = 0; i < picked_.size(); ++i) {
    float* o = &sum[sz((picked_[i].source * Tl_ + picked_[i].token) * h)];
    const float* r = &picked_y_[i * sz(h)];
    for (int64_t j = 0; j < h; ++j) o[j] += picked_[i].weight * r[j];
  }
  ep.reduce_scatter(sum.data(), out.data(), Tl_ * h, ReduceOp::kSum);
}

void TokenDispatcher::combine_backward(const PassContext& c, const Buf& dout, Buf& dy, Buf& dweight) {
  const int64_t h = h_, k = c.D.topk;
  dweight.assign(sz(Tl_ * k), 0.0f);
  auto dot = [h](const float* a, const float* b) {
    double s = 0;
    for (int64_t i = 0; i < h; ++i) s += static_cast<double>(a[i]) * b[i];
    return static_cast<float>(s);
  };
  Buf local;
  if (alltoall_) {
    Buf owner(mine_.size() * sz(h));
    for (size_t a = 0; a < mine_.size(); ++a) {
      const float* g = &dout[sz(mine_[a].token * h)];
      for (int64_t i = 0; i < h; ++i) owner[a * sz(h) + sz(i)] = mine_[a].weight * g[i];
      if (mine_[a].slot >= 0) dweight[sz(mine_[a].token * k + mine_[a].slot)] = dot(&owner_y_[a * sz(h)], g);
    }
    owners_to_experts(c, owner, local);
  } else {
    Communicator& ep = *c.groups.ep;
    Buf all(sz(ep.size() * Tl_ * h)), dw_all(sz(ep.size() * Tl_ * k), 0.0f);
    ep.all_gather(dout.data(), all.data(), Tl_ * h);
    local.resize(picked_.size() * sz(h));
    for (size_t i = 0; i < picked_.size(); ++i) {
      const int64_t g = picked_[i].source * Tl_ + picked_[i].token;
      const float* d = &all[sz(g * h)];
      for (int64_t j = 0; j < h; ++j) local[i * sz(h) + sz(j)] = picked_[i].weight * d[j];
      if (picked_[i].slot >= 0) dw_all[sz(g * k + picked_[i].slot)] = dot(&picked_y_[i * sz(h)], d);
    }
    ep.reduce_scatter(dw_all.data(), dweight.data(), Tl_ * k, ReduceOp::kSum);
  }
  gather_expert_tp(c, local, dy);
}

void TokenDispatcher::dispatch_backward(const PassContext& c, const Buf& dx, Buf& dln) {
  const int64_t h = h_;
  Buf local;
  scatter_expert_tp(c, dx, local);
  if (alltoall_) {
    Buf owner;
    experts_to_owners(c, local, owner);
    for (size_t a = 0; a < mine_.size(); ++a) {
      float* o = &dln[sz(mine_[a].token * h)];
      const float* r = &owner[a * sz(h)];
      for (int64_t i = 0; i < h; ++i) o[i] += r[i];
    }
    return;
  }
  Communicator& ep = *c.groups.ep;
  Buf sum(sz(ep.size() * Tl_ * h), 0.0f), mine(sz(Tl_ * h));
  for (size_t i = 0; i < picked_.size(); ++i) {
    float* o = &sum[sz((picked_[i].source * Tl_ + picked_[i].token) * h)];
    const float* r = &local[i * sz(h)];
    for (int64_t j = 0; j < h; ++j) o[j] += r[j];
  }
  ep.reduce_scatter(sum.data(), mine.data(), Tl_ * h, ReduceOp::kSum);
  for (int64_t i = 0; i < Tl_ * h; ++i) dln[sz(i)] += mine[sz(i)];
}

}  // namespace mt::cpu
