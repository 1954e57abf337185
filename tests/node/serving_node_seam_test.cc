// The serving node with a worker that is not the model: ServingNode builds its worker only
// through NodeOptions::worker_factory, from a model-free WorkerConfig. This binary links no model
// code (tests/CMakeLists.txt dsv4_coordinator_tests), so it also proves the coordinator runs
// without it.
#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "common/cache_config.h"
#include "common/model_config.h"
#include "node/serving_node.h"
#include "tests/testing/checkpoint_writer.h"

namespace dsv4 {
namespace {

// What the fake worker saw, in order ("configure", "load", "warm-up", "step", "drain",
// "shutdown"), and the config it was given.
struct Seen {
  std::string device;
  std::optional<WorkerConfig> config;
  std::vector<std::string> calls;
};

// Samples token 1 for every sampled row; reports the pool of the config it was given.
class ConfigWorker final : public Worker {
 public:
  explicit ConfigWorker(Seen* seen) : seen_(seen) {}
  WorkerInfo info() const override {
    WorkerInfo i;
    i.device = "fake-seam";
    if (!seen_->config) return i;
    i.num_blocks = seen_->config->cache.num_blocks;
    i.num_slots = seen_->config->cache.num_slots;
    i.block_size = seen_->config->cache.block_size;
    i.max_model_len = seen_->config->cache.max_model_len;
    return i;
  }
  absl::Status Configure(const WorkerConfig& c) override {
    seen_->config = c;
    seen_->calls.push_back("configure");
    return absl::OkStatus();
  }
  absl::Status Load(const LoadProgressFn& progress) override {
    seen_->calls.push_back("load");
    if (progress) progress(LoadProgress{"weights", 1, 1});
    return absl::OkStatus();
  }
  absl::Status WarmUp() override {
    seen_->calls.push_back("warm-up");
    return absl::OkStatus();
  }
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    if (seen_->calls.empty() || seen_->calls.back() != "step") seen_->calls.push_back("step");
    StepResult r;
    r.step_id = plan.step_id;
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.sample) continue;
      SampledToken t;
      t.request_id = s.request_id;
      t.token = 1;
      r.sampled.push_back(t);
    }
    return r;
  }
  absl::Status Drain() override {
    seen_->calls.push_back("drain");
    return Worker::Drain();
  }
  void Shutdown() override { seen_->calls.push_back("shutdown"); }

 private:
  Seen* seen_;
};

NodeOptions SeamOptions() {
  NodeOptions o;
  o.model_dir = testing::TestData("dsv4-tiny");
  o.tokenizer_path = testing::TestData("tok-tiny/tokenizer.json");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  o.device = "cuda:3";  // passed through untouched: the factory decides what it means
  o.precision = "fp32";
  o.weight_format = "bf16";
  o.threads = 3;
  o.max_model_len = 512;
  o.max_num_seqs = 8;
  return o;
}

TEST(ServingNodeSeam, RefusesOptionsWithoutAWorkerFactory) {
  auto node = ServingNode::Start(SeamOptions());
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(node.status().message().find("worker_factory"), std::string::npos)
      << node.status();
}

TEST(ServingNodeSeam, BringsItsWorkerUpFromAModelFreeConfigAndServesThroughIt) {
  NodeOptions o = SeamOptions();
  Seen seen;
  o.worker_factory = [&](const std::string& device) -> absl::StatusOr<std::unique_ptr<Worker>> {
    seen.device = device;
    return std::unique_ptr<Worker>(std::make_unique<ConfigWorker>(&seen));
  };
  auto node = ServingNode::Start(o);
  ASSERT_TRUE(node.ok()) << node.status();
  EXPECT_EQ(seen.device, "cuda:3");
  ASSERT_TRUE(seen.config.has_value());
  const WorkerConfig& c = *seen.config;
  EXPECT_EQ(c.precision, "fp32");
  EXPECT_EQ(c.weight_format, "bf16");
  EXPECT_EQ(c.threads, 3);
  EXPECT_EQ(c.model_dir, o.model_dir);
  EXPECT_FALSE(c.synthetic);
  auto config = LoadModelConfig(o.model_dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(c.model.vocab_size, config->vocab_size);
  EXPECT_EQ(c.model.num_layers, config->num_layers);
  const int32_t block = DefaultBlockSize(*config);
  EXPECT_EQ(c.cache.block_size, block);
  EXPECT_EQ(c.cache.num_slots, 8);
  EXPECT_EQ(c.cache.max_model_len, 512);
  EXPECT_EQ(c.cache.num_blocks, 8 * ((512 + block - 1) / block));
  // Configured, loaded and warmed up before the first step (the warm-up request), and the node
  // reports the worker.
  const std::vector<std::string> up = {"configure", "load", "warm-up", "step"};
  ASSERT_GE(seen.calls.size(), up.size());
  EXPECT_EQ(std::vector<std::string>(seen.calls.begin(), seen.calls.begin() + 4), up);
  EXPECT_EQ((*node)->engine().worker_info().device, "fake-seam");
  EXPECT_EQ((*node)->runtime().model_info.device(), "fake-seam");
  EXPECT_GE((*node)->engine().stats().steps, 1u);
  // The engine shuts its worker down when the node does, once.
  (*node)->Shutdown();
  ASSERT_FALSE(seen.calls.empty());
  EXPECT_EQ(seen.calls.back(), "shutdown");
  node->reset();
  EXPECT_EQ(std::count(seen.calls.begin(), seen.calls.end(), "shutdown"), 1);
}

TEST(ServingNodeSeam, AWorkerThatFailsToLoadFailsTheStartNamingTheStage) {
  class BrokenLoad final : public Worker {
   public:
    WorkerInfo info() const override { return WorkerInfo{}; }
    absl::Status Load(const LoadProgressFn&) override {
      return absl::DataLossError("model.safetensors: truncated");
    }
    absl::StatusOr<StepResult> Execute(const StepPlan&) override {
      return absl::InternalError("never");
    }
  };
  NodeOptions o = SeamOptions();
  o.worker_factory = [](const std::string&) -> absl::StatusOr<std::unique_ptr<Worker>> {
    return std::unique_ptr<Worker>(std::make_unique<BrokenLoad>());
  };
  auto node = ServingNode::Start(o);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(node.status().message().find("loading the model"), std::string::npos) << node.status();
  EXPECT_NE(node.status().message().find("truncated"), std::string::npos) << node.status();
}

TEST(ServingNodeSeam, AFailingFactoryFailsTheStartWithItsError) {
  NodeOptions o = SeamOptions();
  o.worker_factory = [](const std::string&) -> absl::StatusOr<std::unique_ptr<Worker>> {
    return absl::FailedPreconditionError("no such device: cuda:3");
  };
  auto node = ServingNode::Start(o);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(node.status().message().find("cuda:3"), std::string::npos) << node.status();
}

}  // namespace
}  // namespace dsv4
