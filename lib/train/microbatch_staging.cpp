// microbatch_staging.cpp: layout of a slot (int32 words, T = tokens per microbatch): tokens [0, T),
// labels [T, 2T), positions [2T, 3T), loss-mask bits [3T, 4T), the token CSR from 4T (ids T, offsets T + 1,
// positions T), the position CSR from 7T + 1 (same three arrays), then (from 10T + 2, 8-byte aligned) the
// hidden-dropout keys as uint64, then the document starts of --reset-attention-mask (T).
#include "train/microbatch_staging.h"

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "tensor/cuda/cuda_check.h"

namespace mt {

MicrobatchSlot::MicrobatchSlot(int64_t T, int64_t max_keys)
    : T_(T), n_(static_cast<size_t>(11 * T + 2 + 2 * max_keys)), max_keys_(max_keys) {
  MT_CUDA_CHECK(cudaMallocHost(&host_, n_ * 4));
  MT_CUDA_CHECK(cudaMalloc(&dev_, n_ * 4));
  MT_CUDA_CHECK(cudaEventCreateWithFlags(&copied_, cudaEventDisableTiming));
}

MicrobatchSlot::~MicrobatchSlot() {
  cudaFreeHost(host_);
  cudaFree(dev_);
  cudaEventDestroy(copied_);
}

DeviceMicrobatch MicrobatchSlot::upload(const Microbatch& mb, bool learned_pos, int64_t vocab_start, int64_t vocab_local, int64_t max_pos,
                                        cudaStream_t stream,
                                        const std::function<void(cudaEvent_t)>& wait, const std::vector<uint64_t>& drop_keys) {
  if (static_cast<int64_t>(drop_keys.size()) > max_keys_) throw std::logic_error("microbatch slot: more dropout keys than its room");
  if (used_) {  // the last copy out of this buffer finished (bounds the host's run-ahead to two iterations)
    const auto t0 = std::chrono::steady_clock::now();
    wait(copied_);
    wait_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  }
  used_ = true;
  const int64_t T = mb.B * mb.S;
  int32_t* h = host_;
  std::memcpy(h, mb.tokens.data(), static_cast<size_t>(T) * 4);
  std::memcpy(h + T_, mb.labels.data(), static_cast<size_t>(T) * 4);
  // (one positions array: the learned position embeddings' where the model has them, else RoPE's, which under
  // --reset-position-ids are the sequence's, as Megatron's; MLA beside learned positions with the reset is refused)
  std::memcpy(h + 2 * T_, learned_pos ? mb.positions.data() : rope_positions(mb), static_cast<size_t>(T) * 4);
  std::memcpy(h + 3 * T_, mb.loss_mask.data(), static_cast<size_t>(T) * 4);
  const auto tok = cuda::build_token_csr(mb.tokens.data(), T, vocab_start, vocab_local);
  put_csr(tok, 4);
  DeviceMicrobatch d;
  if (learned_pos) put_csr(cuda::build_token_csr(mb.positions.data(), T, 0, max_pos), 7);
  if (!drop_keys.empty()) std::memcpy(h + 10 * T_ + 2, drop_keys.data(), drop_keys.size() * 8);
  int32_t* row_start = h + 10 * T_ + 2 + 2 * max_keys_;
  if (!mb.row_start.empty()) std::memcpy(row_start, mb.row_start.data(), static_cast<size_t>(T) * 4);
  MT_CUDA_CHECK(cudaMemcpyAsync(dev_, host_, n_ * 4, cudaMemcpyHostToDevice, stream));
  MT_CUDA_CHECK(cudaEventRecord(copied_, stream));
  d.B = mb.B;
  d.S = mb.S;
  d.first_sample = mb.first_sample;
  d.tokens = dev_;
  d.labels = dev_ + T_;
  d.positions = dev_ + 2 * T_;
  d.loss_mask = reinterpret_cast<const float*>(dev_ + 3 * T_);
  d.tok_ids = dev_ + 4 * T_;
  d.tok_offsets = dev_ + 5 * T_;
  d.tok_positions = dev_ + 6 * T_ + 1;
  d.n_tok_ids = static_cast<int64_t>(tok.ids.size());
  if (learned_pos) {
    d.pos_ids = dev_ + 7 * T_ + 1;
    d.pos_offsets = dev_ + 8 * T_ + 1;
    d.pos_positions = dev_ + 9 * T_ + 2;
    d.n_pos_ids = n_pos_;
  }
  if (!drop_keys.empty()) d.drop_keys = reinterpret_cast<const uint64_t*>(dev_ + 10 * T_ + 2);
  if (!mb.row_start.empty()) d.row_start = dev_ + 10 * T_ + 2 + 2 * max_keys_;
  static std::atomic<uint64_t> uploads{0};
  d.serial = ++uploads;
  return d;
}

void MicrobatchSlot::put_csr(const cuda::TokenCsr& c, int64_t at) {
  int32_t* base = host_ + at * T_ + (at == 7 ? 1 : 0);
  std::memcpy(base, c.ids.data(), c.ids.size() * 4);
  std::memcpy(base + T_, c.offsets.data(), c.offsets.size() * 4);
  std::memcpy(base + 2 * T_ + 1, c.positions.data(), c.positions.size() * 4);
  if (at == 7) n_pos_ = static_cast<int64_t>(c.ids.size());
}

}  // namespace mt
