// Every CUDA op against the CPU reference (label `gpu`), over shape sweeps that include the real
// DSV4-Flash shapes: hidden 4096, 64 heads x 512, q_lora 1024, o_groups 8 x 1024, indexer 64 x 128
// with top-512 (and 1024) over up to 256k candidates, ratios 4 and 128, window 128, 256 experts
// top-6 (2048 wide), hc_mult 4, vocab 129280. fp32 backend unless a test says bf16.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <set>

#include "kernels/indexer_ref.h"
#include "tests/gpu/backend_pair.h"
#include "tests/gpu/moe_test_data.h"

namespace dsv4 {
namespace {

using testing::BackendPair;
using testing::Both;
using testing::Close;
using testing::RandomRouting;
using testing::RandomVec;
using testing::ScopedEnv;
using testing::SeqSpec;

constexpr int32_t kBlock = 128;  // the Flash default block (lcm of ratios 4 and 128)

RopeConfig FlashCompressRope() {
  RopeConfig r;
  r.yarn = true;
  r.theta = 160000;
  r.factor = 16;
  r.original_max_position = 65536;
  r.beta_fast = 32;
  r.beta_slow = 1;
  return r;
}

std::vector<SeqSpec> Decode(int32_t n, int32_t start = 0) {
  return std::vector<SeqSpec>(n, SeqSpec{start, 1});
}

// ---- GEMMs ----

struct GemmCase {
  int64_t m, n, k;
};

TEST(CudaOps, LinearFp32MatchesReference) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  for (const GemmCase& c : std::vector<GemmCase>{{1, 1024, 4096},   // q_a
                                                  {7, 32768, 1024},  // q_b
                                                  {130, 512, 4096},  // kv
                                                  {3, 4096, 8192},   // o_b
                                                  {64, 256, 4096},   // router
                                                  {5, 33, 17}}) {
    SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k);
    p.Begin(Decode(1), kBlock);
    Both x = p.Input(Shape{c.m, c.k}, RandomVec(c.m * c.k, 1));
    Both w = p.Weight(Shape{c.n, c.k}, RandomVec(c.n * c.k, 2, -0.05f, 0.05f), WeightUse::kMatrix);
    Both y = p.Scratch(DType::kF32, Shape{c.m, c.n});
    ASSERT_TRUE(p.cpu.Linear(x.c, w.c, y.c).ok());
    const absl::Status s = p.gpu->Linear(x.g, w.g, y.g);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(p.Same(y, 1e-4, 1e-4));
  }
}

TEST(CudaOps, LinearBf16MatchesReferenceOnRoundedOperands) {
  DSV4_REQUIRE_GPU();
  BackendPair p(Precision::kBF16);
  // M = 1 takes the single-token GEMV (kernels/cuda/gemv.h) up to 256 Mi weight elements and
  // cuBLASLt above (lm_head); K % 256 != 0 leaves lanes of the last chunk idle; K >= 2048 splits
  // each row over two warps (2056: the second warp's slice is not a whole number of chunks).
  for (const GemmCase& c : std::vector<GemmCase>{{1, 129280, 4096},  // lm_head
                                                  {1, 1024, 4096},    // q_a
                                                  {1, 32768, 1024},   // q_b
                                                  {1, 4096, 8192},    // o_b
                                                  {1, 4096, 2048},    // shared expert down
                                                  {1, 64, 4096},      // indexer weights
                                                  {1, 33, 264},
                                                  // two warps per row, the split ending mid-chunk
                                                  {1, 1000, 2056},
                                                  {8, 1024, 4096},
                                                  {256, 4096, 2048}}) {
    SCOPED_TRACE(::testing::Message() << c.m << "x" << c.n << "x" << c.k);
    p.Begin(Decode(1), kBlock);
    Both w = p.Synthetic(SyntheticSpec{DType::kF32, Shape{c.n, c.k}, 4, -0.05f, 0.05f, 1},
                         WeightUse::kMatrix);
    ASSERT_EQ(w.g.dtype, DType::kBF16);
    p.MirrorToCpu(w);
    // The GPU rounds x to bf16 itself; the reference gets the rounded x. What remains is the
    // accumulation order.
    const auto xv = RandomVec(c.m * c.k, 3);
    Both x = p.Input(Shape{c.m, c.k}, xv);
    Both xr = p.Input(Shape{c.m, c.k}, testing::RoundBf16(xv));
    Both y = p.Scratch(DType::kF32, Shape{c.m, c.n});
    ASSERT_TRUE(p.cpu.Linear(xr.c, w.c, y.c).ok());
    const absl::Status s = p.gpu->Linear(x.g, w.g, y.g);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(p.Same(y, 1e-4, 1e-4));
  }
}

TEST(CudaOps, GroupedOutputProjectionMatchesReference) {
  DSV4_REQUIRE_GPU();
  // o_a_proj: 8 groups, each (8 heads x 512) -> 1024. bf16 at m = 1 is the single-token GEMV
  // with a group per 1024 rows (x and the reference rounded as in the bf16 Linear test).
  for (Precision prec : {Precision::kFP32, Precision::kBF16}) {
    BackendPair p(prec);
    for (int64_t m : {1, 9, 64}) {
      p.Begin(Decode(1), kBlock);
      const int64_t g = 8, k = 4096, n = 1024;
      auto xv = RandomVec(m * g * k, 5);
      Both x = p.Input(Shape{m, g * k}, xv);
      if (prec == Precision::kBF16) xv = testing::RoundBf16(xv);
      Both xr = p.Input(Shape{m, g * k}, xv);
      Both w = p.Weight(Shape{g * n, k}, RandomVec(g * n * k, 6, -0.03f, 0.03f), WeightUse::kMatrix);
      if (prec == Precision::kBF16) p.MirrorToCpu(w);
      Both y = p.Scratch(DType::kF32, Shape{m, g * n});
      ASSERT_TRUE(p.cpu.GroupedLinear(xr.c, w.c, g, y.c).ok());
      const absl::Status s = p.gpu->GroupedLinear(x.g, w.g, g, y.g);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(p.Same(y, 1e-4, 1e-4)) << "m=" << m << " " << PrecisionName(prec);
    }
  }
}

// ---- norms, RoPE, elementwise ----

TEST(CudaOps, RmsNormWeightedAndUnweighted) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  for (int64_t dim : {4096, 1024, 512, 128, 96}) {
    for (int64_t rows : {1, 33, 257}) {
      p.Begin(Decode(1), kBlock);
      Both x = p.Input(Shape{rows, dim}, RandomVec(rows * dim, 8, -3, 3));
      Both w = p.Weight(Shape{dim}, RandomVec(dim, 9, 0.5f, 1.5f));
      Both y = p.Scratch(DType::kF32, Shape{rows, dim});
      RmsNormParams np{1e-6f};
      ASSERT_TRUE(p.cpu.RmsNorm(x.c, w.c, np, y.c).ok());
      ASSERT_TRUE(p.gpu->RmsNorm(x.g, w.g, np, y.g).ok());
      EXPECT_TRUE(p.Same(y, 1e-5, 1e-5)) << rows << "x" << dim;
      // Unweighted, in place (the per-head query norm).
      ASSERT_TRUE(p.cpu.RmsNorm(x.c, Tensor{}, np, x.c).ok());
      ASSERT_TRUE(p.gpu->RmsNorm(x.g, Tensor{}, np, x.g).ok());
      EXPECT_TRUE(p.Same(x, 1e-5, 1e-5)) << rows << "x" << dim;
    }
  }
}

TEST(CudaOps, RopeMainAndYarnForwardAndInverse) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  RopeConfig main_rope;
  main_rope.theta = 10000;
  const RopeConfig yarn = FlashCompressRope();
  struct Case {
    int64_t heads, dim;
  };
  for (const RopeConfig& rc : {main_rope, yarn}) {
    for (const Case& c : std::vector<Case>{{64, 512}, {64, 128}, {1, 512}}) {
      // Decode tokens at far positions and a prefill chunk.
      p.Begin({{0, 17}, {4095, 1}, {65536, 1}, {1048000, 2}}, kBlock);
      const int64_t T = p.meta.num_tokens, rd = 64;
      Both freq = p.Weight(Shape{rd / 2}, RopeInvFreq(rc, rd));
      RopeParams rp;
      rp.rope_dims = rd;
      rp.inv_freq = freq.c;
      Both x = p.Input(Shape{T, c.heads, c.dim}, RandomVec(T * c.heads * c.dim, 10));
      for (bool inverse : {false, true}) {
        rp.inverse = inverse;
        rp.inv_freq = freq.c;
        ASSERT_TRUE(p.cpu.Rope(x.c, rp).ok());
        rp.inv_freq = freq.g;
        ASSERT_TRUE(p.gpu->Rope(x.g, rp).ok());
        EXPECT_TRUE(p.Same(x, 2e-5, 1e-4)) << rc.yarn << " " << c.heads << "x" << c.dim;
      }
    }
  }
}

