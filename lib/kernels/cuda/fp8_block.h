// fp8_block.h (CUDA): blockwise FP8 scaling (Transformer Engine's Float8BlockScaling, Megatron's --fp8-recipe
// blockwise) as Hopper's cuBLASLt block-scaled GEMMs take it (cuBLAS 12.9+): a power-of-2 scale per block from the
// block's amax, rounded as kernels/cpu/fp8's fp8_block_scale and fp8_quantize_blocks round (the CPU engine's emulation,
// the oracle), and the inverse scales (what cuBLASLt multiplies by) in cuBLASLt's layouts, for an operand [R, K] stored
// K-contiguous:
//   1 x 128 blocks along K (CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F): inverse scale of row r, block kb at
//       [kb * pad4(R) + r]   (fp8_vec128_scales(R, K) floats)
//   128 x 128 blocks (CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F): block (rb, kb) at [rb * pad4(ceil(K / 128)) + kb]
//       (fp8_blk128_scales(R, K) floats)
// with pad4(n) = n rounded up to a multiple of 4 (16-byte columns). The entries past R (or past the blocks) are never
// written: the caller zeroes the buffers once.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/cuda/fp8_cast.h"

namespace mt::cuda {

constexpr int64_t kFp8BlockSize = 128;
int64_t fp8_vec128_scales(int64_t R, int64_t K);
int64_t fp8_blk128_scales(int64_t R, int64_t K);

// x [rows, cols] (bf16, 16-byte aligned, cols a multiple of 8, rows of 4; out 8-byte aligned) quantised in 1 x 128 blocks along its rows into out
// [rows, cols] with out_scale_inv (vec128 of (rows, cols)), and/or in 128 x 1 blocks (128 consecutive rows of one
// column) into out_t [cols, rows], the transpose, with out_t_scale_inv (vec128 of (cols, rows)). Either output may be
// null (with its scales). One pass over x.
void fp8_quantize_1x128(const bf16* x, int64_t rows, int64_t cols, Fp8Type type, uint8_t* out, float* out_scale_inv, uint8_t* out_t,
                        float* out_t_scale_inv, cudaStream_t stream);
// W [rows, cols] in 128 x 128 blocks into out [rows, cols] (scale_inv: blk128 of (rows, cols)) and its transpose out_t
// [cols, rows] (t_scale_inv: blk128 of (cols, rows)), each block's scale shared by both. One pass over W.
void fp8_quantize_128x128(const bf16* w, int64_t rows, int64_t cols, Fp8Type type, uint8_t* out, float* scale_inv, uint8_t* out_t,
                          float* t_scale_inv, cudaStream_t stream);

}  // namespace mt::cuda
