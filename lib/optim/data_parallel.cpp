// data_parallel.cpp: bucketed all-reduce / reduce-scatter of gradients and all-gather of parameters.
#include "optim/data_parallel.h"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "tensor/dtype.h"

namespace mt {

DataParallel::DataParallel(const Config& c, ParamStore& params, std::shared_ptr<Communicator> dp, GradGroup group, double scale,
                           std::shared_ptr<Communicator> instances)
    : params_(params),
      dp_(std::move(dp)),
      instances_(std::move(instances)),
      dist_opt_(c.training.use_distributed_optimizer),
      overlap_grad_(c.training.overlap_grad_reduce),
      overlap_param_(c.training.overlap_param_gather),
      bf16_reduce_(c.precision.grad_reduce_in_bf16),
      scale_(scale) {
  const int64_t ndp = dp_->size();
  // Megatron: one bucket unless overlapping or asked; overlapping default max(40M, 1M x DP) elements (DP the whole group's,
  // every instance's ranks).
  const int64_t whole_dp = ndp * (instances_ ? instances_->size() : 1);
  std::tie(region_begin_, region_end_) = params_.group_range(group);
  int64_t bucket = std::max<int64_t>(1, region_end_ - region_begin_);
  if (c.training.ddp_bucket_size) bucket = std::max<int64_t>(1, *c.training.ddp_bucket_size);
  else if (overlap_grad_) bucket = std::max<int64_t>(40000000, 1000000 * whole_dp);
  // The group's parameters in reverse registration order: the order backward finishes them.
  std::vector<size_t> mine;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (params_.info(i).grad_group == group) mine.push_back(i);
  }
  GradBucket cur;
  cur.end = region_end_;
  for (size_t j = mine.size(); j-- > 0;) {
    const ParamInfo& p = params_.info(mine[j]);
    cur.begin = p.offset;
    cur.first_param = mine[j];
    if (cur.end - cur.begin >= bucket || j == 0 || params_.info(mine[j - 1]).chunk != p.chunk) {
      buckets_.push_back(cur);
      cur = GradBucket{};
      cur.end = p.offset;
    }
  }
  const int me = dp_->rank();
  for (auto& b : buckets_) {
    const int64_t m = b.end - b.begin;
    int64_t off = b.begin;
    for (int64_t r = 0; r < ndp; ++r) {
      const int64_t n = m / ndp + (r < m % ndp ? 1 : 0);
      b.shard_counts.push_back(n);
      if (r == me) {
        b.shard_begin = off;
        b.shard_end = off + n;
      }
      off += n;
    }
  }
  grad_reqs_.resize(buckets_.size());
  param_reqs_.resize(buckets_.size());
  shard_tmp_.resize(buckets_.size());
  held_.assign(buckets_.size(), 0);
  launched_.assign(buckets_.size(), 0);
}

void DataParallel::hold(size_t param) {
  const int64_t off = params_.info(param).offset;
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (buckets_[b].begin <= off && off < buckets_[b].end) held_[b] = 1;
  }
}

DataParallel::~DataParallel() = default;

std::vector<std::pair<int64_t, int64_t>> DataParallel::owned_ranges() const {
  if (!dist_opt_) return {{region_begin_, region_end_}};
  std::vector<std::pair<int64_t, int64_t>> out;
  for (auto it = buckets_.rbegin(); it != buckets_.rend(); ++it) out.emplace_back(it->shard_begin, it->shard_end);
  return out;
}

void DataParallel::arm() {
  armed_ = true;
  next_ = 0;
}

void DataParallel::launch(size_t b) {
  launched_[b] = 1;
  const ReduceOp op = scale_ > 0 ? ReduceOp::kSum : ReduceOp::kAvg;
  const GradBucket& bk = buckets_[b];
  float* g = params_.grads().f32();
  if (bf16_reduce_) {
    for (int64_t i = bk.begin; i < bk.end; ++i) g[i] = round_bf16(g[i]);
  }
  if (dist_opt_) {
    shard_tmp_[b].resize(static_cast<size_t>(bk.shard_end - bk.shard_begin));
    grad_reqs_[b] = dp_->reduce_scatter_v_async(g + bk.begin, shard_tmp_[b].data(), bk.shard_counts, op);
  } else {
    grad_reqs_[b] = dp_->all_reduce_async(g + bk.begin, bk.end - bk.begin, op);
  }
  if (!overlap_grad_) grad_reqs_[b]->wait();
}

void DataParallel::on_grads_ready(size_t lowest) {
  if (!armed_ || !overlap_grad_) return;
  for (; next_ < buckets_.size() && buckets_[next_].first_param >= lowest; ++next_) {
    if (!held_[next_]) launch(next_);
  }
}

void DataParallel::finish() {
  // What has not gone out yet, held buckets included, in bucket order (the same on every DP rank).
  for (size_t b = 0; b < buckets_.size(); ++b) {
    if (!launched_[b]) launch(b);
  }
  std::fill(launched_.begin(), launched_.end(), 0);
  float* g = params_.grads().f32();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    grad_reqs_[b]->wait();
    const GradBucket& bk = buckets_[b];
    if (dist_opt_ && instances_ && instances_->size() > 1) {  // (the shard over the instances: an average of averages of equal groups)
      if (bf16_reduce_) {  // (Megatron's bf16 buffer holds the slice's sum before the instances reduce it)
        for (float& x : shard_tmp_[b]) x = round_bf16(x);
      }
      instances_->all_reduce(shard_tmp_[b].data(), static_cast<int64_t>(shard_tmp_[b].size()), scale_ > 0 ? ReduceOp::kSum : ReduceOp::kAvg);
    }
    if (dist_opt_) std::memcpy(g + bk.shard_begin, shard_tmp_[b].data(), shard_tmp_[b].size() * sizeof(float));
    const int64_t lo = dist_opt_ ? bk.shard_begin : bk.begin, hi = dist_opt_ ? bk.shard_end : bk.end;
    if (scale_ > 0) {
      const float s = static_cast<float>(scale_);
      for (int64_t i = lo; i < hi; ++i) g[i] *= s;
    }
    if (bf16_reduce_) {
      for (int64_t i = lo; i < hi; ++i) g[i] = round_bf16(g[i]);
    }
  }
  armed_ = false;
}

void DataParallel::start_param_gather() {
  if (!dist_opt_) return;
  float* w = params_.params().f32();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const GradBucket& bk = buckets_[b];
    param_reqs_[b] = dp_->all_gather_v_async(w + bk.shard_begin, w + bk.begin, bk.shard_counts);
    if (!overlap_param_) param_reqs_[b]->wait();
  }
}

void DataParallel::finish_param_gather() {
  for (auto& r : param_reqs_) {
    if (r) r->wait();
    r.reset();
  }
}

}  // namespace mt
