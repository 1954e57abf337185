// The load's memory plan (Dsv4Model::PlanMemory) at DeepSeek-V4-Flash's shapes, and the refusal
// of a model that does not fit, before anything is allocated.
#include <cmath>
#include <memory>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/model/dsv4_model.h"

namespace dsv4 {
namespace {

// A CPU backend that plans like the CUDA one: bf16 dense matrices, FP8/MXFP4 kept, a device of
// `free_bytes`.
class PlanningBackend final : public CpuBackend {
 public:
  explicit PlanningBackend(uint64_t free_bytes) : free_(free_bytes) {}
  int DenseMatrixBytes() const override { return 2; }
  bool KeepsQuantizedMatrices() const override { return true; }
  absl::StatusOr<uint64_t> FreeMemoryBytes() const override { return free_; }

 private:
  uint64_t free_;
};

ModelConfig Flash(int layers) {
  auto text = ReadFileToString(testing::TestData("configs/dsv4-flash.json"), 1 << 20);
  EXPECT_TRUE(text.ok());
  auto j = ParseJson(*text, "flash");
  EXPECT_TRUE(j.ok());
  (*j)["num_hidden_layers"] = layers;
  auto& lt = (*j)["layer_types"];
  lt.erase(lt.begin() + layers, lt.end());
  auto& mt = (*j)["mlp_layer_types"];
  mt.erase(mt.begin() + layers, mt.end());
  auto c = ParseModelConfig(j->dump());
  EXPECT_TRUE(c.ok()) << c.status();
  return *c;
}

// Released formats: what the model's name policy quantises (the synthetic loader's policy).
QuantFormat Released(const std::string& n) {
  if (n.find("mlp.experts.") != std::string::npos) return QuantFormat::kMxfp4;
  if (n.find("self_attn.compressor.") != std::string::npos &&
      n.find("indexer.q_b_proj") == std::string::npos) {
    return QuantFormat::kNone;
  }
  if (n.find("embed") != std::string::npos || n.find("lm_head") != std::string::npos ||
      n.find("weights_proj") != std::string::npos || n.find("mlp.gate") != std::string::npos) {
    return QuantFormat::kNone;
  }
  return QuantFormat::kFp8Block;
}

TEST(MemoryPlan, FlashWeightsInTheReleasedFormats) {
  PlanningBackend be(0);
  CacheConfig cache;
  cache.num_slots = 64;
  cache.max_model_len = 8192;
  cache.block_size = 128;
  cache.num_blocks = 64 * 8192 / 128;
  auto quant = Dsv4Model::PlanMemory(Flash(43), cache, be, Released);
  auto dense = Dsv4Model::PlanMemory(Flash(43), cache, be, [](const std::string&) {
    return QuantFormat::kNone;
  });
  ASSERT_TRUE(quant.ok() && dense.ok());
  const double gb = 1e9;
  // dsv4-model.md / architecture.md: about 155 GB as released, about 570 GB in bf16.
  EXPECT_GT(quant->weight_bytes() / gb, 140);
  EXPECT_LT(quant->weight_bytes() / gb, 170);
  EXPECT_GT(dense->weight_bytes() / gb, 520);
  EXPECT_LT(dense->weight_bytes() / gb, 620);
  EXPECT_GT(quant->weights.at("routed_experts"), quant->weight_bytes() * 0.8);
  EXPECT_EQ(quant->pools, dense->pools);
  EXPECT_GT(quant->pools, 0u);
}

// A model that does not fit is refused before any weight is made, naming what it needs.
TEST(MemoryPlan, ModelThatDoesNotFitIsRefused) {
  CacheConfig cache;
  cache.num_slots = 4;
  cache.max_model_len = 1024;
  cache.block_size = 128;
  cache.num_blocks = 32;
  auto m = Dsv4Model::LoadSynthetic(Flash(43), 1, std::make_unique<PlanningBackend>(80ull << 30),
                                    cache, LoadOptions{true, true});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(m.status().message().find("does not fit"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("MiB of device memory"), std::string::npos);
}

}  // namespace
}  // namespace dsv4
