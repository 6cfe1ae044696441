// gpt_cuda.h: the GPT / LLaMA decoder on one GPU in mixed precision, Megatron style: fp32 master weights,
// a 16-bit (bf16, or fp16 with --fp16) working copy the GEMMs read, fp32 gradient accumulation (cuBLASLt
// writes weight gradients straight into the fp32 main-grad buffer), 16-bit activations and residual stream
// (fp32 with --fp32-residual-connection), cuDNN flash attention, fused norm / loss kernels. The parameter layout (names, flat offsets, initial values) is the
// one both engines build (model/layout.h), so checkpoints and parity tests line up element for element.
// Tensor parallelism (as the CPU model, Megatron's layout): this rank holds its shard of the heads, the
// FFN and the vocabulary; row-parallel partial sums are combined over TP in that 16-bit type (all-reduce, or
// under sequence parallelism reduce-scatter, with norms on sequence shards and all-gathers before the column-
// parallel GEMMs); the loss is vocabulary-parallel. TP collectives are queued on the compute stream, except
// the split layers' (the forward and backward of each layer as two interleaved halves of the micro batch,
// each half's reductions and the norms that consume them on a TP stream; under SP also the gathers that
// follow the norms). Everything else runs
// on one stream, except that under TP the output layer's and (without the split) the column-parallel
// layers' weight-gradient GEMMs run on a side stream joined at the end of a layer's backward; nothing here
// waits for the device.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "comm/cuda/stream_collectives.h"
#include "config/config.h"
#include "kernels/cuda/bf16_fwd.h"
#include "kernels/cuda/context_attention.h"
#include "kernels/cuda/dropout.h"
#include "kernels/cuda/fp8_swiglu.h"
#include "kernels/cuda/moe.h"
#include "kernels/cuda/norm_bf16.h"
#include "kernels/cuda/sdpa_cudnn.h"
#include "model/fp8_scaling.h"
#include "model/layout.h"
#include "model/model_dims.h"
#include "model/params.h"

namespace mt {

// One microbatch's inputs on the device (uploaded by the trainer from pinned staging buffers).
struct DeviceMicrobatch {
  int64_t B = 0, S = 0;
  int64_t first_sample = 0;  // the global index of its first sample (--moe-router-force-load-balancing's random logits)
  const int32_t *tokens = nullptr, *labels = nullptr, *positions = nullptr;
  const float* loss_mask = nullptr;
  // CSR of token positions per distinct token id (and per position id, with learned positions): the
  // deterministic embedding backward.
  const int32_t *tok_ids = nullptr, *tok_offsets = nullptr, *tok_positions = nullptr;
  int64_t n_tok_ids = 0;
  const int32_t *pos_ids = nullptr, *pos_offsets = nullptr, *pos_positions = nullptr;
  int64_t n_pos_ids = 0;
  // Hidden dropout (training only; null: none): the mask keys [B, 1 + 2L] of each sample, from
  // dropout_key(): the embedding output, then per layer the attention block's and the MLP's output.
  const uint64_t* drop_keys = nullptr;
  // MoE: the scale of the auxiliary losses' gradients (the lm loss's per-microbatch share: 1 / microbatches).
  float aux_grad_scale = 0;
  // --reset-attention-mask: each token's document start in its sample [B * S] (null: one document per sample), and
  // the upload's serial number (a new one per upload, 0: unknown), which tells the model when to rebuild its bias.
  const int32_t* row_start = nullptr;
  uint64_t serial = 0;
  // Attention dropout (training only; 0: none): the micro batch's seed, from which each layer's cuDNN attention takes its
  // own (CudaGPT::attention_seed).
  uint64_t attention_seed = 0;
};

class CudaGPT {
 public:
  // `layout` supplies names, offsets and initial values (uploaded once; the model keeps no host copy) and
  // `where` which parameter each unit reads (model/layout.h: both from build_model_layout). It is this rank's
  // pipeline stage (the whole model at PP 1) and TP shard; `tp` is the tensor-parallel group (nullptr: TP 1). Without keep_master (the
  // distributed optimizer keeps the master weights of its shard itself) master() is null.
  // dp (data parallelism): the group whose symmetric windows hold the gradient buffer, and the 16-bit
  // weights when !keep_master (the distributed optimizer gathers them); nullptr: ordinary allocations.
  // max_in_flight: how many microbatches may be forwarded before their backward (a pipeline schedule's
  // peak_in_flight; each holds its own activations). Above 1 the TP layers do not split (their SP row order is
  // set per forward).
  // share_params: another model chunk of the same stage (interleaved pipelining, `layout` holding every
  // chunk): this one uses that one's parameter, gradient and master buffers (its own offsets in them) instead
  // of allocating and uploading its own.
  CudaGPT(const Config& cfg, const ParamStore& layout, const ModelLayout& where, cudaStream_t stream, StreamCollectives* tp = nullptr,
          bool keep_master = true, StreamCollectives* dp = nullptr, int64_t max_in_flight = 1, const CudaGPT* share_params = nullptr);
  ~CudaGPT();
  CudaGPT(const CudaGPT&) = delete;
  CudaGPT& operator=(const CudaGPT&) = delete;

  // Forward (and, when grad_scale > 0, backward) of one microbatch. loss_acc[0] += loss_weight * sum of
  // masked token losses; gradients of (sum of masked losses * grad_scale) accumulate into grads().
  void step(const DeviceMicrobatch& mb, float grad_scale, float loss_weight, float* loss_acc);
  // The same in two calls (a pipeline stage's forward and backward), the microbatch's activations in `slot`
  // (< max_in_flight()): with grad_scale > 0 the forward also computes the loss gradient, and backward(mb, slot)
  // must come before that slot's next forward; mb's device buffers must live until then.
  // A pipeline stage without the embedding reads `input`, the previous stage's output; one without the output
  // layer writes `output` (both this rank's residual-stream rows, boundary_activation_bytes) and adds nothing to
  // loss_acc. Its backward reads `output_grad` (the next stage's input gradient) and, without the embedding,
  // writes `input_grad` (boundary_gradient_bytes, fp32). The buffers are read and written on the model's stream.
  void forward(const DeviceMicrobatch& mb, float grad_scale, float loss_weight, float* loss_acc, int64_t slot = 0, const void* input = nullptr,
               void* output = nullptr);
  // defer_weights: the input-gradient half B only (what zero-bubble schedules run first); the layers' weight-
  // gradient GEMMs and the grads-ready hooks wait for backward_weights(mb, slot), the slot held until then.
  // Not with full recompute (a recomputed layer's activations are gone after its backward) nor the split TP
  // layers. Under TP the gathered output gradients are saved; what needs this rank's rows (row-parallel bias
  // gradients under SP) and the reductions of replicated gradients stay in the backward, the K/V-replica sum
  // of the QKV weight gradient moves to W.
  void backward(const DeviceMicrobatch& mb, int64_t slot = 0, const float* output_grad = nullptr, float* input_grad = nullptr,
                bool defer_weights = false);
  // W: the weight gradients of the layers of the microbatch in `slot`, from the output gradients its deferred
  // backward saved and its activations.
  void backward_weights(const DeviceMicrobatch& mb, int64_t slot);
  // Whether backward can defer the weight gradients here (no full recompute, no split TP layers, no MoE layer, no
  // multi-latent attention).
  bool can_defer_weights() const { return !full_recompute_ && !mlp_recompute_ && !split_forward_ && moe_layers_ == 0 && !D_.mla; }
  cudaStream_t stream() const { return stream_; }
  bool pre_process() const { return pre_; }
  bool post_process() const { return post_; }
  // The stage boundary of a `tokens`-token microbatch: this rank's rows of width h (T / TP under SP) in the
  // residual stream's type (16-bit, or fp32 with --fp32-residual-connection) forward, fp32 backward.
  size_t boundary_activation_bytes(int64_t tokens) const;
  size_t boundary_gradient_bytes(int64_t tokens) const;
  int64_t max_in_flight() const { return static_cast<int64_t>(slots_.size()); }
  // Called during a backward (only when `final_backward` is set: the iteration's last microbatch) once the
  // gradients of every parameter at flat offset >= `lowest` are final: data parallelism starts its bucket
  // all-reduces from here, overlapping the rest of the backward.
  void set_grads_ready_hook(std::function<void(int64_t lowest)> hook) { grads_ready_ = std::move(hook); }
  void set_final_backward(bool final_backward) { final_backward_ = final_backward; }
  // Called in the forward before the parameters at flat offsets < `end` are first read (embedding, each
  // layer, then the output layer with end = numel()): the distributed optimizer's overlapped parameter gather
  // makes the compute stream wait for the buckets holding them.
  void set_params_needed_hook(std::function<void(int64_t end)> hook) { params_needed_ = std::move(hook); }
  // fp16: the loss gradient is multiplied by *scale (device memory, read when the backward runs).
  void set_loss_scale(const float* scale) { loss_scale_ = scale; }
  cuda::F16 half_type() const { return dt_; }

