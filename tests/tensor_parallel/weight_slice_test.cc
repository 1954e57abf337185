// WeightSlice: host tensors and stored FP8 / MXFP4 weights cut to a rank's part, and the shard
// arithmetic of common/tensor_parallel.h.
#include "worker/checkpoint/weight_slice.h"

#include <set>
#include <string>
#include <vector>

#include "common/tensor_parallel.h"
#include "gtest/gtest.h"
#include "kernels/quant_weights.h"
#include "worker/checkpoint/stored_weight.h"
#include "worker/checkpoint/weight_source.h"
#include "tests/testing/checkpoint_writer.h"
#include <random>

namespace dsv4 {
namespace {

// The [rows, cols] sub-block of a dense row-major matrix.
std::vector<float> Block(const std::vector<float>& m, int64_t cols, int64_t r0, int64_t nr,
                         int64_t c0, int64_t nc) {
  std::vector<float> out;
  for (int64_t r = r0; r < r0 + nr; ++r) {
    for (int64_t c = c0; c < c0 + nc; ++c) out.push_back(m[r * cols + c]);
  }
  return out;
}

TEST(WeightSlice, HostTensorsAlongEveryDim) {
  HostTensor t{DType::kF32, Shape{2, 3, 4}, {}, {}};
  for (int i = 0; i < 24; ++i) t.f32.push_back(static_cast<float>(i));
  auto d0 = SliceHost(t, WeightSlice::Along(0, 1, 1), "t");
  ASSERT_TRUE(d0.ok());
  EXPECT_EQ(d0->shape, (Shape{1, 3, 4}));
  EXPECT_EQ(d0->f32.front(), 12.0f);
  auto d1 = SliceHost(t, WeightSlice::Along(1, 1, 2), "t");
  ASSERT_TRUE(d1.ok());
  EXPECT_EQ(d1->f32, (std::vector<float>{4, 5, 6, 7, 8, 9, 10, 11, 16, 17, 18, 19, 20, 21, 22, 23}));
  auto d2 = SliceHost(t, WeightSlice::Along(2, 3, 1), "t");
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(d2->f32, (std::vector<float>{3, 7, 11, 15, 19, 23}));
  auto bad = SliceHost(t, WeightSlice::Along(1, 2, 2), "model.x.weight");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("model.x.weight"), std::string::npos);
  EXPECT_FALSE(SliceHost(t, WeightSlice::Along(3, 0, 1), "t").ok());
  EXPECT_FALSE(SliceHost(t, WeightSlice::Along(0, 0, 0), "t").ok());
}

// FP8 and MXFP4 slices: in format on the blocks, dense off them, and always the exact values of
// the full weight's slice.
TEST(WeightSlice, StoredWeightsKeepTheirFormatOnBlocksAndValuesAlways) {
  const int64_t rows = 256, cols = 256;
  StoredWeight fp8 = SyntheticStoredWeight(QuantFormat::kFp8Block, Shape{rows, cols}, 5, -1, 1,
                                           128, 128, 0);
  fp8.name = "w";
  StoredWeight mx = SyntheticStoredWeight(QuantFormat::kMxfp4, Shape{rows, cols}, 6, -1, 1, 1, 32, 0);
  mx.name = "e";
  struct Case {
    const StoredWeight* w;
    WeightSlice slice;
    WeightFormat expect;
  };
  const std::vector<Case> cases = {
      {&fp8, WeightSlice::Along(0, 128, 128), WeightFormat::kFp8Block},
      {&fp8, WeightSlice::Along(1, 0, 128), WeightFormat::kFp8Block},
      {&fp8, WeightSlice::Along(0, 64, 64), WeightFormat::kDense},
      {&fp8, WeightSlice::Along(1, 128, 32), WeightFormat::kDense},
      {&mx, WeightSlice::Along(0, 3, 17), WeightFormat::kMxfp4},
      {&mx, WeightSlice::Along(1, 64, 96), WeightFormat::kMxfp4},
      {&mx, WeightSlice::Along(1, 16, 32), WeightFormat::kDense},
  };
  for (const Case& c : cases) {
    auto full = Dequantize(*c.w);
    ASSERT_TRUE(full.ok());
    auto cut = SliceStored(*c.w, c.slice);
    ASSERT_TRUE(cut.ok()) << cut.status();
    EXPECT_EQ(cut->format, c.expect) << c.w->name << " dim " << c.slice.dim << " at " << c.slice.begin;
    auto values = Dequantize(*cut);
    ASSERT_TRUE(values.ok());
    const bool rows_cut = c.slice.dim == 0;
    EXPECT_EQ(values->f32, Block(full->f32, cols, rows_cut ? c.slice.begin : 0,
                                 rows_cut ? c.slice.size : rows, rows_cut ? 0 : c.slice.begin,
                                 rows_cut ? cols : c.slice.size));
    if (c.expect != WeightFormat::kDense) {
      EXPECT_LT(cut->bytes(), c.w->bytes());
    }
  }
}

// Read-time cuts (WeightSource::Stored / F32 with a cut): the same weight as reading all of it
// and cutting after, while reading only the cut's bytes when it falls on the format's blocks.
TEST(WeightSlice, CheckpointReadsOnlyTheCut) {
  std::mt19937 rng(11);
  auto bytes = [&](size_t n, uint8_t avoid_mask, uint8_t avoid) {
    std::vector<uint8_t> v(n);
    for (auto& b : v) {
      do b = static_cast<uint8_t>(rng()); while ((b & avoid_mask) == avoid);
    }
    return v;
  };
  std::vector<testing::NamedTensor> t;
  t.push_back({"model.layers.0.self_attn.q_b_proj.weight", DType::kF8E4M3, {256, 256},
               bytes(256 * 256, 0x7f, 0x7f)});
  t.push_back(testing::F32Tensor("model.layers.0.self_attn.q_b_proj.weight_scale_inv", {2, 2},
                                 {0.5f, 2.0f, 0.25f, 4.0f}));
  t.push_back({"model.layers.0.mlp.experts.0.gate_proj.weight", DType::kU8, {64, 32},
               bytes(64 * 32, 0, 1)});
  t.push_back({"model.layers.0.mlp.experts.0.gate_proj.weight_scale_inv", DType::kF8E8M0, {64, 2},
               bytes(64 * 2, 0xff, 0xff)});
  std::vector<float> dense(48 * 40);
  for (auto& x : dense) x = static_cast<float>(rng() % 1000) / 37.0f;
  t.push_back(testing::F32Tensor("model.layers.0.self_attn.o_b_proj.weight", {48, 40}, dense));
  const std::string dir = testing::TempDir("slice_ckpt");
  testing::WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(t));
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto src = WeightSource::Create(ckpt->get());
  ASSERT_TRUE(src.ok()) << src.status();
  struct Case {
    std::string name;
    Shape shape;
    WeightSlice cut;
    bool reads_less;
  };
  const std::string fp8 = "model.layers.0.self_attn.q_b_proj.weight";
  const std::string mx = "model.layers.0.mlp.experts.0.gate_proj.weight";
  const std::string bf = "model.layers.0.self_attn.o_b_proj.weight";
  const std::vector<Case> cases = {
      {fp8, Shape{256, 256}, WeightSlice::Along(0, 128, 128), true},
      {fp8, Shape{256, 256}, WeightSlice::Along(1, 0, 128), true},
      {fp8, Shape{256, 256}, WeightSlice::Along(0, 64, 64), false},  // off the blocks: all, dense
      {mx, Shape{64, 64}, WeightSlice::Along(0, 10, 20), true},
      {mx, Shape{64, 64}, WeightSlice::Along(1, 32, 32), true},
      {bf, Shape{48, 40}, WeightSlice::Along(0, 5, 12), true},
      {bf, Shape{48, 40}, WeightSlice::Along(1, 8, 12), true},
  };
  for (const Case& c : cases) {
    const uint64_t before_all = src->bytes_read();
    auto all = src->Stored(c.name, c.shape);
    ASSERT_TRUE(all.ok()) << all.status();
    const uint64_t all_bytes = src->bytes_read() - before_all;
    auto want = SliceStored(*all, c.cut);
    ASSERT_TRUE(want.ok());
    const uint64_t before = src->bytes_read();
    auto got = src->Stored(c.name, c.shape, c.cut);
    ASSERT_TRUE(got.ok()) << got.status();
    const uint64_t cut_bytes = src->bytes_read() - before;
    const std::string what = c.name + " dim " + std::to_string(c.cut.dim);
    EXPECT_EQ(got->format, want->format) << what;
    EXPECT_EQ(got->shape, want->shape) << what;
    EXPECT_EQ(got->data, want->data) << what;
    EXPECT_EQ(got->scale_f32, want->scale_f32) << what;
    EXPECT_EQ(got->scale_e8m0, want->scale_e8m0) << what;
    EXPECT_EQ(got->dense.f32, want->dense.f32) << what;
    if (c.reads_less) {
      EXPECT_LT(cut_bytes, all_bytes) << what;
    } else {
      EXPECT_GE(cut_bytes, all_bytes) << what;
    }
    // The dequantising path (--weight-format bf16) reads the same part.
    auto f32 = src->F32(c.name, c.shape, c.cut);
    ASSERT_TRUE(f32.ok()) << f32.status();
    auto values = Dequantize(*want);
    ASSERT_TRUE(values.ok());
    EXPECT_EQ(f32->f32, values->f32) << what;
  }
}

