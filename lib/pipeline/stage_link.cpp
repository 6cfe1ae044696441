// stage_link.cpp: the NCCL link between pipeline stages.
#include "pipeline/stage_link.h"

#include "comm/cuda/stream_collectives.h"
#include "tensor/cuda/cuda_check.h"

namespace mt {

NcclStageLink::NcclStageLink(StreamCollectives& pipeline) : pipeline_(pipeline) {
  MT_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
}

NcclStageLink::~NcclStageLink() {
  cudaEventDestroy(ready_);
  cudaEventDestroy(done_);
  cudaStreamDestroy(stream_);
}

void NcclStageLink::post(const std::vector<Transfer>& batch, cudaStream_t compute) {
  // The sends read what the compute stream wrote; the receives' buffers are free once it got this far.
  MT_CUDA_CHECK(cudaEventRecord(ready_, compute));
  MT_CUDA_CHECK(cudaStreamWaitEvent(stream_, ready_, 0));
  // Activations (16-bit or fp32) and gradients (fp32) in one launch: counted as 16-bit elements (NCCL moves bytes).
  std::vector<StreamCollectives::Transfer> t;
  for (const Transfer& x : batch) t.push_back({x.send, x.data, static_cast<int64_t>(x.bytes / 2), x.peer});
  pipeline_.send_recv_on(t, WireType::kBF16, stream_);
  MT_CUDA_CHECK(cudaEventRecord(done_, stream_));
}

void NcclStageLink::complete(cudaStream_t compute) { MT_CUDA_CHECK(cudaStreamWaitEvent(compute, done_, 0)); }

}  // namespace mt
