// The serving node with a worker that is not the model: ServingNode builds its worker only
// through NodeOptions::worker_factory, from a model-free WorkerConfig. This binary links no model
// code (tests/CMakeLists.txt dsv4_coordinator_tests), so it also proves the coordinator runs
// without it.
#include <memory>
#include <optional>

#include <gtest/gtest.h>

#include "common/cache_config.h"
#include "common/model_config.h"
#include "node/serving_node.h"
#include "tests/testing/checkpoint_writer.h"

namespace dsv4 {
namespace {

// Samples token 1 for every sampled row; reports the pool of the config it was built from.
class ConfigWorker final : public Worker {
 public:
  explicit ConfigWorker(const WorkerConfig& c) : config_(c) {}
  WorkerInfo info() const override {
    WorkerInfo i;
    i.device = "fake-seam";
    i.num_blocks = config_.cache.num_blocks;
    i.num_slots = config_.cache.num_slots;
    i.block_size = config_.cache.block_size;
    i.max_model_len = config_.cache.max_model_len;
    return i;
  }
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
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

 private:
  WorkerConfig config_;
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

TEST(ServingNodeSeam, BuildsItsWorkerFromAModelFreeConfigAndServesThroughIt) {
  NodeOptions o = SeamOptions();
  std::optional<WorkerConfig> seen;
  o.worker_factory = [&](const WorkerConfig& c) -> absl::StatusOr<std::unique_ptr<Worker>> {
    seen = c;
    return std::unique_ptr<Worker>(std::make_unique<ConfigWorker>(c));
  };
  auto node = ServingNode::Start(o);
  ASSERT_TRUE(node.ok()) << node.status();
  ASSERT_TRUE(seen.has_value());
  EXPECT_EQ(seen->device, "cuda:3");
  EXPECT_EQ(seen->precision, "fp32");
  EXPECT_EQ(seen->weight_format, "bf16");
  EXPECT_EQ(seen->threads, 3);
  EXPECT_EQ(seen->model_dir, o.model_dir);
  EXPECT_FALSE(seen->synthetic);
  auto config = LoadModelConfig(o.model_dir + "/config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(seen->model.vocab_size, config->vocab_size);
  EXPECT_EQ(seen->model.num_layers, config->num_layers);
  const int32_t block = DefaultBlockSize(*config);
  EXPECT_EQ(seen->cache.block_size, block);
  EXPECT_EQ(seen->cache.num_slots, 8);
  EXPECT_EQ(seen->cache.max_model_len, 512);
  EXPECT_EQ(seen->cache.num_blocks, 8 * ((512 + block - 1) / block));
  // The warm-up request ran through the fake worker, and the node reports it.
  EXPECT_EQ((*node)->engine().worker_info().device, "fake-seam");
  EXPECT_EQ((*node)->runtime().model_info.device(), "fake-seam");
  EXPECT_GE((*node)->engine().stats().steps, 1u);
  (*node)->Shutdown();
}

TEST(ServingNodeSeam, AFailingFactoryFailsTheStartWithItsError) {
  NodeOptions o = SeamOptions();
  o.worker_factory = [](const WorkerConfig&) -> absl::StatusOr<std::unique_ptr<Worker>> {
    return absl::FailedPreconditionError("no such device: cuda:3");
  };
  auto node = ServingNode::Start(o);
  ASSERT_FALSE(node.ok());
  EXPECT_EQ(node.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(node.status().message().find("cuda:3"), std::string::npos) << node.status();
}

}  // namespace
}  // namespace dsv4