  int64_t numel() const { return numel_; }
  float* master() const { return master_; }
  float* grads() const { return grads_; }
  // The weight gradients that only their weight gradient GEMMs write (the layers' linear weights, the routed and shared
  // experts', an untied output layer's; not with the split TP layers) are written by the iteration's first such GEMM
  // with beta 0 instead of accumulated into zeroed memory, the same bits (0 + x is x); the engine zeroes everything
  // else. MEGATRAIN_WGRAD_OVERWRITE unset (kAuto): on when the run is one rank (the layouts of several have not run it
  // in check mode), =1 on for every layout, =0 off, =check: on, and the engine fills those ranges with NaN instead of
  // leaving them (tests). Any other value is an error.
  enum class WgradOverwrite { kAuto, kOff, kOn, kCheck };
  static WgradOverwrite wgrad_overwrite_mode();
  // Their ranges [offset, offset + count) in grads(), sorted:
  const std::vector<std::pair<int64_t, int64_t>>& overwritten_gradients() const { return overwrite_ranges_; }
  // ... and the start of an iteration's gradients (none of them written yet).
  void begin_gradients() { std::fill(overwrite_written_.begin(), overwrite_written_.end(), char{0}); }
  // ... and after the iteration's backward: throws where a range was neither written nor zeroed (its gradient would be
  // the last iteration's).
  void check_gradients_written() const;
  cuda::bf16* working() const { return w16_; }  // the 16-bit working copy (bf16 or fp16: half_type())
  const ModelDims& dims() const { return D_; }
  size_t activation_bytes() const { return act_bytes_; }
  // Tensor parallelism with the layers split in two halves of the micro batch (see split_layers_forward).
  bool split_layers() const { return split_forward_; }
  // The split layers under SP take each half's sums as an all-to-all plus the norm (see reduce_half).
  bool split_all_to_all() const { return all_to_all_; }
  // Refreshes the 16-bit working copy from the fp32 master weights (after loading; needs the master).
  void refresh_working();
  // MoE: the statistics the training forwards added since the last zeroing, per MoE layer of the stage (rows of
  // cuda::kMoeStatsHead + E floats: the three load-balancing losses without their coefficients, the z-loss's mean
  // lse^2, then the tokens each expert kept), on the device; nullptr without MoE layers.
  const float* moe_stats() const { return moe_acc_; }
  int64_t moe_layer_count() const { return moe_layers_; }
  int64_t moe_stats_row() const;  // the floats of a layer's row of moe_stats()
  std::vector<int64_t> moe_layer_indices() const;  // the global layer index of each row of moe_stats()
  void zero_moe_stats();
  // The MoE statistics summed over a group's ranks (data parallelism: the expert bias, qb_beta and the log take every
  // replica's tokens), in place, on the training stream.
  void sum_moe_stats(StreamCollectives& group);
  // --moe-router-enable-expert-bias: each MoE layer's bias (fp32, on the device, from the layout's values) moved by
  // `rate` towards balance from the iteration's statistics (queued after the step, before zero_moe_stats), and
  // copied into the host store's values for a checkpoint (waits for the stream).
  void update_expert_biases(float rate);
  // --moe-router-load-balancing-type quantile_balancing: each MoE layer's qb_beta (fp32, on the device, from the layout's
  // values) updated from the iteration's quantiles with --moe-router-quantile-balancing-ema (queued after the step,
  // after sum_moe_stats), as the CPU engine's GPTModel::update_quantile_biases.
  void update_quantile_biases(double ema);
  // The expert biases and the qb_betas into the host store's values, for a checkpoint (waits for the stream).
  void download_router_biases(ParamStore& host) const;
  // FP8's delayed scaling (model/fp8_scaling.h): whether this model uses it, and its state (scales, amax histories,
  // the weights' cast scales) copied from the device (waits for the stream) or to it, for checkpoints.
  bool fp8_delayed() const { return f8_scale_ != nullptr; }
  // FP8 casts' inverse scales as last used (tests: under tensorwise TP every rank's must be equal): each layer's 4 sites'
  // weights, then each layer's 4 input sites from its record (0 where a site has none, or the layer is recomputed).
  std::vector<float> fp8_last_inverse_scales() const;
  Fp8ScalingState fp8_scaling_state() const;
  void set_fp8_scaling_state(const Fp8ScalingState& state);

