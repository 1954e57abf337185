#include "worker/checkpoint/weight_source.h"

#include <cstring>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/checkpoint/tensor_names.h"

namespace dsv4 {
namespace {

using testing::F32Tensor;
using testing::NamedTensor;
using testing::SafetensorsBytes;
using testing::TempDir;
using testing::WriteFile;

TEST(TensorNames, AllSpellingsMeetInOneCanonicalName) {
  struct Case {
    std::string in, out;
  };
  const std::vector<Case> cases = {
      {"embed.weight", "model.embed_tokens.weight"},
      {"model.embed_tokens.weight", "model.embed_tokens.weight"},
      {"head.weight", "lm_head.weight"},
      {"lm_head.weight", "lm_head.weight"},
      {"norm.weight", "model.norm.weight"},
      {"model.norm.weight", "model.norm.weight"},
      {"hc_head_fn", "model.hc_head.hc_fn"},
      {"model.hc_head.hc_scale", "model.hc_head.hc_scale"},
      {"layers.3.attn.wq_a.weight", "model.layers.3.self_attn.q_a_proj.weight"},
      {"model.layers.3.attn.wq_a.weight", "model.layers.3.self_attn.q_a_proj.weight"},
      {"model.layers.3.self_attn.q_a_proj.weight", "model.layers.3.self_attn.q_a_proj.weight"},
      {"model.layers.0.attn.norm.weight", "model.layers.0.self_attn.kv_norm.weight"},
      {"layers.0.attn.kv_norm.weight", "model.layers.0.self_attn.kv_norm.weight"},
      {"layers.1.hc_attn_scale", "model.layers.1.attn_hc.scale"},
      {"model.layers.1.attn_hc.scale", "model.layers.1.attn_hc.scale"},
      {"layers.1.attn.indexer.weights_proj.weight",
       "model.layers.1.self_attn.compressor.indexer.scorer.weights_proj.weight"},
      {"layers.1.attn.indexer.compressor.ape",
       "model.layers.1.self_attn.compressor.indexer.position_bias"},
      {"layers.2.ffn.gate.bias", "model.layers.2.mlp.gate.e_score_correction_bias"},
      {"layers.2.ffn.experts.17.w3.weight", "model.layers.2.mlp.experts.17.up_proj.weight"},
      {"layers.2.ffn.shared_experts.w2.weight", "model.layers.2.mlp.shared_experts.down_proj.weight"},
      {"layers.2.attn.wq_a.scale", "model.layers.2.self_attn.q_a_proj.weight_scale_inv"},
      {"layers.2.ffn.experts.3.w1.scale", "model.layers.2.mlp.experts.3.gate_proj.weight_scale_inv"},
      {"something.else", "something.else"},
  };
  for (const auto& c : cases) {
    auto got = CanonicalTensorName(c.in);
    ASSERT_TRUE(got.has_value()) << c.in;
    EXPECT_EQ(*got, c.out) << c.in;
  }
  EXPECT_FALSE(CanonicalTensorName("mtp.0.e_proj.weight").has_value());
  EXPECT_FALSE(CanonicalTensorName("model.mtp.0.norm.weight").has_value());
}

class WeightSourceTest : public ::testing::Test {
 protected:
  WeightSource Open(const std::vector<NamedTensor>& tensors) {
    dir_ = TempDir("ws");
    WriteFile(dir_ + "/model.safetensors", SafetensorsBytes(tensors));
    auto ckpt = Checkpoint::Open(dir_);
    EXPECT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = std::move(*ckpt);
    auto src = WeightSource::Create(ckpt_.get());
    EXPECT_TRUE(src.ok()) << src.status();
    return std::move(*src);
  }
  std::string dir_;
  std::unique_ptr<Checkpoint> ckpt_;
};

TEST_F(WeightSourceTest, MissingAndMisShapedTensorsAreNamed) {
  WeightSource src = Open({F32Tensor("layers.0.attn.wkv.weight", {2, 3}, std::vector<float>(6, 1))});
  auto missing = src.F32("model.layers.0.self_attn.q_a_proj.weight", Shape{2, 3});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("q_a_proj"), std::string::npos);
  auto shaped = src.F32("model.layers.0.self_attn.kv_proj.weight", Shape{3, 2});
  ASSERT_FALSE(shaped.ok());
  EXPECT_NE(shaped.status().message().find("layers.0.attn.wkv.weight"), std::string::npos);
  EXPECT_NE(shaped.status().message().find("[2, 3]"), std::string::npos);
  auto ok = src.F32("model.layers.0.self_attn.kv_proj.weight", Shape{2, 3});
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(src.Unused().empty());
}

TEST_F(WeightSourceTest, DuplicateSpellingsAreRejected) {
  dir_ = TempDir("dup");
  WriteFile(dir_ + "/model.safetensors",
            SafetensorsBytes({F32Tensor("embed.weight", {1}, {1}),
                              F32Tensor("model.embed_tokens.weight", {1}, {2})}));
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok());
  auto src = WeightSource::Create(ckpt->get());
  ASSERT_FALSE(src.ok());
  EXPECT_NE(src.status().message().find("both name"), std::string::npos);
}

