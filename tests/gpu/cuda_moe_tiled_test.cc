// The tiled grouped expert GEMMs of prefill-sized steps (kernels/cuda/moe_tiled.h) against the
// CPU reference, through the Backend seam in bf16 mode (label `gpu`): bf16, MXFP4 and FP8 routed
// experts, ragged token counts (1, 7, 129, 1000, 8192), experts with none, one and many
// assignments (HotRouting), both token tiles forced (DSV4_MOE_TILED=64 / 128) and chosen by
// shape, on the warp-specialised kernels (DSV4_MOE_WS, their token tiles sized per expert), the
// wgmma kernels and the mma.sync ones (DSV4_MOE_WS=0 DSV4_MOE_WGMMA=0). The tolerance is the
// bf16 expert tests' 1e-2 at the output's scale (u and h rounded to bf16; FP8 weights rounded to
// bf16 once). The mma.sync kernels sum every output over k in the same order with the same
// operands at both token tiles and warp layouts, so those four must agree bit for bit.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tests/gpu/backend_pair.h"
#include "tests/gpu/moe_test_data.h"

namespace dsv4 {
namespace {

using testing::BackendPair;
using testing::Both;
using testing::HotRouting;
using testing::RandomExperts;
using testing::RandomRouting;
using testing::RandomVec;
using testing::ScopedEnv;
using testing::Stored;
using testing::StoredExperts;

constexpr int32_t kBlock = 128;
constexpr float kLimit = 10.0f;

// Expert weights in `format`; kDense: random values the GPU holds in bf16 and the CPU side then
// reads as those bf16 values.
struct Experts {
  Both gate_up, down;
};
Experts MakeExperts(BackendPair& p, WeightFormat format, int64_t e, int64_t dim, int64_t inter,
                    uint32_t seed) {
  if (format == WeightFormat::kDense) {
    Experts x{p.Weight(Shape{e, 2 * inter, dim}, RandomVec(e * 2 * inter * dim, seed, -0.02f, 0.02f),
                       WeightUse::kMatrix),
              p.Weight(Shape{e, dim, inter}, RandomVec(e * dim * inter, seed + 1, -0.03f, 0.03f),
                       WeightUse::kMatrix)};
    p.MirrorToCpu(x.gate_up);
    p.MirrorToCpu(x.down);
    return x;
  }
  const StoredExperts st = RandomExperts(format, e, dim, inter, seed);
  return Experts{Stored(p, st.gate_up), Stored(p, st.down)};
}

struct TiledCase {
  int64_t experts, dim, inter, top_k;
  std::vector<int32_t> tokens;
  bool hot = false;
};

// The tiled kernels: warp-specialised (moe_tiled_ws.cu), wgmma, or mma.sync with 8 or 4 warps
// a block.
enum class Mma { kWs, kWgmma, kSync8, kSync4 };
const char* MmaName(Mma m) {
  return m == Mma::kWs      ? "warp-specialised"
         : m == Mma::kWgmma ? "wgmma"
         : m == Mma::kSync8 ? "mma.sync x8"
                            : "mma.sync x4";
}

// GPU (with DSV4_MOE_TILED = `mode` and the kernels `mma`, in `precision`) against the CPU
// reference for each token count of `c` at `tol` of the output's scale; returns the GPU outputs
// in order, and in *err the largest error over them as a share of the output's scale.
std::vector<std::vector<float>> CompareTiled(const char* mode, WeightFormat format,
                                             const TiledCase& c, uint32_t seed, Mma mma,
                                             Precision precision = Precision::kBF16,
                                             double tol = 1e-2, double* err = nullptr) {
  std::vector<std::vector<float>> outs;
  const ScopedEnv tiled("DSV4_MOE_TILED", mode);
  const ScopedEnv ws("DSV4_MOE_WS", mma == Mma::kWs ? "1" : "0");
  const ScopedEnv wgmma("DSV4_MOE_WGMMA", mma == Mma::kWgmma ? "1" : "0");
  const ScopedEnv tile_warps("DSV4_MOE_TILE_WARPS", mma == Mma::kSync4 ? "4" : "8");
  BackendPair p(precision);
  EXPECT_TRUE(p.gpu != nullptr);
  if (err != nullptr) *err = 0;
  if (p.gpu == nullptr) return outs;
  const Experts x = MakeExperts(p, format, c.experts, c.dim, c.inter, seed);
  const MoeWeights wc{x.gate_up.c, x.down.c, Tensor{}, Tensor{}, Tensor{}};
  const MoeWeights wg{x.gate_up.g, x.down.g, Tensor{}, Tensor{}, Tensor{}};
  for (int32_t T : c.tokens) {
    SCOPED_TRACE(::testing::Message() << "DSV4_MOE_TILED=" << mode << " " << MmaName(mma) << " "
                                      << WeightFormatName(format) << " T=" << T
                                      << (c.hot ? " hot" : ""));
    p.Begin({{0, T}}, kBlock);
    const std::vector<int32_t> idx = c.hot ? HotRouting(T, c.experts, c.top_k, seed + T)
                                           : RandomRouting(T, c.experts, c.top_k, seed + T);
    Both u = p.Input(Shape{T, c.dim}, testing::RoundBf16(RandomVec(T * c.dim, seed + 2)));
    Both ix = p.InputI(Shape{T, c.top_k}, idx);
    Both w = p.Input(Shape{T, c.top_k}, RandomVec(T * c.top_k, seed + 3, 0, 1));
    Both out = p.Scratch(DType::kF32, Shape{T, c.dim});
    EXPECT_TRUE(p.cpu.MoeExperts(u.c, ix.c, w.c, wc, kLimit, out.c).ok());
    const absl::Status st = p.gpu->MoeExperts(u.g, ix.g, w.g, wg, kLimit, out.g);
    EXPECT_TRUE(st.ok()) << st;
    if (!st.ok()) return outs;
    EXPECT_TRUE(p.SameAtScale(out, tol));
    outs.push_back(p.HostAs<float>(*p.gpu, out.g));
    if (err != nullptr) *err = std::max(*err, testing::ErrorAtScale(outs.back(), p.HostC(out.c)));
  }
  return outs;
}

// Small widths in all three formats, both token tiles and both warp layouts forced: ragged
// counts (a partial last token tile everywhere; at T = 2 and 7 most experts have no assignment,
// the rest one; T = 1 takes the single-token kernels whatever the switch) and a hot expert
// (every token: 1000 assignments, four 250-row tiles of the warp-specialised kernels) next to
// experts with none or one. The four mma.sync variants give the same bits; the wgmma kernels at
// both token tiles and the warp-specialised ones meet the reference.
TEST(CudaMoeTiled, RaggedCountsMatchReference) {
  DSV4_REQUIRE_GPU();
  for (WeightFormat f : {WeightFormat::kDense, WeightFormat::kMxfp4, WeightFormat::kFp8Block}) {
    for (bool hot : {false, true}) {
      const TiledCase c{8, 256, 128, 2, {1, 2, 7, 129, 1000}, hot};
      CompareTiled("64", f, c, 900, Mma::kWs);
      CompareTiled("64", f, c, 900, Mma::kWgmma);
      CompareTiled("128", f, c, 900, Mma::kWgmma);
      const std::vector<std::vector<float>> runs[4] = {
          CompareTiled("64", f, c, 900, Mma::kSync8), CompareTiled("128", f, c, 900, Mma::kSync8),
          CompareTiled("64", f, c, 900, Mma::kSync4), CompareTiled("128", f, c, 900, Mma::kSync4)};
      for (const auto& r : runs) ASSERT_EQ(r.size(), c.tokens.size());
      for (int v = 1; v < 4; ++v) {
        for (size_t i = 0; i < c.tokens.size(); ++i) {
          EXPECT_EQ(0, std::memcmp(runs[0][i].data(), runs[v][i].data(),
                                   runs[0][i].size() * sizeof(float)))
              << WeightFormatName(f) << " T=" << c.tokens[i] << (hot ? " hot" : "")
              << " variant " << v;
        }
      }
    }
  }
}

// Flash widths (D = 4096, I = 2048, top-6) at 8 experts and 1000 tokens, chosen by shape
// (750 assignments an expert: 128-row tiles; three of 250 on the warp-specialised kernels) with
// random and hot routing on the warp-specialised and wgmma kernels, 64-row tiles forced at 300
// tokens on wgmma, and random routing on mma.sync.
TEST(CudaMoeTiled, FlashWidthsMatchReference) {
  DSV4_REQUIRE_GPU();
  for (WeightFormat f : {WeightFormat::kDense, WeightFormat::kMxfp4, WeightFormat::kFp8Block}) {
    CompareTiled("1", f, TiledCase{8, 4096, 2048, 6, {1000}, false}, 910, Mma::kWs);
    CompareTiled("1", f, TiledCase{8, 4096, 2048, 6, {1000}, true}, 920, Mma::kWs);
    CompareTiled("1", f, TiledCase{8, 4096, 2048, 6, {1000}, false}, 910, Mma::kWgmma);
    CompareTiled("1", f, TiledCase{8, 4096, 2048, 6, {1000}, true}, 920, Mma::kWgmma);
    CompareTiled("64", f, TiledCase{8, 4096, 2048, 6, {300}, false}, 930, Mma::kWgmma);
    CompareTiled("1", f, TiledCase{8, 4096, 2048, 6, {1000}, false}, 910, Mma::kSync8);
  }
}

// An 8192-token prefill over 64 experts (768 assignments each: 128-row tiles by shape) and 2048
// tokens over 256 experts (48 each: 64-row tiles), MXFP4 as released.
TEST(CudaMoeTiled, LongPromptsMatchReference) {
  DSV4_REQUIRE_GPU();
  for (Mma m : {Mma::kWs, Mma::kWgmma, Mma::kSync8}) {
    CompareTiled("1", WeightFormat::kMxfp4, TiledCase{64, 512, 256, 6, {8192}}, 930, m);
    CompareTiled("1", WeightFormat::kMxfp4, TiledCase{256, 512, 256, 6, {2048}}, 940, m);
  }
}

// The warp-specialised kernels' token tiles: experts with 1 .. ~900 assignments (16 experts,
// top-4, random routing over 37 .. 3600 tokens) take every N from 32 to 256 and splits into 2 to
// 4 even tiles, in all three formats, against the reference; and they agree with the wgmma
// kernels, which sum the same bf16 products over k in the same order, to far below the
// reference tolerance (printed: whether the bits are equal). The second case gives the down
// GEMM a single k stage (I = 64) and ~8 tiles a block, so the producer runs whole tiles ahead of
// the down epilogue, which reads its tile's rows from the table ring (MXFP4 needs I % 128 and
// takes the wgmma kernels there).
TEST(CudaMoeTiled, WarpSpecialisedTileSizesMatchReference) {
  DSV4_REQUIRE_GPU();
  const TiledCase cases[] = {{16, 256, 128, 4, {37, 300, 777, 1500, 3600}, false},
                             {64, 1024, 64, 4, {8192}, false}};
  for (WeightFormat f : {WeightFormat::kDense, WeightFormat::kMxfp4, WeightFormat::kFp8Block}) {
    for (const TiledCase& c : cases) {
      const auto ws = CompareTiled("64", f, c, 960, Mma::kWs);
      const auto wg = CompareTiled("64", f, c, 960, Mma::kWgmma);
      ASSERT_EQ(ws.size(), c.tokens.size());
      ASSERT_EQ(wg.size(), c.tokens.size());
      for (size_t i = 0; i < c.tokens.size(); ++i) {
        const double err = testing::ErrorAtScale(ws[i], wg[i]);
        const bool same =
            std::memcmp(ws[i].data(), wg[i].data(), ws[i].size() * sizeof(float)) == 0;
        std::printf("    %s I=%lld T=%d: warp-specialised vs wgmma %s (%.3g of the scale)\n",
                    std::string(WeightFormatName(f)).c_str(), static_cast<long long>(c.inter),
                    c.tokens[i], same ? "bit for bit" : "differ", err);
        EXPECT_LT(err, 1e-4) << WeightFormatName(f) << " I=" << c.inter << " T=" << c.tokens[i];
      }
    }
  }
}

// Precision fp8 with DSV4_MOE_FP8=1: MXFP4 experts expanded to e4m3 against u and h in e4m3
// per 1 x 128 group, on FP8 tensor cores (moe_tiled_fp8.cu). e4m3 keeps 4 significant bits, so
// the outputs stay within a few percent of their scale (8e-2 allowed; a wrong scale, group or
// swizzle is off by far more), and well above the bf16 path's error on the same case: the FP8 kernels ran. Ragged
// counts and hot routing at small widths, and the Flash widths; the four scale groups of a
// 128-column block differ (RandomExperts' scales span 2^-8 .. 2^-4), so the per-row e4m3 base
// is exercised.
TEST(CudaMoeTiled, Fp8ActivationsStayWithinTheirError) {
  DSV4_REQUIRE_GPU();
  const std::vector<TiledCase> cases = {
      {8, 256, 128, 2, {129, 1000}, false},
      {8, 256, 128, 2, {1000}, true},
      {8, 4096, 2048, 6, {300}, false},
  };
  uint32_t seed = 950;
  for (const TiledCase& c : cases) {
    double bf16_err = 0, fp8_err = 0;
    CompareTiled("1", WeightFormat::kMxfp4, c, ++seed, Mma::kWgmma, Precision::kBF16, 1e-2,
                 &bf16_err);
    {
      const ScopedEnv moe_fp8("DSV4_MOE_FP8", "1");
      CompareTiled("1", WeightFormat::kMxfp4, c, seed, Mma::kWgmma, Precision::kFP8, 8e-2,
                   &fp8_err);
    }
    std::printf("    D=%lld I=%lld%s: error at the output's scale bf16 %.3g, fp8 %.3g\n",
                static_cast<long long>(c.dim), static_cast<long long>(c.inter),
                c.hot ? " hot" : "", bf16_err, fp8_err);
    EXPECT_GT(fp8_err, 2 * bf16_err) << "the FP8 kernels did not run";
  }
}

}  // namespace
}  // namespace dsv4
