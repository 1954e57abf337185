// CUDA launchers: products with FP8 block-scaled weight matrices (kernels/quant_weights.h), as the
// release stores every dense projection of the attention and the shared expert.
//   Fp8Gemv        decode (m <= kFp8GemvMaxRows rows of x): the FP8 bytes streamed once for all m
//                  rows, dequantised in registers (e4m3 x the block's fp32 scale), fp32
//                  accumulation; built for HBM bandwidth like RowGemvBf16 (gemv.h).
//   Fp8Dequantize  the whole matrix to bf16 or fp32 in device memory: the correct path for larger
//                  m (the caller then runs its bf16/fp32 GEMM).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/quant_weights.h"

namespace dsv4::cuda {

constexpr int64_t kFp8GemvMaxRows = 8;

// y[i, n] = Σ_k' xr(x[i, g(n) * k + k']) · W[n, k'] for i < m, n < w.rows, where k = w.cols,
// g(n) = n / group_rows (the grouped output projection: each row of x holds w.rows / group_rows
// vectors of length k; group_rows = w.rows for a plain product), x [m, (w.rows / group_rows) * k]
// fp32 and y [m, w.rows] fp32 row-major. xr rounds x to bf16 when `round_x_bf16` (the bf16
// convention of the other GEMM paths) and is exact otherwise (fp32 mode: the CPU reference's
// numbers to rounding). Deterministic: a fixed summation order.
absl::Status Fp8Gemv(const float* x, int64_t m, const Fp8Matrix& w, int64_t group_rows,
                     bool round_x_bf16, float* y, cudaStream_t stream);
// Whether Fp8Gemv takes these shapes (m in [1, kFp8GemvMaxRows], alignment, sizes).
bool Fp8GemvFits(const float* x, int64_t m, const Fp8Matrix& w, int64_t group_rows);

// out[w.rows, w.cols] = W, as bf16 (`to_bf16`, round to nearest even) or fp32 (exact).
absl::Status Fp8Dequantize(const Fp8Matrix& w, bool to_bf16, void* out, cudaStream_t stream);

}  // namespace dsv4::cuda
