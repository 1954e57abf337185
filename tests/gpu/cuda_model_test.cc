// The whole model on the GPU (label `gpu`): the transformers fixture in fp32 (CPU pass criteria)
// and bf16 (documented tolerance, greedy ids where the margin allows), GPU vs CPU engines on
// synthetic models up to Flash widths over ragged prefill/decode schedules, and on-device sampling
// against the CPU worker's sampler.
#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "tests/gpu/backend_pair.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/cpu_worker.h"
#include "worker/model/local_sequences.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/tools/golden_check.h"

namespace dsv4 {
namespace {

// The checkpoint's formats kept (true) or dequantised at load (false).
LoadOptions Keep(bool keep) {
  LoadOptions o;
  o.keep_formats = keep;
  o.synthetic_released_formats = false;
  return o;
}

using Logits = SequenceStep::Logits;

void ExpectGoldenPass(const GoldenOptions& options, double bound) {
  auto report = RunGoldenCheck(testing::TestData("dsv4-tiny"), options);
  ASSERT_TRUE(report.ok()) << report.status();
  ASSERT_GE(report->items.size(), 18u);
  for (const GoldenItem& item : report->items) {
    std::printf("    %-28s max_abs=%.3g %s\n", item.name.c_str(), item.max_abs, item.detail.c_str());
    EXPECT_TRUE(item.pass) << item.name << " " << item.detail;
    EXPECT_LE(item.max_abs, bound) << item.name;
  }
  EXPECT_TRUE(report->pass());
}

TEST(CudaModel, GoldenFixtureFp32) {
  DSV4_REQUIRE_GPU();
  GoldenOptions options;
  options.make_backend = [] { return *CreateCudaBackend(0, Precision::kFP32); };
  ExpectGoldenPass(options, 1e-4);
  options.force_indexer_scoring = true;
  options.cache.block_size = 16;
  ExpectGoldenPass(options, 1e-4);
}

// Teacher-forced logits of `prompts` on a model (all positions).
std::vector<std::vector<float>> AllLogits(Dsv4Model& model, const std::vector<std::vector<int32_t>>& prompts,
                                          std::vector<int> chunks) {
  std::vector<std::vector<float>> out;
  for (const auto& p : prompts) {
    LocalSequences seqs(model);
    const int id = *seqs.Create();
    std::vector<float> all;
    size_t pos = 0, c = 0;
    while (pos < p.size()) {
      const size_t n = std::min<size_t>(chunks[c++ % chunks.size()], p.size() - pos);
      auto step = seqs.Next(id, std::span(p).subspan(pos, n), Logits::kAll);
      EXPECT_TRUE(step.ok()) << step.status();
      StepLogits logits;
      const absl::Status s = model.Step({&*step, 1}, StepOptions{}, &logits);
      EXPECT_TRUE(s.ok()) << s;
      seqs.Advance(id, static_cast<int64_t>(n));
      all.insert(all.end(), logits.values.begin(), logits.values.end());
      pos += n;
    }
    out.push_back(std::move(all));
  }
  return out;
}

// bf16 on the fixture model: most positions stay within a small logit error; a few move far when
// bf16 rounding flips a discrete choice (an expert of the top-k router, an indexer selection), as
// in any bf16 engine. So the bound is on the typical position, and greedy ids must agree wherever
// the fp32 margin is clear. Measured figures: docs/cuda-backend.md.
constexpr double kBf16MedianTol = 0.1;  // measured p50 0.053 on the H200
constexpr double kGreedyMargin = 0.1;

// bf16 GPU engine against the fp32 CPU engine on a fixture's weights (random prompts): the
// typical position's logit error and greedy agreement where the fp32 margin is clear.
void ExpectBf16Close(const std::string& dir, const LoadOptions& load,
                     Precision precision = Precision::kBF16) {
  auto config = LoadModelConfig(dir + "/config.json");
  ASSERT_TRUE(config.ok());
  auto ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok());
  CacheConfig cache;
  cache.num_slots = 2;
  cache.num_blocks = 40;
  cache.max_model_len = 1024;
  auto cpu = Dsv4Model::Load(*config, **ckpt, std::make_unique<CpuBackend>(), cache);
  auto gpu = Dsv4Model::Load(*config, **ckpt, *CreateCudaBackend(0, precision), cache, load);
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
  std::mt19937 rng(5);
  std::vector<std::vector<int32_t>> prompts(4);
  for (auto& p : prompts) {
    p.resize(200);
    for (auto& t : p) t = static_cast<int32_t>(rng() % config->vocab_size);
  }
  const auto ref = AllLogits(**cpu, prompts, {200});
  const auto got = AllLogits(**gpu, prompts, {37, 1, 1, 64});
  const int64_t V = config->vocab_size;
  std::vector<double> errs;
  int64_t checked = 0, agree = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    ASSERT_EQ(got[p].size(), ref[p].size());
    for (size_t r = 0; r < ref[p].size() / V; ++r) {
      const float* a = ref[p].data() + r * V;
      const float* b = got[p].data() + r * V;
      double e = 0;
      for (int64_t i = 0; i < V; ++i) e = std::max<double>(e, std::fabs(a[i] - b[i]));
      errs.push_back(e);
      std::vector<float> sorted(a, a + V);
      std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
      if (sorted[0] - sorted[1] <= kGreedyMargin) continue;
      ++checked;
      agree += (std::max_element(b, b + V) - b) == (std::max_element(a, a + V) - a) ? 1 : 0;
    }
  }
  std::sort(errs.begin(), errs.end());
  auto pct = [&](double q) { return errs[static_cast<size_t>(q * (errs.size() - 1))]; };
  std::printf("    %s, bf16 (formats %s) vs fp32 CPU, per-position max |logit diff|: p50=%.4g "
              "p90=%.4g p99=%.4g max=%.4g\n"
              "    greedy agreement where the fp32 margin > %.2g: %lld of %lld\n",
              dir.c_str(), load.keep_formats ? "kept" : "dequantised", pct(0.5), pct(0.9), pct(0.99),
              errs.back(), kGreedyMargin, static_cast<long long>(agree),
              static_cast<long long>(checked));
  EXPECT_LE(pct(0.5), kBf16MedianTol);
  EXPECT_GT(checked, static_cast<int64_t>(errs.size()) / 2);
  EXPECT_GE(agree, checked * 95 / 100);
}

