// Test helpers for the GPU suites: the CPU reference backend and a CUDA backend (from the plugin)
// driven side by side with identical inputs, and a tolerance check that reports the worst element.
// GPU suites skip when the plugin or a device is missing (CI) and must pass on the H200 host.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/worker_factory.h"

namespace dsv4::testing {

// Skips the current test unless a CUDA device is usable.
#define DSV4_REQUIRE_GPU()                                                          \
  do {                                                                              \
    auto n_ = ::dsv4::CudaDeviceCount();                                            \
    if (!n_.ok()) GTEST_SKIP() << "no CUDA: " << n_.status();                      \
    if (*n_ < 1) GTEST_SKIP() << "no CUDA device";                                 \
  } while (0)

// Whether synthetic test models keep the released formats (FP8 projections, MXFP4 experts; the
// default) or are dense: DSV4_TEST_WEIGHT_FORMAT=auto|bf16, so that the GPU suites run both ways.
inline bool TestKeepsFormats() {
  const char* v = std::getenv("DSV4_TEST_WEIGHT_FORMAT");
  return v == nullptr || std::string(v) != "bf16";
}

// Sets an environment variable (a backend's A/B switch, read when the backend is created) for
// its lifetime and puts the caller's value back after.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    const char* before = std::getenv(name);
    had_ = before != nullptr;
    if (had_) saved_ = before;
    EXPECT_EQ(setenv(name, value, 1), 0) << name;
  }
  ~ScopedEnv() {
    if (had_) {
      setenv(name_, saved_.c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  bool had_ = false;
  std::string saved_;
};

inline std::vector<float> RandomVec(int64_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = d(rng);
  return v;
}

inline std::vector<float> RoundBf16(std::vector<float> v) {
  for (auto& x : v) x = Bf16ToF32(F32ToBf16(x));
  return v;
}

// max |got - ref| as a share of the output's scale max |ref| (the absolute error when ref is all
// zero): how far an approximate path (FP8 activations) is from the reference, for the tests that
// print it and check that the approximate path ran.
inline double ErrorAtScale(const std::vector<float>& got, const std::vector<float>& ref) {
  double worst = 0, scale = 0;
  for (size_t i = 0; i < ref.size() && i < got.size(); ++i) {
    worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - ref[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
  }
  return scale > 0 ? worst / scale : worst;
}

// max over i of |a - b| / (atol + rtol |b|) must be <= 1. Prints the worst element.
inline ::testing::AssertionResult Close(const std::vector<float>& got, const std::vector<float>& ref,
                                        double atol, double rtol) {
  if (got.size() != ref.size()) {
    return ::testing::AssertionFailure() << "size " << got.size() << " vs " << ref.size();
  }
  double worst = 0, max_abs = 0, max_ref = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(ref[i])) {
      if (std::isnan(got[i]) || std::isnan(ref[i]) || got[i] != ref[i]) {
        return ::testing::AssertionFailure() << "non-finite at " << i << ": " << got[i] << " vs "
                                             << ref[i];
      }
      continue;
    }
    const double d = std::fabs(static_cast<double>(got[i]) - ref[i]);
    const double r = d / (atol + rtol * std::fabs(ref[i]));
    max_abs = std::max(max_abs, d);
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
    if (r > worst) {
      worst = r;
      at = i;
    }
  }
  std::printf("    max_abs_err=%.3g (max |ref|=%.3g, n=%zu)\n", max_abs, max_ref, got.size());
  if (worst <= 1) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "element " << at << ": got " << got[at] << ", ref "
                                       << ref[at] << " (ratio " << worst << ", atol " << atol
                                       << ", rtol " << rtol << ")";
}

// A tensor on each backend.
struct Both {
  Tensor c, g;
};

// Per-sequence work of a step: `tokens` new tokens starting at `start`.
struct SeqSpec {
  int32_t start = 0;
  int32_t tokens = 1;
};

class BackendPair {
 public:
  explicit BackendPair(Precision precision = Precision::kFP32, bool batch_invariant = false) {
    auto g = CreateCudaBackend(0, precision, batch_invariant);
    EXPECT_TRUE(g.ok()) << g.status();
    if (g.ok()) gpu = std::move(*g);
  }

  // Starts a step over `seqs`: sequence s owns slot s and contiguous blocks; token ids random.
  void Begin(const std::vector<SeqSpec>& seqs, int32_t block_size, int32_t vocab = 1000,
             bool force_indexer = false, uint32_t seed = 7, int32_t min_stride = 1) {
    std::mt19937 rng(seed);
    meta = StepMeta{};
    meta.num_seqs = static_cast<int32_t>(seqs.size());
    meta.block_size = block_size;
    int32_t stride = min_stride;
    for (const auto& s : seqs) stride = std::max(stride, (s.start + s.tokens + block_size - 1) / block_size);
    meta.block_stride = stride;
    meta.force_indexer_scoring = force_indexer;
    for (int32_t s = 0; s < meta.num_seqs; ++s) {
      meta.seq_begin.push_back(static_cast<int32_t>(meta.token_ids.size()));
      meta.seq_start_pos.push_back(seqs[s].start);
      meta.state_slot.push_back(s);
      for (int32_t b = 0; b < stride; ++b) meta.block_table.push_back(s * stride + b);
      for (int32_t i = 0; i < seqs[s].tokens; ++i) {
        meta.token_ids.push_back(static_cast<int32_t>(rng() % vocab));
        meta.positions.push_back(seqs[s].start + i);
        meta.token_seq.push_back(s);
      }
      meta.logit_rows.push_back(static_cast<int32_t>(meta.token_ids.size()) - 1);
    }
    meta.seq_begin.push_back(static_cast<int32_t>(meta.token_ids.size()));
    meta.num_tokens = static_cast<int32_t>(meta.token_ids.size());
    blocks = meta.num_seqs * stride;
    ASSERT_TRUE(cpu.BeginStep(meta).ok());
    const absl::Status st = gpu->BeginStep(meta);
    ASSERT_TRUE(st.ok()) << st;
  }

  Both Scratch(DType dtype, Shape shape) {
    Both t;
    t.c = *cpu.Scratch(dtype, shape);
    t.g = *gpu->Scratch(dtype, shape);
    return t;
  }
  Both Input(Shape shape, const std::vector<float>& v) {
    Both t = Scratch(DType::kF32, shape);
    EXPECT_EQ(static_cast<int64_t>(v.size()), shape.numel());
    EXPECT_TRUE(cpu.CopyFromHost(v.data(), t.c).ok());
    EXPECT_TRUE(gpu->CopyFromHost(v.data(), t.g).ok());
    return t;
  }
  Both InputI(Shape shape, const std::vector<int32_t>& v) {
    Both t = Scratch(DType::kI32, shape);
    EXPECT_TRUE(cpu.CopyFromHost(v.data(), t.c).ok());
    EXPECT_TRUE(gpu->CopyFromHost(v.data(), t.g).ok());
    return t;
  }
  Both Weight(Shape shape, std::vector<float> v, WeightUse use = WeightUse::kParam) {
    HostTensor h{DType::kF32, shape, std::move(v), {}};
    Both t;
    t.c = *cpu.CreateWeight(h, use);
    auto g = gpu->CreateWeight(h, use);
    EXPECT_TRUE(g.ok()) << g.status();
    t.g = *g;
    return t;
  }
  Both WeightI(Shape shape, std::vector<int32_t> v) {
    HostTensor h{DType::kI32, shape, {}, std::move(v)};
    Both t;
    t.c = *cpu.CreateWeight(h, WeightUse::kParam);
    t.g = *gpu->CreateWeight(h, WeightUse::kParam);
    return t;
  }
  Both Synthetic(const SyntheticSpec& spec, WeightUse use) {
    Both t;
    auto c = cpu.CreateSyntheticWeight(spec, use);
    auto g = gpu->CreateSyntheticWeight(spec, use);
    EXPECT_TRUE(c.ok() && g.ok());
    t.c = *c;
    t.g = *g;
    return t;
  }
  // A pool with the same random contents on both sides.
  Both Pool(Shape shape, uint32_t seed, float scale = 1) {
    Both t;
    t.c = *cpu.CreatePool(DType::kF32, shape);
    t.g = *gpu->CreatePool(DType::kF32, shape);
    if (seed != 0) {
      const auto v = RandomVec(shape.numel(), seed, -scale, scale);
      EXPECT_TRUE(cpu.CopyFromHost(v.data(), t.c).ok());
      EXPECT_TRUE(gpu->CopyFromHost(v.data(), t.g).ok());
    }
    return t;
  }
  std::vector<float> HostC(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    EXPECT_TRUE(cpu.CopyToHost(t, v.data()).ok());
    return v;
  }
  std::vector<float> HostG(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    const absl::Status s = gpu->CopyToHost(t, v.data());
    EXPECT_TRUE(s.ok()) << s;
    return v;
  }
  // The values a GPU tensor holds, as fp32 (bf16 widened exactly).
  std::vector<float> HostHeld(const Tensor& g) {
    if (g.dtype != DType::kBF16) return HostG(g);
    std::vector<uint16_t> bits(static_cast<size_t>(g.numel()));
    const absl::Status s = gpu->CopyToHost(g, bits.data());
    EXPECT_TRUE(s.ok()) << s;
    std::vector<float> v(bits.size());
    for (size_t i = 0; i < bits.size(); ++i) v[i] = Bf16ToF32(bits[i]);
    return v;
  }
  // The CPU side of `t` set to what the GPU holds, so that the reference sees exactly the rounded
  // values (bf16 weights).
  void MirrorToCpu(const Both& t) {
    const std::vector<float> v = HostHeld(t.g);
    std::copy(v.begin(), v.end(), t.c.ptr<float>());
  }
  template <typename T>
  std::vector<T> HostAs(Backend& b, const Tensor& t) {
    std::vector<T> v(static_cast<size_t>(t.numel()));
    const absl::Status s = b.CopyToHost(t, v.data());
    EXPECT_TRUE(s.ok()) << s;
    return v;
  }
  ::testing::AssertionResult Same(const Both& t, double atol, double rtol) {
    return Close(HostG(t.g), HostC(t.c), atol, rtol);
  }
  // Within `tol` of the output's scale: |got - ref| <= tol * (max |ref| + |ref|). For sums of
  // many terms whose magnitude is far above some of their results (MoE outputs of random experts
  // reach ±300 while elements near 0 carry the same absolute rounding).
  ::testing::AssertionResult SameAtScale(const Both& t, double tol) {
    const std::vector<float> ref = HostC(t.c);
    double scale = 0;
    for (float v : ref) scale = std::max(scale, std::fabs(static_cast<double>(v)));
    return Close(HostG(t.g), ref, tol * scale, tol);
  }

  CpuBackend cpu;
  std::unique_ptr<Backend> gpu;
  StepMeta meta;
  int32_t blocks = 0;
};

// A pair whose CUDA backend is created with the environment variable `name` set to `value` (an
// A/B switch, read at creation); the caller's value is back when this returns.
inline std::unique_ptr<BackendPair> PairWithEnv(const char* name, const char* value,
                                                Precision precision) {
  const ScopedEnv env(name, value);
  return std::make_unique<BackendPair>(precision);
}

// MoeExperts on backend b (its step begun) from host inputs: u [T, D], the routing idx and
// weights [T, K]; the output [T, D] on the host (empty, and the test failed, where a call fails).
inline std::vector<float> RunMoeExperts(Backend& b, const MoeWeights& mw, int32_t tokens,
                                        int64_t dim, int64_t top_k, const std::vector<float>& u,
                                        const std::vector<int32_t>& idx,
                                        const std::vector<float>& weights, float limit) {
  auto du = b.Scratch(DType::kF32, Shape{tokens, dim});
  auto dix = b.Scratch(DType::kI32, Shape{tokens, top_k});
  auto dw = b.Scratch(DType::kF32, Shape{tokens, top_k});
  auto out = b.Scratch(DType::kF32, Shape{tokens, dim});
  if (!du.ok() || !dix.ok() || !dw.ok() || !out.ok()) {
    ADD_FAILURE() << "RunMoeExperts: scratch tensors";
    return {};
  }
  for (const absl::Status& s : {b.CopyFromHost(u.data(), *du), b.CopyFromHost(idx.data(), *dix),
                                b.CopyFromHost(weights.data(), *dw)}) {
    if (!s.ok()) {
      ADD_FAILURE() << s;
      return {};
    }
  }
  const absl::Status s = b.MoeExperts(*du, *dix, *dw, mw, limit, *out);
  if (!s.ok()) {
    ADD_FAILURE() << s;
    return {};
  }
  std::vector<float> v(static_cast<size_t>(out->numel()));
  const absl::Status c = b.CopyToHost(*out, v.data());
  if (!c.ok()) {
    ADD_FAILURE() << c;
    return {};
  }
  return v;
}

// Each output of `got` is nonzero somewhere (the products ran) and bit for bit `want`'s.
inline void ExpectSameBits(const std::vector<std::vector<float>>& got,
                           const std::vector<std::vector<float>>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    float max_abs = 0;
    for (float v : got[i]) max_abs = std::max(max_abs, std::fabs(v));
    EXPECT_GT(max_abs, 0.0f) << what << " case " << i;
    ASSERT_EQ(got[i].size(), want[i].size()) << what << " case " << i;
    EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float)))
        << what << " case " << i;
  }
}

}  // namespace dsv4::testing
