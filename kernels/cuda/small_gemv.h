// CUDA launcher: the dense GEMV for a few rows (decode projections that are not the single-token
// RowGemvBf16's: the router, narrow outputs). A split-K kernel over a thread-block cluster, with
// the routed experts' FMA grouped GEMV (moe_mma.cuh) on one weight as the fallback for operands
// it does not take; defined in small_gemv.cu.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "common/dtype.h"

namespace dsv4::cuda {

// y[M, N] = x[M, K] · w[N, K]ᵀ for M <= kSmallGemvMaxRows (decode projections): the expert GEMV
// kernel on one weight, many blocks for narrow N, weights streamed once. bf16 weights see x
// rounded to bf16, as in the cuBLASLt path; fp32 accumulation.
constexpr int64_t kSmallGemvMaxRows = 8;
absl::Status SmallGemv(const float* x, int64_t m, int64_t k, const void* w, DType wdtype, int64_t n,
                       float* y, cudaStream_t stream);

}  // namespace dsv4::cuda
