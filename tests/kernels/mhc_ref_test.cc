#include "kernels/mhc_ref.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace dsv4 {
namespace {

float Sig(float x) { return 1.0f / (1.0f + std::exp(-x)); }

TEST(SinkhornRef, OneIterationByHand) {
  // logits 0 everywhere except c[0][1] = log 3: row softmax gives [[.25,.75],[.5,.5]] (+eps 0).
  std::vector<float> c = {0, std::log(3.0f), 0, 0};
  SinkhornRef(c.data(), 2, /*iters=*/1, /*eps=*/0);
  // One column normalisation: col0 = [.25,.5]/.75, col1 = [.75,.5]/1.25.
  EXPECT_NEAR(c[0], 1.0 / 3, 1e-6);
  EXPECT_NEAR(c[2], 2.0 / 3, 1e-6);
  EXPECT_NEAR(c[1], 0.6, 1e-6);
  EXPECT_NEAR(c[3], 0.4, 1e-6);
}

TEST(SinkhornRef, ConvergesToDoublyStochastic) {
  std::vector<float> c = {0.3f, -1.0f, 2.0f, 0.5f, 0.1f, -0.7f, 1.1f, 0.0f, -2.0f};
  SinkhornRef(c.data(), 3, 20, 1e-6f);
  for (int k = 0; k < 3; ++k) {
    EXPECT_NEAR(c[k] + c[3 + k] + c[6 + k], 1.0, 1e-5);  // columns: exact after the last step
    EXPECT_NEAR(c[3 * k] + c[3 * k + 1] + c[3 * k + 2], 1.0, 1e-3);  // rows: converged
  }
}

// With fn = 0 every mix is 0, so the gates depend only on base: checkable by hand.
TEST(HcRef, PreWithZeroProjection) {
  HcShape s;
  s.tokens = 1;
  s.n = 2;
  s.dim = 2;
  s.sinkhorn_iters = 1;
  s.hc_eps = 0.0f;
  const std::vector<float> hs = {1, 2, 3, 4};  // stream 0 = (1,2), stream 1 = (3,4)
  const std::vector<float> fn(8 * 4, 0.0f);    // (2+n)n = 8 mixes x nD = 4
  const std::vector<float> base = {0.0f, std::log(3.0f), 1.0f, -1.0f, 0, std::log(3.0f), 0, 0};
  const std::vector<float> scale = {1, 1, 1};
  std::vector<float> collapsed(2), post(2), comb(4);
  HcPreRef(s, hs.data(), fn.data(), base.data(), scale.data(), collapsed.data(), post.data(),
           comb.data());
  const float pre0 = 0.5f, pre1 = Sig(std::log(3.0f));  // 0.75
  EXPECT_NEAR(collapsed[0], pre0 * 1 + pre1 * 3, 1e-6);
  EXPECT_NEAR(collapsed[1], pre0 * 2 + pre1 * 4, 1e-6);
  EXPECT_NEAR(post[0], 2 * Sig(1.0f), 1e-6);
  EXPECT_NEAR(post[1], 2 * Sig(-1.0f), 1e-6);
  EXPECT_NEAR(comb[0], 1.0 / 3, 1e-6);  // same matrix as SinkhornRef.OneIterationByHand
  EXPECT_NEAR(comb[1], 0.6, 1e-6);
}

TEST(HcRef, PostSumsOverTheFirstIndex) {
  HcShape s;
  s.tokens = 1;
  s.n = 2;
  s.dim = 1;
  const std::vector<float> hs = {10, 20};
  const std::vector<float> f = {1};
  const std::vector<float> post = {0.5f, 2.0f};
  const std::vector<float> comb = {0.1f, 0.2f, 0.3f, 0.4f};  // c[j][k], j = source stream
  std::vector<float> out(2);
  HcPostRef(s, hs.data(), f.data(), post.data(), comb.data(), out.data());
  EXPECT_FLOAT_EQ(out[0], 0.5f * 1 + 0.1f * 10 + 0.3f * 20);
  EXPECT_FLOAT_EQ(out[1], 2.0f * 1 + 0.2f * 10 + 0.4f * 20);
}

TEST(HcRef, HeadGates) {
  HcShape s;
  s.tokens = 1;
  s.n = 2;
  s.dim = 1;
  s.hc_eps = 1e-6f;
  const std::vector<float> hs = {1, 3};
  // fn rows: mix_0 = fhat·(1, 0), mix_1 = 0. fhat = hs / rms(hs) = (1,3)/sqrt(5).
  const std::vector<float> fn = {1, 0, 0, 0};
  const std::vector<float> base = {0, 0};
  const std::vector<float> scale = {2};
  std::vector<float> y(1);
  HcHeadRef(s, hs.data(), fn.data(), base.data(), scale.data(), y.data());
  const float mix0 = 1.0f / std::sqrt(5.0f + 1e-6f);
  const float expect = (Sig(2 * mix0) + 1e-6f) * 1 + (0.5f + 1e-6f) * 3;
  EXPECT_NEAR(y[0], expect, 1e-5);
}

}  // namespace
}  // namespace dsv4
