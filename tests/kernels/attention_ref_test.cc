#include "kernels/attention_ref.h"

#include <cmath>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/one_sequence.h"

namespace dsv4 {
namespace {


TEST(AttentionRef, SingleKeyWithSink) {
  AttentionShape s;
  s.heads = 1;
  s.dim = 2;
  s.window = 4;
  s.scale = 0.5f;
  testing::OneSequence seq(0, 1);
  const std::vector<float> q = {1, 2}, kv = {3, 1}, sinks = {0.7f};
  std::vector<float> ring(4 * 2, 0.0f), out(2);
  AttentionRef(s, seq.view, q.data(), kv.data(), ring.data(), nullptr, nullptr, sinks.data(),
               out.data());
  const double l = (1 * 3 + 2 * 1) * 0.5;  // 2.5
  const double p = std::exp(l) / (std::exp(l) + std::exp(0.7));
  EXPECT_NEAR(out[0], p * 3, 1e-6);
  EXPECT_NEAR(out[1], p * 1, 1e-6);
}

TEST(AttentionRef, RingAndStepKeysAreTheSameWindow) {
  // Attending at positions 5..7 with all keys in the step must equal attending with keys 0..4
  // already in the ring. Window 4: position 7 sees 4..7 only.
  AttentionShape s;
  s.heads = 2;
  s.dim = 3;
  s.window = 4;
  s.scale = 0.3f;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-2, 2);
  std::vector<float> q(8 * 2 * 3), kv(8 * 3), sinks = {0.1f, -0.4f};
  for (auto& x : q) x = u(rng);
  for (auto& x : kv) x = u(rng);
  std::vector<float> ring(4 * 3, 0.0f);
  std::vector<float> one_shot(8 * 2 * 3);
  testing::OneSequence all(0, 8);
  AttentionRef(s, all.view, q.data(), kv.data(), ring.data(), nullptr, nullptr, sinks.data(),
               one_shot.data());
  testing::OneSequence first(0, 5);
  RingWriteRef(3, 4, first.view, kv.data(), ring.data());
  // Corrupt nothing the window may read: positions 1..4 are in ring slots 1..4 mod 4.
  testing::OneSequence rest(5, 3);
  std::vector<float> split(3 * 2 * 3);
  AttentionRef(s, rest.view, q.data() + 5 * 6, kv.data() + 5 * 3, ring.data(), nullptr, nullptr,
               sinks.data(), split.data());
  for (int i = 0; i < 3 * 6; ++i) EXPECT_NEAR(split[i], one_shot[5 * 6 + i], 1e-6) << i;
}

TEST(AttentionRef, KeysOutsideTheWindowAreIgnored) {
  AttentionShape s;
  s.heads = 1;
  s.dim = 1;
  s.window = 2;
  s.scale = 1;
  testing::OneSequence seq(0, 3);
  std::vector<float> q = {1, 1, 1}, kv = {1000, 1, 2}, sinks = {-100};
  std::vector<float> ring(2, 0.0f), out(3);
  AttentionRef(s, seq.view, q.data(), kv.data(), ring.data(), nullptr, nullptr, sinks.data(),
               out.data());
  // Position 2 sees keys 1 and 2 only.
  const double p1 = std::exp(1.0) / (std::exp(1.0) + std::exp(2.0));
  EXPECT_NEAR(out[2], p1 * 1 + (1 - p1) * 2, 1e-5);
}

TEST(AttentionRef, CompressedEntriesDenseAndSelected) {
  AttentionShape s;
  s.heads = 1;
  s.dim = 1;
  s.window = 1;  // only the token itself from the raw window
  s.scale = 1;
  s.ratio = 2;
  testing::OneSequence seq(5, 1, /*block_size=*/8, /*blocks=*/1);  // position 5: entries 0..2 visible
  const std::vector<float> q = {1}, kv = {0}, sinks = {-100};
  const std::vector<float> entries = {1, 2, 3, 50};  // entry 3 is in the future
  std::vector<float> ring(1, 0.0f), out(1);
  s.dense_compressed = true;
  AttentionRef(s, seq.view, q.data(), kv.data(), ring.data(), entries.data(), nullptr, sinks.data(),
               out.data());
  const double z = 1 + std::exp(1.0) + std::exp(2.0) + std::exp(3.0);
  EXPECT_NEAR(out[0], (std::exp(1.0) * 1 + std::exp(2.0) * 2 + std::exp(3.0) * 3) / z, 1e-5);
  // CSA: only the selected entries (-1 = none; a future pick is ignored).
  s.dense_compressed = false;
  s.topk = 3;
  const std::vector<int32_t> sel = {2, -1, 3};
  AttentionRef(s, seq.view, q.data(), kv.data(), ring.data(), entries.data(), sel.data(),
               sinks.data(), out.data());
  EXPECT_NEAR(out[0], std::exp(3.0) * 3 / (1 + std::exp(3.0)), 1e-5);
}

}  // namespace
}  // namespace dsv4
