// optimizer_step.cu: fixed-grid partial sums then a one-thread finish keep the norm deterministic.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/cuda/bf16_common.cuh"
#include "kernels/cuda/optimizer_step.h"
#include "tensor/dtype.h"
#include "tensor/cuda/cuda_check.h"

namespace mt::cuda {
namespace {

__device__ __forceinline__ int64_t state_index(const AdamChunk& c) { return c.state < 0 ? c.start : c.state; }

__global__ void sumsq_kernel(float* partials, const float* g, const AdamChunk* chunks, int64_t nchunks, bool by_state) {
  float s = 0.0f;
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const AdamChunk ch = chunks[c];
    const int64_t off = by_state ? state_index(ch) : ch.start;
    const float* base = g + off;
    float cs = 0.0f;
    if (off % 4 == 0 && ch.len % 4 == 0) {  // 16-byte loads (the buffers are 256-byte aligned)
      const float4* b4 = reinterpret_cast<const float4*>(base);
      for (int64_t k = threadIdx.x; k < ch.len / 4; k += blockDim.x) {
        const float4 x = b4[k];
        cs += x.x * x.x + x.y * x.y + x.z * x.z + x.w * x.w;
      }
    } else {
      for (int64_t k = threadIdx.x; k < ch.len; k += blockDim.x) {
        const float x = base[k];
        cs += x * x;
      }
    }
    s += cs * ch.norm_weight;
  }
  s = block_sum(s);
  if (threadIdx.x == 0) partials[blockIdx.x] = s;
}

__global__ void zero_count_kernel(double* count, const float* g, const AdamChunk* chunks, int64_t nchunks) {
  double acc = 0.0;
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const AdamChunk ch = chunks[c];
    int zeros = 0;
    for (int64_t k = threadIdx.x; k < ch.len; k += blockDim.x) zeros += g[ch.start + k] == 0.0f ? 1 : 0;
    acc += static_cast<double>(zeros) * ch.norm_weight;
  }
  for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
  if ((threadIdx.x & 31) == 0 && acc != 0.0) atomicAdd(count, acc);
}

__global__ void prepare_kernel(StepState* st, const float* partials, float max_norm, float b1, float b2, float loss_weight, LossScaleRule rule,
                               float loss_tokens_dp, float grad_tokens_dp) {
  const float tokens = fmaxf(st->loss_tokens, 1.0f);
  const float loss_scale = loss_tokens_dp > 0.0f ? loss_tokens_dp / tokens : 1.0f;
  const float grad_scale = grad_tokens_dp > 0.0f ? grad_tokens_dp / tokens : 1.0f;
  const float used = rule.fp16 ? st->loss_scale : 1.0f, inv_ls = grad_scale / used;
  st->unscale = inv_ls;
  double s = 0.0;
  for (int i = 0; i < kNormPartials; ++i) s += partials[i];
  const float norm = static_cast<float>(sqrt(s)) * inv_ls;
  st->grad_sumsq = static_cast<float>(s) * inv_ls * inv_ls;
  st->grad_norm = norm;
  st->loss = st->loss_acc * loss_weight * loss_scale;
  st->loss_acc = 0.0f;
  const bool loss_ok = isfinite(st->loss), bad = !isfinite(norm) || !loss_ok;
  st->skip = bad ? 1 : 0;
  st->clip_coef = (max_norm > 0.0f && norm > max_norm) ? max_norm / (norm + 1e-6f) : 1.0f;
  if (rule.dynamic) {  // Megatron's DynamicGradScaler, for the next step
    if (bad) {
      st->clean_steps = 0;
      if (--st->hysteresis_left <= 0) st->loss_scale = fmaxf(rule.min_scale, st->loss_scale * 0.5f);
    } else if (++st->clean_steps == rule.window) {
      st->clean_steps = 0;
      st->hysteresis_left = rule.hysteresis;
      st->loss_scale *= 2.0f;
    }
  }
  // fp16 with a finite loss and non-finite gradients: an overflow, skipped as the scale shrinks; anything
  // else non-finite (the loss, or bf16 / fp32 gradients) is a NaN iteration and extends the run that
  // --exit-on-nan-count bounds (no loss scale cures a non-finite loss).
  const bool nan_iter = bad && !(rule.fp16 && loss_ok);
  st->nonfinite_run = nan_iter ? st->nonfinite_run + 1 : 0;
  st->max_nonfinite_run = max(st->max_nonfinite_run, st->nonfinite_run);
  if (bad) {
    st->skipped_total += 1;
    if (nan_iter) st->nan_total += 1;
    return;
  }
  st->t += 1;
  st->bc1 = static_cast<float>(1.0 - pow(static_cast<double>(b1), static_cast<double>(st->t)));
  st->bc2 = static_cast<float>(1.0 - pow(static_cast<double>(b2), static_cast<double>(st->t)));
}

// One element's AdamW update (the gradient already scaled): m, v and w in place.
__device__ __forceinline__ void adam_update(float& w, float& m, float& v, float g, float lr, float b1, float b2, float bc1, float bc2, float eps,
                                            float decay) {
  m = b1 * m + (1.0f - b1) * g;
  v = b2 * v + (1.0f - b2) * g * g;
  const float update = (m / bc1) / (sqrtf(v / bc2) + eps);
  w = w - lr * (update + decay * w);
}

