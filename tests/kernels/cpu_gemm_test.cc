// The CPU GEMM is batch-invariant: a row's bits do not depend on the row count or the row's place.
#include "kernels/cpu_gemm.h"

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dsv4 {
namespace {

TEST(CpuGemm, RowsDoNotDependOnTheirBatch) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-1, 1);
  for (int64_t k : {16, 96, 257, 1024}) {
    for (int64_t n : {1, 17, 300}) {
      std::vector<float> w(n * k), x(40 * k);
      for (float& v : w) v = u(rng);
      for (float& v : x) v = u(rng);
      // Row 0 alone, then every row of products of 1..40 rows, then row 5 of a product that
      // starts at row 3 (other neighbours, another place in the tile).
      std::vector<float> alone(40 * n);
      for (int64_t r = 0; r < 40; ++r) SgemmNT(1, n, k, &x[r * k], k, w.data(), k, &alone[r * n], n);
      for (int64_t m : {2, 7, 8, 9, 23, 40}) {
        std::vector<float> y(m * n);
        SgemmNT(m, n, k, x.data(), k, w.data(), k, y.data(), n);
        EXPECT_EQ(std::memcmp(y.data(), alone.data(), sizeof(float) * m * n), 0)
            << "m=" << m << " n=" << n << " k=" << k;
      }
      std::vector<float> y(20 * n);
      SgemmNT(20, n, k, &x[3 * k], k, w.data(), k, y.data(), n);
      EXPECT_EQ(std::memcmp(y.data(), &alone[3 * n], sizeof(float) * 20 * n), 0);
      // And the product is right.
      for (int64_t j = 0; j < n; ++j) {
        double ref = 0;
        for (int64_t i = 0; i < k; ++i) ref += double{x[i]} * w[j * k + i];
        EXPECT_NEAR(alone[j], ref, 1e-4 * std::sqrt(static_cast<double>(k)));
      }
    }
  }
}

TEST(CpuGemm, AccumulatesIntoStridedRows) {
  const int64_t m = 11, n = 5, k = 9, ldy = 7;
  std::vector<float> x(m * k, 1.0f), w(n * k, 2.0f), y(m * ldy, 3.0f);
  SgemmNT(m, n, k, x.data(), k, w.data(), k, y.data(), ldy, /*accumulate=*/true);
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t j = 0; j < ldy; ++j) EXPECT_EQ(y[r * ldy + j], j < n ? 3.0f + 18.0f : 3.0f);
  }
}

}  // namespace
}  // namespace dsv4
