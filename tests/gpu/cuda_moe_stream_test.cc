// The weight-streaming MXFP4 expert GEMMs (kernels/cuda/moe_stream.h) through the Backend seam
// in bf16 mode (label `gpu`), on wgmma and on mma.sync (DSV4_MOE_STREAM_WGMMA): forced wherever
// the shapes fit (DSV4_MOE_STREAM=2, tiled GEMMs off)
// against the CPU reference at ragged token counts (1, 2, 7, 129, 1000; T = 1 takes the
// single-token kernels), with a hot expert (every token: passes of 64 over its weights) next to
// experts with none or one, and with UE8M0 scales above 2^1 (the folded expansion's second
// product); chosen by shape at Flash widths (32 experts, 128 tokens: 24 assignments an expert,
// a 1k prefill's); and bit for bit against the wide kernel (DSV4_MOE_STREAM=0), whose products
// are the same bf16 operands summed in the same order. The tolerance is the bf16 expert tests'
// 1e-2 at the output's scale (u and h rounded to bf16).
#include <memory>
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

struct StreamCase {
  int64_t experts, dim, inter, top_k;
  std::vector<int32_t> tokens;
  bool hot = false;
  int big_one_in = 0;  // MXFP4 scales above 2^1 (RandomExperts)
};

// GPU (DSV4_MOE_STREAM = `mode`, tiled GEMMs off, products on wgmma or mma.sync) against the
// CPU reference for every token count.
void CompareStream(const char* mode, const StreamCase& c, uint32_t seed, bool wgmma = true) {
  const ScopedEnv tiled("DSV4_MOE_TILED", "0");
  const ScopedEnv stream("DSV4_MOE_STREAM", mode);
  const ScopedEnv products("DSV4_MOE_STREAM_WGMMA", wgmma ? "1" : "0");
  BackendPair p(Precision::kBF16);
  ASSERT_TRUE(p.gpu != nullptr);
  const StoredExperts st =
      RandomExperts(WeightFormat::kMxfp4, c.experts, c.dim, c.inter, seed, c.big_one_in);
  const Both gate_up = Stored(p, st.gate_up), down = Stored(p, st.down);
  const MoeWeights wc{gate_up.c, down.c, Tensor{}, Tensor{}, Tensor{}};
  const MoeWeights wg{gate_up.g, down.g, Tensor{}, Tensor{}, Tensor{}};
  for (int32_t T : c.tokens) {
    SCOPED_TRACE(::testing::Message() << "DSV4_MOE_STREAM=" << mode
                                      << (wgmma ? " wgmma" : " mma.sync") << " E=" << c.experts
                                      << " D=" << c.dim << " T=" << T << (c.hot ? " hot" : "")
                                      << (c.big_one_in > 0 ? " large scales" : ""));
    p.Begin({{0, T}}, kBlock);
    const std::vector<int32_t> idx = c.hot ? HotRouting(T, c.experts, c.top_k, seed + T)
                                           : RandomRouting(T, c.experts, c.top_k, seed + T);
    Both u = p.Input(Shape{T, c.dim}, testing::RoundBf16(RandomVec(T * c.dim, seed + 2)));
    Both ix = p.InputI(Shape{T, c.top_k}, idx);
    Both w = p.Input(Shape{T, c.top_k}, RandomVec(T * c.top_k, seed + 3, 0, 1));
    Both out = p.Scratch(DType::kF32, Shape{T, c.dim});
    ASSERT_TRUE(p.cpu.MoeExperts(u.c, ix.c, w.c, wc, kLimit, out.c).ok());
    const absl::Status s = p.gpu->MoeExperts(u.g, ix.g, w.g, wg, kLimit, out.g);
    ASSERT_TRUE(s.ok()) << s;
    EXPECT_TRUE(p.SameAtScale(out, 1e-2));
  }
}

