// Properties every correct DSV4 engine has, checked on synthetic models of many configs (other
// hc_mult, ratios, top-k, layer orders, vocab sizes), bit for bit: batched == one at a time,
// chunked prefill == one-shot prefill == token-by-token decode, shortcut == forced indexer scoring, and the
// result does not depend on the KV block size or on which physical blocks are used. On the CPU
// reference and on the GPU in batch-invariant mode (fp32 and bf16; skipped without a device).
#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "tests/gpu/backend_pair.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/test_backends.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/model/dsv4_model.h"
#include "worker/model/local_sequences.h"

namespace dsv4 {
namespace {

using Logits = SequenceStep::Logits;
using testing::TestBackend;

struct Variant {
  std::string name;
  std::function<void(Json&)> edit;
};

void PrintTo(const Variant& v, std::ostream* os) { *os << v.name; }

std::vector<Variant> Variants() {
  return {
      {"tiny", [](Json&) {}},
      {"hc2_ratios8_32_topk4",
       [](Json& j) {
         j["hc_mult"] = 2;
         j["compress_rates"] = {{"compressed_sparse_attention", 8},
                                {"heavily_compressed_attention", 32}};
         j["index_topk"] = 4;
         j["layer_types"] = {"heavily_compressed_attention", "compressed_sparse_attention",
                             "sliding_attention", "compressed_sparse_attention"};
         j["mlp_layer_types"] = {"hash_moe", "moe", "moe", "moe"};
         j["num_hidden_layers"] = 4;
         j["vocab_size"] = 777;
         j["num_attention_heads"] = 8;
         j["o_groups"] = 4;
         j["o_lora_rank"] = 16;
         j["head_dim"] = 32;
         j["qk_rope_head_dim"] = 8;
         j["partial_rotary_factor"] = 0.25;
         j["rope_parameters"]["main"]["partial_rotary_factor"] = 0.25;
         j["rope_parameters"]["compress"]["partial_rotary_factor"] = 0.25;
         j["index_n_heads"] = 4;
         j["index_head_dim"] = 16;
         j["n_routed_experts"] = 5;
         j["num_experts_per_tok"] = 3;
       }},
      {"hc1_csa_only_window8",
       [](Json& j) {
         j["hc_mult"] = 1;
         j["sliding_window"] = 8;
         j["compress_rates"] = {{"compressed_sparse_attention", 2},
                                {"heavily_compressed_attention", 8}};
         j["index_topk"] = 3;
         j["num_hidden_layers"] = 2;
         j["layer_types"] = {"compressed_sparse_attention", "compressed_sparse_attention"};
         j["mlp_layer_types"] = {"moe", "moe"};
         j["hc_sinkhorn_iters"] = 3;
       }},
      {"sliding_only",
       [](Json& j) {
         j["num_hidden_layers"] = 2;
         j["layer_types"] = {"sliding_attention", "sliding_attention"};
         j["mlp_layer_types"] = {"hash_moe", "moe"};
         j["sliding_window"] = 5;
       }},
      // 16 heads of 128 dims: the GPU's bf16 tensor-core attention.
      {"heads16_dim128",
       [](Json& j) {
         j["num_attention_heads"] = 16;
         j["head_dim"] = 128;
         j["qk_rope_head_dim"] = 32;  // partial_rotary_factor 0.25
         j["o_groups"] = 4;
       }},
      {"hca_only_hc3",
       [](Json& j) {
         j["hc_mult"] = 3;
         j["num_hidden_layers"] = 2;
         j["layer_types"] = {"heavily_compressed_attention", "heavily_compressed_attention"};
         j["mlp_layer_types"] = {"moe", "hash_moe"};
         j["compress_rates"]["heavily_compressed_attention"] = 8;
         j["num_experts_per_tok"] = 1;
       }},
  };
}

class ModelConsistency : public ::testing::TestWithParam<std::tuple<Variant, TestBackend>> {
 protected:
  void SetUp() override {
    backend_ = std::get<1>(GetParam());
    if (testing::IsCuda(backend_)) DSV4_REQUIRE_GPU();
    Json j = testing::TinyConfigJson();
    std::get<0>(GetParam()).edit(j);
    auto config = ParseModelConfig(j.dump());
    ASSERT_TRUE(config.ok()) << config.status();
    config_ = *config;
    dir_ = testing::WriteSyntheticModel("model", j, /*seed=*/11);
    auto ckpt = Checkpoint::Open(dir_);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    ckpt_ = std::move(*ckpt);
    std::mt19937 rng(99);
    for (int s = 0; s < 3; ++s) {
      std::vector<int32_t> p(kLen - 9 * s);
      for (auto& t : p) t = static_cast<int32_t>(rng() % config_.vocab_size);
      prompts_.push_back(p);
    }
  }

