// data_parallel.h: gradient reduction over the data-parallel (x context-parallel) group in buckets of
// whole parameters (--ddp-bucket-size), launched as soon as a bucket's gradients are final during the
// last microbatch's backward (--overlap-grad-reduce), optionally in bf16 (--grad-reduce-in-bf16).
// With --use-distributed-optimizer each bucket is split over the DP ranks: gradients are
// reduce-scattered to the shard owners and updated parameters all-gathered back (--overlap-param-gather).
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
  std::vector<int64_t> shard_counts;  // elements owned by each DP rank, back to back from begin
  int64_t shard_begin = 0, shard_end = 0;  // this rank's shard
};

class DataParallel {
 public:
  DataParallel(const Config& cfg, ParamStore& params, std::shared_ptr<Communicator> dp_group);
  ~DataParallel();

  const std::vector<GradBucket>& buckets() const { return buckets_; }
  bool distributed_optimizer() const { return dist_opt_; }
  // Flat ranges whose optimizer state this rank owns (all parameters without the distributed optimizer).
  std::vector<std::pair<int64_t, int64_t>> owned_ranges() const;

  // Gradient sync of one iteration: arm() before the last microbatch's backward; the model's
  // grads-ready hook calls on_grads_ready(); finish() launches what is left and waits. Afterwards the
  // owned ranges of the gradient buffer hold the DP average.
  void arm();
  void on_grads_ready(int64_t lowest_final_offset);
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
  std::shared_ptr<Communicator> dp_;
  bool dist_opt_, overlap_grad_, overlap_param_, bf16_reduce_;
  std::vector<GradBucket> buckets_;
  std::vector<std::unique_ptr<CommRequest>> grad_reqs_, param_reqs_;
  std::vector<std::vector<float>> shard_tmp_;
  std::vector<char> held_, launched_;  // per bucket
  bool armed_ = false;
  size_t next_ = 0;  // next bucket to launch (buckets run from the end of the buffer)
};

}  // namespace mt