TEST(CudaModel, FixtureInBf16WithinToleranceAndGreedyWhereMarginsAllow) {
  DSV4_REQUIRE_GPU();
  ExpectBf16Close(testing::TestData("dsv4-tiny"), LoadOptions{});
}

// The released quantised layout (dsv4-tiny-fp8) with its FP8 and MXFP4 weights kept on the GPU:
// fp32 activations meet the CPU pass criteria (exact dequantisation in the kernels), bf16 the
// bf16 tolerance; the bf16 baseline (dequantised at load) for comparison.
TEST(CudaModel, QuantizedFixtureFp32MeetsTheCpuCriteria) {
  DSV4_REQUIRE_GPU();
  GoldenOptions options;
  options.make_backend = [] { return *CreateCudaBackend(0, Precision::kFP32); };
  auto report = RunGoldenCheck(testing::TestData("dsv4-tiny-fp8"), options);
  ASSERT_TRUE(report.ok()) << report.status();
  for (const GoldenItem& item : report->items) {
    std::printf("    %-28s max_abs=%.3g %s\n", item.name.c_str(), item.max_abs, item.detail.c_str());
    EXPECT_TRUE(item.pass) << item.name << " " << item.detail;
    EXPECT_LE(item.max_abs, 1e-4) << item.name;
  }
}

TEST(CudaModel, QuantizedFixtureInBf16WithinTolerance) {
  DSV4_REQUIRE_GPU();
  ExpectBf16Close(testing::TestData("dsv4-tiny-fp8"), Keep(true));
  ExpectBf16Close(testing::TestData("dsv4-tiny-fp8"), Keep(false));
}

// The same in precision fp8 with DSV4_FP8_ACTIVATION_ROWS=all (FP8 activations from 9 rows; the
// prompts here are chunks of at most 64 tokens). FP8 activations need whole 128 x 128 weight
// blocks (K and N multiples of 128) and every FP8 projection of this fixture has partial ones
// (K 64 or 128 with N 64, ...), so they all stay on the bf16 path: this checks that precision
// fp8 leaves everything else as bf16 has it. The e4m3 activations' own error is measured at the
// Flash shapes (CudaFp8Linear.Fp8ActivationsStayWithinTheirError, CudaMoeTiled.Fp8*). With
// partial blocks on cuBLASLt's block-scaled FP8 GEMM this fixture's median logit error was 1.8
// on the H200 (bench/results/2026-12-03-wgmma-experts, run4; not yet understood).
TEST(CudaModel, QuantizedFixtureWithFp8ActivationsWithinTolerance) {
  DSV4_REQUIRE_GPU();
  const testing::ScopedEnv rows("DSV4_FP8_ACTIVATION_ROWS", "all");
  ExpectBf16Close(testing::TestData("dsv4-tiny-fp8"), Keep(true), Precision::kFP8);
}

