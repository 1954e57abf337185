// The released quantised layout (tests/data/dsv4-tiny-fp8: FP8 128x128 dense projections, MXFP4
// routed experts, official names) through the CPU engine and WeightSource::Stored, and broken
// variants of it: each must fail at load with an error naming the tensor.
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint/stored_weight.h"
#include "worker/checkpoint/weight_source.h"
#include "worker/tools/golden_check.h"

namespace dsv4 {
namespace {

using testing::NamedTensor;
using testing::TestData;

void ExpectPass(const absl::StatusOr<GoldenReport>& report, double bound) {
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_GE(report->items.size(), 18u);
  for (const GoldenItem& item : report->items) {
    EXPECT_TRUE(item.pass) << item.name << " max_abs=" << item.max_abs << " " << item.detail;
    EXPECT_LE(item.max_abs, bound) << item.name;
  }
}

// Exact dequantisation in fp32: the CPU reference lands near 1e-5, as on dsv4-tiny. Both paths
// (formats kept to the backend, which dequantises; or dequantised at load) give the same.
TEST(QuantizedCheckpoint, Fp8FixturePassesOnTheCpu) {
  GoldenOptions options;
  ExpectPass(RunGoldenCheck(TestData("dsv4-tiny-fp8"), options), 1e-4);
  options.load.keep_formats = false;
  options.batched = false;
  ExpectPass(RunGoldenCheck(TestData("dsv4-tiny-fp8"), options), 1e-4);
}

std::vector<NamedTensor> Fp8Tensors() {
  auto ckpt = Checkpoint::Open(TestData("dsv4-tiny-fp8"));
  EXPECT_TRUE(ckpt.ok());
  std::vector<NamedTensor> out;
  for (const TensorInfo& t : (*ckpt)->tensors()) {
    const uint8_t* p = (*ckpt)->Bytes(t).data;
    out.push_back(NamedTensor{t.name, t.dtype, t.shape, std::vector<uint8_t>(p, p + t.nbytes)});
  }
  return out;
}

// The stored forms of the fixture's tensors: formats, shapes, block grids.
TEST(QuantizedCheckpoint, StoredFormsKeepTheReleasedLayout) {
  auto ckpt = Checkpoint::Open(TestData("dsv4-tiny-fp8"));
  ASSERT_TRUE(ckpt.ok());
  auto src = WeightSource::Create(ckpt->get(), {128, 128});
  ASSERT_TRUE(src.ok());
  auto wq_b = src->Stored("model.layers.1.self_attn.q_b_proj.weight", Shape{256, 64});
  ASSERT_TRUE(wq_b.ok()) << wq_b.status();
  EXPECT_EQ(wq_b->format, WeightFormat::kFp8Block);
  EXPECT_EQ(wq_b->data.size(), 256u * 64);
  EXPECT_EQ(wq_b->scale_f32.size(), 2u);  // ceil(256/128) x ceil(64/128)
  auto w1 = src->Stored("model.layers.1.mlp.experts.0.gate_proj.weight", Shape{64, 128});
  ASSERT_TRUE(w1.ok()) << w1.status();
  EXPECT_EQ(w1->format, WeightFormat::kMxfp4);
  EXPECT_EQ(w1->data.size(), 64u * 64);
  EXPECT_EQ(w1->scale_e8m0.size(), 64u * 4);
  auto embed = src->Stored("model.embed_tokens.weight", Shape{1024, 128});
  ASSERT_TRUE(embed.ok());
  EXPECT_EQ(embed->format, WeightFormat::kDense);
  // Stacked parts dequantise to the parts' values in order; FP8 grids restart per part.
  auto w3 = src->Stored("model.layers.1.mlp.experts.0.up_proj.weight", Shape{64, 128});
  auto a = Dequantize(*w1), b = Dequantize(*w3);
  ASSERT_TRUE(a.ok() && b.ok());
  auto stacked = StackParts({*w1, *w3}, Shape{128, 128});
  ASSERT_TRUE(stacked.ok()) << stacked.status();
  auto both = Dequantize(*stacked);
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(std::vector<float>(both->f32.begin(), both->f32.begin() + 64 * 128), a->f32);
  EXPECT_EQ(std::vector<float>(both->f32.begin() + 64 * 128, both->f32.end()), b->f32);
  auto s1 = src->Stored("model.layers.1.mlp.shared_experts.gate_proj.weight", Shape{64, 128});
  auto s3 = src->Stored("model.layers.1.mlp.shared_experts.up_proj.weight", Shape{64, 128});
  ASSERT_TRUE(s1.ok() && s3.ok());
  auto shared = StackParts({*s1, *s3}, Shape{128, 128});
  ASSERT_TRUE(shared.ok());
  EXPECT_EQ(shared->part_rows, 64);
  EXPECT_EQ(shared->scale_f32.size(), 2u);  // one block per part
  auto sa = Dequantize(*s1), sb = Dequantize(*s3), sab = Dequantize(*shared);
  EXPECT_EQ(std::vector<float>(sab->f32.begin() + 64 * 128, sab->f32.end()), sb->f32);
  EXPECT_EQ(std::vector<float>(sab->f32.begin(), sab->f32.begin() + 64 * 128), sa->f32);
}

// A broken copy of the fixture: `edit` changes its tensors (or the config); the load must fail
// naming `names`.
void ExpectRefused(const std::string& what, std::function<void(std::vector<NamedTensor>&, Json&)> edit,
                   const std::string& names) {
  std::vector<NamedTensor> tensors = Fp8Tensors();
  auto config_text = ReadFileToString(TestData("dsv4-tiny-fp8/config.json"), 1 << 20);
  ASSERT_TRUE(config_text.ok());
  auto config = ParseJson(*config_text, "config");
  ASSERT_TRUE(config.ok());
  edit(tensors, *config);
  const std::string dir = testing::TempDir(absl::StrCat("fp8-broken-", what));
  testing::WriteFile(dir + "/config.json", config->dump());
  for (const char* f : {"golden.json", "golden.safetensors"}) {
    testing::WriteFile(absl::StrCat(dir, "/", f),
                       *ReadFileToString(TestData(absl::StrCat("dsv4-tiny-fp8/", f)), 1 << 26));
  }
  testing::WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(tensors));
  for (bool keep : {true, false}) {
    GoldenOptions options;
    options.load.keep_formats = keep;
    auto report = RunGoldenCheck(dir, options);
    ASSERT_FALSE(report.ok()) << what;
    EXPECT_NE(report.status().ToString().find(names), std::string::npos)
        << what << ": " << report.status();
  }
}

NamedTensor& Find(std::vector<NamedTensor>& ts, const std::string& name) {
  for (auto& t : ts) {
    if (t.name == name) return t;
  }
  ADD_FAILURE() << "no tensor " << name;
  return ts.front();
}

TEST(QuantizedCheckpoint, BrokenScalesAndFormatsAreNamed) {
  ExpectRefused("missing-scale", [](auto& ts, Json&) {
    std::erase_if(ts, [](const NamedTensor& t) { return t.name == "layers.1.attn.wq_b.scale"; });
  }, "wq_b");
  ExpectRefused("misshapen-scale", [](auto& ts, Json&) {
    NamedTensor& s = Find(ts, "layers.1.attn.wq_b.scale");
    s.shape = {1, 1};
    s.bytes.resize(1);
  }, "wq_b");
  ExpectRefused("block-does-not-fit", [](auto&, Json& c) {
    c["quantization_config"]["weight_block_size"] = {64, 64};  // scales are for 128x128
  }, "scale");
  ExpectRefused("wrong-dtype", [](auto& ts, Json&) {
    NamedTensor& w = Find(ts, "layers.1.attn.wkv.weight");
    w.dtype = DType::kI64;
    w.shape = {64, 16};
  }, "wkv");
  ExpectRefused("nan-fp8-code", [](auto& ts, Json&) {
    Find(ts, "layers.1.attn.wo_b.weight").bytes[17] = 0x7f;
  }, "wo_b");
  ExpectRefused("nan-mxfp4-scale", [](auto& ts, Json&) {
    Find(ts, "layers.1.ffn.experts.0.w2.scale").bytes[3] = 0xff;
  }, "experts.0.w2");
  ExpectRefused("mxfp4-shape", [](auto& ts, Json&) {
    NamedTensor& w = Find(ts, "layers.1.ffn.experts.0.w1.weight");
    w.shape = {64, 32};
    w.bytes.resize(64 * 32);
  }, "experts.0.w1");
  ExpectRefused("mxfp4-scale-dtype", [](auto& ts, Json&) {
    NamedTensor& s = Find(ts, "layers.1.ffn.experts.0.w3.scale");
    s.dtype = DType::kF32;
    s.shape = {64, 1};
  }, "experts.0.w3");
}

}  // namespace
}  // namespace dsv4
