#include "kernels/compressor_ref.h"

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/one_sequence.h"
#include "kernels/rms_norm_ref.h"
#include "kernels/rope_ref.h"

namespace dsv4 {
namespace {


// Direct formula of dsv4-model.md §7 for entry w from the full projection history.
std::vector<float> ExpectedEntry(const CompressorShape& s, const std::vector<float>& a,
                                 const std::vector<float>& z, const std::vector<float>& bias,
                                 const std::vector<float>& norm_w, const std::vector<float>& inv,
                                 int64_t w) {
  const int64_t m = s.ratio, d = s.dim, cd = s.overlap * d;
  std::vector<float> e(d);
  for (int64_t i = 0; i < d; ++i) {
    std::vector<double> logit, value;
    if (s.overlap == 2 && w > 0) {
      for (int64_t j = 0; j < m; ++j) {
        const int64_t t = (w - 1) * m + j;
        logit.push_back(z[t * cd + i] + bias[j * cd + i]);
        value.push_back(a[t * cd + i]);
      }
    }
    const int64_t col = (s.overlap == 2 ? d : 0) + i;
    for (int64_t j = 0; j < m; ++j) {
      const int64_t t = w * m + j;
      logit.push_back(z[t * cd + col] + bias[j * cd + col]);
      value.push_back(a[t * cd + col]);
    }
    double mx = -1e300, sum = 0, acc = 0;
    for (double l : logit) mx = std::max(mx, l);
    for (size_t k = 0; k < logit.size(); ++k) sum += std::exp(logit[k] - mx);
    for (size_t k = 0; k < logit.size(); ++k) acc += std::exp(logit[k] - mx) / sum * value[k];
    e[i] = static_cast<float>(acc);
  }
  RmsNormRef(e.data(), norm_w.data(), 1, d, s.norm_eps, e.data());
  RopeRowRef(e.data(), d, s.rope_dims, inv.data(), w * m, false);
  return e;
}

class CompressorRef : public ::testing::TestWithParam<int /*overlap*/> {};

TEST_P(CompressorRef, MatchesTheFormulaWhateverTheChunking) {
  CompressorShape s;
  s.ratio = 4;
  s.overlap = GetParam();
  s.dim = 6;
  s.rope_dims = 4;
  const int64_t T = 19, cd = s.overlap * s.dim, block_size = 8, blocks = 3;
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> a(T * cd), z(T * cd), bias(s.ratio * cd), norm_w(s.dim), inv = {0.3f, 0.05f};
  for (auto* v : {&a, &z, &bias, &norm_w}) {
    for (auto& x : *v) x = u(rng);
  }
  const int64_t per_block = block_size / s.ratio;
  for (const std::vector<int>& chunks : {std::vector<int>{19}, std::vector<int>{1, 5, 3, 10},
                                        std::vector<int>(19, 1)}) {
    std::vector<float> state(CompressorStateFloats(s), 0.0f);
    std::vector<float> entries(blocks * per_block * s.dim, std::nanf(""));
    int32_t pos = 0;
    for (int n : chunks) {
      testing::OneSequence seq(pos, n, block_size, blocks);
      CompressRef(s, seq.view, a.data() + pos * cd, z.data() + pos * cd, bias.data(),
                  norm_w.data(), inv.data(), state.data(), entries.data());
      pos += n;
    }
    // 19 tokens close windows 0..3; entry 4 (tokens 16..19) is still open.
    for (int64_t w = 0; w < 4; ++w) {
      const auto expect = ExpectedEntry(s, a, z, bias, norm_w, inv, w);
      for (int64_t i = 0; i < s.dim; ++i) {
        EXPECT_NEAR(entries[w * s.dim + i], expect[i], 2e-5) << "entry " << w << " ch " << i;
      }
    }
    EXPECT_TRUE(std::isnan(entries[4 * s.dim])) << "an open window must not produce an entry";
  }
}

INSTANTIATE_TEST_SUITE_P(HcaAndCsa, CompressorRef, ::testing::Values(1, 2));

}  // namespace
}  // namespace dsv4
