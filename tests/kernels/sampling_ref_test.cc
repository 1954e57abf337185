#include "kernels/sampling_ref.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace dsv4 {
namespace {

TEST(SamplingRef, GreedyAndDegenerateFilters) {
  const std::vector<float> logits = {0.1f, 3.0f, 2.9f, -1.0f};
  SamplingParams p;
  EXPECT_EQ(SampleRef(logits, p, 0), 1);
  p.temperature = 1.0f;
  p.top_k = 1;
  EXPECT_EQ(SampleRef(logits, p, 7), 1);
  p.top_k = 0;
  p.top_p = 1e-6f;
  EXPECT_EQ(SampleRef(logits, p, 7), 1);
  p.top_p = 1;
  p.min_p = 1;
  EXPECT_EQ(SampleRef(logits, p, 7), 1);
}

TEST(SamplingRef, DeterministicPerSeedAndStep) {
  std::vector<float> logits(50);
  for (int i = 0; i < 50; ++i) logits[i] = std::sin(i * 1.3f);
  SamplingParams p;
  p.temperature = 1.5f;
  p.seed = 42;
  std::vector<int32_t> a, b;
  for (uint64_t step = 0; step < 20; ++step) a.push_back(SampleRef(logits, p, step));
  for (uint64_t step = 0; step < 20; ++step) b.push_back(SampleRef(logits, p, step));
  EXPECT_EQ(a, b);
  p.seed = 43;
  std::vector<int32_t> c;
  for (uint64_t step = 0; step < 20; ++step) c.push_back(SampleRef(logits, p, step));
  EXPECT_NE(a, c);
}

TEST(SamplingRef, FollowsTheDistribution) {
  // p(1) = 3/4 at temperature 1; top-k 2 removes the rest.
  const std::vector<float> logits = {0.0f, std::log(3.0f), -50.0f};
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_k = 2;
  int ones = 0;
  const int n = 8000;
  for (int i = 0; i < n; ++i) {
    p.seed = static_cast<uint64_t>(i);
    ones += SampleRef(logits, p, 0) == 1;
  }
  EXPECT_NEAR(static_cast<double>(ones) / n, 0.75, 0.02);
  // top-p 0.5 keeps only the top token.
  p.top_p = 0.5f;
  for (int i = 0; i < 100; ++i) {
    p.seed = static_cast<uint64_t>(i);
    EXPECT_EQ(SampleRef(logits, p, 0), 1);
  }
}

}  // namespace
}  // namespace dsv4