  std::unique_ptr<Dsv4Model> Load(int32_t block_size = 0) {
    CacheConfig cache;
    cache.block_size = block_size;
    cache.num_slots = 4;
    const int32_t bs = block_size > 0 ? block_size : DefaultBlockSize(config_);
    cache.num_blocks = 4 * ((kLen + bs - 1) / bs) + 3;
    auto backend = testing::MakeTestBackend(backend_);
    EXPECT_TRUE(backend.ok()) << backend.status();
    if (!backend.ok()) return nullptr;
    auto model = Dsv4Model::Load(config_, *ckpt_, std::move(*backend), cache);
    EXPECT_TRUE(model.ok()) << model.status();
    return model.ok() ? std::move(*model) : nullptr;
  }

  // Runs `prompt` with the given chunk sizes (last chunk takes the rest); logits at every position.
  std::vector<float> RunChunked(Dsv4Model& model, const std::vector<int32_t>& prompt,
                                std::vector<int> chunks, bool force = false,
                                bool reverse_blocks = false) {
    LocalSequences seqs(model, reverse_blocks);
    const int id = *seqs.Create();
    std::vector<float> all;
    size_t pos = 0;
    StepOptions opts;
    opts.force_indexer_scoring = force;
    while (pos < prompt.size()) {
      size_t n = chunks.empty() ? prompt.size() - pos : std::min<size_t>(chunks.front(), prompt.size() - pos);
      if (!chunks.empty()) chunks.erase(chunks.begin());
      auto step = seqs.Next(id, std::span(prompt).subspan(pos, n), Logits::kAll);
      EXPECT_TRUE(step.ok());
      StepLogits out;
      const absl::Status s = model.Step({&*step, 1}, opts, &out);
      EXPECT_TRUE(s.ok()) << s;
      seqs.Advance(id, static_cast<int64_t>(n));
      all.insert(all.end(), out.values.begin(), out.values.end());
      pos += n;
    }
    return all;
  }

  static double MaxDiff(const std::vector<float>& a, const std::vector<float>& b) {
    EXPECT_EQ(a.size(), b.size());
    double m = 0;
    for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
      m = std::max(m, static_cast<double>(std::fabs(a[i] - b[i])));
    }
    return m;
  }

  static constexpr int kLen = 70;
  // Bit for bit: the CPU backend is batch-invariant (kernels/cpu_gemm.h), and so is the GPU in
  // batch-invariant mode; prefix caching relies on it (a hit's suffix must give the bits a cold
  // prefill gives).
  static constexpr double kTol = 0;
  TestBackend backend_ = TestBackend::kCpu;
  ModelConfig config_;
  std::string dir_;
  std::unique_ptr<Checkpoint> ckpt_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_P(ModelConsistency, ChunkedAndTokenByTokenEqualOneShot) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  const auto& p = prompts_[0];
  const auto one_shot = RunChunked(*model, p, {});
  ASSERT_EQ(one_shot.size(), p.size() * config_.vocab_size);
  EXPECT_LE(MaxDiff(RunChunked(*model, p, {1, 2, 3, 5, 8, 13, 21}), one_shot), kTol);
  EXPECT_LE(MaxDiff(RunChunked(*model, p, {31, 7}), one_shot), kTol);
  EXPECT_LE(MaxDiff(RunChunked(*model, p, std::vector<int>(p.size(), 1)), one_shot), kTol);
}

TEST_P(ModelConsistency, ShortcutEqualsForcedScoring) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  for (const auto& p : prompts_) {
    // Where every visible candidate fits in top-k, scoring must select them all too.
    EXPECT_LE(MaxDiff(RunChunked(*model, p, {}, /*force=*/true), RunChunked(*model, p, {})), kTol);
  }
}

