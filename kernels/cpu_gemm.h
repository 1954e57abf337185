// fp32 GEMM on the CPU through OpenBLAS (cblas_sgemm), batch-invariant: a row's result does not
// depend on how many rows the call has or where the row sits among them.
#pragma once

#include <cstdint>

namespace dsv4 {

// Rows per OpenBLAS call. OpenBLAS picks its kernels (and so its rounding) by the row count, so
// every call has exactly this many rows (the last tile of a product is padded): row r of a
// product is computed by the same kernel whatever M is. Chunked prefill, batching and prefix-cache
// hits then give the same bits as a one-shot prefill (tests/worker/model_consistency_test.cc).
constexpr int64_t kGemmRowTile = 8;

// y[M, N] = x[M, K] · w[N, K]ᵀ (+ y when accumulate). Row strides: ldx, ldw, ldy.
void SgemmNT(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
             int64_t ldw, float* y, int64_t ldy, bool accumulate = false);

// Sets OpenBLAS's thread count (<= 0 keeps its default).
void SetBlasThreads(int threads);

}  // namespace dsv4