// Small widths (D = 256, I = 128: two and one k blocks, so one partial chunk of activations),
// forced: ragged counts, a hot expert (1000 tokens: 16 passes of 64), large scales.
TEST(CudaMoeStream, RaggedCountsMatchReference) {
  DSV4_REQUIRE_GPU();
  for (bool wgmma : {true, false}) {
    CompareStream("2", StreamCase{8, 256, 128, 2, {1, 2, 7, 129, 1000}}, 1000, wgmma);
    CompareStream("2", StreamCase{8, 256, 128, 2, {7, 129, 1000}, true}, 1010, wgmma);
    CompareStream("2", StreamCase{8, 1024, 384, 6, {7, 300}, false, 256}, 1020, wgmma);
    CompareStream("2", StreamCase{8, 1024, 384, 6, {300}, true, 256}, 1030, wgmma);
  }
}

// Flash widths (D = 4096, I = 2048, top-6) chosen by shape: 32 experts at 128 tokens (24
// assignments an expert, as 256 experts at a 1k prompt) and 70 (13).
TEST(CudaMoeStream, FlashWidthsByShapeMatchReference) {
  DSV4_REQUIRE_GPU();
  CompareStream("1", StreamCase{32, 4096, 2048, 6, {70, 128}}, 1040);
  CompareStream("1", StreamCase{32, 4096, 2048, 6, {128}, true}, 1050);
}

// Forced, on wgmma and on mma.sync, against the wide kernel (and the 8-token kernel of the
// experts with at most 8, K unsplit at 32 Flash-size experts): the same bits at 4.5, 24, 56 and
// 131 assignments an expert (passes of 64 from the last), random and hot routing.
TEST(CudaMoeStream, GivesTheWideKernelsBits) {
  DSV4_REQUIRE_GPU();
  const ScopedEnv no_tiles("DSV4_MOE_TILED", "0");
  std::unique_ptr<BackendPair> pairs[3];
  {
    const ScopedEnv stream("DSV4_MOE_STREAM", "2");
    pairs[0] = testing::PairWithEnv("DSV4_MOE_STREAM_WGMMA", "1", Precision::kBF16);
    pairs[1] = testing::PairWithEnv("DSV4_MOE_STREAM_WGMMA", "0", Precision::kBF16);
  }
  pairs[2] = testing::PairWithEnv("DSV4_MOE_STREAM", "0", Precision::kBF16);
  for (const auto& p : pairs) ASSERT_TRUE(p->gpu != nullptr);
  constexpr int64_t E = 32, D = 4096, I = 2048, K = 6;
  const StoredExperts st = RandomExperts(WeightFormat::kMxfp4, E, D, I, 1060);
  std::vector<std::vector<float>> outs[3];
  for (int side = 0; side < 3; ++side) {
    BackendPair& p = *pairs[side];
    Backend& b = *p.gpu;
    auto gate_up = b.CreateStoredWeight(st.gate_up, WeightUse::kMatrix);
    auto down = b.CreateStoredWeight(st.down, WeightUse::kMatrix);
    ASSERT_TRUE(gate_up.ok() && down.ok());
    const MoeWeights mw{*gate_up, *down, Tensor{}, Tensor{}, Tensor{}};
    for (bool hot : {false, true}) {
      for (int32_t T : {24, 128, 300, 700}) {
        p.Begin({{0, T}}, kBlock);
        const std::vector<int32_t> idx =
            hot ? HotRouting(T, E, K, 1070 + T) : RandomRouting(T, E, K, 1070 + T);
        outs[side].push_back(testing::RunMoeExperts(b, mw, T, D, K, RandomVec(T * D, 1071), idx,
                                                    RandomVec(T * K, 1072, 0, 1), kLimit));
      }
    }
  }
  testing::ExpectSameBits(outs[0], outs[2], "wgmma");
  testing::ExpectSameBits(outs[1], outs[2], "mma.sync");
}

}  // namespace
}  // namespace dsv4
