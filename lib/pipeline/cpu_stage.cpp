// cpu_stage.cpp: the CPU stage's actions and boundary transfers.
#include "pipeline/cpu_stage.h"

#include <stdexcept>
#include <string>

namespace mt {
namespace {

using Key = std::pair<int64_t, int64_t>;

GPTModel::Activations take(std::map<Key, GPTModel::Activations>& from, Key key, const char* what) {
  auto it = from.find(key);
  if (it == from.end()) {
    throw std::logic_error(std::string("pipeline stage: no ") + what + " for microbatch " + std::to_string(key.second) + " of chunk " +
                           std::to_string(key.first));
  }
  GPTModel::Activations v = std::move(it->second);
  from.erase(it);
  return v;
}

}  // namespace

CpuPipelineStage::CpuPipelineStage(GPTModel& model, std::function<Microbatch(int64_t)> get_microbatch, int64_t step, float grad_scale,
                                   Communicator* pipeline, int64_t micro_batch_size, bool training)
    : model_(model),
      get_(std::move(get_microbatch)),
      step_(step),
      grad_scale_(grad_scale),
      pipeline_(pipeline),
      micro_batch_size_(micro_batch_size),
      training_(training) {}

void CpuPipelineStage::forward(int64_t microbatch, int64_t chunk) {
  const ModelLayout& at = model_.layout(chunk);
  const Key key{chunk, microbatch};
  GPTModel::Activations in = at.pre_process ? GPTModel::Activations{} : take(inputs_, key, "received activations");
  GPTModel::Activations out;
  const float loss = model_.forward_stage(microbatch, get_(microbatch), step_, training_, std::move(in), at.post_process ? nullptr : &out, chunk);
  if (at.post_process) {
    losses_.emplace_back(microbatch, loss);
  } else {
    outputs_[key] = std::move(out);
  }
}

void CpuPipelineStage::backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) {
  const ModelLayout& at = model_.layout(chunk);
  const Key key{chunk, microbatch};
  GPTModel::Activations dy = at.post_process ? GPTModel::Activations{} : take(output_grads_, key, "received gradient");
  GPTModel::Activations dx;
  model_.backward_stage(microbatch, grad_scale_, last, std::move(dy), at.pre_process ? nullptr : &dx, !with_weights, chunk);
  if (!at.pre_process) input_grads_[key] = std::move(dx);
}

void CpuPipelineStage::backward_weights(int64_t microbatch, int64_t chunk, bool last) { model_.backward_weights(microbatch, last, chunk); }

void CpuPipelineStage::exchange(const std::vector<ScheduleAction>& transfers) {
  if (!pipeline_ || pipeline_->size() == 1) throw std::logic_error("pipeline stage: transfers without a pipeline group");
  if (pending_) throw std::logic_error("pipeline stage: a batch of transfers is already in flight");
  const int me = pipeline_->rank(), P = pipeline_->size();
  const int next = (me + 1) % P, prev = (me + P - 1) % P;  // the ring of virtual stages
  // Every boundary carries one microbatch's residual-stream rows of this TP rank: a size known in advance.
  const int64_t n = model_.boundary_elements(micro_batch_size_);
  std::vector<P2POp> ops;
  for (const ScheduleAction& a : transfers) {
    const Key key{a.chunk, a.microbatch};
    switch (a.kind) {
      case ActionKind::kSendForward:
        ops.push_back(P2POp::send(outputs_.at(key).data(), n, next));
        sending_.emplace_back(&outputs_, key);
        break;
      case ActionKind::kSendBackward:
        ops.push_back(P2POp::send(input_grads_.at(key).data(), n, prev));
        sending_.emplace_back(&input_grads_, key);
        break;
      case ActionKind::kRecvForward:
        inputs_[key].assign(static_cast<size_t>(n), 0.0f);
        ops.push_back(P2POp::recv(inputs_[key].data(), n, prev));
        break;
      case ActionKind::kRecvBackward:
        output_grads_[key].assign(static_cast<size_t>(n), 0.0f);
        ops.push_back(P2POp::recv(output_grads_[key].data(), n, next));
        break;
      default: throw std::logic_error("pipeline stage: " + action_name(a) + " is not a transfer");
    }
  }
  pending_ = pipeline_->send_recv_batch_async(ops);
}

void CpuPipelineStage::complete_exchange() {
  if (!pending_) return;
  pending_->wait();
  pending_.reset();
  for (auto& [from, key] : sending_) from->erase(key);
  sending_.clear();
}

}  // namespace mt