TEST_F(WeightSourceTest, HalfPrecisionConverts) {
  NamedTensor bf16{"norm.weight", DType::kBF16, {2}, {0x80, 0x3f, 0x00, 0xc0}};  // 1.0, -2.0
  NamedTensor f16{"head.weight", DType::kF16, {1}, {0x00, 0x3c}};                 // 1.0
  WeightSource src = Open({bf16, f16});
  auto a = src.F32("model.norm.weight", Shape{2});
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->f32, (std::vector<float>{1.0f, -2.0f}));
  auto b = src.F32("lm_head.weight", Shape{1});
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->f32[0], 1.0f);
}

TEST_F(WeightSourceTest, Fp8BlockScaledDequantises) {
  // 2 x 3 weights, block 128: one scale. e4m3 0x38 = 1.0, 0x40 = 2.0, 0xb8 = -1.0.
  NamedTensor w{"layers.0.attn.wq_a.weight", DType::kF8E4M3, {2, 3},
                {0x38, 0x40, 0xb8, 0x38, 0x38, 0x40}};
  NamedTensor s{"layers.0.attn.wq_a.scale", DType::kF8E8M0, {1, 1}, {128}};  // 2^1
  WeightSource src = Open({w, s});
  auto t = src.F32("model.layers.0.self_attn.q_a_proj.weight", Shape{2, 3});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->f32, (std::vector<float>{2, 4, -2, 2, 2, 4}));
  EXPECT_TRUE(src.Unused().empty());
}

TEST_F(WeightSourceTest, Fp8WithoutScaleIsAnError) {
  WeightSource src = Open({NamedTensor{"layers.0.attn.wq_a.weight", DType::kF8E4M3, {1, 1}, {0x38}}});
  auto t = src.F32("model.layers.0.self_attn.q_a_proj.weight", Shape{1, 1});
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("scale"), std::string::npos);
}

TEST_F(WeightSourceTest, Mxfp4Dequantises) {
  // One row of 32 columns: bytes hold (even, odd) = (low, high) nibbles.
  std::vector<uint8_t> packed(16, 0);
  packed[0] = 0x72;  // col0 = nibble 2 (1.0), col1 = nibble 7 (6.0)
  packed[1] = 0x9f;  // col2 = nibble 15 (-6.0), col3 = nibble 9 (-0.5)
  NamedTensor w{"layers.0.ffn.experts.0.w1.weight", DType::kI8, {1, 16}, packed};
  NamedTensor s{"layers.0.ffn.experts.0.w1.scale", DType::kF8E8M0, {1, 1}, {126}};  // 0.5
  WeightSource src = Open({w, s});
  auto t = src.F32("model.layers.0.mlp.experts.0.gate_proj.weight", Shape{1, 32});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->f32[0], 0.5f);
  EXPECT_EQ(t->f32[1], 3.0f);
  EXPECT_EQ(t->f32[2], -3.0f);
  EXPECT_EQ(t->f32[3], -0.25f);
  EXPECT_EQ(t->f32[4], 0.0f);
}

TEST_F(WeightSourceTest, IntegerTables) {
  WeightSource src = Open({testing::I64Tensor("layers.0.ffn.gate.tid2eid", {2, 2}, {0, 3, 1, 1}),
                           testing::I64Tensor("layers.1.ffn.gate.tid2eid", {1, 1}, {int64_t{1} << 40})});
  auto t = src.I32("model.layers.0.mlp.gate.tid2eid", Shape{2, 2});
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->i32, (std::vector<int32_t>{0, 3, 1, 1}));
  EXPECT_FALSE(src.I32("model.layers.1.mlp.gate.tid2eid", Shape{1, 1}).ok());
  EXPECT_FALSE(src.F32("model.layers.0.mlp.gate.tid2eid", Shape{2, 2}).ok());
}

}  // namespace
}  // namespace dsv4