template <typename T16>
struct alignas(8) Half4 {
  T16 x[4];
};

// Four consecutive moments (16-byte aligned fp32, or 8-byte aligned bf16: --exp-avg-dtype / --exp-avg-sq-dtype) in fp32.
__device__ __forceinline__ float4 load4(const float* p, int64_t k) { return reinterpret_cast<const float4*>(p)[k]; }
__device__ __forceinline__ float4 load4(const bf16* p, int64_t k) {
  const Half4<bf16> h = reinterpret_cast<const Half4<bf16>*>(p)[k];
  return float4{to_f(h.x[0]), to_f(h.x[1]), to_f(h.x[2]), to_f(h.x[3])};
}
__device__ __forceinline__ void store4(float* p, int64_t k, float4 v) { reinterpret_cast<float4*>(p)[k] = v; }
__device__ __forceinline__ void store4(bf16* p, int64_t k, float4 v) {  // rounded to nearest even
  reinterpret_cast<Half4<bf16>*>(p)[k] = Half4<bf16>{{from_f<bf16>(v.x), from_f<bf16>(v.y), from_f<bf16>(v.z), from_f<bf16>(v.w)}};
}

// MA / MV: the moments' storage types (float, or bf16 under Megatron's precision-aware optimizer). The update uses
// each moment as computed in fp32; the stored one is its rounding (Transformer Engine's FusedAdam does the same).
template <typename T16, typename MA, typename MV>
__global__ void adam_kernel(float* w, MA* m, MV* v, T16* w16, const float* g, const AdamChunk* chunks, const StepState* st, float base_lr,
                            float decoupled_lr, float b1, float b2, float eps, float wd) {
  if (st->skip) return;
  const AdamChunk c = chunks[blockIdx.x];
  const float lr = c.decoupled && decoupled_lr >= 0.0f ? decoupled_lr : base_lr;
  const float scale = st->clip_coef * st->unscale, bc1 = st->bc1, bc2 = st->bc2;
  const float decay = c.decay ? wd : 0.0f;
  const int64_t s0 = state_index(c);
  // i: parameter / gradient index, j: optimizer state index. Where both start on a multiple of 4 (every
  // chunk but a distributed-optimizer shard's odd ends), vector loads and stores of four elements.
  if (c.start % 4 == 0 && s0 % 4 == 0 && c.len % 4 == 0) {
    const auto* g4 = reinterpret_cast<const float4*>(g + c.start);
    auto* w4 = reinterpret_cast<float4*>(w + s0);
    auto* h4 = reinterpret_cast<Half4<T16>*>(w16 + c.start);
    for (int64_t k = threadIdx.x; k < c.len / 4; k += blockDim.x) {
      const float4 gv = g4[k];
      float4 wv = w4[k], mv = load4(m + s0, k), vv = load4(v + s0, k);
      adam_update(wv.x, mv.x, vv.x, gv.x * scale, lr, b1, b2, bc1, bc2, eps, decay);
      adam_update(wv.y, mv.y, vv.y, gv.y * scale, lr, b1, b2, bc1, bc2, eps, decay);
      adam_update(wv.z, mv.z, vv.z, gv.z * scale, lr, b1, b2, bc1, bc2, eps, decay);
      adam_update(wv.w, mv.w, vv.w, gv.w * scale, lr, b1, b2, bc1, bc2, eps, decay);
      w4[k] = wv;
      store4(m + s0, k, mv);
      store4(v + s0, k, vv);
      h4[k] = Half4<T16>{{from_f<T16>(wv.x), from_f<T16>(wv.y), from_f<T16>(wv.z), from_f<T16>(wv.w)}};
    }
    return;
  }
  for (int64_t k = threadIdx.x; k < c.len; k += blockDim.x) {
    const int64_t i = c.start + k, j = s0 + k;
    float mj = to_f(m[j]), vj = to_f(v[j]);
    adam_update(w[j], mj, vj, g[i] * scale, lr, b1, b2, bc1, bc2, eps, decay);
    m[j] = from_f<MA>(mj);
    v[j] = from_f<MV>(vj);
    w16[i] = from_f<T16>(w[j]);
  }
}

__global__ void poison_kernel(float* partials, const float* value) {
  if (!isfinite(*value)) partials[0] = NAN;
}

template <typename T16>
__global__ void cast_kernel(T16* out, const float* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = from_f<T16>(in[i]);
  }
}

template <typename T16>
__global__ void uncast_kernel(float* out, const T16* in, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = to_f(in[i]);
  }
}

}  // namespace

template <typename T16>
void cast_from_bf16_t(float* out, const T16* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  uncast_kernel<<<grid_for(n, 256), 256, 0, stream>>>(out, in, n);
  MT_CUDA_CHECK_LAUNCH();
}

