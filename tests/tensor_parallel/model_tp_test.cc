// Tensor + expert parallelism of the model (common/tensor_parallel.h): ranks as threads of this
// process, each with its own CpuBackend over a Gloo group, against the same model on one rank.
// The partial sums change the order of additions, so logits agree within rounding; the
// all-reduce hands every rank the same bits, so the ranks agree exactly.
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "common/status.h"
#include "parallel/gloo_communicator.h"
#include "parallel/rendezvous_service.h"
#include "parallel/rendezvous_store.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/checkpoint/safetensors.h"
#include "worker/cpu/cpu_backend.h"
#include "worker/model/dsv4_model.h"
#include "worker/model/local_sequences.h"

namespace dsv4 {
namespace {

using Logits = SequenceStep::Logits;

// Where the weights come from: a fixture directory or synthetic weights of its config.
struct Source {
  std::string dir;
  bool synthetic = false;
  bool released_formats = false;
};

// Runs three prompts as one ragged batch over three steps (prefill chunks and decode tokens
// mixed) and returns every logit row, in order.
absl::StatusOr<std::vector<float>> RunSteps(Dsv4Model& model, int64_t vocab) {
  const std::vector<std::vector<int32_t>> prompts = {
      {3, 17, 29, 5, 11, 40, 2, 9, 33, 7, 21, 14, 8},
      {50, 4, 19, 23, 6},
      {12, 12, 31, 44, 1, 18, 27, 3, 36, 10, 15, 25, 30, 2, 16, 5, 13, 22, 38}};
  const std::vector<std::vector<int>> schedule = {{6, 1, 6}, {1, 4, 0}, {9, 9, 1}};
  LocalSequences seqs(model, /*reverse_blocks=*/true);
  std::vector<int> ids;
  std::vector<size_t> pos(prompts.size(), 0);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSIGN_OR_RETURN(int id, seqs.Create());
    ids.push_back(id);
  }
  std::vector<float> all;
  for (int step = 0; step < 3; ++step) {
    std::vector<SequenceStep> steps;
    std::vector<size_t> who, count;
    for (size_t i = 0; i < prompts.size(); ++i) {
      const size_t n = std::min<size_t>(schedule[i][step], prompts[i].size() - pos[i]);
      if (n == 0) continue;
      ASSIGN_OR_RETURN(SequenceStep s, seqs.Next(ids[i], std::span(prompts[i]).subspan(pos[i], n),
                                                 Logits::kAll));
      steps.push_back(s);
      who.push_back(i);
      count.push_back(n);
    }
    StepLogits out;
    RETURN_IF_ERROR(model.Step(steps, StepOptions{}, &out));
    if (out.vocab != vocab) return absl::InternalError("vocab");
    all.insert(all.end(), out.values.begin(), out.values.end());
    for (size_t r = 0; r < who.size(); ++r) {
      seqs.Advance(ids[who[r]], static_cast<int64_t>(count[r]));
      pos[who[r]] += count[r];
    }
  }
  return all;
}

absl::StatusOr<std::vector<float>> RunRank(const Source& src, const ParallelLayout& layout,
                                           Communicator* comm) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(src.dir + "/config.json"));
  CacheConfig cache;
  cache.num_blocks = 16;
  cache.num_slots = 4;
  cache.max_model_len = 256;
  LoadOptions options;
  options.parallel = layout;
  options.synthetic_released_formats = src.released_formats;
  auto backend = std::make_unique<CpuBackend>(comm);
  std::unique_ptr<Dsv4Model> model;
  if (src.synthetic) {
    ASSIGN_OR_RETURN(model, Dsv4Model::LoadSynthetic(config, 7, std::move(backend), cache, options));
  } else {
    ASSIGN_OR_RETURN(auto ckpt, Checkpoint::Open(src.dir));
    ASSIGN_OR_RETURN(model, Dsv4Model::Load(config, *ckpt, std::move(backend), cache, options));
  }
  return RunSteps(*model, config.vocab_size);
}