// The fused query / latent norm + RoPE: the same arithmetic as the two kernels (bit-identical on
// the GPU) and the CPU ops within rounding; weighted (kv_norm) and unweighted (per-head q norm),
// forward and inverse; a dim the fused kernel does not take falls back to the two ops.
TEST(CudaOps, RmsNormRopeFusedEqualsTheTwoOps) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  RopeConfig main_rope;
  main_rope.theta = 10000;
  struct Case {
    int64_t heads, dim;
    bool weighted;
  };
  for (const Case& c : std::vector<Case>{{64, 512, false}, {1, 512, true}, {3, 130, true}}) {
    for (bool inverse : {false, true}) {
      SCOPED_TRACE(::testing::Message() << c.heads << "x" << c.dim << " w=" << c.weighted
                                        << " inverse=" << inverse);
      p.Begin({{0, 17}, {4095, 1}, {1048000, 2}}, kBlock);
      const int64_t T = p.meta.num_tokens, rd = 64;
      Both freq = p.Weight(Shape{rd / 2}, RopeInvFreq(main_rope, rd));
      Both w = p.Weight(Shape{c.dim}, RandomVec(c.dim, 12, 0.5f, 1.5f));
      const auto xv = RandomVec(T * c.heads * c.dim, 13, -3, 3);
      Both x = p.Input(Shape{T, c.heads, c.dim}, xv);
      Both two = p.Input(Shape{T, c.heads, c.dim}, xv);
      RopeParams rp;
      rp.rope_dims = rd;
      rp.inverse = inverse;
      rp.inv_freq = freq.c;
      const Tensor wc = c.weighted ? w.c : Tensor{};
      const Tensor wg = c.weighted ? w.g : Tensor{};
      ASSERT_TRUE(p.cpu.RmsNormRope(x.c, wc, RmsNormParams{}, rp).ok());
      rp.inv_freq = freq.g;
      ASSERT_TRUE(p.gpu->RmsNorm(two.g, wg, RmsNormParams{}, two.g).ok());
      ASSERT_TRUE(p.gpu->Rope(two.g, rp).ok());
      ASSERT_TRUE(p.gpu->RmsNormRope(x.g, wg, RmsNormParams{}, rp).ok());
      std::vector<float> fused(xv.size()), separate(xv.size());
      ASSERT_TRUE(p.gpu->CopyToHost(x.g, fused.data()).ok());
      ASSERT_TRUE(p.gpu->CopyToHost(two.g, separate.data()).ok());
      EXPECT_EQ(0, std::memcmp(fused.data(), separate.data(), fused.size() * sizeof(float)));
      EXPECT_TRUE(p.Same(x, 2e-5, 1e-4));
    }
  }
}

TEST(CudaOps, EmbedGatherExpandAddSwiGlu) {
  DSV4_REQUIRE_GPU();
  for (Precision prec : {Precision::kFP32, Precision::kBF16}) {
    BackendPair p(prec);
    p.Begin({{0, 20}, {300, 1}, {7, 3}}, kBlock, /*vocab=*/1000);
    const int64_t T = p.meta.num_tokens, D = 4096, V = 1000;
    auto table = RandomVec(V * D, 11);
    if (prec == Precision::kBF16) table = testing::RoundBf16(table);
    Both emb = p.Weight(Shape{V, D}, table, WeightUse::kMatrix);
    Both x = p.Scratch(DType::kF32, Shape{T, D});
    ASSERT_TRUE(p.cpu.Embed(emb.c, x.c).ok());
    ASSERT_TRUE(p.gpu->Embed(emb.g, x.g).ok());
    EXPECT_TRUE(p.Same(x, 0, 0));  // a copy (bf16 values are exact in fp32)

    Both hs = p.Scratch(DType::kF32, Shape{T, 4, D});
    ASSERT_TRUE(p.cpu.HcExpand(x.c, hs.c).ok());
    ASSERT_TRUE(p.gpu->HcExpand(x.g, hs.g).ok());
    EXPECT_TRUE(p.Same(hs, 0, 0));
    // The fused embedding + expansion (one kernel on the GPU, the two ops on the CPU) and a
    // stream tensor whose row count is not the step's token count (an error, not a launch).
    Both fused = p.Scratch(DType::kF32, Shape{T, 4, D});
    ASSERT_TRUE(p.cpu.EmbedExpand(emb.c, fused.c).ok());
    ASSERT_TRUE(p.gpu->EmbedExpand(emb.g, fused.g).ok());
    EXPECT_TRUE(p.Same(fused, 0, 0));
    Both short_hs = p.Scratch(DType::kF32, Shape{T - 1, 4, D});
    const absl::Status bad = p.gpu->EmbedExpand(emb.g, short_hs.g);
    EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(bad.message().find("EmbedExpand"), std::string::npos) << bad;

    Both rows = p.Scratch(DType::kF32, Shape{3, 4 * D});
    ASSERT_TRUE(p.cpu.GatherLogitRows(hs.c.View(Shape{T, 4 * D}), rows.c).ok());
    ASSERT_TRUE(p.gpu->GatherLogitRows(hs.g.View(Shape{T, 4 * D}), rows.g).ok());
    EXPECT_TRUE(p.Same(rows, 0, 0));

    Both b = p.Input(Shape{T, D}, RandomVec(T * D, 12));
    ASSERT_TRUE(p.cpu.Add(x.c, b.c, x.c).ok());
    ASSERT_TRUE(p.gpu->Add(x.g, b.g, x.g).ok());
    EXPECT_TRUE(p.Same(x, 0, 0));

    const int64_t I = 2048;
    Both gu = p.Input(Shape{T, 2 * I}, RandomVec(T * 2 * I, 13, -14, 14));
    Both h = p.Scratch(DType::kF32, Shape{T, I});
    ASSERT_TRUE(p.cpu.SwiGlu(gu.c, 10.0f, h.c).ok());
    ASSERT_TRUE(p.gpu->SwiGlu(gu.g, 10.0f, h.g).ok());
    EXPECT_TRUE(p.Same(h, 1e-5, 1e-5));
  }
}

// ---- mHC ----

TEST(CudaOps, HyperConnectionsPrePostHead) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  // Prefill-sized (130 tokens) and decode-sized (1 and 6 tokens) steps: the mixing kernel tiles
  // tokens differently for each.
  const std::vector<std::vector<SeqSpec>> layouts = {
      {{0, 9}, {50, 1}, {0, 120}}, {{10, 1}}, {{3, 1}, {5, 1}, {0, 4}}};
  for (int64_t D : {4096, 128})
  for (const auto& layout : layouts) {
    SCOPED_TRACE(layout.size());
    p.Begin(layout, kBlock);
    const int64_t T = p.meta.num_tokens, n = 4, mix = (2 + n) * n;
    HcParams hp;
    hp.hc_mult = n;
    Both hs = p.Input(Shape{T, n, D}, RandomVec(T * n * D, 14, -2, 2));
    const float a = 1.0f / std::sqrt(static_cast<float>(n * D));
    Both fn = p.Weight(Shape{mix, n * D}, RandomVec(mix * n * D, 15, -a, a));
    Both base = p.Weight(Shape{mix}, RandomVec(mix, 16, -0.5f, 0.5f));
    Both scale = p.Weight(Shape{3}, RandomVec(3, 17, 0.5f, 1.5f));
    Both collapsed = p.Scratch(DType::kF32, Shape{T, D});
    Both post = p.Scratch(DType::kF32, Shape{T, n});
    Both comb = p.Scratch(DType::kF32, Shape{T, n, n});
    ASSERT_TRUE(p.cpu.HcPre(hs.c, fn.c, base.c, scale.c, hp, collapsed.c, post.c, comb.c).ok());
    const absl::Status s = p.gpu->HcPre(hs.g, fn.g, base.g, scale.g, hp, collapsed.g, post.g, comb.g);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(p.Same(post, 1e-5, 1e-4)) << D;
    EXPECT_TRUE(p.Same(comb, 1e-5, 1e-4)) << D;
    EXPECT_TRUE(p.Same(collapsed, 1e-4, 1e-4)) << D;

    Both f = p.Input(Shape{T, D}, RandomVec(T * D, 18));
    Both out = p.Scratch(DType::kF32, Shape{T, n, D});
    ASSERT_TRUE(p.cpu.HcPost(hs.c, f.c, post.c, comb.c, out.c).ok());
    ASSERT_TRUE(p.gpu->HcPost(hs.g, f.g, post.g, comb.g, out.g).ok());
    EXPECT_TRUE(p.Same(out, 1e-4, 1e-4)) << D;

    Both hfn = p.Weight(Shape{n, n * D}, RandomVec(n * n * D, 19, -a, a));
    Both hbase = p.Weight(Shape{n}, RandomVec(n, 20, -0.5f, 0.5f));
    Both hscale = p.Weight(Shape{1}, {0.8f});
    Both y = p.Scratch(DType::kF32, Shape{T, D});
    ASSERT_TRUE(p.cpu.HcHead(hs.c, hfn.c, hbase.c, hscale.c, hp, y.c).ok());
    ASSERT_TRUE(p.gpu->HcHead(hs.g, hfn.g, hbase.g, hscale.g, hp, y.g).ok());
    EXPECT_TRUE(p.Same(y, 1e-4, 1e-4)) << D;
  }
}

