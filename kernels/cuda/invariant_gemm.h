// CUDA launcher: the batch-invariant GEMM of --batch-invariant (docs/cuda-backend.md,
// "Batch-invariant mode"). y[b][M, N] = x[b][M, K] · w[b][N, K]ᵀ with each output the fp32 sum of
// its K products in order k = 0, 1, ..., K - 1 (one fma each), whatever M, N, the tile or the
// batch: a row's result never depends on the other rows of the step, so a prompt prefilled in one
// chunk, in several, or as a prefix-cache hit's suffix gives the same bits. Operands as
// cuda::Gemm (both bf16 or both fp32, row strides and strided batches from GemmShape); SIMT fp32
// FMAs, no tensor cores, no split-K.
#pragma once

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "kernels/cuda/gemm.h"

namespace dsv4::cuda {

absl::Status InvariantGemm(const GemmShape& s, const void* x, const void* w, float* y,
                           cudaStream_t stream);

}  // namespace dsv4::cuda