TEST_P(ModelConsistency, BlockSizeAndPlacementDoNotMatter) {
  auto a = Load();
  const int32_t bs = DefaultBlockSize(config_);
  auto b = Load(bs * 2);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const auto& p = prompts_[1];
  const auto ref = RunChunked(*a, p, {9, 9});
  EXPECT_LE(MaxDiff(RunChunked(*b, p, {9, 9}), ref), kTol);
  EXPECT_LE(MaxDiff(RunChunked(*a, p, {9, 9}, false, /*reverse_blocks=*/true), ref), kTol);
}

TEST_P(ModelConsistency, BatchedEqualsOneAtATime) {
  auto model = Load();
  ASSERT_NE(model, nullptr);
  std::vector<std::vector<float>> alone;
  for (const auto& p : prompts_) alone.push_back(RunChunked(*model, p, {}));
  // All three sequences share every step, each with its own chunk schedule (prefill chunks and
  // decode tokens mixed in one ragged batch).
  const std::vector<std::vector<int>> schedules = {{5, 1, 1, 20, 1}, {1, 1, 17, 3}, {12, 12, 1, 1}};
  LocalSequences seqs(*model, /*reverse_blocks=*/true);
  std::vector<int> ids;
  std::vector<size_t> pos(prompts_.size(), 0);
  std::vector<std::vector<float>> got(prompts_.size());
  for (size_t i = 0; i < prompts_.size(); ++i) ids.push_back(*seqs.Create());
  for (int step = 0;; ++step) {
    std::vector<SequenceStep> steps;
    std::vector<size_t> who, count;
    for (size_t i = 0; i < prompts_.size(); ++i) {
      if (pos[i] >= prompts_[i].size()) continue;
      const int want = step < static_cast<int>(schedules[i].size()) ? schedules[i][step] : 1;
      const size_t n = std::min<size_t>(want, prompts_[i].size() - pos[i]);
      auto s = seqs.Next(ids[i], std::span(prompts_[i]).subspan(pos[i], n), Logits::kAll);
      ASSERT_TRUE(s.ok());
      steps.push_back(*s);
      who.push_back(i);
      count.push_back(n);
    }
    if (steps.empty()) break;
    StepLogits out;
    ASSERT_TRUE(model->Step(steps, StepOptions{}, &out).ok());
    for (size_t r = 0; r < who.size(); ++r) {
      const size_t i = who[r];
      got[i].insert(got[i].end(), out.values.begin() + out.seq_row_begin[r] * out.vocab,
                    out.values.begin() + out.seq_row_begin[r + 1] * out.vocab);
      seqs.Advance(ids[i], static_cast<int64_t>(count[r]));
      pos[i] += count[r];
    }
  }
  for (size_t i = 0; i < prompts_.size(); ++i) EXPECT_LE(MaxDiff(got[i], alone[i]), kTol) << i;
}

INSTANTIATE_TEST_SUITE_P(Configs, ModelConsistency,
                         ::testing::Combine(::testing::ValuesIn(Variants()),
                                            ::testing::Values(TestBackend::kCpu,
                                                              TestBackend::kCudaFp32Invariant,
                                                              TestBackend::kCudaBf16Invariant)),
                         [](const auto& i) {
                           return std::get<0>(i.param).name + "_" +
                                  testing::TestBackendName(std::get<1>(i.param));
                         });