class ModelTensorParallel : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
    auto server = RendezvousServer::Start("127.0.0.1:0", &store_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  // Every rank's logits (rank order) for `src` on `n` ranks.
  std::vector<std::vector<float>> RunGroup(const Source& src, int n) {
    const std::string group = absl::StrCat("g", next_group_++);
    const std::string token = *NewRendezvousToken();
    EXPECT_TRUE(store_.OpenGroup(group, n, token).ok());
    std::vector<std::vector<float>> logits(n);
    std::vector<absl::Status> errors(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        GlooOptions o;
        o.rank = r;
        o.world_size = n;
        o.connect_timeout = std::chrono::seconds(10);
        o.op_timeout = std::chrono::seconds(30);
        auto comm = GlooCommunicator::Connect(
            o, {absl::StrCat("127.0.0.1:", server_->port()), group, token});
        if (!comm.ok()) {
          errors[r] = comm.status();
          return;
        }
        auto got = RunRank(src, {r, n}, comm->get());
        if (got.ok()) {
          logits[r] = std::move(*got);
        } else {
          errors[r] = got.status();
          (*comm)->Abort(got.status());
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(errors[r].ok()) << "rank " << r << ": " << errors[r];
    return logits;
  }

  // TP n against TP1: within `tol` everywhere, identical on every rank, same argmax per row.
  void ExpectMatchesOneRank(const Source& src, int n, double tol) {
    auto one = RunRank(src, {0, 1}, nullptr);
    ASSERT_TRUE(one.ok()) << one.status();
    auto ranks = RunGroup(src, n);
    ASSERT_EQ(ranks.size(), static_cast<size_t>(n));
    ASSERT_EQ(ranks[0].size(), one->size());
    double max_abs = 0;
    for (size_t i = 0; i < one->size(); ++i) {
      max_abs = std::max(max_abs, std::fabs(double(ranks[0][i]) - (*one)[i]));
    }
    EXPECT_LT(max_abs, tol) << "TP" << n << " vs TP1";
    EXPECT_GT(max_abs, 0.0) << "TP" << n << " should add in another order than TP1";
    for (int r = 1; r < n; ++r) EXPECT_EQ(ranks[r], ranks[0]) << "rank " << r << " differs";
    ASSERT_TRUE(ConfigVocab(src).ok());
    const int64_t V = *ConfigVocab(src);
    for (size_t row = 0; row * V < one->size(); ++row) {
      auto a = one->begin() + row * V, b = ranks[0].begin() + row * V;
      EXPECT_EQ(std::max_element(a, a + V) - a, std::max_element(b, b + V) - b) << "row " << row;
    }
  }

  static absl::StatusOr<int64_t> ConfigVocab(const Source& src) {
    ASSIGN_OR_RETURN(ModelConfig c, LoadModelConfig(src.dir + "/config.json"));
    return c.vocab_size;
  }

  RendezvousStore store_;
  std::unique_ptr<RendezvousServer> server_;
  int next_group_ = 0;
};

TEST_P(ModelTensorParallel, FixtureMatchesOneRank) {
  ExpectMatchesOneRank({testing::TestData("dsv4-tiny")}, GetParam(), 1e-4);
}

// The released layout: FP8 projections (their 128x128 blocks are larger than a rank's slice here,
// so the slices come back dequantised) and MXFP4 experts (whole experts per rank).
TEST_P(ModelTensorParallel, QuantisedFixtureMatchesOneRank) {
  ExpectMatchesOneRank({testing::TestData("dsv4-tiny-fp8")}, GetParam(), 1e-4);
}

// Synthetic weights: a rank's slices are cut from the tensors one rank makes.
TEST_P(ModelTensorParallel, SyntheticWeightsMatchOneRank) {
  ExpectMatchesOneRank({testing::TestData("dsv4-tiny"), true, false}, GetParam(), 1e-4);
  ExpectMatchesOneRank({testing::TestData("dsv4-tiny"), true, true}, GetParam(), 1e-4);
}

INSTANTIATE_TEST_SUITE_P(Sizes, ModelTensorParallel, ::testing::Values(2, 4),
                         [](const auto& info) { return absl::StrCat("TP", info.param); });

TEST(ModelTensorParallelRefusals, SizesThatDoNotSplitAreRefusedAtLoad) {
  auto config = LoadModelConfig(testing::TestData("dsv4-tiny") + "/config.json");
  ASSERT_TRUE(config.ok());
  CacheConfig cache;
  cache.num_blocks = 4;
  cache.num_slots = 1;
  LoadOptions options;
  options.parallel = {0, 3};
  auto m = Dsv4Model::LoadSynthetic(*config, 1, std::make_unique<CpuBackend>(), cache, options);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("num_attention_heads (4)"), std::string::npos) << m.status();
  EXPECT_NE(m.status().message().find("this model takes 1, 2, 4"), std::string::npos) << m.status();
  // A size that splits, but no communicator.
  options.parallel = {0, 2};
  m = Dsv4Model::LoadSynthetic(*config, 1, std::make_unique<CpuBackend>(), cache, options);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("without a communicator"), std::string::npos) << m.status();
}

}  // namespace
}  // namespace dsv4
