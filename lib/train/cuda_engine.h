// cuda_engine.h: the CUDA engine behind the training loop (one GPU per rank): the model, the gradients and
// the optimizer state on the device. Microbatches are staged in pinned host buffers (two sets, alternating
// iterations; an event guards reuse) and copied asynchronously; the schedule, the gradient norm, the skip
// decision and AdamW are queued on the training stream (collectives on NCCL's streams, ordered by events).
// The host never waits inside a step: the loss, the gradient norm and the skip decision stay on the device
// (a history per iteration) and are read when the loop asks (log intervals, evaluation, saves).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "data/token_source.h"
#include "kernels/cuda/optimizer_step.h"
#include "model/cuda/gpt_cuda.h"
#include "model/layout.h"
#include "optim/cuda/offloaded_adam.h"
#include "optim/data_parallel.h"
#include "optim/loss_scaler.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "pipeline/cuda_stage.h"
#include "pipeline/stage_link.h"
#include "train/microbatch_staging.h"
#include "train/training_loop.h"
#ifdef MEGATRAIN_HAVE_NCCL
#include "comm/cuda/nccl_communicator.h"
#include "optim/cuda/device_data_parallel.h"
#endif

namespace mt {

class CudaEngine final : public TrainingEngine {
 public:
  CudaEngine(const Config& cfg, ProcessGroups groups, const TokenSource& data, bool lead);
  ~CudaEngine() override;
  TrainState resumed() const override { return resumed_; }
  std::vector<std::string> describe() const override;
  void step(int64_t iteration, int64_t first_sample, int64_t num_microbatches, double lr) override;
  bool reports_each_step() const override { return false; }
  std::vector<StepReport> read_reports() override;
  double loss_scale() const override { return cfg_.precision.fp16 ? last_.loss_scale : 1.0; }
  double params_norm() override;
  bool any_rank(bool mine) override;  // (over the world's NCCL communicator: a device flag)
  double evaluate(int64_t iteration, Split split, int64_t first_sample) override;
  void save(TrainState state) override;
  double peak_tflops() const override { return peak_; }
  // The caching allocator's and device_malloc's counts, and the most GPU memory any rank's process has used (total - free, sampled at log intervals; the caching allocator
  // keeps its blocks, so the sample after the steps is their peak); the first call prints Megatron's report_memory
  // line on each rank of DP rank 0.
  DeviceMemory device_memory(int64_t iteration) override;
  void finish() override;

 private:
  // The iteration's gradients zeroed on the compute stream, less the ranges the chunks' weight gradient GEMMs overwrite.
  void zero_gradients();
  void setup_optimizer_state(const std::vector<Optimizer::Segment>& segments);
  void setup_data_parallel();
  // Every host wait on the device goes through here: with data or tensor parallelism it polls an NCCL
  // communicator, so a dead peer ends the job after --distributed-timeout-seconds instead of hanging it.
  void wait_event(cudaEvent_t ev);
  void wait_stream();
  cuda::StepState read_state();
  // partials_ = the norm partial sums of x (gradients, indexed like the parameters, or master weights,
  // indexed like the optimizer state), summed over TP, and over DP when each rank owns a shard.
  // By state: the chunks whose state is on the device, plus `host_part` (the offloaded state's share).
  void norm_partials(const float* x, bool by_state, const float* loss = nullptr, float host_part = 0.0f);
  // Averages host values over the data-parallel group (log and validation time only).
  void dp_average(float* values, int64_t n);
  // values[n] (host) reduced over `group` through avg_buf_ (NCCL reduces device memory; n at most the history x its values per step).
  void reduce_through_device(Communicator& group, float* values, int64_t n, ReduceOp op);
  void params_gathered();
  void profile_report(int64_t iteration, double waited_before, int64_t mallocs_before);
  void make_drop_keys(const Microbatch& mb, int64_t step);
  // The stage's neighbours for a CudaPipelineStage (none at PP 1).
  StagePipeline stage_pipeline();
  double activation_gib() const;

