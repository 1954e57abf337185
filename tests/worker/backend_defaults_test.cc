// The Backend's composite ops (the sub-block boundaries, the shared expert computed ahead, the
// attention's output RoPE) on the CPU backend: each equals its ops run one by one, bit for bit,
// and a bad parameter is an error that leaves the output untouched. The CUDA backend's fused
// versions are checked against these in tests/gpu/cuda_kernels_test.cc.
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "common/model_config.h"
#include "worker/cpu/cpu_backend.h"

namespace dsv4 {
namespace {

std::vector<float> Random(int64_t n, uint32_t seed, float lo = -1, float hi = 1) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(rng);
  return v;
}

class CpuDefaults : public ::testing::Test {
 protected:
  // Two sequences decoding one token each (positions 5 and 40), 16-token blocks.
  void SetUp() override {
    meta_.num_tokens = 2;
    meta_.num_seqs = 2;
    meta_.token_ids = {3, 7};
    meta_.positions = {5, 40};
    meta_.token_seq = {0, 1};
    meta_.seq_begin = {0, 1, 2};
    meta_.seq_start_pos = {5, 40};
    meta_.state_slot = {0, 1};
    meta_.block_stride = 3;
    meta_.block_size = 16;
    meta_.block_table = {0, 1, 2, 3, 4, 5};
    meta_.logit_rows = {0, 1};
    ASSERT_TRUE(be_.BeginStep(meta_).ok());
  }
  Tensor Input(Shape shape, const std::vector<float>& v) {
    Tensor t = *be_.Scratch(DType::kF32, shape);
    EXPECT_TRUE(be_.CopyFromHost(v.data(), t).ok());
    return t;
  }
  Tensor Weight(Shape shape, std::vector<float> v) {
    return *be_.CreateWeight(HostTensor{DType::kF32, shape, std::move(v), {}}, WeightUse::kParam);
  }
  std::vector<float> Host(const Tensor& t) {
    std::vector<float> v(static_cast<size_t>(t.numel()));
    EXPECT_TRUE(be_.CopyToHost(t, v.data()).ok());
    return v;
  }
  bool SameBits(const Tensor& a, const Tensor& b) {
    const auto x = Host(a), y = Host(b);
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(float)) == 0;
  }

  CpuBackend be_;
  StepMeta meta_;
};

