// gpt_cuda_fp8.cpp: a layer's linear GEMMs in its precision. bf16: cuBLASLt as before. FP8 (Transformer
// Engine's tensorwise recipe, as the CPU engine emulates it in model/cpu/linear_gemms): the input and the weight
// cast to E4M3 with their own amax, the output gradient to E5M2 (hybrid) or E4M3, every GEMM "TN" with device
// scales; the forward accumulates fast (split-accumulator off), the gradient GEMMs precisely, as TE does.
//   forward  y [T, out]  = x [T, in] . W [out, in]^T          (x, W row-major as they are)
//   dgrad    dx [T, in]  = dy [T, out] . (W^T [in, out])^T     (W^T cast from W with the forward's amax)
//   wgrad    dW [out, in] += dy^T [out, T] . (x^T [in, T])^T   (dy^T from the dgrad's cast, x^T with the forward's amax)
#include "kernels/cuda/bias_grad.h"
#include "kernels/cuda/fp8_cast.h"
#include "kernels/cuda/gemm_lt.h"
#include "model/cuda/gpt_cuda_state.h"
#include "tensor/cuda/op_profiler.h"

namespace mt {

namespace {
cudaDataType_t cuda_type(cuda::Fp8Type t) { return t == cuda::Fp8Type::kE5M2 ? CUDA_R_8F_E5M2 : CUDA_R_8F_E4M3; }
}  // namespace

void CudaGPT::linear_forward(int64_t l, Record& r, int site, const char* name, int64_t T, int64_t in, int64_t out, const bf16* x, int64_t w_off,
                             const bf16* bias, bf16* y) {
  auto& lt = cuda::GemmLt::instance();
  if (!fp8_layer(l)) {
    MT_PROF(name, lt.gemm_ex(false, true, T, out, in, 1.0f, x, in, w(w_off), in, 0.0f, y, out, ab_, ab_, bias, stream_));
    return;
  }
  Scratch& s = *s_;
  float* amax_x = r.f8_amax + 2 * site;
  float* amax_w = amax_x + 1;
  const auto e4m3 = cuda::Fp8Type::kE4M3;
  MT_PROF("fwd.fp8_cast", cuda::fp8_amax(x, T * in, amax_x, stream_));
  MT_PROF("fwd.fp8_cast", cuda::fp8_cast(x, T, in, amax_x, e4m3, s.f8_row, nullptr, s.f8_scalar(0), stream_));
  MT_PROF("fwd.fp8_cast", cuda::fp8_amax(w(w_off), out * in, amax_w, stream_));
  MT_PROF("fwd.fp8_cast", cuda::fp8_cast(w(w_off), out, in, amax_w, e4m3, s.f8_w, nullptr, s.f8_scalar(1), stream_));
  MT_PROF(name, lt.gemm_fp8(T, out, in, 1.0f, s.f8_row, CUDA_R_8F_E4M3, s.f8_scalar(0), s.f8_w, CUDA_R_8F_E4M3, s.f8_scalar(1), 0.0f, y, out,
                            CUDA_R_16BF, bias, true, stream_));
}

void CudaGPT::linear_dgrad(int64_t l, Record& r, int site, const char* name, int64_t T, int64_t in, int64_t out, const bf16* dy, int64_t w_off,
                           bf16* dx) {
  auto& lt = cuda::GemmLt::instance();
  if (!fp8_layer(l)) {
    MT_PROF(name, lt.gemm_ex(false, false, T, in, out, 1.0f, dy, out, w(w_off), in, 0.0f, dx, in, ab_, ab_, nullptr, stream_));
    return;
  }
  Scratch& s = *s_;
  const auto grad = D_.fp8_grad_e5m2 ? cuda::Fp8Type::kE5M2 : cuda::Fp8Type::kE4M3;
  MT_PROF("bwd.fp8_cast", cuda::fp8_amax(dy, T * out, s.f8_scalar(2), stream_));
  MT_PROF("bwd.fp8_cast", cuda::fp8_cast(dy, T, out, s.f8_scalar(2), grad, s.f8_row, D_.fp8_wgrad ? s.f8_dyt : nullptr, s.f8_scalar(3), stream_));
  MT_PROF("bwd.fp8_cast", cuda::fp8_cast(w(w_off), out, in, r.f8_amax + 2 * site + 1, cuda::Fp8Type::kE4M3, nullptr, s.f8_w, s.f8_scalar(1), stream_));
  MT_PROF(name, lt.gemm_fp8(T, in, out, 1.0f, s.f8_row, cuda_type(grad), s.f8_scalar(3), s.f8_w, CUDA_R_8F_E4M3, s.f8_scalar(1), 0.0f, dx, in,
                            CUDA_R_16BF, nullptr, false, stream_));
  fp8_dyt_record_ = D_.fp8_wgrad ? &r : nullptr;
  fp8_dyt_site_ = site;
}

void CudaGPT::linear_wgrad(cudaStream_t ws, int64_t l, Record& r, int site, const char* name, int64_t T, int64_t in, int64_t out, const bf16* dy,
                           const bf16* x, int64_t w_off, int64_t b_off) {
  if (!fp8_layer(l) || !D_.fp8_wgrad) {
    wgrad_with_bias(ws, name, out, T, dy, x, in, w_off, b_off);
    return;
  }
  Scratch& s = *s_;
  const auto grad = D_.fp8_grad_e5m2 ? cuda::Fp8Type::kE5M2 : cuda::Fp8Type::kE4M3;
  if (fp8_dyt_record_ != &r || fp8_dyt_site_ != site) {  // a deferred weight gradient: dy's cast again (the same amax, the same bytes)
    MT_PROF_ON(ws, "bwd.fp8_cast", cuda::fp8_amax(dy, T * out, s.f8_scalar(2), ws));
    MT_PROF_ON(ws, "bwd.fp8_cast", cuda::fp8_cast(dy, T, out, s.f8_scalar(2), grad, nullptr, s.f8_dyt, s.f8_scalar(3), ws));
  }
  MT_PROF_ON(ws, "bwd.fp8_cast", cuda::fp8_cast(x, T, in, r.f8_amax + 2 * site, cuda::Fp8Type::kE4M3, nullptr, s.f8_xt, s.f8_scalar(4), ws));
  MT_PROF_ON(ws, name, cuda::GemmLt::instance().gemm_fp8(out, in, T, 1.0f, s.f8_dyt, cuda_type(grad), s.f8_scalar(3), s.f8_xt, CUDA_R_8F_E4M3,
                                                         s.f8_scalar(4), 1.0f, g(w_off), in, CUDA_R_32F, nullptr, false, ws));
  if (b_off >= 0) MT_PROF_ON(ws, "bwd.bias_grad", cuda::bias_grad_bf16(g(b_off), dy, T, out, ws, dt_));
  fp8_dyt_record_ = nullptr;
}

}  // namespace mt