void sumsq_partials(float* partials, const float* x, const AdamChunk* chunks, int64_t nchunks, bool by_state, cudaStream_t stream) {
  sumsq_kernel<<<kNormPartials, 256, 0, stream>>>(partials, x, chunks, nchunks, by_state);
  MT_CUDA_CHECK_LAUNCH();
}

void add_zero_count(double* count, const float* g, const AdamChunk* chunks, int64_t nchunks, cudaStream_t stream) {
  if (nchunks == 0) return;
  zero_count_kernel<<<kNormPartials, 256, 0, stream>>>(count, g, chunks, nchunks);
  MT_CUDA_CHECK_LAUNCH();
}

__global__ void add_to_first_kernel(float* partials, float value) { partials[0] += value; }

void add_to_first(float* partials, float value, cudaStream_t stream) {
  add_to_first_kernel<<<1, 1, 0, stream>>>(partials, value);
  MT_CUDA_CHECK_LAUNCH();
}

void poison_if_nonfinite(float* partials, const float* value, cudaStream_t stream) {
  poison_kernel<<<1, 1, 0, stream>>>(partials, value);
  MT_CUDA_CHECK_LAUNCH();
}

void step_prepare(StepState* s, const float* partials, float max_norm, float beta1, float beta2, float loss_weight, const LossScaleRule& rule,
                  cudaStream_t stream, float loss_tokens_dp, float grad_tokens_dp) {
  prepare_kernel<<<1, 1, 0, stream>>>(s, partials, max_norm, beta1, beta2, loss_weight, rule, loss_tokens_dp, grad_tokens_dp);
  MT_CUDA_CHECK_LAUNCH();
}

__global__ void set_value_kernel(float* dst, float value) { *dst = value; }
void set_value(float* dst, float value, cudaStream_t stream) {
  set_value_kernel<<<1, 1, 0, stream>>>(dst, value);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename T16, typename MA, typename MV>
void adamw_multi_t(const AdamMulti& a, T16* w16, MA* m, MV* v, cudaStream_t stream) {
  if (a.count == 0) return;
  adam_kernel<<<static_cast<unsigned>(a.count), 512, 0, stream>>>(a.w, m, v, w16, a.g, a.chunks, a.state, a.lr, a.decoupled_lr, a.beta1, a.beta2,
                                                                  a.eps, a.weight_decay);
  MT_CUDA_CHECK_LAUNCH();
}

template <typename T16>
void adamw_multi_moments(const AdamMulti& a, T16* w16, cudaStream_t stream) {
  if (a.m16 && a.v16) adamw_multi_t(a, w16, a.m16, a.v16, stream);
  else if (a.m16) adamw_multi_t(a, w16, a.m16, a.v, stream);
  else if (a.v16) adamw_multi_t(a, w16, a.m, a.v16, stream);
  else adamw_multi_t(a, w16, a.m, a.v, stream);
}

template <typename T16>
void cast_to_bf16_t(T16* out, const float* in, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  cast_kernel<<<grid_for(n, 256), 256, 0, stream>>>(out, in, n);
  MT_CUDA_CHECK_LAUNCH();
}

void cast_from_bf16(float* out, const bf16* in, int64_t n, cudaStream_t stream, F16 t) {
  if (t == F16::kFP16) cast_from_bf16_t(out, hp(in), n, stream);
  else cast_from_bf16_t(out, in, n, stream);
}
void adamw_multi(const AdamMulti& a, cudaStream_t stream) {
  if (a.type == F16::kFP16) adamw_multi_moments(a, hp(a.w16), stream);
  else adamw_multi_moments(a, a.w16, stream);
}
void moment_to_device(bf16* dst, const float* src, int64_t n) {
  constexpr int64_t kStage = int64_t{1} << 24;
  std::vector<uint16_t> stage(static_cast<size_t>(std::min(n, kStage)));
  for (int64_t at = 0; at < n; at += kStage) {
    const int64_t len = std::min(kStage, n - at);
    for (int64_t i = 0; i < len; ++i) stage[static_cast<size_t>(i)] = float_to_bf16(src[at + i]);
    MT_CUDA_CHECK(cudaMemcpy(dst + at, stage.data(), static_cast<size_t>(len) * 2, cudaMemcpyHostToDevice));
  }
}

void moment_to_host(float* dst, const bf16* src, int64_t n) {
  constexpr int64_t kStage = int64_t{1} << 24;
  std::vector<uint16_t> stage(static_cast<size_t>(std::min(n, kStage)));
  for (int64_t at = 0; at < n; at += kStage) {
    const int64_t len = std::min(kStage, n - at);
    MT_CUDA_CHECK(cudaMemcpy(stage.data(), src + at, static_cast<size_t>(len) * 2, cudaMemcpyDeviceToHost));
    for (int64_t i = 0; i < len; ++i) dst[at + i] = bf16_to_float(stage[static_cast<size_t>(i)]);
  }
}

void cast_to_bf16(bf16* out, const float* in, int64_t n, cudaStream_t stream, F16 t) {
  if (t == F16::kFP16) cast_to_bf16_t(hp(out), in, n, stream);
  else cast_to_bf16_t(out, in, n, stream);
}

}  // namespace mt::cuda