TEST(TensorParallel, SizesThatSplitAndThoseRefusedByName) {
  ModelConfig c;
  c.num_heads = 64;
  c.o_groups = 8;
  c.head_dim = 512;
  c.n_routed_experts = 256;
  c.moe_intermediate_size = 2048;
  for (int n : {1, 2, 4, 8, 16, 32, 64}) EXPECT_TRUE(CheckTensorParallel(c, n).ok()) << n;
  auto three = CheckTensorParallel(c, 3);
  ASSERT_FALSE(three.ok());
  EXPECT_NE(three.message().find("num_attention_heads (64)"), std::string::npos) << three;
  EXPECT_NE(three.message().find("1, 2, 4, 8, 16, 32, 64"), std::string::npos) << three;
  c.n_routed_experts = 96;
  auto experts = CheckTensorParallel(c, 64);
  ASSERT_FALSE(experts.ok());
  EXPECT_NE(experts.message().find("n_routed_experts (96)"), std::string::npos) << experts;
  c.n_routed_experts = 256;
  c.o_groups = 6;
  c.num_heads = 48;
  auto groups = CheckTensorParallel(c, 4);
  ASSERT_FALSE(groups.ok());
  EXPECT_NE(groups.message().find("o_groups (6"), std::string::npos) << groups;
  EXPECT_FALSE(CheckTensorParallel(c, 0).ok());
}

