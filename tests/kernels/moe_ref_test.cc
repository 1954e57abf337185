#include "kernels/moe_ref.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace dsv4 {
namespace {

float Score(float x) { return std::sqrt(x > 20 ? x : std::log1p(std::exp(x))); }

TEST(RouteRef, BiasSelectsButDoesNotWeigh) {
  RouterShape s{/*tokens=*/1, /*experts=*/4, /*top_k=*/2, /*routed_scale=*/1.5f};
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, 30.0f};
  const std::vector<float> bias = {0.0f, 5.0f, 0.0f, -10.0f};  // pushes 1 in and 3 out
  std::vector<int32_t> idx(2);
  std::vector<float> w(2);
  RouteRef(s, logits.data(), bias.data(), nullptr, nullptr, idx.data(), w.data());
  EXPECT_EQ(idx[0], 1);
  EXPECT_EQ(idx[1], 0);
  const float s0 = Score(2.0f), s1 = Score(1.0f);
  EXPECT_NEAR(w[0], s1 / (s0 + s1) * 1.5f, 1e-6);
  EXPECT_NEAR(w[1], s0 / (s0 + s1) * 1.5f, 1e-6);
  EXPECT_NEAR(Score(30.0f), std::sqrt(30.0f), 1e-6);  // softplus threshold
}

TEST(RouteRef, HashRoutingUsesTheTable) {
  RouterShape s{2, 4, 2, 1.0f};
  const std::vector<float> logits = {0, 1, 2, 3, 3, 2, 1, 0};
  const std::vector<int32_t> table = {0, 0, 3, 1, 2, 2};  // vocab 3 x K 2 (duplicates allowed)
  const std::vector<int32_t> tokens = {1, 0};
  std::vector<int32_t> idx(4);
  std::vector<float> w(4);
  RouteRef(s, logits.data(), nullptr, table.data(), tokens.data(), idx.data(), w.data());
  EXPECT_EQ(idx, (std::vector<int32_t>{3, 1, 0, 0}));
  EXPECT_NEAR(w[0], Score(3) / (Score(3) + Score(1)), 1e-6);
  EXPECT_NEAR(w[2], 0.5f, 1e-6);  // expert 0 twice: two halves
}

TEST(SwiGluRef, ClampsGateAboveOnlyAndUpBothWays) {
  const std::vector<float> gu = {20.0f, -20.0f, 20.0f, -20.0f};  // I = 2: gate (20,-20), up (20,-20)
  std::vector<float> h(2);
  SwiGluRef(gu.data(), 1, 2, 10.0f, h.data());
  const float silu10 = 10.0f / (1 + std::exp(-10.0f));
  const float silu_m20 = -20.0f / (1 + std::exp(20.0f));
  EXPECT_NEAR(h[0], silu10 * 10.0f, 1e-4);
  EXPECT_NEAR(h[1], silu_m20 * -10.0f, 1e-6);
}

TEST(MoeExpertsRef, EqualsPerTokenComputation) {
  ExpertsShape s{/*tokens=*/5, /*dim=*/3, /*inter=*/2, /*experts=*/3, /*top_k=*/2, 10.0f};
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(5 * 3), gate_up(3 * 4 * 3), down(3 * 3 * 2), w(10);
  for (auto* v : {&x, &gate_up, &down, &w}) {
    for (auto& e : *v) e = u(rng);
  }
  const std::vector<int32_t> idx = {0, 2, 1, 1, 2, 0, 0, 1, 2, 2};
  std::vector<float> out(5 * 3);
  MoeExpertsRef(s, x.data(), idx.data(), w.data(), gate_up.data(), down.data(), out.data());
  for (int t = 0; t < 5; ++t) {
    for (int d = 0; d < 3; ++d) {
      double acc = 0;
      for (int k = 0; k < 2; ++k) {
        const int e = idx[t * 2 + k];
        double y = 0;
        for (int i = 0; i < 2; ++i) {
          double g = 0, up = 0;
          for (int c = 0; c < 3; ++c) {
            g += gate_up[(e * 4 + i) * 3 + c] * x[t * 3 + c];
            up += gate_up[(e * 4 + 2 + i) * 3 + c] * x[t * 3 + c];
          }
          g = std::min(g, 10.0);
          up = std::clamp(up, -10.0, 10.0);
          y += down[(e * 3 + d) * 2 + i] * (g / (1 + std::exp(-g)) * up);
        }
        acc += w[t * 2 + k] * y;
      }
      EXPECT_NEAR(out[t * 3 + d], acc, 1e-5);
    }
  }
}

}  // namespace
}  // namespace dsv4
