// CUDA launcher: activations to FP8 e4m3 with one power-of-two scale per row and 128 columns
// (1 x 128 groups, DeepSeek's inference recipe for its FP8 products; the scales are UE8M0 values
// kept as fp32 for cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dsv4::cuda {

// x [m, k] fp32 (row stride ldx) -> x8 [m, k] e4m3 (row stride k) and scales [ceil(k / 128), m]
// fp32 (m contiguous: the layout cuBLASLt reads), with x8 = sat_e4m3(x / s) and s = 2^e the
// smallest power of two with amax / s <= 448 over the group (s = 1 for an all-zero group; the
// last group may be partial). k % 4 == 0. `scales_ld` (>= m; 0: m) is the scales' row stride,
// for a caller that pads the rows.
absl::Status QuantizeFp8Groups(const float* x, int64_t m, int64_t k, int64_t ldx, uint8_t* x8,
                               float* scales, cudaStream_t stream, int64_t scales_ld = 0);

}  // namespace dsv4::cuda