// Every head, group column, expert and shared column is owned by exactly one rank, and a rank's
// heads sit in the groups it holds.
TEST(TensorParallel, ShardsCoverTheLayerOnce) {
  ModelConfig c;
  c.num_heads = 16;
  c.o_groups = 4;
  c.head_dim = 8;
  c.n_routed_experts = 32;
  c.moe_intermediate_size = 64;
  for (int n : {1, 2, 4, 8, 16}) {
    std::set<int64_t> heads, experts, shared, group_cols;
    for (int r = 0; r < n; ++r) {
      auto s = ShardOf(c, {r, n});
      ASSERT_TRUE(s.ok()) << n;
      for (int64_t h = s->head_begin; h < s->head_begin + s->heads; ++h) {
        EXPECT_TRUE(heads.insert(h).second);
        const int64_t g = h / (c.num_heads / c.o_groups);
        EXPECT_GE(g, s->group_begin);
        EXPECT_LT(g, s->group_begin + s->groups);
      }
      for (int64_t g = s->group_begin; g < s->group_begin + s->groups; ++g) {
        for (int64_t col = s->group_col_begin; col < s->group_col_begin + s->group_cols; ++col) {
          EXPECT_TRUE(group_cols.insert(g * 1000 + col).second) << "n=" << n << " g=" << g;
        }
      }
      EXPECT_EQ(s->group_cols * s->groups, s->heads * c.head_dim);
      for (int64_t e = s->expert_begin; e < s->expert_begin + s->experts; ++e) experts.insert(e);
      for (int64_t i = s->shared_begin; i < s->shared_begin + s->shared_inter; ++i) shared.insert(i);
    }
    EXPECT_EQ(heads.size(), 16u);
    EXPECT_EQ(group_cols.size(), static_cast<size_t>(c.o_groups * (c.num_heads / c.o_groups) * c.head_dim));
    EXPECT_EQ(experts.size(), 32u);
    EXPECT_EQ(shared.size(), 64u);
  }
  EXPECT_FALSE(ShardOf(c, {2, 2}).ok());
}

}  // namespace
}  // namespace dsv4
