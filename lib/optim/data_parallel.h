// data_parallel.h: gradient reduction over the data-parallel (x context-parallel) group in buckets of
// whole parameters (--ddp-bucket-size), launched as soon as a bucket's gradients are final during the
// last microbatch's backward (--overlap-grad-reduce), optionally in bf16 (--grad-reduce-in-bf16).
// With --use-distributed-optimizer each bucket is split over the DP ranks: gradients are
// reduce-scattered to the shard owners and updated parameters all-gathered back (--overlap-param-gather).
// One instance per gradient group: the dense parameters over DP x CP, the experts' over expert-DP (each
// group's parameters are contiguous in the flat buffers, ParamStore::group_range).
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "config/config.h"
#include "model/params.h"

namespace mt {

struct GradBucket {
  int64_t begin = 0, end = 0;         // flat range [begin, end) of whole parameters
  size_t first_param = 0;             // the lowest parameter index in it
  std::vector<int64_t> shard_counts;  // elements owned by each DP rank, back to back from begin
  int64_t shard_begin = 0, shard_end = 0;  // this rank's shard
};

class DataParallel {
 public:
  // scale 0: the gradients averaged over the group; else summed and multiplied by scale. instances (with the distributed
  // optimizer; --num-distributed-optimizer-instances): dp_group is then this rank's instance, whose ranks shard the state,
  // and each reduced shard is reduced once more over `instances` (the same shard's holders in the other instances), so the
  // gradients are those of the whole data-parallel group.
  DataParallel(const Config& cfg, ParamStore& params, std::shared_ptr<Communicator> dp_group, GradGroup group = GradGroup::kDense,
               double scale = 0, std::shared_ptr<Communicator> instances = nullptr);
  ~DataParallel();

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  bool distributed_optimizer() const { return dist_opt_; }
  // Flat ranges whose optimizer state this rank owns (all parameters without the distributed optimizer).
  std::vector<std::pair<int64_t, int64_t>> owned_ranges() const;

  // Gradient sync of one iteration: arm() before the last microbatch's backward; the model's
  // grads-ready hook calls on_grads_ready() with the lowest parameter index whose gradients (and those of every
  // parameter after it) are final; finish() launches what is left and waits. Afterwards the owned ranges of the
  // gradient buffer hold the average over the group's ranks.
  void arm();
  void on_grads_ready(size_t lowest_final_param);
  void finish();
  // The bucket holding parameter `param` waits for finish() even when its gradients are final earlier (the
  // tied word embeddings, whose gradient is summed over the pipeline's embedding group first).
  void hold(size_t param);

  // After the optimizer wrote its shards: all-gather the parameters (distributed optimizer only).
  void start_param_gather();
  void finish_param_gather();

 private:
  void launch(size_t b);
  ParamStore& params_;
  std::shared_ptr<Communicator> dp_, instances_;
  bool dist_opt_, overlap_grad_, overlap_param_, bf16_reduce_;
  int64_t region_begin_ = 0, region_end_ = 0;  // the group's flat range
  double scale_ = 0;
  std::vector<GradBucket> buckets_;
  std::vector<std::unique_ptr<CommRequest>> grad_reqs_, param_reqs_;
  std::vector<std::vector<float>> shard_tmp_;
  std::vector<char> held_, launched_;  // per bucket
  bool armed_ = false;
  size_t next_ = 0;  // next bucket to launch (buckets run from the end of the buffer)
};

}  // namespace mt
