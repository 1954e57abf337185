#include "kernels/cpu_gemm.h"

#include <cblas.h>

namespace dsv4 {

void SgemmNT(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
             int64_t ldw, float* y, int64_t ldy, bool accumulate) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, x, static_cast<blasint>(ldx),
              w, static_cast<blasint>(ldw), accumulate ? 1.0f : 0.0f, y, static_cast<blasint>(ldy));
}

void SetBlasThreads(int threads) {
  if (threads > 0) openblas_set_num_threads(threads);
}

}  // namespace dsv4