// The fused sub-block boundaries (HcPostMix + HcPreNorm, HcHeadNorm) against the same GPU
// backend's ops one by one (bit for bit: same rounding by construction) and against the CPU
// reference. D = 4100 exceeds the fused kernels (D <= 4096) and checks the fallback. Up to 16
// tokens with D a multiple of 512 (clusters of 8, 2 and 1 blocks here) the boundary is one
// cluster launch (cuda::HcClusterNorm); 17 and 129 tokens, and D = 128, take the two kernels.
// Each backend configuration: the default (the Sinkhorn deferred to the gates stream), the
// Sinkhorn in the boundary kernel (DSV4_HC_DEFER_GATES=0) and the two-kernel path at every
// token count (DSV4_HC_CLUSTER=0); the switches are read when a backend is created.
TEST(CudaOps, HyperConnectionBoundariesEqualTheOpsOneByOne) {
  DSV4_REQUIRE_GPU();
  for (const char* config : {"", "DSV4_HC_DEFER_GATES", "DSV4_HC_CLUSTER"}) {
  SCOPED_TRACE(::testing::Message() << "config " << config);
  if (*config != '\0') setenv(config, "0", 1);
  BackendPair p;
  if (*config != '\0') unsetenv(config);
  const std::vector<std::vector<SeqSpec>> layouts = {{{0, 9}, {50, 1}, {0, 120}},
                                                     {{10, 1}},
                                                     {{3, 1}, {5, 1}, {0, 4}},
                                                     {{0, 16}},
                                                     {{0, 16}, {7, 1}}};
  for (int64_t D : {4096, 128, 4100, 1024, 512})
  for (const auto& layout : layouts) {
    SCOPED_TRACE(::testing::Message() << "D=" << D << " seqs=" << layout.size());
    p.Begin(layout, kBlock);
    const int64_t T = p.meta.num_tokens, n = 4, mix = (2 + n) * n;
    const float a = 1.0f / std::sqrt(static_cast<float>(n * D));
    Both hs = p.Input(Shape{T, n, D}, RandomVec(T * n * D, 31, -2, 2));
    Both f = p.Input(Shape{T, D}, RandomVec(T * D, 32));
    Both post_in = p.Input(Shape{T, n}, RandomVec(T * n, 33, 0.2f, 1.8f));
    Both comb_in = p.Input(Shape{T, n, n}, RandomVec(T * n * n, 34, 0.0f, 0.5f));
    Both fn = p.Weight(Shape{mix, n * D}, RandomVec(mix * n * D, 35, -a, a));
    Both base = p.Weight(Shape{mix}, RandomVec(mix, 36, -0.5f, 0.5f));
    Both scale = p.Weight(Shape{3}, RandomVec(3, 37, 0.5f, 1.5f));
    Both nw = p.Weight(Shape{D}, RandomVec(D, 38, 0.5f, 1.5f));
    HcGateNorm gc{fn.c, base.c, scale.c, HcParams{}, nw.c, RmsNormParams{}};
    HcGateNorm gg{fn.g, base.g, scale.g, HcParams{}, nw.g, RmsNormParams{}};

    // Fused boundary, post / comb updated in place (as the model calls it).
    Both hs_out = p.Scratch(DType::kF32, Shape{T, n, D});
    Both normed = p.Scratch(DType::kF32, Shape{T, D});
    Both post = p.Input(Shape{T, n}, RandomVec(T * n, 33, 0.2f, 1.8f));
    Both comb = p.Input(Shape{T, n, n}, RandomVec(T * n * n, 34, 0.0f, 0.5f));
    ASSERT_TRUE(p.cpu.HcPostPreNorm(hs.c, f.c, post.c, comb.c, hs_out.c, gc, normed.c, post.c,
                                    comb.c).ok());
    const absl::Status st = p.gpu->HcPostPreNorm(hs.g, f.g, post.g, comb.g, hs_out.g, gg, normed.g,
                                                 post.g, comb.g);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(p.Same(hs_out, 1e-4, 1e-4));
    EXPECT_TRUE(p.Same(normed, 1e-4, 1e-4));
    EXPECT_TRUE(p.Same(post, 1e-5, 1e-4));
    EXPECT_TRUE(p.Same(comb, 1e-5, 1e-4));

    // The GPU ops one by one: HcPost, HcPre, RmsNorm.
    Both hs_sep = p.Scratch(DType::kF32, Shape{T, n, D});
    Both collapsed = p.Scratch(DType::kF32, Shape{T, D});
    Both post_sep = p.Scratch(DType::kF32, Shape{T, n});
    Both comb_sep = p.Scratch(DType::kF32, Shape{T, n, n});
    ASSERT_TRUE(p.gpu->HcPost(hs.g, f.g, post_in.g, comb_in.g, hs_sep.g).ok());
    ASSERT_TRUE(p.gpu->HcPre(hs_sep.g, fn.g, base.g, scale.g, HcParams{}, collapsed.g, post_sep.g,
                             comb_sep.g).ok());
    ASSERT_TRUE(p.gpu->RmsNorm(collapsed.g, nw.g, RmsNormParams{}, collapsed.g).ok());
    auto same_bits = [&](const Both& x, const Both& y) {
      std::vector<float> hx(x.g.numel()), hy(y.g.numel());
      EXPECT_TRUE(p.gpu->CopyToHost(x.g, hx.data()).ok());
      EXPECT_TRUE(p.gpu->CopyToHost(y.g, hy.data()).ok());
      return hx.size() == hy.size() &&
             std::memcmp(hx.data(), hy.data(), hx.size() * sizeof(float)) == 0;
    };
    EXPECT_TRUE(same_bits(hs_out, hs_sep));
    EXPECT_TRUE(same_bits(normed, collapsed));
    EXPECT_TRUE(same_bits(post, post_sep));
    EXPECT_TRUE(same_bits(comb, comb_sep));

    // The first boundary of a step (no HcPost) and the head's gate + final norm.
    ASSERT_TRUE(p.cpu.HcPreNorm(hs.c, gc, normed.c, post.c, comb.c).ok());
    ASSERT_TRUE(p.gpu->HcPreNorm(hs.g, gg, normed.g, post.g, comb.g).ok());
    EXPECT_TRUE(p.Same(normed, 1e-4, 1e-4));
    EXPECT_TRUE(p.Same(post, 1e-5, 1e-4));
    EXPECT_TRUE(p.Same(comb, 1e-5, 1e-4));
    ASSERT_TRUE(p.gpu->HcPre(hs.g, fn.g, base.g, scale.g, HcParams{}, collapsed.g, post_sep.g,
                             comb_sep.g).ok());
    ASSERT_TRUE(p.gpu->RmsNorm(collapsed.g, nw.g, RmsNormParams{}, collapsed.g).ok());
    EXPECT_TRUE(same_bits(normed, collapsed));
    EXPECT_TRUE(same_bits(post, post_sep));
    EXPECT_TRUE(same_bits(comb, comb_sep));
    Both hfn = p.Weight(Shape{n, n * D}, RandomVec(n * n * D, 39, -a, a));
    Both hbase = p.Weight(Shape{n}, RandomVec(n, 40, -0.5f, 0.5f));
    Both hscale = p.Weight(Shape{1}, {0.8f});
    Both y = p.Scratch(DType::kF32, Shape{T, D});
    ASSERT_TRUE(p.cpu.HcHeadNorm(hs.c, {hfn.c, hbase.c, hscale.c, HcParams{}, nw.c, {}}, y.c).ok());
    ASSERT_TRUE(p.gpu->HcHeadNorm(hs.g, {hfn.g, hbase.g, hscale.g, HcParams{}, nw.g, {}}, y.g).ok());
    EXPECT_TRUE(p.Same(y, 1e-4, 1e-4));
    Both y_sep = p.Scratch(DType::kF32, Shape{T, D});
    ASSERT_TRUE(p.gpu->HcHead(hs.g, hfn.g, hbase.g, hscale.g, HcParams{}, y_sep.g).ok());
    ASSERT_TRUE(p.gpu->RmsNorm(y_sep.g, nw.g, RmsNormParams{}, y_sep.g).ok());
    EXPECT_TRUE(same_bits(y, y_sep));
  }
  }
}

// The first boundary (HcPreNorm) and the head (HcHeadNorm) at shapes DeepSeek-V4 does not use:
// hc_mult 8 (80 mix rows: the generic mix kernel), and widths 4 and 132 (one partial warp in
// the final kernel). Equal bit for bit to HcPre / HcHead then RmsNorm on the GPU, and to the CPU
// within rounding.
TEST(CudaOps, HyperConnectionNormsAtOtherWidths) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  struct Case {
    int64_t n, D;
  };
  for (const Case& c : std::vector<Case>{{8, 4096}, {8, 4}, {4, 4}, {4, 132}, {2, 132}}) {
    SCOPED_TRACE(::testing::Message() << "n=" << c.n << " D=" << c.D);
    p.Begin({{3, 1}, {0, 5}}, kBlock);
    const int64_t T = p.meta.num_tokens, n = c.n, D = c.D, mix = (2 + n) * n;
    const float a = 1.0f / std::sqrt(static_cast<float>(n * D));
    HcParams hp;
    hp.hc_mult = n;
    Both hs = p.Input(Shape{T, n, D}, RandomVec(T * n * D, 41, -2, 2));
    Both fn = p.Weight(Shape{mix, n * D}, RandomVec(mix * n * D, 42, -a, a));
    Both base = p.Weight(Shape{mix}, RandomVec(mix, 43, -0.5f, 0.5f));
    Both scale = p.Weight(Shape{3}, RandomVec(3, 44, 0.5f, 1.5f));
    Both nw = p.Weight(Shape{D}, RandomVec(D, 45, 0.5f, 1.5f));
    Both normed = p.Scratch(DType::kF32, Shape{T, D});
    Both post = p.Scratch(DType::kF32, Shape{T, n});
    Both comb = p.Scratch(DType::kF32, Shape{T, n, n});
    ASSERT_TRUE(p.cpu.HcPreNorm(hs.c, {fn.c, base.c, scale.c, hp, nw.c, {}}, normed.c, post.c,
                                comb.c).ok());
    const absl::Status st =
        p.gpu->HcPreNorm(hs.g, {fn.g, base.g, scale.g, hp, nw.g, {}}, normed.g, post.g, comb.g);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(p.Same(normed, 1e-4, 1e-4));
    EXPECT_TRUE(p.Same(post, 1e-5, 1e-4));
    EXPECT_TRUE(p.Same(comb, 1e-5, 1e-4));
    Both sep = p.Scratch(DType::kF32, Shape{T, D});
    Both post_sep = p.Scratch(DType::kF32, Shape{T, n});
    Both comb_sep = p.Scratch(DType::kF32, Shape{T, n, n});
    ASSERT_TRUE(p.gpu->HcPre(hs.g, fn.g, base.g, scale.g, hp, sep.g, post_sep.g, comb_sep.g).ok());
    ASSERT_TRUE(p.gpu->RmsNorm(sep.g, nw.g, RmsNormParams{}, sep.g).ok());
    EXPECT_EQ(p.HostAs<float>(*p.gpu, normed.g), p.HostAs<float>(*p.gpu, sep.g));
    EXPECT_EQ(p.HostAs<float>(*p.gpu, post.g), p.HostAs<float>(*p.gpu, post_sep.g));
    EXPECT_EQ(p.HostAs<float>(*p.gpu, comb.g), p.HostAs<float>(*p.gpu, comb_sep.g));
    // The head: n mix rows, unweighted norm.
    Both hfn = p.Weight(Shape{n, n * D}, RandomVec(n * n * D, 46, -a, a));
    Both hbase = p.Weight(Shape{n}, RandomVec(n, 47, -0.5f, 0.5f));
    Both hscale = p.Weight(Shape{1}, {0.8f});
    Both y = p.Scratch(DType::kF32, Shape{T, D});
    ASSERT_TRUE(p.cpu.HcHeadNorm(hs.c, {hfn.c, hbase.c, hscale.c, hp, Tensor{}, {}}, y.c).ok());
    ASSERT_TRUE(p.gpu->HcHeadNorm(hs.g, {hfn.g, hbase.g, hscale.g, hp, Tensor{}, {}}, y.g).ok());
    EXPECT_TRUE(p.Same(y, 1e-4, 1e-4));
    Both y_sep = p.Scratch(DType::kF32, Shape{T, D});
    ASSERT_TRUE(p.gpu->HcHead(hs.g, hfn.g, hbase.g, hscale.g, hp, y_sep.g).ok());
    ASSERT_TRUE(p.gpu->RmsNorm(y_sep.g, Tensor{}, RmsNormParams{}, y_sep.g).ok());
    EXPECT_EQ(p.HostAs<float>(*p.gpu, y.g), p.HostAs<float>(*p.gpu, y_sep.g));
  }
}

