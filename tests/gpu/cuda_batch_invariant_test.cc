// The CUDA backend's batch-invariant mode (CudaBackendOptions::batch_invariant, --batch-invariant;
// label `gpu`): every product row is the fp32 sum of its K products in order (one fma each), so it
// equals that sum computed on the host bit for bit, and a row gives the same bits whether it runs
// alone, in a small batch or in a large one, for plain and grouped products, in fp32 and bf16
// precision (bf16: both operands rounded to bf16 first, as the backend does).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/gpu/backend_pair.h"

namespace dsv4 {
namespace {

using testing::BackendPair;
using testing::Both;
using testing::RandomVec;

constexpr int32_t kBlock = 128;

struct Product {
  int64_t n, k, groups;
};

// y[m, groups * n] with y[r, g * n + j] = Σ_k x[r, g * k + kk] · w[g * n + j, kk], summed in
// order with one fma each from +0.
std::vector<float> HostSequential(const std::vector<float>& x, const std::vector<float>& w,
                                  int64_t m, const Product& s) {
  std::vector<float> y(static_cast<size_t>(m * s.groups * s.n));
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t g = 0; g < s.groups; ++g) {
      for (int64_t j = 0; j < s.n; ++j) {
        const float* xr = &x[static_cast<size_t>(r * s.groups * s.k + g * s.k)];
        const float* wr = &w[static_cast<size_t>((g * s.n + j) * s.k)];
        float acc = 0.0f;
        for (int64_t kk = 0; kk < s.k; ++kk) acc = std::fmaf(xr[kk], wr[kk], acc);
        y[static_cast<size_t>(r * s.groups * s.n + g * s.n + j)] = acc;
      }
    }
  }
  return y;
}

std::vector<float> RunProduct(BackendPair& p, const Both& w, const std::vector<float>& x,
                              int64_t m, const Product& s) {
  p.Begin(std::vector<testing::SeqSpec>(1), kBlock);
  Both xt = p.Input(Shape{m, s.groups * s.k}, x);
  Both y = p.Scratch(DType::kF32, Shape{m, s.groups * s.n});
  const absl::Status st = s.groups > 1 ? p.gpu->GroupedLinear(xt.g, w.g, s.groups, y.g)
                                       : p.gpu->Linear(xt.g, w.g, y.g);
  EXPECT_TRUE(st.ok()) << st;
  return p.HostG(y.g);
}

size_t Mismatches(const float* a, const float* b, size_t n) {
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += std::memcmp(&a[i], &b[i], sizeof(float)) != 0 ? 1 : 0;
  return bad;
}

TEST(CudaBatchInvariant, ProductRowsEqualTheOrderedSumWhateverTheBatch) {
  DSV4_REQUIRE_GPU();
  constexpr int64_t kRows = 300;
  // Row ranges run on their own: single rows (the decode path of the default mode), a few, more
  // than one tile, the whole batch.
  const std::vector<std::pair<int64_t, int64_t>> ranges = {
      {0, 1}, {5, 1}, {299, 1}, {3, 7}, {100, 129}, {0, kRows}};
  for (Precision prec : {Precision::kFP32, Precision::kBF16}) {
    BackendPair p(prec, /*batch_invariant=*/true);
    for (const Product& s : std::vector<Product>{{33, 17, 1},      // odd: partial tiles
                                                 {1024, 4096, 1},  // q_a
                                                 {512, 1000, 1},   // k not a tile multiple
                                                 {128, 512, 8}}) { // grouped (o_a_proj)
      SCOPED_TRACE(::testing::Message() << PrecisionName(prec) << " n=" << s.n << " k=" << s.k
                                        << " groups=" << s.groups);
      Both w = p.Weight(Shape{s.groups * s.n, s.k},
                        RandomVec(s.groups * s.n * s.k, 2, -0.05f, 0.05f), WeightUse::kMatrix);
      const std::vector<float> wh = p.HostHeld(w.g);
      std::vector<float> x = RandomVec(kRows * s.groups * s.k, 1);
      const std::vector<float> full = RunProduct(p, w, x, kRows, s);
      if (prec == Precision::kBF16) x = testing::RoundBf16(x);
      const std::vector<float> ref = HostSequential(x, wh, kRows, s);
      EXPECT_EQ(Mismatches(full.data(), ref.data(), full.size()), 0u) << "against the host sum";
      const int64_t in = s.groups * s.k, out = s.groups * s.n;
      for (const auto& [a, len] : ranges) {
        const std::vector<float> xs(x.begin() + a * in, x.begin() + (a + len) * in);
        const std::vector<float> got = RunProduct(p, w, xs, len, s);
        EXPECT_EQ(Mismatches(got.data(), full.data() + a * out, got.size()), 0u)
            << "rows [" << a << ", " << a + len << ") alone";
      }
    }
  }
}

}  // namespace
}  // namespace dsv4
