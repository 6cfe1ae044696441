// cpu_stage.cpp: the CPU stage's actions and boundary transfers.
#include "pipeline/cpu_stage.h"

#include <stdexcept>
#include <string>

namespace mt {
namespace {

GPTModel::Activations take(std::map<int64_t, GPTModel::Activations>& from, int64_t m, const char* what) {
  auto it = from.find(m);
  if (it == from.end()) throw std::logic_error(std::string("pipeline stage: no ") + what + " for microbatch " + std::to_string(m));
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

void CpuPipelineStage::one_chunk(int64_t chunk) {
  if (chunk != 0) throw std::logic_error("the CPU stage holds one model chunk");
}

void CpuPipelineStage::forward(int64_t microbatch, int64_t chunk) {
  one_chunk(chunk);
  const ModelLayout& at = model_.layout();
  GPTModel::Activations in = at.pre_process ? GPTModel::Activations{} : take(inputs_, microbatch, "received activations");
  GPTModel::Activations out;
  loss_sum_ += model_.forward_stage(microbatch, get_(microbatch), step_, training_, std::move(in), at.post_process ? nullptr : &out);
  ++forwards_;
  if (!at.post_process) outputs_[microbatch] = std::move(out);
}

void CpuPipelineStage::backward(int64_t microbatch, int64_t chunk, bool last, bool with_weights) {
  one_chunk(chunk);
  const ModelLayout& at = model_.layout();
  GPTModel::Activations dy = at.post_process ? GPTModel::Activations{} : take(output_grads_, microbatch, "received gradient");
  GPTModel::Activations dx;
  model_.backward_stage(microbatch, grad_scale_, last, std::move(dy), at.pre_process ? nullptr : &dx, !with_weights);
  if (!at.pre_process) input_grads_[microbatch] = std::move(dx);
}

void CpuPipelineStage::backward_weights(int64_t microbatch, int64_t chunk, bool last) {
  one_chunk(chunk);
  model_.backward_weights(microbatch, last);
}

void CpuPipelineStage::exchange(const std::vector<ScheduleAction>& transfers) {
  if (!pipeline_ || pipeline_->size() == 1) throw std::logic_error("pipeline stage: transfers without a pipeline group");
  const int me = pipeline_->rank();
  // Every boundary carries one microbatch's residual-stream rows of this TP rank: a size known in advance.
  const int64_t n = model_.boundary_elements(micro_batch_size_);
  std::vector<P2POp> ops;
  std::vector<std::pair<std::map<int64_t, GPTModel::Activations>*, int64_t>> sent;
  for (const ScheduleAction& a : transfers) {
    switch (a.kind) {
      case ActionKind::kSendForward:
        ops.push_back(P2POp::send(outputs_.at(a.microbatch).data(), n, me + 1));
        sent.emplace_back(&outputs_, a.microbatch);
        break;
      case ActionKind::kSendBackward:
        ops.push_back(P2POp::send(input_grads_.at(a.microbatch).data(), n, me - 1));
        sent.emplace_back(&input_grads_, a.microbatch);
        break;
      case ActionKind::kRecvForward:
        inputs_[a.microbatch].assign(static_cast<size_t>(n), 0.0f);
        ops.push_back(P2POp::recv(inputs_[a.microbatch].data(), n, me - 1));
        break;
      case ActionKind::kRecvBackward:
        output_grads_[a.microbatch].assign(static_cast<size_t>(n), 0.0f);
        ops.push_back(P2POp::recv(output_grads_[a.microbatch].data(), n, me + 1));
        break;
      default: throw std::logic_error("pipeline stage: " + action_name(a) + " is not a transfer");
    }
  }
  pipeline_->send_recv_batch_async(ops)->wait();
  for (auto& [from, m] : sent) from->erase(m);
}

}  // namespace mt