// The host inputs of a prefill step's hyper-connection boundaries at hc_mult 4 (random, as in
// the tests above).
struct HcStepInputs {
  int64_t T = 0, D = 0, n = 4;
  std::vector<float> hs, f, post, comb, fn, base, scale, nw, hfn, hbase;
};
HcStepInputs MakeHcStepInputs(int64_t T, int64_t D) {
  HcStepInputs in;
  in.T = T;
  in.D = D;
  const int64_t n = in.n, mix = (2 + n) * n;
  const float a = 1.0f / std::sqrt(static_cast<float>(n * D));
  in.hs = RandomVec(T * n * D, 61, -2, 2);
  in.f = RandomVec(T * D, 62);
  in.post = RandomVec(T * n, 63, 0.2f, 1.8f);
  in.comb = RandomVec(T * n * n, 64, 0.0f, 0.5f);
  in.fn = RandomVec(mix * n * D, 65, -a, a);
  in.base = RandomVec(mix, 66, -0.5f, 0.5f);
  in.scale = RandomVec(3, 67, 0.5f, 1.5f);
  in.nw = RandomVec(D, 68, 0.5f, 1.5f);
  in.hfn = RandomVec(n * n * D, 69, -a, a);
  in.hbase = RandomVec(n, 70, -0.5f, 0.5f);
  return in;
}

// The GPU outputs of the boundaries on pair p: the fused boundary (HcPostPreNorm: the streams it
// writes, the normalised row, post and comb), the first boundary (HcPreNorm) and the head
// (HcHeadNorm). With `reference`, the fused boundary is also checked against the CPU.
std::vector<std::vector<float>> RunHcStep(BackendPair& p, const HcStepInputs& in,
                                          bool reference) {
  p.Begin({{0, static_cast<int32_t>(in.T)}}, kBlock);
  const int64_t T = in.T, n = in.n, D = in.D, mix = (2 + n) * n;
  Both hs = p.Input(Shape{T, n, D}, in.hs);
  Both f = p.Input(Shape{T, D}, in.f);
  Both post = p.Input(Shape{T, n}, in.post);
  Both comb = p.Input(Shape{T, n, n}, in.comb);
  Both fn = p.Weight(Shape{mix, n * D}, in.fn);
  Both base = p.Weight(Shape{mix}, in.base);
  Both scale = p.Weight(Shape{3}, in.scale);
  Both nw = p.Weight(Shape{D}, in.nw);
  HcGateNorm gg{fn.g, base.g, scale.g, HcParams{}, nw.g, RmsNormParams{}};
  Both hs_out = p.Scratch(DType::kF32, Shape{T, n, D});
  Both normed = p.Scratch(DType::kF32, Shape{T, D});
  const absl::Status st = p.gpu->HcPostPreNorm(hs.g, f.g, post.g, comb.g, hs_out.g, gg, normed.g,
                                               post.g, comb.g);
  EXPECT_TRUE(st.ok()) << st;
  std::vector<std::vector<float>> out = {p.HostG(hs_out.g), p.HostG(normed.g), p.HostG(post.g),
                                         p.HostG(comb.g)};
  if (reference) {
    HcGateNorm gc{fn.c, base.c, scale.c, HcParams{}, nw.c, RmsNormParams{}};
    EXPECT_TRUE(p.cpu.HcPostPreNorm(hs.c, f.c, post.c, comb.c, hs_out.c, gc, normed.c, post.c,
                                    comb.c).ok());
    EXPECT_TRUE(p.Same(hs_out, 1e-4, 1e-4));
    EXPECT_TRUE(p.Same(normed, 1e-4, 1e-4));
    EXPECT_TRUE(p.Same(post, 1e-5, 1e-4));
    EXPECT_TRUE(p.Same(comb, 1e-5, 1e-4));
  }
  // The first boundary of a step on the streams just written, and the head's gate + norm.
  EXPECT_TRUE(p.gpu->HcPreNorm(hs_out.g, gg, normed.g, post.g, comb.g).ok());
  for (const Both* t : {&normed, &post, &comb}) out.push_back(p.HostG(t->g));
  Both hfn = p.Weight(Shape{n, n * D}, in.hfn);
  Both hbase = p.Weight(Shape{n}, in.hbase);
  Both hscale = p.Weight(Shape{1}, {0.8f});
  Both y = p.Scratch(DType::kF32, Shape{T, D});
  EXPECT_TRUE(
      p.gpu->HcHeadNorm(hs_out.g, {hfn.g, hbase.g, hscale.g, HcParams{}, nw.g, {}}, y.g).ok());
  out.push_back(p.HostG(y.g));
  return out;
}

// The staged prefill kernels (cuda::HcMix, HcPostMix and HcPreNorm with staged = true, the
// default) against the previous kernels (a backend created with DSV4_HC_STAGED=0, which passes
// staged = false): the same bytes from every boundary of a step (the fused boundary, the first
// boundary, the head and its 4-row mix), at 7 tokens (both run the previous kernels, or the
// cluster launch), 129 and 1000 (partial stages and token groups; at D = 1024 and 129 tokens
// only HcPreNorm's one-block kernel is staged) at D = 4096 and 1024, and 4096 (whole groups) at
// D = 1024; and the staged fused boundary against the CPU reference. The mix parts stay inside
// the backend: every output is computed from them (the normalised row from the pre gates and
// Σ hs², post and comb from all the others), so parts that differ show as different bytes here.
TEST(CudaOps, HyperConnectionStagedKernelsGiveTheSameBits) {
  DSV4_REQUIRE_GPU();
  BackendPair staged;
  const auto previous = testing::PairWithEnv("DSV4_HC_STAGED", "0", Precision::kFP32);
  struct Case {
    int64_t D, T;
  };
  const char* const names[] = {"hs_out", "normed", "post", "comb",
                               "first normed", "first post", "first comb", "head y"};
  for (const Case& c : std::vector<Case>{
           {4096, 7}, {4096, 129}, {4096, 1000}, {1024, 7}, {1024, 129}, {1024, 1000},
           {1024, 4096}}) {
    SCOPED_TRACE(::testing::Message() << "D=" << c.D << " T=" << c.T);
    const HcStepInputs in = MakeHcStepInputs(c.T, c.D);
    const auto got = RunHcStep(staged, in, /*reference=*/true);
    const auto want = RunHcStep(*previous, in, /*reference=*/false);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); ++k) {
      EXPECT_TRUE(got[k].size() == want[k].size() &&
                  std::memcmp(got[k].data(), want[k].data(), got[k].size() * sizeof(float)) == 0)
          << names[k];
    }
  }
}

// ---- compressors ----

struct CompressCase {
  const char* name;
  int64_t ratio, overlap, dim;
};

