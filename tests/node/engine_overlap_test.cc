// Overlapped decode in the engine (EngineConfig::overlap): step N+1 is planned and launched before
// step N's results come back, its inputs deferred to the worker. A fake worker whose next token is
// a function of the token fed in (so a wrongly resolved input changes every later token) and of
// the output index; the expected streams are computed from that function directly.
#include <chrono>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "node/engine.h"
#include "node/metrics.h"
#include "tests/node/fake_worker.h"
#include "tests/testing/checkpoint_writer.h"

namespace dsv4 {
namespace {

int32_t Next(int32_t input, int32_t output_index) {
  return 20 + (input * 31 + output_index * 7) % 900;
}

class FakeChainWorker final : public Worker {
 public:
  WorkerInfo info() const override {
    WorkerInfo i = testing::FakeWorkerInfo();
    i.overlap = true;
    return i;
  }

  // Counts the launches that carried deferred tokens; the base class resolves them on the host.
  absl::Status Launch(const StepPlan& plan) override {
    bool deferred = false;
    for (const ScheduledSeq& s : plan.seqs) deferred |= s.deferred_token;
    if (deferred && fail_deferred_) return absl::InternalError("injected launch failure");
    {
      std::lock_guard<std::mutex> lock(mu_);
      deferred_launches_ += deferred ? 1 : 0;
      max_in_flight_ = std::max(max_in_flight_, in_flight() + 1);
    }
    return Worker::Launch(plan);
  }

  // The `fail_collect_at_`-th collect (counting from 1) fails, as a device error would.
  absl::StatusOr<StepResult> Collect() override {
    absl::StatusOr<StepResult> r = Worker::Collect();
    std::lock_guard<std::mutex> lock(mu_);
    if (++collects_ == fail_collect_at_) return absl::InternalError("injected collect failure");
    return r;
  }

  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    if (step_delay_.count() > 0) std::this_thread::sleep_for(step_delay_);
    StepResult r;
    r.step_id = plan.step_id;
    for (const ScheduledSeq& s : plan.seqs) {
      EXPECT_FALSE(s.deferred_token);
      for (int32_t t : s.tokens) EXPECT_GE(t, 0);
      if (!s.sample) continue;
      SampledToken t;
      t.request_id = s.request_id;
      t.token = Next(s.tokens.back(), s.output_index);
      if (s.output_index == nonfinite_at_) {
        // As a NaN in the logits: the CPU worker reports token -1, the GPU worker a valid id.
        t.nonfinite = true;
        t.token = s.output_index % 2 == 0 ? -1 : 0;
      }
      r.sampled.push_back(std::move(t));
    }
    return r;
  }

  void fail_deferred_launches() { fail_deferred_ = true; }
  void fail_collect_at(int n) { fail_collect_at_ = n; }
  void set_step_delay(std::chrono::microseconds d) { step_delay_ = d; }
  // Every row sampling output `index` reports non-finite logits.
  void set_nonfinite_at(int index) { nonfinite_at_ = index; }
  int deferred_launches() const {
    std::lock_guard<std::mutex> lock(mu_);
    return deferred_launches_;
  }
  int max_in_flight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return max_in_flight_;
  }

 private:
  bool fail_deferred_ = false;
  int fail_collect_at_ = 0, collects_ = 0;
  int nonfinite_at_ = -1;
  std::chrono::microseconds step_delay_{0};
  mutable std::mutex mu_;
  int deferred_launches_ = 0;
  int max_in_flight_ = 0;
};

struct Spec {
  std::vector<int32_t> prompt;
  int max_tokens = 1;
  int32_t stop_token = -1;
  float repetition_penalty = 1;
};

// The stream the chain gives: stops at max_tokens or after the stop token.
std::vector<int32_t> Expected(const Spec& s) {
  std::vector<int32_t> out;
  int32_t in = s.prompt.back();
  for (int k = 0; k < s.max_tokens; ++k) {
    in = Next(in, k);
    out.push_back(in);
    if (in == s.stop_token) break;
  }
  return out;
}

class EngineOverlapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tok = Tokenizer::Load(testing::TestData("tok-tiny/tokenizer.json"));
    ASSERT_TRUE(tok.ok()) << tok.status();
    tokenizer_ = *std::move(tok);
  }
  void TearDown() override {
    if (engine_) engine_->Stop();
  }

  void StartEngine(OverlapMode overlap, std::unique_ptr<FakeChainWorker> worker = nullptr,
                   NodeMetrics* metrics = nullptr) {
    if (engine_) engine_->Stop();
    if (worker == nullptr) worker = std::make_unique<FakeChainWorker>();
    worker_ = worker.get();
    EngineConfig config;
    config.scheduler.max_num_seqs = 8;
    config.scheduler.max_batched_tokens = 256;
    config.overlap = overlap;
    engine_ = std::make_unique<Engine>(config, std::move(worker), tokenizer_.get(), metrics);
    engine_->Start();
  }

  // Submits every spec at once; returns each request's final response and streamed tokens.
  struct Outcome {
    v1::GenerateResponse last;
    std::vector<int32_t> tokens;
  };
  class CollectSink final : public RequestSink {
   public:
    void Emit(v1::GenerateResponse response, bool last) override {
      for (int32_t t : response.chunk().token_ids()) tokens_.push_back(t);
      if (last) done_.set_value(Outcome{std::move(response), tokens_});
    }
    std::future<Outcome> future() { return done_.get_future(); }

   private:
    std::vector<int32_t> tokens_;
    std::promise<Outcome> done_;
  };

  std::vector<std::future<Outcome>> Submit(const std::vector<Spec>& specs,
                                           std::vector<std::string>* names = nullptr) {
    std::vector<std::future<Outcome>> futures;
    for (const Spec& s : specs) {
      v1::GenerateRequest req;
      for (int32_t id : s.prompt) req.mutable_token_ids()->add_ids(id);
      req.set_max_tokens(s.max_tokens);
      req.set_ignore_eos(true);
      if (s.stop_token >= 0) req.add_stop_token_ids(s.stop_token);
      if (s.repetition_penalty != 1)
        req.mutable_sampling()->set_repetition_penalty(s.repetition_penalty);
      auto validated = testing::ValidateForFakeWorker(req, *tokenizer_);
      EXPECT_TRUE(validated.ok()) << validated.status();
      auto sink = std::make_shared<CollectSink>();
      futures.push_back(sink->future());
      auto name = engine_->Submit(*std::move(validated), sink);
      EXPECT_TRUE(name.ok()) << name.status();
      if (names != nullptr) names->push_back(name.ok() ? *name : "");
    }
    return futures;
  }

  static Outcome Wait(std::future<Outcome>& f) {
    EXPECT_EQ(f.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    return f.get();
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
  FakeChainWorker* worker_ = nullptr;
};

std::vector<Spec> Mixed() {
  std::vector<Spec> specs;
  for (int i = 0; i < 6; ++i) {
    Spec s;
    for (int k = 0; k < 3 + 5 * i; ++k) s.prompt.push_back(30 + 11 * k + i);
    s.max_tokens = 4 + 7 * i;
    specs.push_back(s);
  }
  // Two that stop on a token of their own chain before max_tokens.
  specs[2].stop_token = Expected(specs[2])[5];
  specs[5].stop_token = Expected(specs[5])[17];
  return specs;
}

// Issue #18 finding 8: NaN or Inf logits fail the request with a clear error and count as a
// worker error; the other requests of the batch go on.
TEST_F(EngineOverlapTest, NonFiniteLogitsFailOnlyThatRequest) {
  for (OverlapMode mode : {OverlapMode::kOn, OverlapMode::kOff}) {
    for (int at : {4, 5}) {
      auto registry = std::make_shared<prometheus::Registry>();
      NodeMetrics metrics(registry);
      auto worker = std::make_unique<FakeChainWorker>();
      worker->set_nonfinite_at(at);
      StartEngine(mode, std::move(worker), &metrics);
      Spec shorter{{30, 31, 32}, 3};
      Spec longer{{40, 41}, 20};
      auto futures = Submit({shorter, longer});
      const Outcome a = Wait(futures[0]);
      const Outcome b = Wait(futures[1]);
      ASSERT_TRUE(a.last.has_finished());
      EXPECT_EQ(a.tokens, Expected(shorter));
      ASSERT_TRUE(b.last.has_error()) << b.last.DebugString();
      EXPECT_EQ(b.last.error().code(), static_cast<int>(absl::StatusCode::kInternal));
      EXPECT_NE(b.last.error().message().find("non-finite logits"), std::string::npos);
      EXPECT_EQ(b.tokens.size(), static_cast<size_t>(at));  // nothing of the broken row streamed
      EXPECT_EQ(metrics.worker_errors->Value(), 1);
      engine_->Stop();
      engine_.reset();
    }
  }
}

TEST_F(EngineOverlapTest, OverlappedStepsFeedTheSampledTokens) {
  for (OverlapMode mode : {OverlapMode::kOn, OverlapMode::kOff}) {
    StartEngine(mode);
    const std::vector<Spec> specs = Mixed();
    auto futures = Submit(specs);
    for (size_t i = 0; i < specs.size(); ++i) {
      const Outcome o = Wait(futures[i]);
      ASSERT_TRUE(o.last.has_finished()) << o.last.DebugString();
      EXPECT_EQ(o.tokens, Expected(specs[i])) << "request " << i;
      EXPECT_EQ(o.last.finished().finish_reason(), specs[i].stop_token >= 0 ? v1::STOP : v1::LENGTH)
          << "request " << i;
    }
    ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
    engine_->Stop();
    const EngineStats stats = engine_->stats();
    EXPECT_EQ(stats.free_blocks, stats.total_blocks);
    EXPECT_EQ(stats.free_slots, 8);
    if (mode == OverlapMode::kOn) {
      EXPECT_TRUE(engine_->overlap());
      EXPECT_GT(stats.overlapped_steps, 20u);
      EXPECT_EQ(static_cast<uint64_t>(worker_->deferred_launches()), stats.overlapped_steps);
      EXPECT_EQ(worker_->max_in_flight(), 2);
    } else {
      EXPECT_FALSE(engine_->overlap());
      EXPECT_EQ(stats.overlapped_steps, 0u);
      EXPECT_EQ(worker_->deferred_launches(), 0);
      EXPECT_EQ(worker_->max_in_flight(), 1);
    }
  }
}

TEST_F(EngineOverlapTest, AutoFollowsTheWorker) {
  StartEngine(OverlapMode::kAuto);
  EXPECT_TRUE(engine_->overlap());  // the fake worker says it overlaps
  auto parsed = ParseOverlapMode("sometimes");
  EXPECT_FALSE(parsed.ok());
  EXPECT_NE(parsed.status().message().find("sometimes"), absl::string_view::npos);
  EXPECT_EQ(*ParseOverlapMode("off"), OverlapMode::kOff);
}

TEST_F(EngineOverlapTest, PenaltiesOverlapToo) {
  // (The worker counts the deferred token: the GPU worker from its slot table, this one from the
  // previous result.)
  StartEngine(OverlapMode::kOn);
  Spec s;
  s.prompt = {40, 41, 42};
  s.max_tokens = 12;
  s.repetition_penalty = 1.3f;
  auto futures = Submit({s});
  const Outcome o = Wait(futures[0]);
  EXPECT_EQ(o.tokens, Expected(s));
  EXPECT_EQ(worker_->deferred_launches(), 11);
  EXPECT_EQ(engine_->stats().overlapped_steps, 11u);
}

TEST_F(EngineOverlapTest, AbortWhileAStepIsInFlight) {
  // 1 ms steps: the longer request is still decoding when the shorter one ends.
  auto worker = std::make_unique<FakeChainWorker>();
  worker->set_step_delay(std::chrono::milliseconds(1));
  StartEngine(OverlapMode::kOn, std::move(worker));
  Spec longer;
  longer.prompt = {50, 51, 52};
  longer.max_tokens = 400;
  Spec shorter = longer;
  shorter.max_tokens = 30;
  std::vector<std::string> names;
  auto futures = Submit({longer, shorter}, &names);
  const Outcome done = Wait(futures[1]);
  EXPECT_EQ(done.tokens, Expected(shorter));
  ASSERT_TRUE(engine_->Abort(names[0], "test abort"));
  const Outcome aborted = Wait(futures[0]);
  ASSERT_TRUE(aborted.last.has_finished());
  EXPECT_EQ(aborted.last.finished().finish_reason(), v1::CANCELLED);
  // What it streamed before the abort is a prefix of its chain.
  const std::vector<int32_t> full = Expected(longer);
  ASSERT_LE(aborted.tokens.size(), full.size());
  EXPECT_EQ(aborted.tokens,
            std::vector<int32_t>(full.begin(), full.begin() + aborted.tokens.size()));
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  engine_->Stop();
  EXPECT_EQ(engine_->stats().free_blocks, engine_->stats().total_blocks);
}

TEST_F(EngineOverlapTest, AFailedOverlappedLaunchFailsItsRequestsAndTheEngineGoesOn) {
  auto worker = std::make_unique<FakeChainWorker>();
  worker->fail_deferred_launches();
  StartEngine(OverlapMode::kOn, std::move(worker));
  Spec s;
  s.prompt = {60, 61};
  s.max_tokens = 8;
  auto futures = Submit({s});
  const Outcome o = Wait(futures[0]);
  ASSERT_TRUE(o.last.has_error()) << o.last.DebugString();
  EXPECT_NE(o.last.error().message().find("injected launch failure"), std::string::npos);
  // A one-token request never needs an overlapped step: it still completes.
  s.max_tokens = 1;
  futures = Submit({s});
  const Outcome one = Wait(futures[0]);
  ASSERT_TRUE(one.last.has_finished()) << one.last.DebugString();
  EXPECT_EQ(one.tokens, Expected(s));
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  engine_->Stop();
  EXPECT_EQ(engine_->stats().free_blocks, engine_->stats().total_blocks);
}

TEST_F(EngineOverlapTest, AFailedCollectFailsTheStepFedOnItToo) {
  // Collect 1 is the prefill; collect 3 fails while the step after it (fed on its tokens) is in
  // flight: both steps' requests fail, and the engine serves the next request.
  auto worker = std::make_unique<FakeChainWorker>();
  worker->fail_collect_at(3);
  StartEngine(OverlapMode::kOn, std::move(worker));
  Spec s;
  s.prompt = {70, 71, 72};
  s.max_tokens = 20;
  auto futures = Submit({s});
  const Outcome o = Wait(futures[0]);
  ASSERT_TRUE(o.last.has_error()) << o.last.DebugString();
  EXPECT_NE(o.last.error().message().find("injected collect failure"), std::string::npos);
  const std::vector<int32_t> chain = Expected(s);
  EXPECT_EQ(o.tokens, std::vector<int32_t>(chain.begin(), chain.begin() + 2));
  futures = Submit({s});
  const Outcome next = Wait(futures[0]);
  ASSERT_TRUE(next.last.has_finished()) << next.last.DebugString();
  EXPECT_EQ(next.tokens, Expected(s));
  ASSERT_TRUE(engine_->WaitIdle(std::chrono::seconds(10)));
  engine_->Stop();
  EXPECT_EQ(engine_->stats().free_blocks, engine_->stats().total_blocks);
  EXPECT_EQ(worker_->in_flight(), 0);
}

TEST_F(EngineOverlapTest, ArrivalsDuringOverlapAndStopWithStepsInFlight) {
  // 1 ms steps. A request arriving while another decodes ahead is admitted by a synchronous step
  // and both streams stay exact; then Stop with steps in flight cancels what is left and leaves
  // nothing launched.
  auto worker = std::make_unique<FakeChainWorker>();
  worker->set_step_delay(std::chrono::milliseconds(1));
  StartEngine(OverlapMode::kOn, std::move(worker));
  Spec first;
  first.prompt = {80, 81, 82};
  first.max_tokens = 60;
  Spec second = first;
  second.prompt = {90, 91};
  second.max_tokens = 30;
  auto a = Submit({first});
  std::this_thread::sleep_for(std::chrono::milliseconds(10));
  auto b = Submit({second});
  const Outcome ob = Wait(b[0]);
  const Outcome oa = Wait(a[0]);
  EXPECT_EQ(oa.tokens, Expected(first));
  EXPECT_EQ(ob.tokens, Expected(second));
  EXPECT_GT(engine_->stats().overlapped_steps, 40u);

  Spec long_one = first;
  long_one.max_tokens = 400;
  auto c = Submit({long_one});
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  engine_->Stop();
  const Outcome oc = Wait(c[0]);
  ASSERT_TRUE(oc.last.has_finished()) << oc.last.DebugString();
  EXPECT_EQ(oc.last.finished().finish_reason(), v1::CANCELLED);
  EXPECT_EQ(worker_->in_flight(), 0);
}

}  // namespace
}  // namespace dsv4