  const Config& cfg_;
  ProcessGroups groups_;
  const TokenSource& data_;
  bool lead_;
  cudaStream_t stream_ = nullptr;
  std::string gpu_name_;
  double peak_ = -1;
  // The host side of the parameters (the shared layout and initial values) and of the optimizer state: kept by
  // the ranks that write checkpoints, dropped by the others after the upload.
  std::unique_ptr<ParamStore> host_;
  std::unique_ptr<Optimizer> host_opt_;
  std::unique_ptr<DataParallel> shard_layout_;
  // MoE with the distributed optimizer: the experts' shards over expert-DP (without EP the DP group itself), their
  // buckets reduced by expert_ddp_ after the dense ones.
  std::unique_ptr<DataParallel> expert_layout_;
  // MoE: each pending step's statistics (the model's sums over its microbatches, moe_row_ floats) and microbatches.
  int64_t moe_row_ = 0;
  float* moe_hist_ = nullptr;
  std::vector<int64_t> moe_microbatches_;
  void add_moe_reports(std::vector<StepReport>& out);  // the distributed optimizer's buckets (set-up only)
  bool keep_host_ = false, loaded_ = false;
  int64_t P_ = 0, n_state_ = 0, dp_ = 1, dp_rank_ = 0;
  bool dist_opt_ = false, overlap_gather_ = false;
  LossScaler scaler_;
  std::optional<LrSchedule> decoupled_;  // --decoupled-lr: the word embeddings' and output layer's schedule
  TrainState resumed_;
#ifdef MEGATRAIN_HAVE_NCCL
  // Declared before the model: the model keeps raw pointers into their symmetric windows.
  std::shared_ptr<NcclCommunicator> tp_nccl_, dp_nccl_;
  // Pipeline parallelism: the pipeline group (the stages' transfers, the loss and the norm's partial sums)
  // and the embedding group (the tied word embeddings' gradient sum between the first and the last stage).
  std::shared_ptr<NcclCommunicator> pp_nccl_, embedding_nccl_, cp_nccl_, ep_nccl_, etp_nccl_;
#endif
  std::unique_ptr<CudaGPT> model_;  // chunk 0 of this stage: it owns the parameter, gradient and master buffers
  std::vector<std::unique_ptr<CudaGPT>> extra_chunks_;  // interleaving: the stage's other chunks, in model_'s buffers
  std::vector<CudaGPT*> chunks_models_;                 // every chunk, in order
  std::vector<ModelLayout> chunk_layouts_;
  // PP > 1: the link to the neighbouring stages and the pools of boundary buffers (kept across iterations).
  int64_t pp_ = 1, pp_rank_ = 0;
  int64_t cp_ = 1, cp_rank_ = 0;  // context parallelism
  std::unique_ptr<StageLink> link_;
  std::unique_ptr<StageBuffers> boundary_activations_, boundary_gradients_;
  int64_t tied_offset_ = -1, tied_numel_ = 0;  // this stage's tied word embeddings across stages (-1: none)
  float *master_ = nullptr, *m_ = nullptr, *v_ = nullptr, *partials_ = nullptr, *eval_acc_ = nullptr, *avg_buf_ = nullptr;
  float *loss_hist_ = nullptr, *norm_hist_ = nullptr;
  // --exp-avg-dtype / --exp-avg-sq-dtype bf16 (Megatron's precision-aware optimizer): that moment stored here, m_ / v_ null
  cuda::bf16 *m16_ = nullptr, *v16_ = nullptr;
  int32_t* skip_hist_ = nullptr;
  // --log-num-zeros-in-grad: each pending step's zero entries of the gradient on this rank (weighted as the norm's
  // squares), summed over the ranks as the norm at read_reports; null without the flag.
  double* zeros_hist_ = nullptr;
  cuda::StepState* st_ = nullptr;
  cuda::LossScaleRule scale_rule_;
  std::vector<cuda::AdamChunk> chunks_;  // every parameter chunk (the gradient norm)
  cuda::AdamChunk* d_chunks_ = nullptr;
  // The chunks the GPU updates (all of them unless offloading), their state indexed in the device's arrays.
  std::vector<cuda::AdamChunk> gpu_chunks_;
  cuda::AdamChunk* d_gpu_chunks_ = nullptr;
  // --optimizer-cpu-offload: the state indices [0, n_offloaded_) on the CPU (in the host optimizer's arrays when
  // this rank keeps one for checkpoints, else in offload_state_), the rest on the device.
  bool offloading_ = false;
  int64_t n_offloaded_ = 0;
  std::vector<float> offload_state_;
  std::unique_ptr<OffloadedAdam> offload_;
  float grad_share_ = 1.0f;
#ifdef MEGATRAIN_HAVE_NCCL
  std::unique_ptr<DeviceDataParallel> ddp_;
  // MoE with expert-DP > 1: the experts' buckets over expert-DP (reduced after the dense ones, not overlapped; gathered
  // after the step); null otherwise.
  std::unique_ptr<DeviceDataParallel> expert_ddp_;
  // --overlap-param-gather with MoE: the optimizer chunks of the experts [first, end), updated and gathered after the
  // backward (not bucket by bucket).
  std::pair<int64_t, int64_t> expert_chunks_{0, 0};
  std::shared_ptr<NcclCommunicator> expert_dp_nccl_;
#endif
  // --overlap-param-gather: the chunks [first, second) of the table that update the bucket starting at lo.
  std::map<int64_t, std::pair<int64_t, int64_t>> bucket_chunks_;
  int64_t nmb_max_ = 1;
  std::vector<std::unique_ptr<MicrobatchSlot>> slots_;
  std::vector<std::unique_ptr<MicrobatchSlot>> eval_slots_;
  std::vector<uint64_t> drop_keys_;
  std::unique_ptr<CheckpointSaver> saver_;
  cudaEvent_t drained_ = nullptr;
  int64_t profile_iter_ = -1;
  int64_t pending_ = 0;     // steps queued since the last read_reports
  cuda::StepState last_{};  // the device state at the last read
  double used_peak_ = 0;     // this rank's largest sample of the device's used memory
  bool memory_reported_ = false;
};

}  // namespace mt
