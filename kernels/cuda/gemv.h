// Single-token (decode at batch 1) products with bf16 weights: a GEMV for every projection (the
// fused routed + shared expert block of the same design is moe_decode.h; both stream their weights
// through row_stream.cuh). At one token a step is a stream of weights, so this kernel is built for
// HBM bandwidth: one warp per group of whole weight rows (two warps of one block, each over half
// of k, from k >= 2048, summed through shared memory in slice order), 16-byte weight loads issued
// a pass ahead of their use, no staging; launched with programmatic dependent launch
// (common.cuh). Numerics follow the GEMM convention of the other paths: x rounded to bf16, exact
// products in fp32, fp32 accumulation (lane order, a fixed butterfly, then the slices in order):
// deterministic.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace dsv4::cuda {

// y[n] = Σ_k bf16(x[g(n) * k + k']) · w[n, k'] for n < rows, g(n) = n / group_rows (the grouped
// output projection: x holds rows / group_rows vectors of length k; group_rows = rows for a plain
// GEMV). w bf16 [rows, k], k % 8 == 0, x and w 16-byte aligned.
absl::Status RowGemvBf16(const float* x, int64_t k, const void* w, int64_t rows,
                         int64_t group_rows, float* y, cudaStream_t stream);

}  // namespace dsv4::cuda
