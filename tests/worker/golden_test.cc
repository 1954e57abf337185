// The transformers fixture (tests/data/dsv4-tiny) through the whole CPU engine.
#include "worker/tools/golden_check.h"

#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/checkpoint/tensor_names.h"

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
  EXPECT_TRUE(report->pass());
}

TEST(Golden, TinyFixturePasses) {
  GoldenOptions options;
  // The acceptance bound is the fixture's 2e-3; an exact fp32 implementation lands near 1e-5.
  ExpectPass(RunGoldenCheck(TestData("dsv4-tiny"), options), 1e-4);
}

TEST(Golden, TinyFixtureWithForcedIndexerScoringAndSmallBlocks) {
  GoldenOptions options;
  options.force_indexer_scoring = true;
  options.cache.block_size = 16;
  ExpectPass(RunGoldenCheck(TestData("dsv4-tiny"), options), 1e-4);
}

// The fixture's weights re-saved under other names and layouts must give the same result.
class GoldenRenamed : public ::testing::TestWithParam<std::string> {};

std::vector<NamedTensor> FixtureTensors() {
  auto ckpt = Checkpoint::Open(TestData("dsv4-tiny"));
  EXPECT_TRUE(ckpt.ok());
  std::vector<NamedTensor> out;
  for (const TensorInfo& t : (*ckpt)->tensors()) {
    const uint8_t* p = (*ckpt)->Bytes(t).data;
    out.push_back(NamedTensor{t.name, t.dtype, t.shape, std::vector<uint8_t>(p, p + t.nbytes)});
  }
  return out;
}

std::string OfficialName(const std::string& fixture_name) {
  if (fixture_name == "model.embed_tokens.weight") return "embed.weight";
  if (fixture_name.rfind("model.hc_head.hc_", 0) == 0) return "hc_head_" + fixture_name.substr(17);
  if (fixture_name.rfind("model.", 0) == 0) return fixture_name.substr(6);
  return fixture_name;
}

TEST_P(GoldenRenamed, SameResult) {
  const std::string mode = GetParam();
  std::vector<NamedTensor> tensors = FixtureTensors();
  if (mode == "official") {
    for (auto& t : tensors) t.name = OfficialName(t.name);
  } else if (mode == "hf") {
    // HF in-memory names, with the routed experts fused into [E, 2I, D] and [E, D, I].
    std::map<std::string, std::map<int, std::map<std::string, NamedTensor>>> experts;
    std::vector<NamedTensor> rest;
    for (auto& t : tensors) {
      const std::string c = *CanonicalTensorName(t.name);
      const size_t at = c.find(".mlp.experts.");
      if (at != std::string::npos) {
        const std::string layer = c.substr(0, at);
        std::string tail = c.substr(at + 13);  // "E.gate_proj.weight"
        const int e = std::stoi(tail.substr(0, tail.find('.')));
        const std::string proj = tail.substr(tail.find('.') + 1);
        experts[layer][e][proj] = t;
      } else {
        t.name = c;
        rest.push_back(t);
      }
    }
    for (auto& [layer, by_expert] : experts) {
      NamedTensor gu{layer + ".mlp.experts.gate_up_proj", DType::kF32, {}, {}};
      NamedTensor down{layer + ".mlp.experts.down_proj", DType::kF32, {}, {}};
      const auto& first = by_expert.begin()->second;
      const int64_t E = static_cast<int64_t>(by_expert.size());
      const int64_t I = first.at("gate_proj.weight").shape[0];
      const int64_t D = first.at("gate_proj.weight").shape[1];
      gu.shape = {E, 2 * I, D};
      down.shape = {E, D, I};
      for (auto& [e, projs] : by_expert) {
        for (const char* p : {"gate_proj.weight", "up_proj.weight"}) {
          gu.bytes.insert(gu.bytes.end(), projs.at(p).bytes.begin(), projs.at(p).bytes.end());
        }
        down.bytes.insert(down.bytes.end(), projs.at("down_proj.weight").bytes.begin(),
                          projs.at("down_proj.weight").bytes.end());
      }
      rest.push_back(gu);
      rest.push_back(down);
    }
    tensors = std::move(rest);
  }
  const std::string dir = testing::TempDir(mode);
  for (const char* f : {"config.json", "golden.json"}) {
    auto text = ReadFileToString(TestData(absl::StrCat("dsv4-tiny/", f)), 1 << 24);
    ASSERT_TRUE(text.ok());
    testing::WriteFile(absl::StrCat(dir, "/", f), *text);
  }
  auto golden = ReadFileToString(TestData("dsv4-tiny/golden.safetensors"), 1 << 26);
  ASSERT_TRUE(golden.ok());
  testing::WriteFile(dir + "/golden.safetensors", *golden);
  if (mode == "sharded") {
    Json index = {{"metadata", Json::object()}, {"weight_map", Json::object()}};
    std::vector<std::vector<NamedTensor>> shards(3);
    for (size_t i = 0; i < tensors.size(); ++i) {
      const std::string file = absl::StrCat("model-0000", i % 3 + 1, "-of-00003.safetensors");
      index["weight_map"][tensors[i].name] = file;
      shards[i % 3].push_back(tensors[i]);
    }
    for (int s = 0; s < 3; ++s) {
      testing::WriteFile(absl::StrCat(dir, "/model-0000", s + 1, "-of-00003.safetensors"),
                         testing::SafetensorsBytes(shards[s]));
    }
    testing::WriteFile(dir + "/model.safetensors.index.json", index.dump());
  } else {
    testing::WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(tensors));
  }
  GoldenOptions options;
  options.batched = false;
  ExpectPass(RunGoldenCheck(dir, options), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Layouts, GoldenRenamed,
                         ::testing::Values("official", "hf", "sharded"));

TEST(Golden, MissingTensorIsNamed) {
  std::vector<NamedTensor> tensors = FixtureTensors();
  std::erase_if(tensors, [](const NamedTensor& t) {
    return t.name == "model.layers.3.attn.indexer.weights_proj.weight";
  });
  const std::string dir = testing::TempDir("missing");
  auto config = ReadFileToString(TestData("dsv4-tiny/config.json"), 1 << 20);
  testing::WriteFile(dir + "/config.json", *config);
  testing::WriteFile(dir + "/golden.json", *ReadFileToString(TestData("dsv4-tiny/golden.json"), 1 << 24));
  testing::WriteFile(dir + "/golden.safetensors",
                     *ReadFileToString(TestData("dsv4-tiny/golden.safetensors"), 1 << 26));
  testing::WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(tensors));
  auto report = RunGoldenCheck(dir, GoldenOptions{});
  ASSERT_FALSE(report.ok());
  EXPECT_NE(report.status().message().find(
                "model.layers.3.self_attn.compressor.indexer.scorer.weights_proj.weight"),
            std::string::npos)
      << report.status();
}

}  // namespace
}  // namespace dsv4
