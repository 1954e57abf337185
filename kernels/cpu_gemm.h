// fp32 GEMM on the CPU through OpenBLAS (cblas_sgemm).
#pragma once

#include <cstdint>

namespace dsv4 {

// y[M, N] = x[M, K] · w[N, K]ᵀ (+ y when accumulate). Row strides: ldx, ldw, ldy.
void SgemmNT(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
             int64_t ldw, float* y, int64_t ldy, bool accumulate = false);

// Sets OpenBLAS's thread count (<= 0 keeps its default).
void SetBlasThreads(int threads);

}  // namespace dsv4