TEST(CudaOps, CompressorsOverPrefillDecodeAndMixedSteps) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  const RopeConfig yarn = FlashCompressRope();
  for (const CompressCase& c : std::vector<CompressCase>{{"csa", 4, 2, 512},
                                                        {"hca", 128, 1, 512},
                                                        {"indexer", 4, 2, 128}}) {
    SCOPED_TRACE(c.name);
    const int64_t cd = c.overlap * c.dim, slots = 3, per_block = kBlock / c.ratio;
    // Schedules of three sequences: prefill chunks, then decodes and a mixed step.
    const std::vector<std::vector<SeqSpec>> steps = {
        {{0, 300}, {0, 5}, {0, 130}},
        {{300, 1}, {5, 1}, {130, 1}},
        {{301, 7}, {6, 1}, {131, 129}},
        {{308, 1}, {7, 1}, {260, 1}},
    };
    const int32_t max_len = 400;
    const int64_t blocks = slots * ((max_len + kBlock - 1) / kBlock);
    Both state = p.Pool(Shape{slots, CompressStateFloats(c.ratio, c.overlap, c.dim)}, 0);
    Both entries = p.Pool(Shape{blocks, per_block, c.dim}, 0);
    Both bias = p.Weight(Shape{c.ratio, cd}, RandomVec(c.ratio * cd, 21, -0.5f, 0.5f));
    Both normw = p.Weight(Shape{c.dim}, RandomVec(c.dim, 22, 0.5f, 1.5f));
    Both freq = p.Weight(Shape{32}, RopeInvFreq(yarn, 64));
    uint32_t seed = 30;
    for (const auto& step : steps) {
      // Block tables sized for the whole schedule, so every sequence's blocks stay put.
      p.Begin(step, kBlock, 1000, false, 7, (max_len + kBlock - 1) / kBlock);
      const int64_t T = p.meta.num_tokens;
      Both a = p.Input(Shape{T, cd}, RandomVec(T * cd, ++seed));
      Both z = p.Input(Shape{T, cd}, RandomVec(T * cd, ++seed, -2, 2));
      CompressParams cp;
      cp.ratio = c.ratio;
      cp.overlap = c.overlap;
      cp.dim = c.dim;
      cp.norm_eps = 1e-6f;
      cp.rope.rope_dims = 64;
      cp.position_bias = bias.c;
      cp.norm_weight = normw.c;
      cp.rope.inv_freq = freq.c;
      ASSERT_TRUE(p.cpu.Compress(cp, a.c, z.c, state.c, entries.c).ok());
      cp.position_bias = bias.g;
      cp.norm_weight = normw.g;
      cp.rope.inv_freq = freq.g;
      const absl::Status s = p.gpu->Compress(cp, a.g, z.g, state.g, entries.g);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_TRUE(p.Same(state, 1e-6, 1e-6));
      EXPECT_TRUE(p.Same(entries, 1e-4, 1e-4));
    }
  }
}

// ---- lightning indexer ----

// Scores on the host for one token (the reference's formula).
std::vector<float> HostScores(const IndexerShape& s, const StepMeta& m, int32_t t,
                              const std::vector<float>& q, const std::vector<float>& w,
                              const std::vector<float>& keys) {
  const RaggedBatchView b = HostView(m);
  const int64_t visible = (m.positions[t] + 1) / s.ratio;
  std::vector<float> scores(static_cast<size_t>(visible));
  IndexerScoresRef(s, b, t, q.data(), w.data(), keys.data(), scores.data());
  return scores;
}

// The Flash indexer's parameters at a head count, dim, ratio and top-k.
IndexerParams IndexerParamsFor(int64_t heads, int64_t dim, int64_t ratio, int64_t topk) {
  IndexerParams ip;
  ip.ratio = ratio;
  ip.topk = topk;
  ip.weight_scale = 1.0f / std::sqrt(static_cast<float>(heads));
  ip.score_scale = 1.0f / std::sqrt(static_cast<float>(dim));
  return ip;
}

// IndexerTopK on both backends into `out`; the reference's and the GPU's selections.
void RunIndexerTopK(BackendPair& p, const IndexerParams& ip, const Both& q, const Both& w,
                    const Both& keys, const Both& out, std::vector<int32_t>* ref,
                    std::vector<int32_t>* got) {
  ASSERT_TRUE(p.cpu.IndexerTopK(ip, q.c, w.c, keys.c, out.c).ok());
  const absl::Status s = p.gpu->IndexerTopK(ip, q.g, w.g, keys.g, out.g);
  ASSERT_TRUE(s.ok()) << s;
  *ref = p.HostAs<int32_t>(p.cpu, out.c);
  *got = p.HostAs<int32_t>(*p.gpu, out.g);
}

struct IndexerCase {
  const char* name;
  std::vector<SeqSpec> seqs;
  int64_t topk;
  bool force;
};

// IndexerTopK on both backends for the step begun on p (nI heads of dI, entries of `ratio`
// tokens; q, w and the keys random from `seed`), then the GPU's selections against the
// reference's: ascending and -1 padded, sets of the same size, and an entry the GPU takes
// instead of one of the reference's only within tol(kth, top) of the reference's k-th score (top:
// the token's largest |score|). Adds the swapped entries and all selected ones to the counts.
void CheckIndexerSelections(BackendPair& p, int64_t nI, int64_t dI, int64_t ratio, int64_t topk,
                            uint32_t seed, const std::function<float(float, float)>& tol,
                            int64_t* swapped, int64_t* selected) {
  const int64_t T = p.meta.num_tokens;
  const auto qv = RandomVec(T * nI * dI, seed);
  const auto wv = RandomVec(T * nI, seed + 1);
  Both keys = p.Pool(Shape{p.blocks, kBlock / ratio, dI}, seed + 2);
  Both q = p.Input(Shape{T, nI, dI}, qv);
  Both w = p.Input(Shape{T, nI}, wv);
  Both out = p.Scratch(DType::kI32, Shape{T, topk});
  const IndexerParams ip = IndexerParamsFor(nI, dI, ratio, topk);
  std::vector<int32_t> ref, got;
  ASSERT_NO_FATAL_FAILURE(RunIndexerTopK(p, ip, q, w, keys, out, &ref, &got));
  const auto key_host = p.HostC(keys.c);
  IndexerShape is;
  is.heads = nI;
  is.dim = dI;
  is.ratio = ratio;
  is.topk = topk;
  is.weight_scale = ip.weight_scale;
  is.score_scale = ip.score_scale;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* r = ref.data() + t * topk;
    const int32_t* g = got.data() + t * topk;
    for (int64_t k = 1; k < topk; ++k) {
      if (g[k] >= 0) {
        ASSERT_GT(g[k], g[k - 1]) << "token " << t;
      }
    }
    const std::set<int32_t> rs(r, r + topk), gs(g, g + topk);
    ASSERT_EQ(rs.size(), gs.size()) << "token " << t;
    *selected += static_cast<int64_t>(rs.size());
    if (rs == gs) continue;
    const auto scores = HostScores(is, p.meta, static_cast<int32_t>(t), qv, wv, key_host);
    float kth = INFINITY, top = 0.0f;
    for (float v : scores) top = std::max(top, std::fabs(v));
    for (int32_t e : rs) if (e >= 0) kth = std::min(kth, scores[e]);
    for (int32_t e : gs) {
      if (e < 0 || rs.count(e)) continue;
      ++*swapped;
      EXPECT_NEAR(scores[e], kth, tol(kth, top)) << "token " << t << " entry " << e;
    }
  }
}

TEST(CudaOps, IndexerTopKUpTo256kCandidates) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  const int64_t nI = 64, dI = 128, ratio = 4;
  const std::vector<IndexerCase> cases = {
      {"short_shortcut", {{0, 40}, {100, 1}}, 512, false},
      {"short_forced", {{0, 40}, {100, 1}}, 512, true},
      {"prefill_across_topk", {{1990, 64}}, 512, false},
      {"decode_16k_64k", {{16383, 1}, {65535, 1}, {3000, 1}}, 512, false},
      {"decode_64k_top1024", {{65535, 1}, {4100, 2}}, 1024, false},
      {"decode_256k", {{1048575, 1}}, 512, false},
  };
  for (const IndexerCase& c : cases) {
    SCOPED_TRACE(c.name);
    p.Begin(c.seqs, kBlock, 1000, c.force);
    // Different sets are allowed only where scores tie within rounding at the boundary.
    int64_t swapped = 0, selected = 0;
    ASSERT_NO_FATAL_FAILURE(CheckIndexerSelections(
        p, nI, dI, ratio, c.topk, 40,
        [](float kth, float) { return 1e-5f * (1 + std::fabs(kth)); }, &swapped, &selected));
    std::printf("    tokens=%lld boundary swaps=%lld\n",
                static_cast<long long>(p.meta.num_tokens), static_cast<long long>(swapped));
  }
}

// The bf16 mode's TF32 tensor-core scoring (cuda::IndexerTopK with tf32): the selections against
// the fp32 reference's at 64 and 32 heads, prefill rows across top-k, long decode contexts and a
// step of 4-token groups spanning sequences.
// The scores differ in rounding (TF32 operands, another summation order), so the sets may differ
// only at the boundary: an entry the GPU takes instead of one of the reference's must score within
// a TF32 error of the reference's k-th (3e-3 of the token's largest score), and such swaps stay a
// small share of the selections.
TEST(CudaOps, IndexerTopKOnTf32TensorCores) {
  DSV4_REQUIRE_GPU();
  BackendPair p(Precision::kBF16);
  const int64_t dI = 128, ratio = 4, topk = 512;
  const std::vector<IndexerCase> cases = {
      {"prefill_across_topk", {{2990, 64}}, topk, false},
      {"prefill_long", {{7000, 200}, {3000, 7}}, topk, false},
      {"decode_16k_64k", {{16383, 1}, {65535, 1}, {3000, 1}}, topk, false},
      // From 512 tokens blocks take 4 tokens; groups here span two and three sequences.
      {"prefill_grouped", {{2000, 600}, {3000, 3}, {9000, 1}, {100, 41}}, topk, false},
  };
  for (int64_t nI : {64, 32}) {
    for (const IndexerCase& c : cases) {
      SCOPED_TRACE(::testing::Message() << c.name << " heads=" << nI);
      p.Begin(c.seqs, kBlock, 1000, c.force);
      const int64_t T = p.meta.num_tokens;
      int64_t swapped = 0, selected = 0;
      ASSERT_NO_FATAL_FAILURE(CheckIndexerSelections(
          p, nI, dI, ratio, c.topk, 50, [](float, float top) { return 3e-3f * top; }, &swapped,
          &selected));
      EXPECT_LT(swapped * 50, selected) << "more than 2% of the selections swapped";
      std::printf("    %s heads=%lld tokens=%lld boundary swaps=%lld of %lld\n", c.name,
                  static_cast<long long>(nI), static_cast<long long>(T),
                  static_cast<long long>(swapped), static_cast<long long>(selected));
    }
  }
}

