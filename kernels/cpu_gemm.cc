#include "kernels/cpu_gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace dsv4 {
namespace {

void Tile(int64_t n, int64_t k, const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
          int64_t ldy, bool accumulate) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(kGemmRowTile),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.0f, x, static_cast<blasint>(ldx),
              w, static_cast<blasint>(ldw), accumulate ? 1.0f : 0.0f, y, static_cast<blasint>(ldy));
}

}  // namespace

void SgemmNT(int64_t m, int64_t n, int64_t k, const float* x, int64_t ldx, const float* w,
             int64_t ldw, float* y, int64_t ldy, bool accumulate) {
  if (m == 0 || n == 0) return;
  const int64_t full = m / kGemmRowTile * kGemmRowTile;
  for (int64_t r = 0; r < full; r += kGemmRowTile) {
    Tile(n, k, x + r * ldx, ldx, w, ldw, y + r * ldy, ldy, accumulate);
  }
  const int64_t rest = m - full;
  if (rest == 0) return;
  // The last rows, padded with zero rows to a whole tile in scratch.
  thread_local std::vector<float> xs, ys;
  xs.assign(static_cast<size_t>(kGemmRowTile * k), 0.0f);
  ys.assign(static_cast<size_t>(kGemmRowTile * n), 0.0f);
  for (int64_t r = 0; r < rest; ++r) {
    std::memcpy(xs.data() + r * k, x + (full + r) * ldx, sizeof(float) * k);
    if (accumulate) std::memcpy(ys.data() + r * n, y + (full + r) * ldy, sizeof(float) * n);
  }
  Tile(n, k, xs.data(), k, w, ldw, ys.data(), n, accumulate);
  for (int64_t r = 0; r < rest; ++r) {
    std::memcpy(y + (full + r) * ldy, ys.data() + r * n, sizeof(float) * n);
  }
}

void SetBlasThreads(int threads) {
  if (threads > 0) openblas_set_num_threads(threads);
}

}  // namespace dsv4