 private:
  struct LayerW;
  struct Record;
  struct Scratch;
  // A layer's units (gpt_cuda_units.cpp), each written once and run over a span of the microbatch's rows: all of them
  // (layer_forward and layer_backward's schedule), or half of its sequences (the split TP layers' schedule,
  // gpt_cuda_split.cpp, the same units around each half's TP reduction). A span is rows [first, first + rows) of the
  // layers' [T, .] buffers, `seqs` whole sequences with their positions; its rows of the residual stream (this rank's:
  // under SP a piece of every rank's) are [piece_first, piece_first + piece_rows). What needs a whole microbatch (context
  // parallelism, documents, attention dropout, qk-norm, K/V groups, squared ReLU, FP8, MoE, deferred weight gradients)
  // takes whole spans only (require_whole).
  struct RowSpan {
    int64_t first = 0, rows = 0, seqs = 0;
    const int32_t* positions = nullptr;
    int64_t piece_first = 0, piece_rows = 0;
    bool whole = true;
  };
  RowSpan whole_span(const DeviceMicrobatch& mb) const;
  RowSpan half_span(const DeviceMicrobatch& mb, int64_t half) const;
  void require_whole(int64_t l, const RowSpan& sp, const char* unit) const;
  // The model-wide features whose units take whole microbatches only (neither the split TP layers nor half spans).
  bool needs_whole_microbatches() const;
  // The attention block: from r.xn1's rows to the projection's output in s_->delta's (partial sums under TP).
  void attention_forward_unit(int64_t l, Record& r, const DeviceMicrobatch& mb, const RowSpan& sp);
  // The MLP block (dense; MoE over whole spans): from r.xn2's rows to s_->delta's.
  // (with_output false: a dense MLP's recompute, which leaves out fc2's GEMM: its backward reads no output)
  void mlp_forward_unit(int64_t l, Record& r, const DeviceMicrobatch& mb, const RowSpan& sp, bool with_output = true);
  // The residual adds and norms between the blocks, over the residual rows [p0, p0 + pr) on stream st; sum is the
  // block's output of those rows (summed over TP, or with parts its TP partials, which the kernel adds):
  // mlp_norm_forward: x_mid = x_in + attention, xn2 = the MLP's input norm of it; input_norm_forward (l > 0): layer l's
  // x_in = x_mid(l - 1) + MLP(l - 1), xn1 = its input norm. The backwards take d xn2 / d xn1 as sum and add the norm's
  // input gradient into s_->dres (and dres16).
  void mlp_norm_forward(int64_t l, Record& r, const DeviceMicrobatch& mb, int64_t p0, int64_t pr, const cuda::bf16* sum, cuda::Partials parts,
                        cudaStream_t st);
  void input_norm_forward(int64_t l, const DeviceMicrobatch& mb, int64_t p0, int64_t pr, const cuda::bf16* sum, cuda::Partials parts, cudaStream_t st);
  void mlp_norm_backward(int64_t l, Record& r, const DeviceMicrobatch& mb, int64_t p0, int64_t pr, const cuda::bf16* sum, cuda::Partials parts,
                         cudaStream_t st);
  void input_norm_backward(int64_t l, Record& r, const DeviceMicrobatch& mb, int64_t p0, int64_t pr, const cuda::bf16* sum, cuda::Partials parts,
                           cudaStream_t st);
  // The MLP block's backward from its output gradient dy (the span's rows) to its input gradient in s_->dxn's rows, fc2's
  // weight gradient on the compute stream (or saved for backward_weights); fc1's is mlp_fc1_wgrad's, on the stream the
  // schedule picks (none for an MoE layer or a deferring backward).
  void mlp_backward_unit(int64_t l, Record& r, const DeviceMicrobatch& mb, const RowSpan& sp, const cuda::bf16* dy);
  void mlp_fc1_wgrad(int64_t l, Record& r, const RowSpan& sp, cudaStream_t ws);
  // The attention block's backward from dy to s_->dxn's rows (s_->qkv's rows then hold d(QKV)), the projection's weight
  // gradient on the compute stream when proj_wgrad; attention_wgrads: the QKV weight gradient (and with proj the
  // projection's, then proj_done_ev_) on ws (none for a deferring backward).
  void attention_backward_unit(int64_t l, Record& r, const DeviceMicrobatch& mb, const RowSpan& sp, const cuda::bf16* dy, bool proj_wgrad);
  void attention_wgrads(int64_t l, Record& r, const RowSpan& sp, const cuda::bf16* dy, bool proj, cudaStream_t ws);
  // Multi-latent attention (gpt_cuda_mla.cpp), over whole spans: from r.xn1 to the attention's r.q, r.k, r.v (the
  // latents and their norms kept in r); and from the attention's s_->dq, dk, dv to s_->dxn, every projection's weight
  // gradient (and the latent norms') on the compute stream.
  void mla_projections_forward(int64_t l, Record& r, const RowSpan& sp);
  void mla_projections_backward(int64_t l, Record& r, const RowSpan& sp);
  // The up projections' part of the forward (the latents' norms, the up projections, RoPE, the heads) from the latents
  // and the rotated shared key k_pe; --recompute-modules mla_up_proj runs it again before the layer's attention backward
  // (r.mla_k_pe set: the layer's up projections' outputs are mla_record_'s).
  void mla_up_forward(int64_t l, Record& r, const RowSpan& sp, const cuda::bf16* k_pe);
  void mla_linear(const char* name, int64_t n, const cuda::bf16* a, int64_t in, int64_t w_off, int64_t out, cuda::bf16* y);
  // Under TP without SP: the gradients of the parameters every rank holds whole, summed over TP (the iteration's last
  // backward).
  void mla_sum_replicated_grads(int64_t l);
  // The plain schedule over every row: returns the MLP output of this rank's rows (combined over TP).
  const cuda::bf16* layer_forward(int64_t l, Record& r, const DeviceMicrobatch& mb);
  // Tensor parallelism: the forward of every layer as two halves of the micro batch's sequences,
  // interleaved block by block, so each half's row-parallel all-reduce overlaps the other half's attention or
  // MLP (DeepSpeed Domino's schedule). The same units as layer_forward (not bit for bit: GEMMs of half the rows
  // may take other cuBLASLt algorithms). Ends with s_->delta (under SP this rank's rows in s_->delta_l) holding
  // the last layer's MLP output and the compute stream after both halves' reductions.
  void split_layers_forward(const DeviceMicrobatch& mb);
  // Half `half`'s rows of base ([T, h]: s_->delta, or s_->dxn in the backward) summed over TP on tp_stream_, after the compute stream's work so far,
  // then `then` on tp_stream_ (the norm, forward or backward, that consumes the sum; may be empty), given
  // the sum's rows and their Partials; wait_reduced: the compute stream waits for both. Without SP the sum is
  // an all-reduce in place. Under SP this rank's piece of the half (see piece()): with a consumer and
  // all_to_all_, an all-to-all of the ranks' partial sums of it into s_->parts (copy engines, no SM; the
  // consumer's kernel adds them), else a reduce-scatter into the piece of `local`.
  using SumConsumer = std::function<void(cudaStream_t, const cuda::bf16* sum, cuda::Partials parts)>;
  void reduce_half(int64_t half, int64_t rows, cuda::bf16* base, cuda::bf16* local, const SumConsumer& then);
  void wait_reduced(int64_t half);
  // Throws, naming `env`, unless every TP rank has the same `mine` (a setting read from each rank's environment).
  void agree_over_tp(bool mine, const char* env);
  // Set-up steps after the activations (gpt_cuda_setup.cpp): the FP8 layers' cached weights; the attention shapes
  // cuDNN must run (and context parallelism's stream), checked before the first step; whether the TP layers split
  // (split_forward_, with the TP stream and its events). bias_grad_fusable: whether cuBLASLt has the bias-gradient
  // epilogue for a weight gradient dW[n, x_width] over k rows.
  void allocate_fp8_weights();
  void check_attention(int64_t micro_batch);
  void choose_split_layers(int64_t micro_batch, int64_t max_in_flight);
  // The overwritten gradients' ranges (after choose_split_layers), and a weight gradient GEMM's beta into g(w_off): 0 at
  // the iteration's first GEMM of such a range (then marked written), else 1.
  void choose_overwritten_gradients(int64_t world_size);
  float wgrad_beta(int64_t w_off);
  // The written flag of the range starting at `off` (and its count), null where none does.
  char* overwrite_flag(int64_t off, int64_t* count = nullptr);
  // The iteration's last backward of an MoE layer: its routed experts' weight gradients that no GEMM wrote (no rows
  // in any microbatch) zeroed on the compute stream.
  void zero_unwritten_experts(const LayerW& lw);
  std::vector<std::pair<int64_t, int64_t>> overwrite_ranges_;
  std::vector<char> overwrite_written_;
  bool bias_grad_fusable(int64_t n, int64_t x_width, int64_t k) const;
  // The compute stream waits for everything queued on tp_stream_ so far.
  void wait_tp_stream();
  // The split layers under SP. The residual stream keeps SP's layout (rank r holds tokens [r T / TP, (r + 1) T / TP)),
  // and half k of the micro batch is piece k of every rank's rows: local rows [k Tl / 2, (k + 1) Tl / 2) of each
  // rank, whole sequences (the micro batch a multiple of 2 TP). The layers' [T, .] buffers hold half 0's rows,
  // then half 1's, each rank's piece after the other (half-major order); the norms work on the pieces, each
  // half's reduce-scatter and all-gather on tp_stream_. Without SP a half's piece is the half itself.
  int64_t piece(int64_t rows) const { return sp_ ? rows / tp_size_ : rows; }
  // Half `half` ([rows, h] in half-major order) of `full` from every rank's piece of `local`, on st.
  void gather_half(int64_t half, int64_t rows, const cuda::bf16* local, cuda::bf16* full, cudaStream_t st);
  // The positions in the layers' row order (half-major under split SP, else the micro batch's own).
  const int32_t* layer_positions(const DeviceMicrobatch& mb) const;
  void layer_backward(int64_t l, Record& r, const DeviceMicrobatch& mb);
  // MoE layer l: from r.xn2 to s_->delta (the combined experts' output), and from the output gradient dy [T, h]
  // to s_->dxn (gpt_cuda_moe.cpp). The forward's row counts per expert wait for the device (as Megatron's dropless
  // dispatch): the expert GEMMs' sizes.
  void moe_forward(int64_t l, Record& r, const DeviceMicrobatch& mb);
  void setup_moe(const MoeConfig& moe, const ParamStore& layout, int64_t max_in_flight, uint64_t seed);
  // The rows on the host: --moe-expert-capacity-factor's choices that fit their expert's capacity, decided as the CPU
  // engine decides them (kernels/cpu/router.h), and with moe_own_rows_ only this TP rank's slice of the tokens; r.row
  // (-1: dropped, or another TP rank's), r.per_expert (the slice's) and the kept counts (every token's, the statistics')
  // uploaded. False (and nothing done) where no capacity drops and every row is this rank's: the device permutes them.
  bool moe_capacity(Record& r, int64_t tokens, int64_t seq_length);
  // The MoE kernels' shape of microbatch mb: its tokens, the router's settings, and the CP shards its sequences span.
  cuda::MoeRouting moe_routing(const DeviceMicrobatch& mb) const;
  // Layer l's router-input noise for microbatch mb (--moe-input-jitter-eps; rows in their natural order).
  cuda::MoeJitter moe_jitter(int64_t l, const DeviceMicrobatch& mb) const;
  void moe_backward(int64_t l, Record& r, const DeviceMicrobatch& mb, const cuda::bf16* dy);
  // One expert's MLP over n rows (a routed expert's rows, or the shared expert over every token; gpt_cuda_moe.cpp):
  // out = fc2(act(fc1(x))) (+ the biases b1, b2 where >= 0; beta 1: added onto out), and its backward (din_beta 1:
  // added onto din; the bias gradients apart, moe_backward's). Queued on stream st.
  // FP8 layers (f8 not null: gpt_cuda_moe_fp8.cpp): n is the expert's rows padded to 16 (the FP8 GEMMs' granule), the
  // rows past `real` zero in x (and, for the backward, in dout).
  struct ExpertFp8;
  void expert_activation(const char* name, int64_t n, int64_t F, const cuda::bf16* fc1_out, cuda::bf16* act, cudaStream_t st);
  void expert_activation_backward(const char* name, int64_t n, int64_t F, const cuda::bf16* dact, const cuda::bf16* fc1_out, cuda::bf16* dfc1,
                                  cudaStream_t st);
  void expert_forward(bool shared, int64_t n, int64_t F, const cuda::bf16* x, int64_t w1, int64_t w2, cuda::bf16* fc1_out, cuda::bf16* act,
                      cuda::bf16* out, float beta, cudaStream_t st, int64_t b1 = -1, int64_t b2 = -1, const ExpertFp8* f8 = nullptr,
                      int64_t real = 0, bool act_apart = false);
  void expert_backward(bool shared, int64_t n, int64_t F, const cuda::bf16* dout, const cuda::bf16* x, int64_t w1, int64_t w2,
                       const cuda::bf16* fc1_out, const cuda::bf16* act, cuda::bf16* dact, cuda::bf16* dfc1, cuda::bf16* din, float din_beta,
                       cudaStream_t st, const ExpertFp8* f8 = nullptr);
  // FP8 experts (gpt_cuda_moe_fp8.cpp, as the CPU engine's experts_forward under FP8): each routed expert's fc1 and fc2,
  // and the shared expert's, with scales of their own (tensorwise: from the amaxes of its rows, its weight and its output
  // gradient; blockwise: 1 x 128 and 128 x 128 blocks of them), each expert's rows padded with zero rows to a multiple
  // of 16 (moe_row_align_: the permutation leaves the gaps, the layer zeroes them). ExpertFp8 locates one expert's
  // cached FP8 weights, its kept x^T and inverse scales in the record, and its share of the scratch: routed expert e
  // (first row `off`, `blocks` 128-row blocks of the experts before it), or e = E the shared expert (every token).
  struct ExpertFp8Weight {
    uint8_t *wq = nullptr, *wqt = nullptr;  // W [out, in] and W^T, cast at the iteration's first forward
    float* inv = nullptr;                   // tensorwise and delayed: the inverse scale (tensorwise: the amax at [1]; 64 floats)
    float *scale = nullptr, *tscale = nullptr;  // blockwise: the 128 x 128 blocks' inverse scales of W and W^T
  };
  struct ExpertFp8 {
    ExpertFp8Weight* w[2] = {};
    uint8_t* xt[2] = {};  // fc1's and fc2's inputs transposed [in, n] (the weight gradients' operands)
    float* xinv[2] = {};  // tensorwise: their inverse scales
    float* xt_scale[2] = {};  // blockwise: x^T's inverse scales (128 rows of a feature)
    uint8_t *row = nullptr, *dyt = nullptr;  // scratch: the row-major FP8 operand [n, .], dy^T [., n]
    float *row_scale = nullptr, *dyt_scale = nullptr;  // blockwise: their inverse scales
    float* scalars = nullptr;  // tensorwise scratch: x's amax, dy's amax, dy's inverse scale (64 floats apart)
    int64_t slot[2] = {-1, -1};  // delayed scaling: fc1's and fc2's slots (a routed expert's, or the layer's fc1 / fc2 for the shared one)
    bool fuse_swiglu = false;  // delayed scaling, SwiGLU without biases in bf16: its kernels write fc2's FP8 input and fc1's FP8 output gradient
  };
  // FP8 under EP: the routed experts' FP8 buffers for `rows` arrived rows (the forward's x^T, kept in the record, and
  // the row-major operand; the backward's operand and dy^T).
  void expert_fp8_rows(Record& r, int64_t rows, bool forward);
  ExpertFp8 expert_fp8(int64_t l, Record& r, int64_t e, int64_t off, int64_t blocks);
  void allocate_expert_fp8_weights();
  // An expert's weight cast to FP8 (W and W^T, with its scale), at the iteration's first forward; the experts without
  // rows in that forward are cast too, on the compute stream (a later microbatch, or a recompute, reads their cast).
  void cast_expert_fp8_weight(const ExpertFp8Weight& wt, int64_t slot, int64_t w_off, int64_t out, int64_t in, cudaStream_t st);
  void cast_idle_expert_fp8_weights(int64_t l, const std::vector<int32_t>& per_expert);
  // One expert GEMM site in FP8: y [n, out] = x [n, in] W^T (+ bias; beta 1: added onto y), x^T kept for the backward;
  // and dx [n, in] = dy W (dx_beta 1: added onto dx) with dW += dy^T x.
  // x_cast / dy_cast: the FP8 operand is in the scratch already (SwiGLU's fused kernels wrote it).
  void expert_linear_fp8(const ExpertFp8& f, int site, const char* name, int64_t n, int64_t in, int64_t out, const cuda::bf16* x, int64_t w_off,
                         const cuda::bf16* bias, float beta, cuda::bf16* y, cudaStream_t st, bool x_cast = false);
  void expert_linear_fp8_backward(const ExpertFp8& f, int site, const char* dgrad_name, const char* wgrad_name, int64_t n, int64_t in, int64_t out,
                                  const cuda::bf16* dy, int64_t w_off, float dx_beta, cuda::bf16* dx, cudaStream_t st, bool dy_cast = false);
  // Delayed scaling's cast of an expert's input (site 0: fc1, 1: fc2) or output gradient into its scratch and x^T / dy^T.
  cuda::Fp8CastTarget expert_input_target(const ExpertFp8& f, int site) const;
  cuda::Fp8CastTarget expert_grad_target(const ExpertFp8& f, int site) const;
  // SwiGLU fused with the delayed casts (f.fuse_swiglu): fc2's FP8 input (and x^T) from fc1's output, or fc1's FP8 output
  // gradient (and its transpose) from d(act); false where the fused kernel does not apply (nothing written).
  bool expert_swiglu_fp8(const ExpertFp8& f, const char* name, int64_t n, int64_t F, const cuda::bf16* fc1_out, cudaStream_t st);
  bool expert_swiglu_backward_fp8(const ExpertFp8& f, const char* name, int64_t n, int64_t F, const cuda::bf16* dact, const cuda::bf16* fc1_out,
                                  cudaStream_t st);
  // The zero rows after each routed expert's (rows: per_expert, their starts aligned to moe_row_align_) in buf [., width].
  void zero_expert_padding(cuda::bf16* buf, int64_t width, const std::vector<int32_t>& per_expert, cudaStream_t st);
  int64_t moe_row_align_ = 1;  // 16 with FP8 experts, else 1
  int64_t align_rows(int64_t n) const { return (n + moe_row_align_ - 1) / moe_row_align_ * moe_row_align_; }
  int64_t f8_moe_width_ = 0;   // the widest row of the FP8 experts' scratch operands
  std::vector<ExpertFp8Weight> f8_expert_w_;  // [L_][E + 1][2]: the routed experts', then the shared expert's
  // The routed experts' GEMMs spread over expert_streams_ (TransformerEngine's GroupedLinear without a grouped GEMM:
  // one expert's last partial wave of tiles runs beside the next one's first): fork_experts() makes them wait for the
  // compute stream's work so far, expert_stream(i) is the i-th non-empty expert's, join_experts() makes the compute
  // stream wait for all of them. Each expert writes only its own rows and gradients, so the results are the same
  // bits on any number of streams. MEGATRAIN_MOE_EXPERT_STREAMS (default 4; 1: the compute stream alone).
  void fork_experts();
  cudaStream_t expert_stream(int64_t i) const;
  void join_experts();
  std::vector<cudaStream_t> expert_streams_;
  std::vector<cudaEvent_t> expert_done_ev_;
  cudaEvent_t experts_fork_ev_ = nullptr;
  Record& act(int64_t l);  // layer l's activations (the shared recompute record for a recomputed layer)
  cuda::bf16* gather_layer_rows(cuda::bf16* local, cuda::bf16* full, int64_t T);
  // The activations of a microbatch in flight: every layer's record and what the output layer's backward reads
  // (the final norm's input and statistics, and its output's gradient, in xnf). The active slot's are in records_
  // and s_ (activate() swaps them in); the others are parked here.
  struct Slot {
    std::vector<std::unique_ptr<Record>> records;
    void* x_final = nullptr;
    cuda::bf16* xnf = nullptr;
    float *meanf = nullptr, *rstdf = nullptr;
    bool forwarded = false;     // its backward is due
    bool weights_due = false;   // its backward deferred the weight gradients
    // A deferred backward's output gradients per layer (allocated at the slot's first deferral): of the MLP
    // block and the attention block ([T, h]), of fc1 ([T, F1]) and of the QKV projection ([T, Wq]).
    std::vector<cuda::bf16*> dy_mlp, dfc1, dy_attn, dqkv;
    // FP8 delayed scaling: the input scales its forward cast with (its recompute casts with them again) and the
    // output-gradient scales of its backward (its deferred weight gradients' dy^T), [L_ x 4 sites] each.
    float *f8_x_scale = nullptr, *f8_dy_scale = nullptr;
  };
  Slot* defer_into_ = nullptr;  // during a deferring backward: where layer_backward saves the output gradients
  void save_for_weights(std::vector<cuda::bf16*>& into, int64_t l, const cuda::bf16* from, int64_t width, int64_t T);
  std::vector<Slot> slots_;
  int64_t active_ = 0;
  void activate(int64_t slot);
  void park(Slot& into);
  void split_layer_backward(int64_t l, Record& r, const DeviceMicrobatch& mb);
  void embed(const DeviceMicrobatch& mb, int64_t T);
  void loss(const DeviceMicrobatch& mb, float grad_scale, int64_t r0, int64_t n);
  void output_layer(const DeviceMicrobatch& mb, float grad_scale, int64_t T);
  // Tensor parallelism. combine_rows: row-parallel partial sums `full` [T, h] summed over TP (in place), or
  // under SP this rank's rows into `local`; returns this rank's rows. gather_rows: this rank's rows `local`
  // into `full` under SP (returns full), else local itself. norm_out: where a norm writes this rank's rows
  // before gather_rows makes `full` of them.
  const cuda::bf16* combine_rows(cuda::bf16* full, cuda::bf16* local, int64_t T);
  // Under TP the column-parallel layers' weight-gradient GEMMs (and the projection's, deferred to beside the
  // QKV dgrad's collective) run on a side stream: the dgrad's collective, queued right behind the dgrad GEMM
  // on the compute stream, starts first and overlaps them (Megatron's asynchronous TP all-reduce). fork_wgrad: the side stream after the work queued so far (the compute
  // stream itself at TP 1); join_wgrad: the compute stream waits for the side stream.
  cudaStream_t fork_wgrad();
  // A layer's linear GEMMs in its precision (bf16, or FP8 where D_.fp8_layer: gpt_cuda_fp8.cpp), site one of
  // kLinearQkv .. kLinearFc2; x [T, in], W [out, in], y / dy [T, out]. The FP8 weight gradient reuses the
  // transposed FP8 dy of the data-gradient GEMM just before it when there is one (else casts it again).
  enum LinearSite : int { kLinearQkv = 0, kLinearProj = 1, kLinearFc1 = 2, kLinearFc2 = 3 };
  // x_cast / dy_cast: the FP8 operand was already written where fp8_input_target / fp8_grad_target say, by the
  // kernel that produced it (delayed scaling's fused casts), so the GEMM reads it without casting x / dy.
  void linear_forward(int64_t l, Record& r, int site, const char* name, int64_t T, int64_t in, int64_t out, const cuda::bf16* x, int64_t w_off,
                      const cuda::bf16* bias, cuda::bf16* y, bool x_cast = false);
  void linear_dgrad(int64_t l, Record& r, int site, const char* name, int64_t T, int64_t in, int64_t out, const cuda::bf16* dy, int64_t w_off,
                    cuda::bf16* dx, bool dy_cast = false);
  // Delayed scaling: where the cast of an FP8 layer's GEMM input (the forward) or output gradient (the backward)
  // goes, with its scale and amax accumulator; SwiGLU fuses these casts (kernels/cuda/fp8_swiglu.h) where
  // fp8_fuses_swiglu says so.
  cuda::Fp8CastTarget fp8_input_target(int64_t l, Record& r, int site) const;
  cuda::Fp8CastTarget fp8_grad_target(int64_t l, int site) const;
  bool fp8_fuses_swiglu(int64_t l) const;
  bool swiglu_output_unread() const;  // (the FP8 layers' records hold no SwiGLU output: see gpt_cuda_fp8.cpp)
  bool experts_swiglu_output_unread() const;  // (nor the MoE layers' records their routed experts')
  bool fp8_fused_swiglu_ = true;  // (MEGATRAIN_FP8_FUSED_SWIGLU=0: the separate kernels)
  void linear_wgrad(cudaStream_t ws, int64_t l, Record& r, int site, const char* name, int64_t T, int64_t in, int64_t out, const cuda::bf16* dy,
                    const cuda::bf16* x, int64_t w_off, int64_t b_off);
  bool fp8_layer(int64_t l) const { return D_.fp8_layer(first_layer_ + l); }
  const Record* fp8_dyt_record_ = nullptr;  // whose dy the scratch's transposed FP8 dy holds (and its site)
  int fp8_dyt_site_ = -1;
  bool f8_weights_due_ = true;  // FP8: the next training forward is the iteration's first (the weights cast anew)
  // FP8 delayed scaling, the host state's layout on the device (Fp8ScalingState's slots: layer l's sites from
  // f8_first_[l], its 4 linear sites, then an MoE layer's two per routed expert): scales [3][n], amax histories
  // [len][3][n] (entry 0: the accumulators, reduced over TP x DP x CP by fp8_update), the weights' cast scales [n]. f8_record_: casts add to the accumulators (a training forward; not a recompute);
  // f8_training_: the weights cast with this iteration's cast scales (else the current ones: evaluation);
  // f8_cast_weights_: this forward is the iteration's first (it takes the weights' cast scales and their amaxes).
  Fp8DelayedRecipe f8_recipe_;
  int64_t f8_slots_ = 0;
  std::vector<int64_t> f8_first_;  // per layer: its first slot
  int64_t fp8_scaling_slot(int64_t l, int site) const { return f8_first_[static_cast<size_t>(l)] + site; }
  Fp8ScalingState fp8_scaling_layout() const;  // this chunk's FP8 layers and their experts, scales at 1
  float *f8_scale_ = nullptr, *f8_history_ = nullptr, *f8_wcast_ = nullptr;
  bool f8_record_ = false, f8_training_ = false, f8_cast_weights_ = false;
  bool f8_keep_xt_ = false;  // FP8 (either recipe): the forward's cast writes x^T for the weight gradient (not in evaluation)
  // FP8 (either recipe): each FP8 layer's weights in FP8, W and W^T per site, cast in one pass at the iteration's
  // first training forward (and at every evaluation forward) and read by its later microbatches, the recomputes and
  // the data-gradient GEMMs (Transformer Engine's cached FP8 weights), with their inverse scales (f8_winv: 64 floats
  // per site, 256 bytes apart). f8_weights_due_ says the weights changed since (the optimizer stepped).
  std::vector<uint8_t*> f8_wq_, f8_wqt_;  // [L_ x 4]
  std::vector<float*> f8_wscale_, f8_wtscale_;  // blockwise: W's and W^T's 128 x 128 blocks' inverse scales [L_ x 4]
  float* f8_winv_ = nullptr;              // [L_ x 4 x 64]
  bool f8_forward_casts_weights_ = false;
  StreamCollectives* amax_group_ = nullptr;  // DP x CP (null: one rank); TP through tp_
  void init_fp8_scaling(StreamCollectives* dp);
  void fp8_update(int first_kind, int last_kind);
  float* fp8_slot_scales(bool grad) const;  // the active slot's snapshot
  bool fp8_tp_sharded(int site, bool output_gradient) const;  // tensorwise under TP: whether the cast's tensor is a TP shard
  void fp8_amax_over_tp(float* amax);                           // ... whose amax is then reduced (max) over TP
  // Delayed scaling, per scaling slot: the weight's cast scale (the iteration's in training, else the current one) and the
  // accumulators a cast adds its amax to (null where this pass records none: inputs in a training forward, weights at the
  // iteration's first, output gradients always).
  const float* fp8_weight_scale(int64_t slot) const;
  float* fp8_input_accumulator(int64_t slot) const;
  float* fp8_weight_accumulator(int64_t slot) const;
  float* fp8_grad_accumulator(int64_t slot) const;
  void join_wgrad();
  // (varying: T changes from call to call, an MoE expert's rows: GemmLt's bucketed plans)
  void wgrad_with_bias(cudaStream_t ws, const char* name, int64_t n, int64_t T, const cuda::bf16* dy, const cuda::bf16* x, int64_t h, int64_t w_off,
                       int64_t b_off, bool varying = false);
  void copy_own_heads(cuda::bf16* own, cuda::bf16* group, int64_t T, bool to_group);
  cuda::bf16* gather_rows(cuda::bf16* local, cuda::bf16* full, int64_t T);
  cuda::bf16* norm_out(cuda::bf16* full) const;
  // Under SP, the gradients of parameters every TP rank holds (norms, row-parallel biases) are partial sums
  // over the rank's tokens: summed over TP once the iteration's last backward has produced them.
  void sum_replicated_grads(const std::vector<std::pair<int64_t, int64_t>>& params, cudaStream_t st);
  const cuda::bf16* row_bias(int64_t off) const { return tp_rank_ == 0 ? w(off) : nullptr; }
  bool recomputed(int64_t l) const;
  // Selective recompute of layer l's MLP block (--recompute-modules mlp for a dense layer, moe for an MoE layer): its
  // record's MLP buffers are mlp_record_'s, shared by every such layer, filled again from its saved norm output
  // before its backward (recompute_mlp).
  bool mlp_recomputed(int64_t l) const { return mlp_recompute_layer_[static_cast<size_t>(l)]; }
  void recompute_mlp(int64_t l, Record& r, const DeviceMicrobatch& mb);
  // An MoE layer's routed experts' 16-bit activation output not kept per layer but written into one buffer that every
  // such layer shares (expert_act_shared_, or under EP and expert-TP's gather Scratch::ep_act_shared): in FP8 layers the
  // backward reads none (the weight gradients take the FP8 x^T the forward kept), and --recompute-modules moe_act
  // (Megatron's output-discarding recompute of the experts' activation) computes it again from fc1's output before the
  // layer's expert backward. Not where the whole MLP block is recomputed (mlp_recomputed: its own shared record).
  bool expert_act_shared(int64_t l) const;
  bool expert_act_recomputed(int64_t l) const { return expert_act_shared(l) && !fp8_layer(l); }
  const cuda::bf16* w(int64_t off) const { return off < 0 ? nullptr : w16_ + off; }
  float* g(int64_t off) const { return off < 0 ? nullptr : grads_ + off; }

