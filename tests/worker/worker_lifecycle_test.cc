// The worker lifecycle (worker/worker.h) on the CPU worker: Configure, Load (with progress),
// WarmUp, steps, Drain, Shutdown, each at its turn only.
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "worker/cpu_worker.h"
#include "worker/in_process_worker.h"
#include "worker/worker.h"

namespace dsv4 {
namespace {

WorkerConfig TinyConfig() {
  WorkerConfig c;
  auto model = LoadModelConfig(testing::TestData("dsv4-tiny/config.json"));
  EXPECT_TRUE(model.ok()) << model.status();
  c.model = *model;
  c.synthetic = true;
  c.synthetic_seed = 7;
  c.source = "dsv4-tiny (synthetic)";
  c.cache.block_size = DefaultBlockSize(c.model);
  c.cache.num_slots = 2;
  c.cache.max_model_len = 128;
  c.cache.num_blocks = 2 * (128 / c.cache.block_size);
  return c;
}

// One sequence of three prompt tokens, sampled greedily.
StepPlan OnePrompt(uint64_t step_id) {
  StepPlan plan;
  plan.step_id = step_id;
  ScheduledSeq s;
  s.request_id = 1;
  s.tokens = {1, 2, 3};
  s.state_slot = 0;
  s.block_table = {0};
  s.sample = true;
  s.prompt_len = 3;
  s.sampling = std::make_shared<SamplingSpec>();
  plan.seqs.push_back(s);
  return plan;
}

TEST(WorkerLifecycle, TheCpuWorkerGoesThroughEveryStageInOrder) {
  auto created = CreateInProcessWorker("cpu");
  ASSERT_TRUE(created.ok()) << created.status();
  Worker& w = **created;
  EXPECT_EQ(w.info().device, "cpu");
  EXPECT_EQ(w.info().num_blocks, 0);  // nothing loaded yet
  // Out of order: steps, Load and WarmUp before Configure.
  EXPECT_EQ(w.Execute(OnePrompt(1)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.Load({}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.WarmUp().code(), absl::StatusCode::kFailedPrecondition);

  const WorkerConfig config = TinyConfig();
  ASSERT_TRUE(w.Configure(config).ok());
  EXPECT_EQ(w.Configure(config).code(), absl::StatusCode::kFailedPrecondition);  // once
  std::vector<LoadProgress> progress;
  ASSERT_TRUE(w.Load([&](const LoadProgress& p) { progress.push_back(p); }).ok());
  // One "weights" report per layer, counting up to the layer count, then the pools.
  ASSERT_EQ(progress.size(), static_cast<size_t>(config.model.num_layers) + 1);
  for (int64_t l = 0; l < config.model.num_layers; ++l) {
    EXPECT_EQ(progress[l].phase, "weights");
    EXPECT_EQ(progress[l].done, l + 1);
    EXPECT_EQ(progress[l].total, config.model.num_layers);
  }
  EXPECT_EQ(progress.back().phase, "pools");
  const WorkerInfo info = w.info();
  EXPECT_EQ(info.num_blocks, config.cache.num_blocks);
  EXPECT_EQ(info.num_slots, config.cache.num_slots);
  EXPECT_EQ(info.block_size, config.cache.block_size);
  EXPECT_EQ(info.max_model_len, config.cache.max_model_len);
  EXPECT_EQ(info.precision, "fp32");
  // Loaded but not warmed up: no steps yet.
  EXPECT_EQ(w.Execute(OnePrompt(1)).status().code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(w.WarmUp().ok());

  auto r = w.Execute(OnePrompt(2));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->sampled.size(), 1u);
  EXPECT_GE(r->sampled[0].token, 0);
  EXPECT_LT(r->sampled[0].token, config.model.vocab_size);

  // Two launched steps, drained: nothing in flight after, and the worker still takes steps.
  StepPlan again = OnePrompt(3);
  ASSERT_TRUE(w.Launch(again).ok());
  StepPlan more = OnePrompt(4);
  ASSERT_TRUE(w.Launch(more).ok());
  EXPECT_EQ(w.in_flight(), 2);
  ASSERT_TRUE(w.Drain().ok());
  EXPECT_EQ(w.in_flight(), 0);
  EXPECT_EQ(w.Collect().status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(w.Execute(OnePrompt(5)).ok());

  w.Shutdown();
  EXPECT_EQ(w.Execute(OnePrompt(6)).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(w.info().num_blocks, config.cache.num_blocks);  // info() still answers
  w.Shutdown();  // idempotent
}

TEST(WorkerLifecycle, ConfigureNamesTheFieldItRefuses) {
  CpuWorker w;
  WorkerConfig c = TinyConfig();
  c.precision = "fp16";
  absl::Status s = w.Configure(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fp16"), std::string::npos) << s;
  c = TinyConfig();
  c.weight_format = "int4";
  s = w.Configure(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("--weight-format"), std::string::npos) << s;
  c = TinyConfig();
  c.synthetic = false;
  s = w.Configure(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("model_dir"), std::string::npos) << s;
  c = TinyConfig();
  c.batch_invariant = true;
  c.parallel = {0, 4};  // more than two ranks: the all-reduce's order depends on the step
  s = w.Configure(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("batch_invariant"), std::string::npos) << s;
  c = TinyConfig();
  c.batch_invariant = true;
  c.precision = "fp8";  // FP8 activations from 128 rows on: rows would depend on the step
  s = w.Configure(c);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("fp8"), std::string::npos) << s;
  // A refused config leaves the worker unconfigured: a good one is still taken.
  EXPECT_TRUE(w.Configure(TinyConfig()).ok());
}

TEST(WorkerLifecycle, BringUpAnnotatesTheStageThatFailed) {
  CpuWorker w;
  WorkerConfig c = TinyConfig();
  c.synthetic = false;
  c.model_dir = testing::TestData("no-such-checkpoint");
  const absl::Status s = BringUp(w, c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("load"), std::string::npos) << s;
  EXPECT_NE(s.message().find("no-such-checkpoint"), std::string::npos) << s;
}

TEST(WorkerLifecycle, AnUnknownDeviceFailsAtCreation) {
  auto w = CreateInProcessWorker("tpu:0");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(w.status().message().find("tpu:0"), std::string::npos) << w.status();
}

}  // namespace
}  // namespace dsv4