// A 3-layer model at the real Flash widths (fewer experts, small vocabulary so that the CPU
// reference stays fast): GPU fp32 engine vs CPU engine over prefill chunks and decode, across the
// indexer's top-k boundary.
Json FlashNarrowConfig() {
  return testing::FlashWidthsConfigJson(/*index_topk=*/64, /*moe_intermediate_size=*/2048,
                                        /*vocab_size=*/2048);  // top-64: crossed after 256 tokens
}

struct EngineCase {
  const char* name;
  std::function<Json()> config;
  int len;
  std::vector<int> chunks;
};

TEST(CudaModel, GpuEngineMatchesCpuEngineOnSyntheticModels) {
  DSV4_REQUIRE_GPU();
  const std::vector<EngineCase> cases = {
      {"tiny", [] { return testing::TinyConfigJson(); }, 300, {100, 1, 1, 57, 3}},
      {"flash_widths", FlashNarrowConfig, 600, {200, 150, 1, 1, 1, 247}},
  };
  for (const EngineCase& c : cases) {
    SCOPED_TRACE(c.name);
    auto config = ParseModelConfig(c.config().dump());
    ASSERT_TRUE(config.ok()) << config.status();
    CacheConfig cache;
    cache.num_slots = 2;
    cache.max_model_len = 4096;
    cache.num_blocks = 2 * (4096 / DefaultBlockSize(*config)) + 2;
    // Dense synthetic weights, then the released formats (FP8 projections, MXFP4 experts: the
    // same bytes filled on the host and on the device).
    for (bool released : {false, true}) {
      SCOPED_TRACE(released ? "released formats" : "dense");
      LoadOptions load;
      load.synthetic_released_formats = released;
      auto cpu = Dsv4Model::LoadSynthetic(*config, 3, std::make_unique<CpuBackend>(), cache, load);
      auto gpu = Dsv4Model::LoadSynthetic(*config, 3, *CreateCudaBackend(0, Precision::kFP32),
                                          cache, load);
      ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
      std::mt19937 rng(9);
      std::vector<std::vector<int32_t>> prompt(1, std::vector<int32_t>(c.len));
      for (auto& t : prompt[0]) t = static_cast<int32_t>(rng() % config->vocab_size);
      const auto ref = AllLogits(**cpu, prompt, c.chunks);
      const auto got = AllLogits(**gpu, prompt, c.chunks);
      EXPECT_TRUE(testing::Close(got[0], ref[0], 2e-4, 2e-4));
    }
  }
}