TEST_F(CpuDefaults, BoundaryOpsEqualTheOpsOneByOne) {
  const int64_t T = 2, n = 4, D = 64, mix = (2 + n) * n;
  const float a = 1.0f / 16;
  Tensor hs = Input(Shape{T, n, D}, Random(T * n * D, 1, -2, 2));
  Tensor f = Input(Shape{T, D}, Random(T * D, 2));
  HcGateNorm g{Weight(Shape{mix, n * D}, Random(mix * n * D, 3, -a, a)),
               Weight(Shape{mix}, Random(mix, 4, -0.5f, 0.5f)),
               Weight(Shape{3}, Random(3, 5, 0.5f, 1.5f)), HcParams{},
               Weight(Shape{D}, Random(D, 6, 0.5f, 1.5f)), RmsNormParams{}};
  // The composite, with post / comb read and rewritten in place as the model calls it.
  Tensor post = Input(Shape{T, n}, Random(T * n, 7, 0.2f, 1.8f));
  Tensor comb = Input(Shape{T, n, n}, Random(T * n * n, 8, 0.0f, 0.5f));
  Tensor hs_out = *be_.Scratch(DType::kF32, Shape{T, n, D});
  Tensor normed = *be_.Scratch(DType::kF32, Shape{T, D});
  ASSERT_TRUE(be_.HcPostPreNorm(hs, f, post, comb, hs_out, g, normed, post, comb).ok());
  // One by one from the same inputs.
  Tensor post1 = Input(Shape{T, n}, Random(T * n, 7, 0.2f, 1.8f));
  Tensor comb1 = Input(Shape{T, n, n}, Random(T * n * n, 8, 0.0f, 0.5f));
  Tensor hs1 = *be_.Scratch(DType::kF32, Shape{T, n, D});
  Tensor collapsed = *be_.Scratch(DType::kF32, Shape{T, D});
  Tensor post2 = *be_.Scratch(DType::kF32, Shape{T, n});
  Tensor comb2 = *be_.Scratch(DType::kF32, Shape{T, n, n});
  ASSERT_TRUE(be_.HcPost(hs, f, post1, comb1, hs1).ok());
  ASSERT_TRUE(be_.HcPre(hs1, g.fn, g.base, g.scale, g.hc, collapsed, post2, comb2).ok());
  ASSERT_TRUE(be_.RmsNorm(collapsed, g.norm_weight, g.norm, collapsed).ok());
  EXPECT_TRUE(SameBits(hs_out, hs1));
  EXPECT_TRUE(SameBits(normed, collapsed));
  EXPECT_TRUE(SameBits(post, post2));
  EXPECT_TRUE(SameBits(comb, comb2));
  // The head: its own gate (n rows), then the final norm.
  HcGateNorm head{Weight(Shape{n, n * D}, Random(n * n * D, 9, -a, a)),
                  Weight(Shape{n}, Random(n, 10, -0.5f, 0.5f)), Weight(Shape{1}, {0.8f}),
                  HcParams{}, g.norm_weight, RmsNormParams{}};
  Tensor y = *be_.Scratch(DType::kF32, Shape{T, D});
  Tensor y1 = *be_.Scratch(DType::kF32, Shape{T, D});
  ASSERT_TRUE(be_.HcHeadNorm(hs, head, y).ok());
  ASSERT_TRUE(be_.HcHead(hs, head.fn, head.base, head.scale, head.hc, y1).ok());
  ASSERT_TRUE(be_.RmsNorm(y1, head.norm_weight, head.norm, y1).ok());
  EXPECT_TRUE(SameBits(y, y1));
  // A gate whose mixing weights do not match the streams is an error, not a partial result.
  HcGateNorm bad = g;
  bad.fn = Weight(Shape{mix, D}, Random(mix * D, 11));
  EXPECT_FALSE(be_.HcPreNorm(hs, bad, normed, post, comb).ok());
}

TEST_F(CpuDefaults, SharedExpertComputedAheadEqualsInline) {
  const int64_t T = 2, D = 32, I = 16, E = 4, K = 2;
  MoeWeights w{Weight(Shape{E, 2 * I, D}, Random(E * 2 * I * D, 20, -0.2f, 0.2f)),
               Weight(Shape{E, D, I}, Random(E * D * I, 21, -0.2f, 0.2f)),
               Weight(Shape{2 * I, D}, Random(2 * I * D, 22, -0.2f, 0.2f)),
               Weight(Shape{D, I}, Random(D * I, 23, -0.2f, 0.2f)), Tensor{}};
  Tensor u = Input(Shape{T, D}, Random(T * D, 24));
  Tensor idx = *be_.Scratch(DType::kI32, Shape{T, K});
  const std::vector<int32_t> ids = {0, 3, 2, 1};
  ASSERT_TRUE(be_.CopyFromHost(ids.data(), idx).ok());
  Tensor wt = Input(Shape{T, K}, Random(T * K, 25, 0, 1));
  Tensor inline_out = *be_.Scratch(DType::kF32, Shape{T, D});
  ASSERT_TRUE(be_.MoeExperts(u, idx, wt, w, 10.0f, inline_out).ok());
  w.shared_h = *be_.Scratch(DType::kF32, Shape{T, I});
  ASSERT_TRUE(be_.SharedExpertUp(u, w, 10.0f, w.shared_h).ok());
  Tensor ahead_out = *be_.Scratch(DType::kF32, Shape{T, D});
  ASSERT_TRUE(be_.MoeExperts(u, idx, wt, w, 10.0f, ahead_out).ok());
  EXPECT_TRUE(SameBits(ahead_out, inline_out));
  // A shared_h of the wrong width is rejected.
  w.shared_h = *be_.Scratch(DType::kF32, Shape{T, I + 1});
  EXPECT_FALSE(be_.MoeExperts(u, idx, wt, w, 10.0f, ahead_out).ok());
  EXPECT_FALSE(be_.SharedExpertUp(u, w, 10.0f, w.shared_h).ok());
}