  ModelDims D_;
  // This stage: its L_ layers (global indices first_layer_ ...; D_.L is the whole model's), the embedding
  // (pre_) and the final norm, output layer and loss (post_).
  bool pre_ = true, post_ = true;
  int64_t L_ = 0, first_layer_ = 0;
  cuda::bf16* unit_w_ = nullptr;  // !post_: ones [h], the weights of the kernel that sums the stage's output
  cudaStream_t stream_;
  // The 16-bit type of the weights' working copy and the activations (--fp16: fp16, else bf16), as cuBLASLt
  // and NCCL name it.
  cuda::F16 dt_;
  cudaDataType_t ab_;
  WireType wire_;
  // The residual stream (each layer's input and mid-layer sum, the final norm's input) in that 16-bit type
  // (Megatron's default), or fp32 with --fp32-residual-connection. Its gradient stays fp32.
  bool res16_;
  // What the norm kernels add to each norm weight (in fp32): 1 under --apply-layernorm-1p (zero-centred weights).
  float norm_offset_;
  void* res_at(void* p, int64_t off) const { return static_cast<char*>(p) + off * (res16_ ? 2 : 4); }
  // Hidden dropout (--hidden-dropout, training micro batches only): the key sites of DeviceMicrobatch::drop_keys.
  float hidden_dropout_;
  cuda::RowDropout drop_;
  static constexpr int32_t kEmbedSite = 0;
  static int32_t attn_site(int64_t l) { return static_cast<int32_t>(1 + 2 * l); }
  static int32_t mlp_site(int64_t l) { return static_cast<int32_t>(2 + 2 * l); }
  const cuda::RowDropout* drop(const DeviceMicrobatch& mb, int32_t site, int64_t t0);
  // The micro batch's token index of this rank's first row (sequence parallelism: its shard).
  int64_t row0(int64_t T) const { return sp_ ? T / tp_size_ * tp_rank_ : 0; }
  const float* loss_scale_ = nullptr;  // fp16: the device-side loss scale the loss gradient is multiplied by
  StreamCollectives* tp_ = nullptr;  // nullptr at TP 1
  // Query groups below TP: the TP ranks holding this rank's copy of its group's QKV block (kv_rep > 1).
  std::shared_ptr<StreamCollectives> kv_group_;
  cudaStream_t wgrad_stream_ = nullptr;
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr, proj_done_ev_ = nullptr;
  // The split forward: the row-parallel reductions run on tp_stream_; per half, ready_ev_ (its rows computed,
  // on the compute stream) and reduced_ev_ (its reduction and what follows it done, on tp_stream_).
  bool split_forward_ = false;
  cudaStream_t tp_stream_ = nullptr;
  cudaEvent_t ready_ev_[2] = {}, reduced_ev_[2] = {}, tp_done_ev_ = nullptr;
  bool sp_ = false;
  // The split layers under SP sum each half's partials with an all-to-all and the norm kernel
  // (MEGATRAIN_TP_SP_ALLTOALL=0: a reduce-scatter, as the plain SP layers).
  bool all_to_all_ = false;
  // This rank's widths, set once: queries (nh_local * d), keys (ng_local * d), fused QKV rows, FFN, fc1 output (2 FFN
  // with SwiGLU), values (KVd) and the attention's output (Hd) but with multi-latent attention (values nh_local * v_dim
  // wide, and so the output; no fused QKV: Wq 0).
  struct Widths {
    int64_t Hd, KVd, Wq, F, F1, Vd, Od;
  };
  Widths W_{};
  // The residual stream's rows of a T-token microbatch on this rank (T / TP under sequence parallelism).
  int64_t local_rows(int64_t T) const { return sp_ ? T / tp_size_ : T; }
  int64_t tp_size_ = 1, tp_rank_ = 0, v0_ = 0;  // v0_: first vocabulary row of this rank's shard
  std::vector<std::vector<std::pair<int64_t, int64_t>>> layer_replicated_;  // (offset, numel) per layer (SP)
  std::vector<std::pair<int64_t, int64_t>> final_replicated_;
  int64_t numel_ = 0;
  float *master_ = nullptr, *grads_ = nullptr;
  cuda::bf16* w16_ = nullptr;
  float* rope_table_ = nullptr;
  // --reset-attention-mask: the document-mask bias [micro batch, 1, S, S] cuDNN's attention adds (kernels/cuda/
  // document_bias.h), built from a microbatch's document starts when its first attention needs it, and the serial of
  // the upload it was built for (a pipeline's other microbatch in between makes the next attention rebuild it). A
  // stage's model chunks (share_params) share both: one bias per GPU, as the plan counts it.
  bool doc_mask_ = false;
  cuda::bf16* doc_bias_ = nullptr;
  std::shared_ptr<uint64_t> doc_bias_serial_ = std::make_shared<uint64_t>(0);
  int64_t doc_bias_rows_ = 0;  // the micro batch it was sized for
  const cuda::bf16* document_bias(const DeviceMicrobatch& mb);
  // --softmax-type: the layer's sink logits in fp32 for cuDNN's attention (the learned ones converted now; off-by-one's
  // zeros), null without sinks.
  const float* sink_logits(const LayerW& lw);
  // Attention dropout: layer l's cuDNN attention shape for the micro batch (its dropout set when the micro batch carries a
  // seed) and the seed of its mask (0: none), a function of the micro batch's seed, the global layer and the TP rank
  // (each rank's heads draw their own masks, as Megatron's model-parallel generator gives them).
  cuda::SdpaShape attention_shape(const DeviceMicrobatch& mb) const;
  // Context parallelism, --cp-comm-type p2p (gpt_cuda_context.cpp): the layer's attention over the whole sequences
  // from this rank's two chunks of each, the other ranks' K/V blocks coming round the ring (kernels/cuda/
  // context_attention.h), r.o and r.stats (the merged log-sum-exp) written; the backward into s.dq, s.dk, s.dv, each K/V
  // block's gradients travelling round with it back to their rank. The transfers run on cp_stream_, each block's
  // beside the attention of the one before.
  void ring_attention_forward(Record& r, const DeviceMicrobatch& mb);
  void ring_attention_backward(Record& r, const DeviceMicrobatch& mb);
  cuda::RingShape ring_shape(const DeviceMicrobatch& mb) const;
  const cuda::bf16* ring_bias(const cuda::RingShape& shape, const DeviceMicrobatch& mb, int64_t rank, int64_t source);
  // Posts a batch of ring transfers after the compute stream's work so far (one to the next rank, one from the previous).
  void ring_pass(const void* send_k, const void* send_v, void* recv_k, void* recv_v, int64_t n, WireType type);
  void ring_wait();  // the compute stream waits for the last batch posted
  // --cp-comm-type a2a (gpt_cuda_context.cpp): an all-to-all gives each rank every row of H / CP of the heads, cuDNN's
  // causal attention runs over the whole sequences, and an all-to-all takes the output back; r.stats holds the
  // statistics in that layout. The backward gathers its inputs again the same way.
  void a2a_attention_forward(Record& r, const DeviceMicrobatch& mb);
  void a2a_attention_backward(Record& r, const DeviceMicrobatch& mb);
  // local [B, 2c, heads, d] -> sequence [B, S, heads / CP, d] over the CP group, and back.
  void a2a_to_sequence(cuda::bf16* sequence, const cuda::bf16* local, int64_t heads, const DeviceMicrobatch& mb);
  void a2a_to_local(cuda::bf16* local, const cuda::bf16* sequence, int64_t heads, const DeviceMicrobatch& mb);
  cuda::SdpaShape a2a_shape(const DeviceMicrobatch& mb) const;