// On-device sampling vs the CPU worker's sampler on the same (synthetic) model: greedy,
// temperature with top-k / top-p / min-p, penalties, the min-tokens mask and log-probabilities,
// over several steps of a batch that mixes them.
TEST(CudaModel, WorkerSamplingMatchesCpuWorker) {
  DSV4_REQUIRE_GPU();
  auto config = ParseModelConfig(testing::TinyConfigJson().dump());
  ASSERT_TRUE(config.ok());
  CacheConfig cache;
  cache.num_slots = 8;
  cache.max_model_len = 512;
  cache.num_blocks = 8 * (512 / DefaultBlockSize(*config));
  WeightsSpec weights;
  weights.synthetic = true;
  weights.seed = 4;
  auto cpu = CreateWorker(DeviceChoice{false, 0}, Precision::kFP32, *config, weights, cache);
  auto gpu = CreateWorker(DeviceChoice{true, 0}, Precision::kFP32, *config, weights, cache);
  ASSERT_TRUE(cpu.ok() && gpu.ok()) << cpu.status() << gpu.status();
  std::vector<std::shared_ptr<SamplingSpec>> specs;
  auto add = [&](auto edit) {
    auto s = std::make_shared<SamplingSpec>();
    edit(*s);
    specs.push_back(s);
  };
  add([](SamplingSpec&) {});  // greedy
  add([](SamplingSpec& s) { s.temperature = 0.8f; s.top_k = 20; s.seed = 11; s.logprobs = 5; });
  add([](SamplingSpec& s) { s.temperature = 1.2f; s.top_p = 0.7f; s.seed = 12; });
  add([](SamplingSpec& s) { s.temperature = 1.0f; s.min_p = 0.05f; s.seed = 13; s.logprobs = 20; });
  add([](SamplingSpec& s) {
    s.temperature = 0.9f; s.seed = 14; s.repetition_penalty = 1.3f; s.presence_penalty = 0.5f;
    s.frequency_penalty = 0.3f;
  });
  add([](SamplingSpec& s) {
    s.min_tokens = 4; s.min_tokens_mask = {1, 2, 3, 4, 5};
    s.repetition_penalty = 0.8f;  // < 1 rewards repeats: greedy loops are likely, masks must hold
  });
  add([](SamplingSpec& s) { s.temperature = 2.0f; s.top_k = 3; s.top_p = 0.5f; s.seed = 15; });
  const int64_t per_seq = 512 / DefaultBlockSize(*config);
  StepPlan plan;
  std::mt19937 rng(3);
  for (size_t i = 0; i < specs.size(); ++i) {
    ScheduledSeq s;
    s.request_id = i + 1;
    s.state_slot = static_cast<int32_t>(i);
    for (int64_t b = 0; b < per_seq; ++b) s.block_table.push_back(static_cast<int32_t>(i * per_seq + b));
    s.tokens.resize(5 + 7 * i);
    for (auto& t : s.tokens) t = static_cast<int32_t>(rng() % config->vocab_size);
    s.prompt_len = static_cast<int32_t>(s.tokens.size());
    s.sample = true;
    s.sampling = specs[i];
    plan.seqs.push_back(s);
  }
  int64_t compared = 0;
  for (int step = 0; step < 24; ++step) {
    plan.step_id = static_cast<uint64_t>(step + 1);
    auto a = (*cpu)->Execute(plan);
    auto b = (*gpu)->Execute(plan);
    ASSERT_TRUE(a.ok() && b.ok()) << a.status() << b.status();
    ASSERT_EQ(a->sampled.size(), b->sampled.size());
    for (size_t i = 0; i < a->sampled.size(); ++i) {
      const SampledToken& x = a->sampled[i];
      const SampledToken& y = b->sampled[i];
      ASSERT_EQ(y.token, x.token) << "step " << step << " seq " << i;
      if (specs[i]->logprobs > 0) {
        EXPECT_NEAR(y.logprob, x.logprob, 1e-4);
        ASSERT_EQ(y.top.size(), x.top.size());
        for (size_t k = 0; k < x.top.size(); ++k) {
          EXPECT_EQ(y.top[k].first, x.top[k].first);
          EXPECT_NEAR(y.top[k].second, x.top[k].second, 1e-4);
        }
      }
      if (plan.seqs[i].output_index < specs[i]->min_tokens) {
        for (int32_t m : specs[i]->min_tokens_mask) EXPECT_NE(y.token, m);
      }
      ++compared;
      ScheduledSeq& s = plan.seqs[i];
      s.start_pos += static_cast<int32_t>(s.tokens.size());
      s.tokens = {y.token};
      s.output_index += 1;
    }
  }
  EXPECT_EQ(compared, 24 * static_cast<int64_t>(specs.size()));
}

}  // namespace
}  // namespace dsv4

namespace dsv4 {
namespace {

// Issue #18 finding 8 on the GPU: rows whose logits overflow to Inf/NaN are flagged by the
// on-device sampler (both its paths: the split kernels at vocabulary 1024, the single-block
// kernel at 40), greedy and sampled, with log-probabilities or not, as the CPU worker flags them.
TEST(CudaModel, WorkerFlagsNonFiniteLogits) {
  DSV4_REQUIRE_GPU();
  for (int vocab : {1024, 40}) {
    Json cj = testing::TinyConfigJson();
    cj["vocab_size"] = vocab;
    const std::string dir = testing::WriteOverflowingModel(absl::StrCat("overflow-", vocab), cj, 6);
    auto config = ParseModelConfig(cj.dump());
    ASSERT_TRUE(config.ok()) << config.status();
    CacheConfig cache;
    cache.num_slots = 4;
    cache.max_model_len = 256;
    cache.num_blocks = 4 * (256 / DefaultBlockSize(*config));
    WeightsSpec weights{dir, false, 1};
    for (bool gpu : {false, true}) {
      for (Precision precision : {Precision::kFP32, Precision::kBF16}) {
        auto worker = CreateWorker(DeviceChoice{gpu, 0}, precision, *config, weights, cache);
        ASSERT_TRUE(worker.ok()) << worker.status();
        StepPlan plan;
        plan.step_id = 1;
        const int64_t per_seq = 256 / DefaultBlockSize(*config);
        for (int i = 0; i < 3; ++i) {
          auto spec = std::make_shared<SamplingSpec>();
          if (i >= 1) spec->temperature = 0.8f;
          if (i == 2) spec->logprobs = 3;
          ScheduledSeq s;
          s.request_id = static_cast<uint64_t>(i + 1);
          s.state_slot = i;
          for (int64_t b = 0; b < per_seq; ++b) s.block_table.push_back(static_cast<int32_t>(i * per_seq + b));
          s.tokens = {2, 3, static_cast<int32_t>(4 + i)};
          s.prompt_len = 3;
          s.sample = true;
          s.sampling = spec;
          plan.seqs.push_back(s);
        }
        auto r = (*worker)->Execute(plan);
        ASSERT_TRUE(r.ok()) << r.status();
        ASSERT_EQ(r->sampled.size(), 3u);
        for (const SampledToken& t : r->sampled) {
          EXPECT_TRUE(t.nonfinite) << (gpu ? "gpu" : "cpu") << " vocab " << vocab << " row "
                                   << t.request_id;
        }
        if (!gpu) break;  // the CPU worker computes in fp32 whatever the precision
      }
    }
  }
}

}  // namespace
}  // namespace dsv4