TEST_F(CpuDefaults, AttentionOutputRopeEqualsRopeAfterIt) {
  const int64_t T = 2, H = 4, hd = 64, W = 8, rd = 16;
  Tensor q = Input(Shape{T, H, hd}, Random(T * H * hd, 30));
  Tensor kv = Input(Shape{T, hd}, Random(T * hd, 31));
  Tensor ring = *be_.CreatePool(DType::kF32, Shape{2, W, hd});
  const auto ring_v = Random(2 * W * hd, 32);
  ASSERT_TRUE(be_.CopyFromHost(ring_v.data(), ring).ok());
  Tensor sinks = Weight(Shape{H}, Random(H, 33));
  RopeConfig rc;
  rc.theta = 10000;
  Tensor freq = Weight(Shape{rd / 2}, RopeInvFreq(rc, rd));
  AttentionParams ap;
  ap.window = W;
  ap.scale = 0.125f;
  Tensor plain = *be_.Scratch(DType::kF32, Shape{T, H, hd});
  ASSERT_TRUE(be_.Attention(ap, q, kv, ring, Tensor{}, Tensor{}, sinks, plain).ok());
  ap.out_rope.rope_dims = rd;
  ap.out_rope.inv_freq = freq;
  ap.out_rope.inverse = true;
  Tensor roped = *be_.Scratch(DType::kF32, Shape{T, H, hd});
  ASSERT_TRUE(be_.Attention(ap, q, kv, ring, Tensor{}, Tensor{}, sinks, roped).ok());
  EXPECT_FALSE(SameBits(roped, plain));  // the rotation happened
  ASSERT_TRUE(be_.Rope(plain, ap.out_rope).ok());
  EXPECT_TRUE(SameBits(roped, plain));
  // A bad output RoPE (inv_freq of the wrong length) is an error before anything is written.
  ap.out_rope.inv_freq = Weight(Shape{rd}, Random(rd, 34));
  Tensor untouched = Input(Shape{T, H, hd}, std::vector<float>(T * H * hd, 7.0f));
  EXPECT_FALSE(be_.Attention(ap, q, kv, ring, Tensor{}, Tensor{}, sinks, untouched).ok());
  for (float v : Host(untouched)) ASSERT_EQ(v, 7.0f);
}

TEST_F(CpuDefaults, EmbedExpandEqualsEmbedThenExpand) {
  const int64_t T = 2, n = 4, D = 32, V = 10;
  Tensor table = *be_.CreateWeight(HostTensor{DType::kF32, Shape{V, D}, Random(V * D, 40), {}},
                                   WeightUse::kMatrix);
  Tensor fused = *be_.Scratch(DType::kF32, Shape{T, n, D});
  ASSERT_TRUE(be_.EmbedExpand(table, fused).ok());
  Tensor x = *be_.Scratch(DType::kF32, Shape{T, D});
  Tensor hs = *be_.Scratch(DType::kF32, Shape{T, n, D});
  ASSERT_TRUE(be_.Embed(table, x).ok());
  ASSERT_TRUE(be_.HcExpand(x, hs).ok());
  EXPECT_TRUE(SameBits(fused, hs));
  // Stream rows that are not the step's tokens, or a width that is not the table's: an error
  // before anything is written.
  for (const Shape& bad : {Shape{T + 1, n, D}, Shape{T, n, D + 4}}) {
    Tensor untouched = Input(bad, std::vector<float>(bad.numel(), 7.0f));
    EXPECT_FALSE(be_.EmbedExpand(table, untouched).ok());
    for (float v : Host(untouched)) ASSERT_EQ(v, 7.0f);
  }
}

}  // namespace
}  // namespace dsv4