// Massive exact ties: every key row is one of three patterns, so the scores take three values and
// the k-th is shared by hundreds of entries. The selection must take every entry above it and
// then its lowest-index ties, ascending, exactly as the reference, at 750, 2000 and 3000
// candidates.
TEST(CudaOps, IndexerTopKTiesTakeTheLowestIndices) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  const int64_t nI = 64, dI = 128, ratio = 4, per_block = kBlock / ratio, topk = 512;
  p.Begin({{2999, 1}, {7999, 1}, {11999, 1}}, kBlock);
  const int64_t T = p.meta.num_tokens, blocks = p.blocks;
  const auto patterns = RandomVec(3 * dI, 43);
  std::vector<float> rows(static_cast<size_t>(blocks * per_block * dI));
  for (int64_t r = 0; r < blocks * per_block; ++r) {
    std::copy_n(patterns.begin() + (r % 3) * dI, dI, rows.begin() + r * dI);
  }
  Both keys = p.Pool(Shape{blocks, per_block, dI}, 0);
  ASSERT_TRUE(p.cpu.CopyFromHost(rows.data(), keys.c).ok());
  ASSERT_TRUE(p.gpu->CopyFromHost(rows.data(), keys.g).ok());
  Both q = p.Input(Shape{T, nI, dI}, RandomVec(T * nI * dI, 44));
  Both w = p.Input(Shape{T, nI}, RandomVec(T * nI, 45));
  Both out = p.Scratch(DType::kI32, Shape{T, topk});
  std::vector<int32_t> ref, got;
  ASSERT_NO_FATAL_FAILURE(
      RunIndexerTopK(p, IndexerParamsFor(nI, dI, ratio, topk), q, w, keys, out, &ref, &got));
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<int32_t> r(ref.begin() + t * topk, ref.begin() + (t + 1) * topk);
    const std::vector<int32_t> g(got.begin() + t * topk, got.begin() + (t + 1) * topk);
    EXPECT_EQ(g, r) << "token " << t;
    // A real tie at the boundary: the selection is not simply the first entries by index.
    EXPECT_NE(r.back(), topk - 1) << "token " << t;
  }
}

// ---- attention ----

struct AttnCase {
  const char* name;
  int64_t ratio;
  bool dense;
};

// A causal selection per token: random distinct visible entries (ratio m), ascending, -1 padded.
std::vector<int32_t> RandomCausalSelection(const StepMeta& meta, int64_t ratio, int64_t topk,
                                           uint32_t seed) {
  const int64_t T = meta.num_tokens;
  std::vector<int32_t> sel(T * topk, -1);
  std::mt19937 rng(seed);
  for (int64_t t = 0; t < T; ++t) {
    const int32_t visible = (meta.positions[t] + 1) / static_cast<int32_t>(ratio);
    std::vector<int32_t> all(visible);
    std::iota(all.begin(), all.end(), 0);
    std::shuffle(all.begin(), all.end(), rng);
    all.resize(std::min<size_t>(all.size(), topk));
    std::sort(all.begin(), all.end());
    std::copy(all.begin(), all.end(), sel.begin() + t * topk);
  }
  return sel;
}

TEST(CudaOps, AttentionSlidingCsaHcaWithSink) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  const int64_t H = 64, hd = 512, W = 128, topk = 512;
  // A mixed batch (decodes at the window edge and at long contexts, a prefill inside the window
  // and one longer than it: only its last W tokens may land in the ring), and a small decode-only
  // batch at long contexts, which splits the keys across blocks (flash decoding).
  const std::vector<std::vector<SeqSpec>> batches = {
      {{5, 1}, {127, 1}, {128, 1}, {1000, 1}, {16384, 1}, {65535, 1}, {100, 40}, {0, 300}},
      {{65535, 1}, {16383, 1}, {700, 1}},
  };
  for (const auto& [c, batch] : std::vector<std::pair<AttnCase, std::vector<SeqSpec>>>{
           {{"sliding", 0, false}, batches[0]}, {{"csa", 4, false}, batches[0]},
           {{"hca", 128, true}, batches[0]}, {{"sliding_split", 0, false}, batches[1]},
           {{"csa_split", 4, false}, batches[1]}, {{"hca_split", 128, true}, batches[1]}}) {
    SCOPED_TRACE(c.name);
    p.Begin(batch, kBlock);
    const int64_t T = p.meta.num_tokens, S = p.meta.num_seqs;
    Both q = p.Input(Shape{T, H, hd}, RandomVec(T * H * hd, 50));
    Both kv = p.Input(Shape{T, hd}, RandomVec(T * hd, 51));
    Both ring = p.Pool(Shape{S, W, hd}, 52);
    Both sinks = p.Weight(Shape{H}, RandomVec(H, 53, -1, 1));
    Both entries, selected;
    if (c.ratio > 0) entries = p.Pool(Shape{p.blocks, kBlock / c.ratio, hd}, 54);
    if (c.ratio > 0 && !c.dense) {
      selected = p.InputI(Shape{T, topk}, RandomCausalSelection(p.meta, c.ratio, topk, 55));
    }
    AttentionParams ap;
    ap.window = W;
    ap.ratio = c.ratio;
    ap.dense_compressed = c.dense;
    ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
    Both out = p.Scratch(DType::kF32, Shape{T, H, hd});
    ASSERT_TRUE(p.cpu.Attention(ap, q.c, kv.c, ring.c, entries.c, selected.c, sinks.c, out.c).ok());
    const absl::Status s =
        p.gpu->Attention(ap, q.g, kv.g, ring.g, entries.g, selected.g, sinks.g, out.g);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(p.Same(out, 1e-5, 1e-4));
    // The output's inverse RoPE as the attention's last step (in the split combine, or the RoPE
    // kernel after a single split): the reference's rotation, and bit for bit Rope after it.
    RopeConfig main_rope;
    main_rope.theta = 10000;
    Both freq = p.Weight(Shape{32}, RopeInvFreq(main_rope, 64));
    AttentionParams rp = ap;
    rp.out_rope.rope_dims = 64;
    rp.out_rope.inverse = true;
    rp.out_rope.inv_freq = freq.c;
    Both roped = p.Scratch(DType::kF32, Shape{T, H, hd});
    ASSERT_TRUE(
        p.cpu.Attention(rp, q.c, kv.c, ring.c, entries.c, selected.c, sinks.c, roped.c).ok());
    rp.out_rope.inv_freq = freq.g;
    ASSERT_TRUE(
        p.gpu->Attention(rp, q.g, kv.g, ring.g, entries.g, selected.g, sinks.g, roped.g).ok());
    EXPECT_TRUE(p.Same(roped, 1e-5, 1e-4));
    ASSERT_TRUE(p.gpu->Rope(out.g, rp.out_rope).ok());
    std::vector<float> fused(T * H * hd), separate(T * H * hd);
    ASSERT_TRUE(p.gpu->CopyToHost(roped.g, fused.data()).ok());
    ASSERT_TRUE(p.gpu->CopyToHost(out.g, separate.data()).ok());
    EXPECT_EQ(0, std::memcmp(fused.data(), separate.data(), fused.size() * sizeof(float)));
    // Then the ring update of the same step.
    ASSERT_TRUE(p.cpu.RingWrite(kv.c, ring.c).ok());
    ASSERT_TRUE(p.gpu->RingWrite(kv.g, ring.g).ok());
    EXPECT_TRUE(p.Same(ring, 0, 0));
  }
}

