#include <cmath>
#include <numbers>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/rms_norm_ref.h"
#include "kernels/rope_ref.h"

namespace dsv4 {
namespace {

TEST(RmsNormRef, HandChecked) {
  const std::vector<float> x = {3, 4, 0, 0};
  const std::vector<float> w = {1, 2};
  std::vector<float> y(4);
  RmsNormRef(x.data(), w.data(), /*rows=*/2, /*dim=*/2, /*eps=*/0.0f, y.data());
  const float r = 1.0f / std::sqrt(12.5f);  // mean(9, 16) = 12.5
  EXPECT_FLOAT_EQ(y[0], 3 * r);
  EXPECT_FLOAT_EQ(y[1], 2 * 4 * r);
  // eps keeps an all-zero row finite.
  RmsNormRef(x.data(), w.data(), 2, 2, 1e-6f, y.data());
  EXPECT_EQ(y[2], 0.0f);
  EXPECT_EQ(y[3], 0.0f);
}

TEST(RmsNormRef, UnweightedInPlace) {
  std::vector<float> x = {1, -1, 1, -1, 2, 2, 2, 2};
  RmsNormRef(x.data(), nullptr, 2, 4, 0.0f, x.data());
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(std::fabs(x[i]), 1.0f);
  for (int i = 4; i < 8; ++i) EXPECT_FLOAT_EQ(x[i], 1.0f);
}

TEST(RopeRef, RotatesAdjacentTrailingPairs) {
  // dim 6, rope_dims 4: channels 0,1 pass through; pairs (2,3) and (4,5) rotate.
  const float half_pi = static_cast<float>(std::numbers::pi / 2);
  const std::vector<float> inv_freq = {half_pi, half_pi / 2};  // angles pi/2 and pi/4 at pos 1
  std::vector<float> x = {7, 8, 1, 0, 1, 0};
  RopeRowRef(x.data(), 6, 4, inv_freq.data(), /*pos=*/1, /*inverse=*/false);
  EXPECT_EQ(x[0], 7);
  EXPECT_EQ(x[1], 8);
  EXPECT_NEAR(x[2], 0, 1e-6);   // (1, 0) by 90 degrees -> (0, 1)
  EXPECT_NEAR(x[3], 1, 1e-6);
  EXPECT_NEAR(x[4], std::sqrt(0.5), 1e-6);
  EXPECT_NEAR(x[5], std::sqrt(0.5), 1e-6);
  RopeRowRef(x.data(), 6, 4, inv_freq.data(), 1, /*inverse=*/true);
  const std::vector<float> back = {7, 8, 1, 0, 1, 0};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(x[i], back[i], 1e-6) << i;
}

TEST(RopeRef, PositionZeroIsIdentityAndTokensUseTheirPositions) {
  const std::vector<float> inv_freq = {1.0f};
  std::vector<float> x = {1, 2, 1, 2};  // two tokens, one head, dim 2
  const std::vector<int32_t> pos = {0, 3};
  RopeRef(x.data(), 2, 1, 2, 2, inv_freq.data(), pos.data(), false);
  EXPECT_FLOAT_EQ(x[0], 1);
  EXPECT_FLOAT_EQ(x[1], 2);
  EXPECT_NEAR(x[2], 1 * std::cos(3.0) - 2 * std::sin(3.0), 1e-6);
  EXPECT_NEAR(x[3], 2 * std::cos(3.0) + 1 * std::sin(3.0), 1e-6);
}

}  // namespace
}  // namespace dsv4
