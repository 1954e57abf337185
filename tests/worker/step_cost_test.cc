// The step cost model (worker/tools/step_cost.h) against the checkpoint itself: the GEMM work of
// a one-token prefill is the checkpoint's matrices as a token uses them (every 2-D weight once,
// the routed experts' by K/E, the head for the sampled row, the embedding a lookup), counted here
// from the tensors of the dsv4-tiny file rather than from the config; and the attention and
// indexer terms on hand-counted small cases.
#include <gtest/gtest.h>

#include "tests/testing/checkpoint_writer.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/tools/step_cost.h"

namespace dsv4 {
namespace {

ModelConfig Tiny() {
  auto c = LoadModelConfig(testing::TestData("dsv4-tiny/config.json"));
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

TEST(StepCost, OneTokenGemmsAreTheCheckpointsMatricesAsATokenUsesThem) {
  const ModelConfig c = Tiny();
  auto ckpt = Checkpoint::Open(testing::TestData("dsv4-tiny/model.safetensors"));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  double macs = 0, routed = 0;
  int matrices = 0;
  const double expert_share = static_cast<double>(c.num_experts_per_tok) / c.n_routed_experts;
  for (const TensorInfo& t : (*ckpt)->tensors()) {
    if (t.shape.size() != 2 || t.dtype == DType::kI64) continue;      // vectors, hash tables
    if (t.name.find("embed_tokens") != std::string::npos) continue;    // a lookup
    if (t.name.find("compressor.ape") != std::string::npos) continue;  // a bias added per slot
    ++matrices;
    const double n = static_cast<double>(t.numel());
    const bool expert = t.name.find(".experts.") != std::string::npos;
    macs += expert ? n * expert_share : n;
    if (expert) routed += n * expert_share;
  }
  ASSERT_GT(matrices, 50);
  const PrefillCost cost = PrefillStepCost(c, 1, 1, WeightBytes{});
  EXPECT_DOUBLE_EQ(cost.gemm_flops, 2.0 * macs)
      << "a projection is missing from (or extra in) the cost model";
  ASSERT_GT(routed, 0);
  EXPECT_DOUBLE_EQ(cost.routed_expert_flops, 2.0 * routed) << "the routed experts' share";
  EXPECT_DOUBLE_EQ(PrefillStepCost(c, 2, 3, WeightBytes{}).routed_expert_flops, 6 * 2.0 * routed);
  // Per-layer figures add up to the same (less the head).
  double layers = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) layers += LayerGemmMacsPerToken(c, l);
  EXPECT_DOUBLE_EQ(2.0 * (layers + c.vocab_size * c.hidden_size + c.hc_mult * c.hc_mult * c.hidden_size),
                   cost.gemm_flops);
}

TEST(StepCost, AttentionCountsTheWindowAndTheCompressedEntriesEachQuerySees) {
  ModelConfig c = Tiny();
  const double per_key = 2.0 * 2.0 * c.num_heads * c.head_dim;  // FLOPs of q.k and p.v
  // One sliding layer, window 16: queries 0..19 see 1, 2, ..., 16, 16, 16, 16, 16 keys.
  c.num_layers = 1;
  c.layer_types = {AttnType::kSliding};
  const double window_keys = 16.0 * 17 / 2 + 4 * 16;
  EXPECT_DOUBLE_EQ(PrefillStepCost(c, 1, 20, WeightBytes{}).attention_flops, per_key * window_keys);
  EXPECT_DOUBLE_EQ(PrefillStepCost(c, 3, 20, WeightBytes{}).attention_flops, 3 * per_key * window_keys);
  // HCA (ratio hca_ratio): every visible entry. 40 tokens at ratio m see floor((p+1)/m) entries.
  c.layer_types = {AttnType::kHca};
  c.hca_ratio = 8;
  double hca_entries = 0;
  for (int p = 0; p < 40; ++p) hca_entries += (p + 1) / 8;
  const double window40 = 16.0 * 17 / 2 + 24 * 16;
  EXPECT_DOUBLE_EQ(PrefillStepCost(c, 1, 40, WeightBytes{}).attention_flops,
                   per_key * (window40 + hca_entries));
  EXPECT_DOUBLE_EQ(PrefillStepCost(c, 1, 40, WeightBytes{}).indexer_flops, 0);
  // CSA (ratio 4, top-8): at most 8 entries each; scoring only once more than 8 are visible
  // (positions 35.. see 9 or more), each such query scoring all of its visible entries.
  c.layer_types = {AttnType::kCsa};
  c.csa_ratio = 4;
  double csa_keys = 0, scored = 0;
  for (int p = 0; p < 40; ++p) {
    const int visible = (p + 1) / 4;
    csa_keys += std::min(visible, 8);
    if (visible > 8) scored += visible;
  }
  EXPECT_EQ(scored, 4 * 9 + 10) << "positions 35..38 see 9 entries, 39 sees 10";
  const PrefillCost csa = PrefillStepCost(c, 1, 40, WeightBytes{});
  EXPECT_DOUBLE_EQ(csa.attention_flops, per_key * (window40 + csa_keys));
  EXPECT_DOUBLE_EQ(csa.indexer_flops, 2.0 * scored * c.index_n_heads * c.index_head_dim);
}

TEST(StepCost, PrefillReadsEveryExpertOnceEnoughTokensPickThem) {
  const ModelConfig c = Tiny();
  const WeightBytes w{2, 1, 0.5};
  const double few = PrefillStepCost(c, 1, 1, w).bytes;
  const double many = PrefillStepCost(c, 1, 1024, w).bytes;
  const double more = PrefillStepCost(c, 1, 2048, w).bytes;
  const double most = PrefillStepCost(c, 1, 3072, w).bytes;
  // From 1 token (K of E experts read) to 1024 (all of them)...
  const double all_experts = c.num_layers * (c.n_routed_experts - c.num_experts_per_tok) *
                             3.0 * c.hidden_size * c.moe_intermediate_size * w.experts;
  EXPECT_GT(many - few, 0.99 * all_experts);
  // ...then no more weights: the bytes grow linearly (embedding rows and the state written).
  EXPECT_NEAR(more - many, most - more, 1e-6 * most);
}

}  // namespace
}  // namespace dsv4
