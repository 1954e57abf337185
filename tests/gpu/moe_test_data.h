// Test data of the GPU expert suites: random routings and random expert stacks in the released
// formats (MXFP4 as the release stores the routed experts, FP8 128 x 128 blocks as the -Base
// checkpoints do), stacked as the model stacks them (per expert w1 [I, D] then w3 [I, D] into
// gate_up [E, 2I, D], w2 [D, I] into down [E, D, I]).
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/backend_pair.h"
#include "worker/checkpoint/stored_weight.h"

namespace dsv4::testing {

// UE8M0 scales of the random MXFP4 matrices: 2^-8 .. 2^-4.
constexpr int kScaleLo = 127 - 8, kScaleHi = 127 - 4;

// One random [rows, cols] matrix in `format`. MXFP4 with big_one_in > 0: about one scale in
// big_one_in is 2^2 .. 2^4 instead (UE8M0 above 128: the single-token kernels' second product).
inline StoredWeight RandomPart(WeightFormat format, int64_t rows, int64_t cols, std::mt19937& rng,
                        int big_one_in = 0) {
  StoredWeight w;
  w.name = "expert";
  w.format = format;
  w.shape = Shape{rows, cols};
  if (format == WeightFormat::kMxfp4) {
    w.data.resize(static_cast<size_t>(rows * cols / 2));
    for (size_t i = 0; i < w.data.size(); i += 4) {
      const uint32_t r = rng();
      for (size_t b = 0; b < 4 && i + b < w.data.size(); ++b) w.data[i + b] = r >> (8 * b);
    }
    w.scale_e8m0.resize(static_cast<size_t>(rows * cols / 32));
    for (auto& s : w.scale_e8m0) {
      s = static_cast<uint8_t>(kScaleLo + rng() % (kScaleHi - kScaleLo + 1));
      if (big_one_in > 0 && rng() % big_one_in == 0) s = static_cast<uint8_t>(129 + rng() % 3);
    }
  } else {
    // e4m3 bytes but the two NaNs (0x7f, 0xff); fp32 block scales (not powers of two: the GPU's
    // bf16 rounding of e4m3 x scale is exercised) keeping |W| <= 448 x 2^-11.
    w.block_rows = w.block_cols = 128;
    w.data.resize(static_cast<size_t>(rows * cols));
    for (auto& b : w.data) {
      uint32_t v = rng() % 254;
      if (v >= 0x7f) ++v;
      b = static_cast<uint8_t>(v);
    }
    const int64_t sr = (rows + 127) / 128, sc = (cols + 127) / 128;
    std::uniform_real_distribution<float> d(1.0f / 8192, 1.0f / 2048);
    w.scale_f32.resize(static_cast<size_t>(sr * sc));
    for (auto& s : w.scale_f32) s = d(rng);
  }
  return w;
}

// Experts [E, 2I, D] and [E, D, I] (or the shared expert's [2I, D] and [D, I] with experts == 0).
struct StoredExperts {
  StoredWeight gate_up, down;
};
inline StoredExperts RandomExperts(WeightFormat format, int64_t experts, int64_t dim, int64_t inter,
                            uint32_t seed, int big_one_in = 0) {
  std::mt19937 rng(seed);
  const int64_t n = experts == 0 ? 1 : experts;
  std::vector<StoredWeight> gu, dn;
  for (int64_t e = 0; e < n; ++e) {
    gu.push_back(RandomPart(format, inter, dim, rng, big_one_in));  // w1
    gu.push_back(RandomPart(format, inter, dim, rng, big_one_in));  // w3
    dn.push_back(RandomPart(format, dim, inter, rng, big_one_in));  // w2
  }
  auto g = StackParts(std::move(gu),
                      experts == 0 ? Shape{2 * inter, dim} : Shape{experts, 2 * inter, dim});
  auto d = StackParts(std::move(dn), experts == 0 ? Shape{dim, inter} : Shape{experts, dim, inter});
  EXPECT_TRUE(g.ok() && d.ok());
  return StoredExperts{*std::move(g), *std::move(d)};
}

// Routing of `tokens` tokens to `top_k` distinct experts each, drawn by `seed`.
inline std::vector<int32_t> RandomRouting(int32_t tokens, int64_t experts, int64_t top_k, uint32_t seed) {
  std::vector<int32_t> idx(static_cast<size_t>(tokens * top_k));
  std::mt19937 rng(seed);
  std::vector<int32_t> e(static_cast<size_t>(experts));
  for (int32_t t = 0; t < tokens; ++t) {
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng);
    std::copy(e.begin(), e.begin() + top_k, idx.begin() + t * top_k);
  }
  return idx;
}

// Routing where expert 0 takes the first slot of every token and the rest are spread over the
// other experts: one expert with many assignments, others with none or one.
inline std::vector<int32_t> HotRouting(int32_t tokens, int64_t experts, int64_t top_k, uint32_t seed) {
  std::vector<int32_t> idx = RandomRouting(tokens, experts - 1, top_k - 1, seed);
  std::vector<int32_t> out;
  for (int32_t t = 0; t < tokens; ++t) {
    out.push_back(0);
    for (int64_t k = 0; k < top_k - 1; ++k) out.push_back(idx[t * (top_k - 1) + k] + 1);
  }
  return out;
}

// A stored (quantised) weight created on both backends of `p`: the CPU reference dequantises it
// exactly, the CUDA backend keeps the codes and scales.
inline Both Stored(BackendPair& p, const StoredWeight& w) {
  Both t;
  auto c = p.cpu.CreateStoredWeight(w, WeightUse::kMatrix);
  auto g = p.gpu->CreateStoredWeight(w, WeightUse::kMatrix);
  EXPECT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(g.ok()) << g.status();
  if (c.ok()) t.c = *c;
  if (g.ok()) t.g = *g;
  return t;
}

}  // namespace dsv4::testing