// The bf16 tensor-core attention (the CUDA backend in bf16 precision) against the exact CPU
// reference at the Flash shapes: decode batches of 1, 8 and 64 at mixed contexts (tokens with no
// compressed entry yet: positions 0, 2, 3) through the split-KV path, and a prefill batch large
// enough to run without key splits. Batches 1 and 8 run 16 heads per block, 64 and the prefill 32.
// Tolerance. The kernel rounds q and the keys (= values) to bf16 (unit roundoff u = 2^-8) and the
// probabilities P to bf16 for P.V; products accumulate in fp32 and the softmax is fp32. With
// inputs that are already bf16 values (the main check) only the P rounding remains: the output is
// sum_j w~_j v_j with w~_j = p_j (1 + e_j) / sum_i p_i (1 + e_i) (+ sink), |e_j| <= u, so
// o~ - o ~= sum_j w_j e_j (v_j - o): at most 2u max|v| = 7.8e-3 in the worst case, and with
// independent rounding std(e) = u / sqrt(3), |v_j - o| ~ 0.58 (v uniform in [-1, 1]) it has std
// ~1.3e-3 / sqrt(N) for N roughly equal weights: <= 5.5e-4 for N >= 6 keys (atol 5e-3 is ~9
// sigma over the ~2M outputs); tokens with one key are exact (p = 1) and with 2-5 keys rtol 1e-2
// of |o| ~ 0.3 adds the margin. Raw fp32 inputs (batch 8) add the q/key rounding: values
// sum_j w_j d_j with |d_j| <= u |v_j| (std ~1.3e-3 / sqrt(N) again) and logit errors
// scale * sum_i (dq_i k_i + q_i dk_i) of std ~1e-3 (~6e-4 / sqrt(N) in o): atol 1e-2, rtol 2e-2.
// The bf16 path must actually run (errors above fp32 rounding) and be bit-identical run to run,
// with and without the output's inverse RoPE.
TEST(CudaOps, AttentionTensorCoreBf16) {
  DSV4_REQUIRE_GPU();
  BackendPair p(Precision::kBF16);
  const int64_t H = 64, hd = 512, W = 128, topk = 512;
  std::vector<SeqSpec> b64;
  for (int32_t i = 0; i < 64; ++i) b64.push_back({i < 2 ? 3 * i : (i * 997) % 3000, 1});
  struct Batch {
    const char* name;
    std::vector<SeqSpec> seqs;
  };
  const std::vector<Batch> batches = {
      {"b1", {{65535, 1}}},
      {"b8", {{2, 1}, {127, 1}, {130, 1}, {1000, 1}, {4095, 1}, {8191, 1}, {16383, 1}, {300, 1}}},
      {"b64", b64},
      {"prefill", {{100, 40}, {0, 300}}},
  };
  for (const Batch& batch : batches) {
    for (const AttnCase& c : {AttnCase{"sliding", 0, false}, AttnCase{"csa", 4, false},
                              AttnCase{"hca", 128, true}}) {
      for (const bool raw : {false, true}) {
        if (raw && std::string(batch.name) != "b8") continue;
        SCOPED_TRACE(::testing::Message() << batch.name << " " << c.name << (raw ? " raw" : " bf16"));
        p.Begin(batch.seqs, kBlock);
        const int64_t T = p.meta.num_tokens, S = p.meta.num_seqs;
        auto data = [&](int64_t n, uint32_t seed) {
          auto v = RandomVec(n, seed);
          return raw ? v : testing::RoundBf16(std::move(v));
        };
        auto fill = [&](const Both& t, const std::vector<float>& v) {
          EXPECT_TRUE(p.cpu.CopyFromHost(v.data(), t.c).ok());
          EXPECT_TRUE(p.gpu->CopyFromHost(v.data(), t.g).ok());
        };
        Both q = p.Input(Shape{T, H, hd}, data(T * H * hd, 80));
        Both kv = p.Input(Shape{T, hd}, data(T * hd, 81));
        Both ring = p.Pool(Shape{S, W, hd}, 0);
        fill(ring, data(S * W * hd, 82));
        Both sinks = p.Weight(Shape{H}, RandomVec(H, 83, -1, 1));
        Both entries, selected;
        if (c.ratio > 0) {
          entries = p.Pool(Shape{p.blocks, kBlock / c.ratio, hd}, 0);
          fill(entries, data(p.blocks * (kBlock / c.ratio) * hd, 84));
        }
        if (c.ratio > 0 && !c.dense) {
          selected = p.InputI(Shape{T, topk}, RandomCausalSelection(p.meta, c.ratio, topk, 85));
        }
        AttentionParams ap;
        ap.window = W;
        ap.ratio = c.ratio;
        ap.dense_compressed = c.dense;
        ap.scale = 1.0f / std::sqrt(static_cast<float>(hd));
        RopeConfig main_rope;
        main_rope.theta = 10000;
        Both freq = p.Weight(Shape{32}, RopeInvFreq(main_rope, 64));
        // Plain, then with the model's inverse RoPE on the last 64 channels (in the split
        // combine, or the RoPE kernel after a single split).
        for (const bool roped : {false, true}) {
          SCOPED_TRACE(roped ? "roped" : "plain");
          if (roped) {
            ap.out_rope.rope_dims = 64;
            ap.out_rope.inverse = true;
            ap.out_rope.inv_freq = freq.c;
          }
          Both out = p.Scratch(DType::kF32, Shape{T, H, hd});
          Both again = p.Scratch(DType::kF32, Shape{T, H, hd});
          ASSERT_TRUE(
              p.cpu.Attention(ap, q.c, kv.c, ring.c, entries.c, selected.c, sinks.c, out.c).ok());
          if (roped) ap.out_rope.inv_freq = freq.g;
          absl::Status s =
              p.gpu->Attention(ap, q.g, kv.g, ring.g, entries.g, selected.g, sinks.g, out.g);
          ASSERT_TRUE(s.ok()) << s;
          s = p.gpu->Attention(ap, q.g, kv.g, ring.g, entries.g, selected.g, sinks.g, again.g);
          ASSERT_TRUE(s.ok()) << s;
          const std::vector<float> got = p.HostG(out.g), ref = p.HostC(out.c);
          EXPECT_TRUE(Close(got, ref, raw ? 1e-2 : 5e-3, raw ? 2e-2 : 1e-2));
          EXPECT_TRUE(got == p.HostG(again.g)) << "not bit-identical run to run";
          double max_abs = 0;
          for (size_t i = 0; i < got.size(); ++i) {
            max_abs = std::max(max_abs, std::fabs(static_cast<double>(got[i]) - ref[i]));
          }
          EXPECT_GT(max_abs, 2e-5) << "fp32-exact output: the bf16 tensor-core path did not run";
        }
      }
    }
  }
}

// ---- MoE ----

TEST(CudaOps, RouterScoreAndHash) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  const int64_t E = 256, K = 6, V = 1000;
  for (int32_t tokens : {1, 64, 300}) {
    p.Begin({{0, tokens}}, kBlock, static_cast<int32_t>(V));
    Both logits = p.Input(Shape{tokens, E}, RandomVec(tokens * E, 60, -4, 4));
    Both bias = p.Weight(Shape{E}, RandomVec(E, 61, -0.1f, 0.1f));
    std::vector<int32_t> table(V * K);
    std::mt19937 rng(62);
    for (auto& e : table) e = static_cast<int32_t>(rng() % E);
    Both tid2eid = p.WeightI(Shape{V, K}, table);
    for (bool hash : {false, true}) {
      RouterParams rp;
      rp.top_k = K;
      rp.routed_scale = 1.5f;
      rp.hash = hash;
      Both idx = p.Scratch(DType::kI32, Shape{tokens, K});
      Both w = p.Scratch(DType::kF32, Shape{tokens, K});
      ASSERT_TRUE(p.cpu.Route(rp, logits.c, hash ? Tensor{} : bias.c, tid2eid.c, idx.c, w.c).ok());
      const absl::Status s = p.gpu->Route(rp, logits.g, hash ? Tensor{} : bias.g, tid2eid.g, idx.g, w.g);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(p.HostAs<int32_t>(*p.gpu, idx.g), p.HostAs<int32_t>(p.cpu, idx.c)) << hash;
      EXPECT_TRUE(p.Same(w, 1e-6, 1e-5)) << hash;
    }
  }
}

struct MoeCase {
  int64_t experts, dim, inter, top_k;
  std::vector<int32_t> tokens;
};

TEST(CudaOps, GroupedExpertsPermuteGemmCombine) {
  DSV4_REQUIRE_GPU();
  for (Precision prec : {Precision::kFP32, Precision::kBF16}) {
    BackendPair p(prec);
    std::vector<MoeCase> cases = {{8, 256, 128, 2, {1, 300}}};  // hot experts, many rows each
    // Flash width: all 256 experts in fp32; in bf16 16 experts of the real size (T = 1 is the
    // fused single-token path there, T = 8 the grouped one; at T = 64 the experts have 12-36
    // assignments and at 200 ~75, which the wide kernel takes in passes of 64).
    if (prec == Precision::kFP32) cases.push_back({256, 4096, 2048, 6, {1, 8, 64}});
    if (prec == Precision::kBF16) cases.push_back({16, 4096, 2048, 6, {1, 8, 64, 200}});
    // All eight single-token slots: seven routed experts and the shared one.
    if (prec == Precision::kBF16) cases.push_back({16, 512, 256, 7, {1}});
    for (const MoeCase& c : cases) {
      SCOPED_TRACE(::testing::Message() << "E=" << c.experts << " " << PrecisionName(prec));
      // Synthetic weights: both backends hold the same values without a host copy.
      SyntheticSpec gu_spec{DType::kF32, Shape{c.experts, 2 * c.inter, c.dim}, 70, -0.02f, 0.02f, 1};
      SyntheticSpec dn_spec{DType::kF32, Shape{c.experts, c.dim, c.inter}, 71, -0.03f, 0.03f, 1};
      SyntheticSpec sgu_spec{DType::kF32, Shape{2 * c.inter, c.dim}, 75, -0.02f, 0.02f, 1};
      SyntheticSpec sdn_spec{DType::kF32, Shape{c.dim, c.inter}, 76, -0.03f, 0.03f, 1};
      Both gate_up = p.Synthetic(gu_spec, WeightUse::kMatrix);
      Both down = p.Synthetic(dn_spec, WeightUse::kMatrix);
      Both shared_gate_up = p.Synthetic(sgu_spec, WeightUse::kMatrix);
      Both shared_down = p.Synthetic(sdn_spec, WeightUse::kMatrix);
      if (prec == Precision::kBF16) {
        for (const Both* t : {&gate_up, &down, &shared_gate_up, &shared_down}) p.MirrorToCpu(*t);
      }
      const MoeWeights routed_c{gate_up.c, down.c, Tensor{}, Tensor{}, Tensor{}};
      const MoeWeights routed_g{gate_up.g, down.g, Tensor{}, Tensor{}, Tensor{}};
      const MoeWeights with_shared_c{gate_up.c, down.c, shared_gate_up.c, shared_down.c, Tensor{}};
      const MoeWeights with_shared_g{gate_up.g, down.g, shared_gate_up.g, shared_down.g, Tensor{}};
      for (int32_t T : c.tokens) {
        p.Begin({{0, T}}, kBlock);
        const std::vector<int32_t> idx = RandomRouting(T, c.experts, c.top_k, 72 + T);
        auto uv = RandomVec(T * c.dim, 73);
        if (prec == Precision::kBF16) uv = testing::RoundBf16(uv);
        Both u = p.Input(Shape{T, c.dim}, uv);
        Both ix = p.InputI(Shape{T, c.top_k}, idx);
        Both w = p.Input(Shape{T, c.top_k}, RandomVec(T * c.top_k, 74, 0, 1));
        // Routed only, with the shared expert (fused into the single-token path), and with the
        // shared expert's first half computed ahead (SharedExpertUp, as the model runs it).
        for (const int mode : {0, 1, 2}) {
          MoeWeights wc = mode == 0 ? routed_c : with_shared_c;
          MoeWeights wg = mode == 0 ? routed_g : with_shared_g;
          const double tol = prec == Precision::kBF16 ? 1e-2 : 1e-4;
          if (mode == 2) {
            Both h = p.Scratch(DType::kF32, Shape{T, c.inter});
            ASSERT_TRUE(p.cpu.SharedExpertUp(u.c, wc, 10.0f, h.c).ok());
            const absl::Status s = p.gpu->SharedExpertUp(u.g, wg, 10.0f, h.g);
            ASSERT_TRUE(s.ok()) << s;
            EXPECT_TRUE(p.Same(h, tol, tol)) << "T=" << T;
            wc.shared_h = h.c;
            wg.shared_h = h.g;
          }
          Both out = p.Scratch(DType::kF32, Shape{T, c.dim});
          ASSERT_TRUE(p.cpu.MoeExperts(u.c, ix.c, w.c, wc, 10.0f, out.c).ok());
          const absl::Status s = p.gpu->MoeExperts(u.g, ix.g, w.g, wg, 10.0f, out.g);
          ASSERT_TRUE(s.ok()) << s;
          // bf16: the intermediate activation is rounded to bf16 before the down projection.
          EXPECT_TRUE(p.Same(out, tol, tol)) << "T=" << T << " mode=" << mode;
        }
      }
    }
  }
}