namespace dsv4 {
namespace {

// Configs the CPU reference runs but the CUDA kernels do not take are refused when the model
// loads, naming the field and what is supported (never at the first step).
TEST(CudaModel, UnsupportedConfigsAreRefusedAtLoad) {
  DSV4_REQUIRE_GPU();
  struct Case {
    const char* field;
    int64_t value;
  };
  for (const Case& c : {Case{"head_dim", 96}, Case{"hc_mult", 9}, Case{"index_n_heads", 12}}) {
    Json j = testing::TinyConfigJson();
    j[c.field] = c.value;
    if (std::string(c.field) == "head_dim") j["qk_rope_head_dim"] = 24;  // partial_rotary 0.25
    auto config = ParseModelConfig(j.dump());
    ASSERT_TRUE(config.ok()) << c.field << ": " << config.status();
    CacheConfig cache;
    cache.num_slots = 1;
    cache.max_model_len = 256;
    cache.num_blocks = 8;
    auto cpu = Dsv4Model::LoadSynthetic(*config, 1, std::make_unique<CpuBackend>(), cache);
    EXPECT_TRUE(cpu.ok()) << c.field << ": " << cpu.status();
    auto gpu = Dsv4Model::LoadSynthetic(*config, 1, *CreateCudaBackend(0, Precision::kBF16), cache);
    ASSERT_FALSE(gpu.ok()) << c.field;
    EXPECT_NE(gpu.status().message().find(c.field), std::string::npos) << gpu.status();
    EXPECT_NE(gpu.status().message().find("supported"), std::string::npos) << gpu.status();
  }
}

// Any head count runs (a tensor-parallel rank's share is often 1 or 2): the attention takes
// blocks of 8, 4, 2 or 1 heads. 6 heads (3 a group, blocks of 2) and 5 (one group, blocks of 1)
// against the CPU reference in fp32; and heads of 32 dims (8 and 4 a block).
TEST(CudaModel, AnyHeadCountAndNarrowHeadsMatchTheCpu) {
  DSV4_REQUIRE_GPU();
  struct Heads {
    int heads, groups, head_dim;
  };
  for (const auto& [heads, groups, head_dim] :
       std::vector<Heads>{{6, 2, 64}, {5, 1, 64}, {2, 2, 64}, {8, 4, 32}, {4, 2, 32}}) {
    Json j = testing::TinyConfigJson();
    j["num_attention_heads"] = heads;
    j["o_groups"] = groups;
    j["head_dim"] = head_dim;
    j["qk_rope_head_dim"] = head_dim / 4;  // partial_rotary_factor 0.25
    auto config = ParseModelConfig(j.dump());
    ASSERT_TRUE(config.ok()) << heads << ": " << config.status();
    CacheConfig cache;
    cache.num_slots = 2;
    cache.max_model_len = 256;
    cache.num_blocks = 16;
    auto cpu = Dsv4Model::LoadSynthetic(*config, 5, std::make_unique<CpuBackend>(), cache);
    ASSERT_TRUE(cpu.ok()) << cpu.status();
    auto gpu = Dsv4Model::LoadSynthetic(*config, 5, *CreateCudaBackend(0, Precision::kFP32), cache);
    ASSERT_TRUE(gpu.ok()) << heads << " heads of " << head_dim << ": " << gpu.status();
    const std::vector<std::vector<int32_t>> prompts = {
        {3, 17, 29, 5, 11, 40, 2, 9, 33, 7, 21, 14, 8, 50, 4, 19, 23, 6, 12, 31, 44, 1, 18}};
    const auto want = AllLogits(**cpu, prompts, {9, 1, 1, 5});
    const auto got = AllLogits(**gpu, prompts, {9, 1, 1, 5});
    ASSERT_EQ(got.size(), want.size());
    EXPECT_TRUE(testing::Close(got[0], want[0], 1e-4, 1e-3)) << heads << " heads of " << head_dim;
  }
}

}  // namespace
}  // namespace dsv4
