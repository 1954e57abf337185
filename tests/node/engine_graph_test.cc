// The engine's side of CUDA graphs on the CPU: a fake worker that claims graph support records
// the mode and padding each plan carries and reports how it "ran" them; the graph metrics follow
// what the worker reports.
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "node/engine.h"
#include "tests/node/fake_worker.h"
#include "tests/testing/checkpoint_writer.h"

namespace dsv4 {
namespace {

struct SeenPlan {
  GraphMode mode;
  int32_t padded_tokens;
  int64_t tokens;
  size_t seqs;
};

class FakeGraphWorker final : public Worker {
 public:
  explicit FakeGraphWorker(bool cuda_graphs) : cuda_graphs_(cuda_graphs) {}

  WorkerInfo info() const override {
    WorkerInfo i = testing::FakeWorkerInfo();
    i.cuda_graphs = cuda_graphs_;
    return i;
  }

  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    StepResult r;
    r.step_id = plan.step_id;
    for (const ScheduledSeq& s : plan.seqs) {
      if (!s.sample) continue;
      SampledToken t;
      t.request_id = s.request_id;
      t.token = 100 + s.output_index;
      r.sampled.push_back(std::move(t));
    }
    if (fail_full_ && plan.graph_mode == GraphMode::kFull) {
      // A capture that fails: the step runs eagerly.
      r.graph.mode = GraphMode::kEager;
      r.graph.fallback = true;
      r.graph.capture_failures = 1;
    } else if (plan.graph_mode != GraphMode::kEager) {
      r.graph.mode = plan.graph_mode;
      r.graph.replays = plan.graph_mode == GraphMode::kFull ? 1 : 3;  // 3 piecewise segments
      if (captured_.insert({plan.graph_mode, plan.padded_tokens}).second) {
        r.graph.captures = plan.graph_mode == GraphMode::kFull ? 1 : 2;
        r.graph.capture_seconds = 0.5 * r.graph.captures;
      }
    }
    std::lock_guard<std::mutex> lock(mu_);
    released_ += plan.released.size();
    // Steps that only release finished requests carry no tokens (always eager); not recorded.
    if (!plan.seqs.empty()) {
      seen_.push_back({plan.graph_mode, plan.padded_tokens, plan.num_tokens(), plan.seqs.size()});
    }
    return r;
  }

  void fail_full_captures() { fail_full_ = true; }
  std::vector<SeenPlan> seen() const {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_;
  }
  size_t released() const {
    std::lock_guard<std::mutex> lock(mu_);
    return released_;
  }