// The wide expert kernel (experts with more than 8 assignments read their weights once per 64,
// kernels/cuda/moe.cu) gives the same bits as the 8-at-a-time kernel it replaces for them
// (DSV4_MOE_WIDE=0): 32 experts of Flash size, so that both run with K unsplit. At T = 24 and
// 40 the experts have ~4.5 and ~7.5 assignments, some more than 8 (both kernels in one product;
// the wide one in passes of 4 groups), at 300 ~56 and at 700 ~131 (passes of 8 groups, three at
// 700, the last partial).
TEST(CudaOps, WideExpertKernelGivesTheSameBits) {
  DSV4_REQUIRE_GPU();
  const ScopedEnv no_tiles("DSV4_MOE_TILED", "0");  // 300 and 700 tokens would be tiled
  // The switch is read when a backend is created; the caller's own value is put back after.
  const auto wide_pair = testing::PairWithEnv("DSV4_MOE_WIDE", "1", Precision::kBF16);
  const auto narrow_pair = testing::PairWithEnv("DSV4_MOE_WIDE", "0", Precision::kBF16);
  BackendPair &wide = *wide_pair, &narrow = *narrow_pair;
  ASSERT_TRUE(wide.gpu != nullptr && narrow.gpu != nullptr);
  constexpr int64_t E = 32, D = 4096, I = 2048, K = 6;
  const SyntheticSpec gu_spec{DType::kF32, Shape{E, 2 * I, D}, 80, -0.02f, 0.02f, 1};
  const SyntheticSpec dn_spec{DType::kF32, Shape{E, D, I}, 81, -0.03f, 0.03f, 1};
  std::vector<std::vector<float>> outs[2];
  for (int side = 0; side < 2; ++side) {
    Backend& b = *(side == 0 ? wide : narrow).gpu;
    auto gate_up = b.CreateSyntheticWeight(gu_spec, WeightUse::kMatrix);
    auto down = b.CreateSyntheticWeight(dn_spec, WeightUse::kMatrix);
    ASSERT_TRUE(gate_up.ok() && down.ok());
    ASSERT_EQ(gate_up->dtype, DType::kBF16);
    const MoeWeights mw{*gate_up, *down, Tensor{}, Tensor{}, Tensor{}};
    for (int32_t T : {24, 40, 300, 700}) {
      (side == 0 ? wide : narrow).Begin({{0, T}}, kBlock);
      outs[side].push_back(testing::RunMoeExperts(
          b, mw, T, D, K, testing::RoundBf16(RandomVec(T * D, 83)), RandomRouting(T, E, K, 82 + T),
          RandomVec(T * K, 84, 0, 1), 10.0f));
    }
  }
  ASSERT_EQ(outs[0].size(), 4u);
  testing::ExpectSameBits(outs[0], outs[1], "wide against narrow");
}

// The wide expert kernel at small shapes against the CPU reference, sized for compute-sanitizer
// (scripts/device/sanitize.sh): 8 experts, K = 512 and 256, so a pass of 8 groups stages all of
// K in one chunk and a pass of 4 too; T = 48 gives 12 assignments per expert (4 groups), 300
// gives 75 (8 groups, a second partial pass).
TEST(CudaOps, WideExpertKernelSmallShapesMatchReference) {
  DSV4_REQUIRE_GPU();
  BackendPair p(Precision::kBF16);
  constexpr int64_t E = 8, D = 512, I = 256, K = 2;
  Both gate_up =
      p.Synthetic({DType::kF32, Shape{E, 2 * I, D}, 90, -0.05f, 0.05f, 1}, WeightUse::kMatrix);
  Both down = p.Synthetic({DType::kF32, Shape{E, D, I}, 91, -0.05f, 0.05f, 1}, WeightUse::kMatrix);
  p.MirrorToCpu(gate_up);
  p.MirrorToCpu(down);
  const MoeWeights wc{gate_up.c, down.c, Tensor{}, Tensor{}, Tensor{}};
  const MoeWeights wg{gate_up.g, down.g, Tensor{}, Tensor{}, Tensor{}};
  for (int32_t T : {48, 300}) {
    p.Begin({{0, T}}, kBlock);
    const std::vector<int32_t> idx = RandomRouting(T, E, K, 92 + T);
    Both u = p.Input(Shape{T, D}, testing::RoundBf16(RandomVec(T * D, 93)));
    Both ix = p.InputI(Shape{T, K}, idx);
    Both w = p.Input(Shape{T, K}, RandomVec(T * K, 94, 0, 1));
    Both out = p.Scratch(DType::kF32, Shape{T, D});
    ASSERT_TRUE(p.cpu.MoeExperts(u.c, ix.c, w.c, wc, 10.0f, out.c).ok());
    const absl::Status st = p.gpu->MoeExperts(u.g, ix.g, w.g, wg, 10.0f, out.g);
    ASSERT_TRUE(st.ok()) << st;
    EXPECT_TRUE(p.Same(out, 1e-2, 1e-2)) << "T=" << T;
  }
}

// The single-token expert kernels skip a slot whose expert id is outside [0, E) (-1, or past the
// last expert): the output equals the reference with that slot's routing weight at 0.
TEST(CudaOps, SingleTokenExpertsSkipInvalidIds) {
  DSV4_REQUIRE_GPU();
  BackendPair p(Precision::kBF16);
  const int64_t E = 16, D = 512, I = 256, K = 6;
  SyntheticSpec gu_spec{DType::kF32, Shape{E, 2 * I, D}, 90, -0.02f, 0.02f, 1};
  SyntheticSpec dn_spec{DType::kF32, Shape{E, D, I}, 91, -0.03f, 0.03f, 1};
  SyntheticSpec sgu_spec{DType::kF32, Shape{2 * I, D}, 92, -0.02f, 0.02f, 1};
  SyntheticSpec sdn_spec{DType::kF32, Shape{D, I}, 93, -0.03f, 0.03f, 1};
  Both gate_up = p.Synthetic(gu_spec, WeightUse::kMatrix);
  Both down = p.Synthetic(dn_spec, WeightUse::kMatrix);
  Both shared_gate_up = p.Synthetic(sgu_spec, WeightUse::kMatrix);
  Both shared_down = p.Synthetic(sdn_spec, WeightUse::kMatrix);
  for (const Both* t : {&gate_up, &down, &shared_gate_up, &shared_down}) p.MirrorToCpu(*t);
  const MoeWeights wc{gate_up.c, down.c, shared_gate_up.c, shared_down.c, Tensor{}};
  const MoeWeights wg{gate_up.g, down.g, shared_gate_up.g, shared_down.g, Tensor{}};
  p.Begin({{0, 1}}, kBlock);
  Both u = p.Input(Shape{1, D}, testing::RoundBf16(RandomVec(D, 94)));
  const std::vector<int32_t> valid = {3, 11, 0, 7, 15, 5};
  std::vector<int32_t> broken = valid;
  broken[2] = -1;
  broken[4] = static_cast<int32_t>(E);
  std::vector<float> weights = RandomVec(K, 95, 0.1f, 1);
  Both ix_bad = p.InputI(Shape{1, K}, broken);
  Both w_all = p.Input(Shape{1, K}, weights);
  weights[2] = weights[4] = 0.0f;
  Both ix_ok = p.InputI(Shape{1, K}, valid);
  Both w_zeroed = p.Input(Shape{1, K}, weights);
  Both out = p.Scratch(DType::kF32, Shape{1, D});
  ASSERT_TRUE(p.cpu.MoeExperts(u.c, ix_ok.c, w_zeroed.c, wc, 10.0f, out.c).ok());
  const absl::Status s = p.gpu->MoeExperts(u.g, ix_bad.g, w_all.g, wg, 10.0f, out.g);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(p.Same(out, 1e-2, 1e-2));
}

// ---- op validation ----

TEST(CudaOps, ShapeMismatchIsAnErrorNotALaunch) {
  DSV4_REQUIRE_GPU();
  BackendPair p;
  p.Begin(Decode(2), kBlock);
  Both x = p.Input(Shape{2, 64}, RandomVec(128, 80));
  Both w = p.Weight(Shape{32, 48}, RandomVec(32 * 48, 81), WeightUse::kMatrix);
  Both y = p.Scratch(DType::kF32, Shape{2, 32});
  const absl::Status s = p.gpu->Linear(x.g, w.g, y.g);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("Linear"), std::string::npos) << s;
}

}  // namespace
}  // namespace dsv4
