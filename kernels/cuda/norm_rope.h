// CUDA launchers: RMSNorm (weighted or not, in place allowed) and interleaved partial RoPE.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dsv4::cuda {

// y[r] = w ⊙ (x[r] · rsqrt(mean(x[r]²) + eps)); w may be null.
absl::Status RmsNorm(const float* x, const float* w, int64_t rows, int64_t dim, float eps, float* y,
                     cudaStream_t stream);
// x [T, heads, dim]: trailing rope_dims of each row rotated at positions[t] (device array).
absl::Status Rope(float* x, int64_t tokens, int64_t heads, int64_t dim, int64_t rope_dims,
                  const float* inv_freq, const int32_t* positions, bool inverse,
                  cudaStream_t stream);

// RmsNorm (w may be null) of every row of x [T, heads, dim] in place, then Rope of its trailing
// rope_dims, in one kernel with the arithmetic of the two launchers above (bit-identical).
bool RmsNormRopeFits(int64_t dim, int64_t rope_dims, const void* x, const void* w);
absl::Status RmsNormRope(float* x, const float* w, int64_t tokens, int64_t heads, int64_t dim,
                         float eps, int64_t rope_dims, const float* inv_freq,
                         const int32_t* positions, bool inverse, cudaStream_t stream);

}  // namespace dsv4::cuda