 public:
  // The context-parallel group (--context-parallel-size > 1): the ring's sends and receives. Set before the first step.
  void set_context_parallel(StreamCollectives* cp) { cp_ = cp; }
  // The expert-parallel group (the layout's ep_size > 1, --expert-model-parallel-size): the all-to-alls that carry the MoE
  // layers' rows to this rank's experts and back (gpt_cuda_expert_parallel.cpp). Set before the first step.
  void set_expert_parallel(StreamCollectives* ep);
  // The expert-tensor-parallel group where it is not the TP group (--expert-tensor-parallel-size other than TP, with more
  // than one rank): each expert's rows gathered over it and the partial outputs reduce-scattered back
  // (gpt_cuda_expert_tensor_parallel.cpp). Set before the first step.
  void set_expert_tensor_parallel(StreamCollectives* etp);

 private:
  StreamCollectives* cp_ = nullptr;
  StreamCollectives* ep_ = nullptr;
  StreamCollectives* etp_ = nullptr;
  // Expert-TP other than TP (Megatron's MoE parallel folding): each TP rank's experts take only the rows of its own slice
  // of the microbatch (every TP rank still routes all of the TP group's rows, as with expert-TP = TP, so the statistics,
  // the capacity and the router's gradients are unchanged; the other ranks' choices get row -1, as dropped ones do), so
  // the combined output is complete on the slice's rows and zero elsewhere, and the layer's TP reduction sums the slices.
  // moe_own_rows_: that mode (TP > 1); moe_etp_gathers_: with an expert-TP group of more than one rank, whose rows are
  // gathered.
  bool moe_own_rows_ = false, moe_etp_gathers_ = false;
  // The experts' rows come from other ranks (EP's all-to-all, or expert-TP's gather): their buffers grow with them.
  bool moe_rows_travel() const { return D_.ep > 1 || moe_etp_gathers_; }
  // Expert-TP's gather: the rows of this rank's experts (local_rows of them, expert-major, r.per_expert each) gathered
  // from every expert-TP rank into r.etp_rows (expert-major, each expert's in expert-TP rank order), r.per_expert made
  // the gathered counts; returns how many. The partial outputs (or input gradients) of the gathered rows summed back to
  // this rank's rows by etp_to_local; etp_to_experts gathers the output gradients as the forward gathered the rows.
  int64_t etp_gather(Record& r, const cuda::bf16* local, int64_t local_rows);
  void etp_to_experts(const Record& r, const cuda::bf16* local, cuda::bf16* gathered, const char* name);
  void etp_to_local(const Record& r, const cuda::bf16* gathered, cuda::bf16* local, const char* name);
  cuda::bf16* etp_transit(const Record& r);
  // Expert parallelism: the counts per expert exchanged, r.per_expert made this rank's experts' and their rows received
  // into r.ep_rows (returns how many); the rows of r (owner order <-> this rank's experts' order) over the EP group.
  int64_t ep_dispatch(Record& r);
  // The host waits for the training stream's queued work: through the EP group where there is one (its all-to-alls may
  // be queued there: a dead peer then ends the job within --distributed-timeout-seconds, naming `op`).
  void host_wait(const char* op);
  void ep_to_experts(const Record& r, const cuda::bf16* owner_rows, cuda::bf16* expert_rows, const char* name);
  void ep_to_owners(const Record& r, const cuda::bf16* expert_rows, cuda::bf16* owner_rows, const char* name);
  cudaStream_t cp_stream_ = nullptr;
  cudaEvent_t cp_ready_ev_ = nullptr, cp_done_ev_ = nullptr;
  uint64_t attention_seed(const DeviceMicrobatch& mb, int64_t l) const;
  int64_t wte_ = -1, wpe_ = -1, lnf_w_ = -1, lnf_b_ = -1, out_w_ = -1;
  std::vector<LayerW> layers_;
  std::vector<std::unique_ptr<Record>> records_;
  std::unique_ptr<Record> recompute_record_;
  std::unique_ptr<Record> mlp_record_;  // the MLP buffers of the layers whose MLP is recomputed (mlp_recomputed)
  std::unique_ptr<Record> mla_record_;  // --recompute-modules mla_up_proj: the MLA up projections' outputs every layer shares
  bool mla_up_recompute_ = false;
  std::unique_ptr<Scratch> s_;
  int64_t T_max_ = 0;
  int64_t S_local_ = 0;  // a microbatch's rows per sequence on this rank (the sequence length / CP)
  int64_t loss_chunk_rows_ = 0;  // the output layer's and the loss's rows at a time (output_layer())
  bool full_recompute_ = false;
  std::vector<bool> recompute_layer_;
  bool mlp_recompute_ = false;  // (some layer's MLP block recomputed)
  bool moe_act_recompute_ = false;  // --recompute-modules moe_act (expert_act_shared)
  cuda::bf16* expert_act_shared_ = nullptr;  // (allocated with the records where some layer shares it)
  std::vector<bool> mlp_recompute_layer_;
  size_t act_bytes_ = 0;
  std::vector<void*> owned_;
  // With TP, the activations are carved from one symmetric window of the TP group (alloc: count, then carve).
  enum class ArenaMode { kOff, kCount, kCarve };
  ArenaMode arena_mode_ = ArenaMode::kOff;
  char* arena_ = nullptr;
  size_t arena_size_ = 0, arena_used_ = 0;
  // The lowest flat offset of each layer's dense parameters, and one past the highest. An MoE layer's experts sit in
  // the expert range after every dense parameter: the engine reduces and gathers them apart (not by these hooks).
  std::vector<int64_t> layer_start_;
  std::vector<int64_t> layer_end_;
  int64_t bgrad_len_ = 0;             // each stream's part of Scratch::bgrad
  bool bgrad_epilogue_ = false;       // bias gradients from the weight-gradient GEMMs' epilogue
  int64_t embed_end_ = 0;             // one past the embedding's parameters
  std::function<void(int64_t)> grads_ready_, params_needed_;
  void need_params(int64_t end) {
    if (params_needed_) params_needed_(end);
  }
  bool final_backward_ = false;
  void* alloc(size_t bytes);
  float* block_scales(int64_t n);  // n floats, zeroed: FP8 block scales (their padding is never written)
  // MoE: the router's settings, the losses' coefficients, whether this forward adds to the statistics (a training
  // forward, not a recompute), and the statistics.
  int64_t moe_layers_ = 0, experts_ = 0, topk_ = 0, F_moe_ = 0, F_shared_ = 0, moe_groups_ = 0, moe_group_topk_ = 0;
  // The load-balancing losses' coefficients (config.h's kAuxLossTypes' order: aux_loss, seq_aux_loss, global_aux_loss;
  // 0: not chosen; Megatron's list form may choose several), whether any is chosen, and whether seq_aux_loss is (the
  // aux gradient's rows then per sequence).
  float moe_aux_coeffs_[3] = {0, 0, 0};
  bool moe_aux_ = false, moe_seq_aux_ = false;
  bool moe_sigmoid_ = false, moe_pre_softmax_ = false;
  bool moe_sqrtsoftplus_ = false;  // --moe-router-score-function sqrtsoftplus (moe_sigmoid_ set too: an element-wise score)
  bool moe_router_fp64_ = false;  // --moe-router-dtype fp64: the logits accumulated in double
  // --moe-router-force-load-balancing: the logits replaced by random ones (model/moe_random_logits.h), their key.
  bool moe_force_balance_ = false;
  uint64_t moe_random_key_ = 0;
  // --moe-input-jitter-eps: the router's input times noise (model/moe_input_jitter.h), its eps (0: off) and key.
  float moe_jitter_eps_ = 0;
  uint64_t moe_jitter_key_ = 0;
  // --moe-router-load-balancing-type sinkhorn: a training forward (or its recompute) chooses by the Sinkhorn-normalised
  // logits (moe_training_ set by forward and backward; evaluation chooses by the scores).
  bool moe_sinkhorn_ = false, moe_training_ = false;
  bool shared_gate_ = false;  // --moe-shared-expert-gate (with a shared expert)
  float moe_scaling_ = 1, moe_z_coeff_ = 0;
  bool moe_record_stats_ = false;
  double moe_capacity_factor_ = 0;  // 0: dropless
  bool moe_pad_ = false;            // --moe-pad-expert-input-to-capacity
  // --moe-apply-probs-on-input (Llama 4, top-1): the gather scales each row by its routing weight, the combine takes
  // moe_ones_ [T x k] as its weights, and the weight's gradient is the experts' input gradient's dot with the token's row.
  bool moe_probs_on_input_ = false;
  float* moe_ones_ = nullptr;
  int64_t moe_rows_ = 0;            // the experts' rows of a microbatch at most
  bool moe_drop_by_probability_ = true;
  // The capacity decision's host copies: the choices and weights, Megatron's token order (for capacity_order_size_),
  // the keep flags and rows.
  std::vector<int32_t> capacity_top_, capacity_row_, capacity_pad_map_;
  std::vector<float> capacity_weight_;
  std::vector<int64_t> capacity_order_;
  std::vector<uint8_t> capacity_keep_;
  std::pair<int64_t, int64_t> capacity_order_size_{-1, -1};
  float* moe_acc_ = nullptr;
  // global_aux_loss: per MoE layer [E + 1], the iteration's aux counts summed over its microbatches so far and how
  // many (zeroed with moe_acc_ after each step). A recompute uses them as its forward did: one microbatch between
  // a forward and its backward (pipeline parallelism refuses more).
  float* moe_global_ = nullptr;
  // --moe-router-enable-expert-bias: per MoE layer [E] in fp32 (not in the 16-bit weights), and where each layer's
  // sits in the flat buffers (the host store's values).
  float* expert_bias_ = nullptr;
  std::vector<int64_t> expert_bias_offsets_;
  // quantile_balancing: per MoE layer its qb_beta [E] (fp32), where each sits in the flat buffers, and the iteration's
  // quantiles [E + 1] (their sums, then how many microbatches; summed over DP by sum_moe_stats).
  float *quantile_bias_ = nullptr, *quantile_acc_ = nullptr;
  std::vector<int64_t> quantile_bias_offsets_;
};

}  // namespace mt