// Bad steps are rejected before any state is touched.
TEST(ModelStep, RejectsBadBatchesWithoutSideEffects) {
  auto config = LoadModelConfig(testing::TestData("dsv4-tiny/config.json"));
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::Open(testing::TestData("dsv4-tiny"));
  ASSERT_TRUE(ckpt.ok());
  CacheConfig cache;
  cache.num_slots = 2;
  cache.num_blocks = 8;
  cache.max_model_len = 256;
  auto model = Dsv4Model::Load(*config, **ckpt, std::make_unique<CpuBackend>(), cache);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::vector<int32_t> tokens = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
  const std::vector<int32_t> blocks = {0, 1, 2, 3};
  auto run = [&](SequenceStep s) {
    StepLogits out;
    return (*model)->Step({&s, 1}, StepOptions{}, &out);
  };
  SequenceStep good{tokens, 0, 0, blocks, Logits::kLast};
  StepLogits before;
  ASSERT_TRUE((*model)->Step({&good, 1}, StepOptions{}, &before).ok());

  const std::vector<int32_t> bad_token = {5, 1024};
  const std::vector<int32_t> bad_blocks = {0, 99};
  struct Case {
    SequenceStep step;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {{bad_token, 0, 0, blocks, Logits::kLast}, "token id 1024"},
      {{std::span<const int32_t>(), 0, 0, blocks, Logits::kLast}, "no tokens"},
      {{tokens, 250, 0, blocks, Logits::kLast}, "exceed the model length"},
      {{tokens, -1, 0, blocks, Logits::kLast}, "exceed"},
      {{tokens, 0, 5, blocks, Logits::kLast}, "state slot 5"},
      {{tokens, 60, 0, std::span<const int32_t>(blocks).first(1), Logits::kLast}, "block table"},
      {{tokens, 60, 0, bad_blocks, Logits::kLast}, "block 99"},
  };
  for (const auto& c : cases) {
    const absl::Status s = run(c.step);
    ASSERT_FALSE(s.ok()) << c.expect;
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << s;
  }
  // Two sequences may not share a state slot.
  std::vector<SequenceStep> twice = {good, good};
  StepLogits out;
  EXPECT_FALSE((*model)->Step(twice, StepOptions{}, &out).ok());
  // The rejected steps left slot 0 alone: re-running the same prefill gives the same logits.
  StepLogits after;
  ASSERT_TRUE((*model)->Step({&good, 1}, StepOptions{}, &after).ok());
  EXPECT_EQ(before.values, after.values);
}

TEST(ModelLoad, RejectsBadCacheConfigs) {
  auto config = LoadModelConfig(testing::TestData("dsv4-tiny/config.json"));
  auto ckpt = Checkpoint::Open(testing::TestData("dsv4-tiny"));
  ASSERT_TRUE(config.ok() && ckpt.ok());
  CacheConfig cache;
  cache.num_slots = 1;
  cache.num_blocks = 1;
  cache.block_size = 12;  // not a multiple of the HCA ratio 16
  auto model = Dsv4Model::Load(*config, **ckpt, std::make_unique<CpuBackend>(), cache);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("multiple"), std::string::npos);
  cache.block_size = 16;
  cache.num_slots = 0;
  EXPECT_FALSE(Dsv4Model::Load(*config, **ckpt, std::make_unique<CpuBackend>(), cache).ok());
}

}  // namespace
}  // namespace dsv4

namespace dsv4 {
namespace {

// Synthetic weights (no file): deterministic per seed, different across seeds, finite logits.
TEST(SyntheticModel, DeterministicPerSeedAndFinite) {
  Json j = testing::TinyConfigJson();
  auto config = ParseModelConfig(j.dump());
  ASSERT_TRUE(config.ok()) << config.status();
  CacheConfig cache;
  cache.num_slots = 2;
  cache.num_blocks = 8;
  cache.max_model_len = 256;
  auto run = [&](uint64_t seed) {
    auto model = Dsv4Model::LoadSynthetic(*config, seed, std::make_unique<CpuBackend>(), cache);
    EXPECT_TRUE(model.ok()) << model.status();
    if (!model.ok()) return std::vector<float>{};
    LocalSequences seqs(**model, false);
    const int id = *seqs.Create();
    std::vector<int32_t> prompt(40);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7) % config->vocab_size);
    auto step = seqs.Next(id, prompt, SequenceStep::Logits::kAll);
    EXPECT_TRUE(step.ok());
    StepLogits out;
    const absl::Status s = (*model)->Step({&*step, 1}, StepOptions{}, &out);
    EXPECT_TRUE(s.ok()) << s;
    return out.values;
  };
  const auto a = run(5), b = run(5), c = run(6);
  ASSERT_EQ(a.size(), 40u * config->vocab_size);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (float v : a) ASSERT_TRUE(std::isfinite(v));
  // Not degenerate: logits vary across the vocabulary.
  const auto [lo, hi] = std::minmax_element(a.begin(), a.begin() + config->vocab_size);
  EXPECT_GT(*hi - *lo, 1e-3f);
}

}  // namespace
}  // namespace dsv4
