// The load's memory plan (Dsv4Model::PlanMemory) at DeepSeek-V4-Flash's shapes, and the refusal
// of a model that does not fit, before anything is allocated.
#include <cmath>
#include <limits>
#include <memory>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/model/dsv4_model.h"

namespace dsv4 {
namespace {

// Matrices kept as stored and synthetic ones in the released formats.
LoadOptions ReleasedLoad() {
  LoadOptions o;
  o.keep_formats = true;
  o.synthetic_released_formats = true;
  return o;
}

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

// A cache of `slots` sequences of `max_len` tokens in 128-token blocks, with the step budget
// (CacheConfig::max_step_tokens, max_graph_tokens).
CacheConfig Cache(int32_t slots, int32_t max_len, int32_t step_tokens = 0, int32_t graph_tokens = -1) {
  CacheConfig c;
  c.num_slots = slots;
  c.max_model_len = max_len;
  c.block_size = 128;
  c.num_blocks = slots * ((max_len + 127) / 128);
  c.max_step_tokens = step_tokens;
  c.max_graph_tokens = graph_tokens;
  return c;
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
  const CacheConfig cache = Cache(64, 8192);
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
  const CacheConfig cache = Cache(4, 1024);
  auto m = Dsv4Model::LoadSynthetic(Flash(43), 1, std::make_unique<PlanningBackend>(80ull << 30),
                                    cache, ReleasedLoad());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(m.status().message().find("does not fit"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("MiB of device memory"), std::string::npos);
}

// Step scratch: large steps (a layer's scratch reused by the next) grow with the step's tokens
// and one layer; decode batches (every layer's scratch kept) with the depth.
TEST(MemoryPlan, StepScratchCountsOneLayerForLargeStepsAndEveryLayerForBatches) {
  const CacheConfig cache = Cache(64, 8192, 0, 64);  // decode graphs of up to the 64 slots
  auto scratch = [&](int layers, int32_t tokens) {
    CacheConfig c = cache;
    c.max_step_tokens = tokens;
    return static_cast<double>(Dsv4Model::StepScratchBytes(Flash(layers), c));
  };
  // A prefill of 8k tokens: about the same at 9 and 37 layers (the per-layer tensors are the
  // same; the layer kinds differ a little), and half a 16k one (the indexer's scores included).
  EXPECT_LT(scratch(37, 8192), 1.2 * scratch(9, 8192));
  EXPECT_NEAR(scratch(37, 16384) / scratch(37, 8192), 2.0, 0.05);
  // Steps of 64 tokens (the slots' decode batch) keep every layer: the depth counts.
  EXPECT_GT(scratch(37, 64), 3.5 * scratch(9, 64));
  // Flash's layer at 8k tokens: q and o alone are 2 x 64 x 512 fp32 values a token (2 GiB).
  EXPECT_GT(scratch(37, 8192), 2.0 * (1ull << 30));
  const CacheConfig none = cache;  // max_step_tokens 0: the default budget
  EXPECT_EQ(Dsv4Model::StepScratchBytes(Flash(37), none), static_cast<uint64_t>(scratch(37, 2048)));
}

// The step scratch is part of what must fit, and the refusal says so.
TEST(MemoryPlan, StepScratchIsPartOfTheFit) {
  CacheConfig cache = Cache(4, 1 << 16, 1 << 16);  // a 64k-token step: tens of GiB of activations
  auto m = Dsv4Model::LoadSynthetic(Flash(2), 1, std::make_unique<PlanningBackend>(40ull << 30),
                                    cache, ReleasedLoad());
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(m.status().message().find("step scratch"), std::string::npos) << m.status();
  cache.max_step_tokens = 512;
  auto plan = Dsv4Model::PlanMemory(Flash(2), cache, PlanningBackend(0), Released);
  ASSERT_TRUE(plan.ok());
  EXPECT_LT(plan->weight_bytes() + plan->pools + plan->step_scratch, 30ull << 30);
}

// The plan covers what the CUDA backend's arenas held on the H200 for Flash cut to 37 layers
// (bench/results/2026-12-02-quantized/runB): 4064 MiB with 64 x 8k of state, decode graphs of up
// to 64 and a 2048-token step; 11522 MiB for one 8192-token prompt, 1280 MiB for 1024 (graphs of
// one token: the decode).
TEST(MemoryPlan, StepScratchCoversWhatTheArenasHeld) {
  const double mib = 1 << 20;
  const CacheConfig serve = Cache(64, 8018, 2048, 64);
  EXPECT_GE(Dsv4Model::StepScratchBytes(Flash(37), serve) / mib, 4064);
  EXPECT_LE(Dsv4Model::StepScratchBytes(Flash(37), serve) / mib, 2.5 * 4064);
  for (const auto& [tokens, held] : {std::pair{8192, 11522}, std::pair{1024, 1280}}) {
    const CacheConfig one = Cache(1, tokens + 4, tokens, 1);
    EXPECT_GE(Dsv4Model::StepScratchBytes(Flash(37), one) / mib, held) << tokens;
    // and not far above it (the plan must not refuse what fits)
    EXPECT_LE(Dsv4Model::StepScratchBytes(Flash(37), one) / mib, 2.5 * held) << tokens;
  }
}

// Steps run as graphs keep every layer's scratch: piecewise prefill of up to 512 tokens on a
// deep model needs far more than the same step run eagerly.
TEST(MemoryPlan, GraphStepsCountEveryLayer) {
  CacheConfig c = Cache(64, 8192, 2048, 64);
  const double decode_graphs = static_cast<double>(Dsv4Model::StepScratchBytes(Flash(37), c));
  c.max_graph_tokens = 512;
  const double prefill_graphs = static_cast<double>(Dsv4Model::StepScratchBytes(Flash(37), c));
  EXPECT_GT(prefill_graphs, 5 * decode_graphs);
  c.max_graph_tokens = -1;  // unknown: as 512
  EXPECT_EQ(static_cast<double>(Dsv4Model::StepScratchBytes(Flash(37), c)), prefill_graphs);
}

// A config at the validation limits saturates instead of wrapping.
TEST(MemoryPlan, StepScratchSaturates) {
  ModelConfig c = Flash(2);
  c.num_heads = 1 << 20;
  c.head_dim = 1 << 20;
  CacheConfig cache;
  cache.num_slots = 1 << 20;
  cache.max_step_tokens = 1 << 30;
  cache.max_model_len = 1 << 30;
  EXPECT_EQ(Dsv4Model::StepScratchBytes(c, cache), std::numeric_limits<uint64_t>::max());
}

}  // namespace
}  // namespace dsv4