 private:
  const bool cuda_graphs_;
  bool fail_full_ = false;
  std::set<std::pair<GraphMode, int32_t>> captured_;
  mutable std::mutex mu_;
  std::vector<SeenPlan> seen_;
  size_t released_ = 0;
};

double Count(const prometheus::Counter* c) { return c->Value(); }
uint64_t Samples(prometheus::Histogram* h) { return h->Collect().histogram.sample_count; }
double Sum(prometheus::Histogram* h) { return h->Collect().histogram.sample_sum; }

class EngineGraphTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::Load(testing::TestData("tok-tiny/tokenizer.json"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
    metrics_ = std::make_unique<NodeMetrics>(std::make_shared<prometheus::Registry>());
  }

  // Starts an engine on `worker` (kept for inspection) with `graphs`.
  void StartEngine(std::unique_ptr<FakeGraphWorker> worker, GraphConfig graphs) {
    worker_ = worker.get();
    requests_ = 0;
    EngineConfig config;
    config.scheduler.max_num_seqs = 8;
    config.scheduler.max_batched_tokens = 256;
    config.graphs = std::move(graphs);
    engine_ = std::make_unique<Engine>(config, std::move(worker), tokenizer_.get(), metrics_.get());
    engine_->Start();
  }

  // Runs one request of `prompt_len` tokens for `max_tokens` outputs to its end, then stops the
  // engine.
  void Generate(int prompt_len, int max_tokens) {
    v1::GenerateRequest req;
    for (int i = 0; i < prompt_len; ++i) req.mutable_token_ids()->add_ids(5 + i);
    req.set_max_tokens(max_tokens);
    req.set_ignore_eos(true);
    auto validated = testing::ValidateForFakeWorker(req, *tokenizer_);
    ASSERT_TRUE(validated.ok()) << validated.status();
    auto sink = std::make_shared<PromiseSink>();
    auto done = sink->future();
    ASSERT_TRUE(engine_->Submit(*std::move(validated), sink).ok());
    ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    const v1::GenerateResponse last = done.get();
    ASSERT_TRUE(last.has_finished()) << last.DebugString();
    EXPECT_EQ(last.finished().usage().completion_tokens(), max_tokens);
    // The finished request is released with one more (token-less, eager) step; stopping the
    // engine once the worker has it lets that step's metrics land before the test reads them.
    const size_t releases = ++requests_;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (worker_->released() < releases && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ASSERT_EQ(worker_->released(), releases);
    engine_->Stop();
  }

  void TearDown() override {
    if (engine_) engine_->Stop();
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<NodeMetrics> metrics_;
  std::unique_ptr<Engine> engine_;
  FakeGraphWorker* worker_ = nullptr;
  size_t requests_ = 0;
};

GraphConfig FullAndPiecewise(std::vector<int32_t> sizes = DefaultCaptureSizes(256)) {
  GraphConfig g;
  g.mode = CudaGraphMode::kFullAndPiecewise;
  g.capture_sizes = std::move(sizes);
  return g;
}

TEST_F(EngineGraphTest, PrefillIsPiecewiseAndDecodeIsFullWithTheMetrics) {
  StartEngine(std::make_unique<FakeGraphWorker>(true), FullAndPiecewise());
  Generate(/*prompt_len=*/5, /*max_tokens=*/3);
  const std::vector<SeenPlan> seen = worker_->seen();
  // The prefill step (5 tokens, padded to 8), then two decode steps of one token.
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[0].mode, GraphMode::kPiecewise);
  EXPECT_EQ(seen[0].tokens, 5);
  EXPECT_EQ(seen[0].padded_tokens, 8);
  for (size_t i = 1; i < 3; ++i) {
    EXPECT_EQ(seen[i].mode, GraphMode::kFull) << i;
    EXPECT_EQ(seen[i].tokens, 1) << i;
    EXPECT_EQ(seen[i].padded_tokens, 1) << i;
  }
  // Replays by mode, captures (2 piecewise segment sets + 1 full graph at 0.5 s each), step time
  // by the mode that ran.
  EXPECT_EQ(Count(metrics_->graph_replays_full), 2);
  EXPECT_EQ(Count(metrics_->graph_replays_piecewise), 3);
  EXPECT_EQ(Count(metrics_->graph_eager_fallbacks), 0);
  EXPECT_EQ(Count(metrics_->graph_capture_failures), 0);
  EXPECT_EQ(Samples(metrics_->graph_capture_seconds), 3u);
  EXPECT_DOUBLE_EQ(Sum(metrics_->graph_capture_seconds), 1.5);
  EXPECT_EQ(Samples(&metrics_->StepDuration("piecewise")), 1u);
  EXPECT_EQ(Samples(&metrics_->StepDuration("full")), 2u);
  EXPECT_EQ(Samples(&metrics_->StepDuration("eager")), 1u);  // the release step
}

TEST_F(EngineGraphTest, StepsBeyondTheCaptureSizesAndFailedCapturesCountAsFallbacks) {
  auto worker = std::make_unique<FakeGraphWorker>(true);
  worker->fail_full_captures();
  StartEngine(std::move(worker), FullAndPiecewise({1, 2, 4}));
  Generate(/*prompt_len=*/5, /*max_tokens=*/2);
  const std::vector<SeenPlan> seen = worker_->seen();
  ASSERT_EQ(seen.size(), 2u);
  // 5 prefill tokens fit no capture size: planned eager (by design for prefill, not a fallback).
  EXPECT_EQ(seen[0].mode, GraphMode::kEager);
  EXPECT_EQ(seen[0].padded_tokens, 0);
  // The decode step is planned FULL, but its capture fails and it runs eagerly.
  EXPECT_EQ(seen[1].mode, GraphMode::kFull);
  EXPECT_EQ(seen[1].padded_tokens, 1);
  EXPECT_EQ(Count(metrics_->graph_eager_fallbacks), 1);
  EXPECT_EQ(Count(metrics_->graph_capture_failures), 1);
  EXPECT_EQ(Count(metrics_->graph_replays_full), 0);
  EXPECT_EQ(Count(metrics_->graph_replays_piecewise), 0);
  EXPECT_EQ(Samples(metrics_->graph_capture_seconds), 0u);
  EXPECT_EQ(Samples(&metrics_->StepDuration("eager")), 3u);  // + the release step
  EXPECT_EQ(Samples(&metrics_->StepDuration("full")), 0u);
}

TEST_F(EngineGraphTest, NoGraphsForAWorkerWithoutThemOrWithModeNone) {
  StartEngine(std::make_unique<FakeGraphWorker>(false), FullAndPiecewise());
  Generate(5, 2);
  for (const SeenPlan& p : worker_->seen()) {
    EXPECT_EQ(p.mode, GraphMode::kEager);
    EXPECT_EQ(p.padded_tokens, 0);
  }
  GraphConfig none = FullAndPiecewise();
  none.mode = CudaGraphMode::kNone;  // what --enforce-eager sets
  StartEngine(std::make_unique<FakeGraphWorker>(true), none);
  Generate(5, 2);
  for (const SeenPlan& p : worker_->seen()) {
    EXPECT_EQ(p.mode, GraphMode::kEager);
    EXPECT_EQ(p.padded_tokens, 0);
  }
  EXPECT_EQ(Count(metrics_->graph_eager_fallbacks), 0);
  EXPECT_EQ(Samples(&metrics_->StepDuration("eager")), 6u);  // 2 x (prefill, decode, release)
}

}  // namespace
}  // namespace dsv4
