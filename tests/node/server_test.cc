// End-to-end tests against a real node on loopback (ephemeral ports): gRPC streaming, batching
// equivalence under concurrency, cancellation, deadlines, validation errors, drain, health and
// the Prometheus exposition.
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "dsv4/v1/dsv4.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "common/status.h"
#include "node/control/remote_worker_group.h"
#include "node/serving_node.h"
#include "worker/in_process_worker.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/http_get.h"
#include "tests/testing/test_node.h"

namespace dsv4 {
namespace {

using v1::GenerateRequest;
using v1::GenerateResponse;

struct CallResult {
  grpc::Status status;
  std::vector<GenerateResponse> responses;
  std::vector<int32_t> tokens;
  std::string text;
  const v1::Finished* finished() const {
    return !responses.empty() && responses.back().has_finished() ? &responses.back().finished()
                                                                 : nullptr;
  }
};

NodeOptions TestOptions() {
  NodeOptions o;
  // DSV4_TEST_TP=N: a node whose model is split over N worker processes; DSV4_TEST_DEVICE=cuda
  // [DSV4_TEST_PRECISION=fp32]: the same suite on the GPU worker (tests/testing/test_node.h).
  testing::UseTestWorker(o, "bf16");
  o.model_dir = testing::TestData("dsv4-tiny");
  o.tokenizer_path = testing::TestData("tok-tiny/tokenizer.json");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  // Overlapped decode on every worker (the CPU worker runs each step inside Launch, resolving the
  // deferred tokens on the host), so the suite covers the engine's overlapped path everywhere;
  // DSV4_TEST_OVERLAP=off|auto runs it the other way.
  const char* overlap = std::getenv("DSV4_TEST_OVERLAP");
  o.overlap = overlap != nullptr ? overlap : "on";
  o.max_model_len = 1024;
  o.max_num_seqs = 64;
  o.max_batched_tokens = 256;
  o.default_max_tokens = 64;
  o.repetition.min_count = 3;
  o.repetition.min_tokens = 4;
  return o;
}

// Whether greedy and seeded streams are exact: equal to the fp32 fixture and independent of the
// batch they ran in. They are on the CPU worker (any precision: it computes in fp32) and on the GPU
// worker in fp32. The GPU worker's bf16 kernels round activations to bf16 and pick their kernels by
// batch shape, so on the tiny random model, whose logits are nearly tied, a stream drifts from the
// fixture after a few tokens and can differ between batch compositions (bf16 against the CPU
// reference, within tolerances: tests/gpu/cuda_model_test.cc). There the tests below keep their
// other assertions and drop the token equality.
bool ExactTokens() {
  const NodeOptions o = TestOptions();
  return o.device != "cuda" || o.precision == "fp32";
}

class Client {
 public:
  explicit Client(int port)
      : channel_(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                     grpc::InsecureChannelCredentials())),
        stub_(v1::Dsv4::NewStub(channel_)) {}

  // Runs a Generate call to completion. `after_chunks` (optional) is called after each response
  // with the count so far; returning true cancels the call.
  CallResult Generate(const GenerateRequest& req, double deadline_s = 60,
                      std::function<bool(int)> cancel_after = nullptr) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000)));
    CallResult r;
    auto reader = stub_->Generate(&ctx, req);
    GenerateResponse resp;
    while (reader->Read(&resp)) {
      if (resp.has_chunk()) {
        for (int32_t t : resp.chunk().token_ids()) r.tokens.push_back(t);
        r.text += resp.chunk().text();
      }
      r.responses.push_back(resp);
      if (cancel_after && cancel_after(static_cast<int>(r.responses.size()))) ctx.TryCancel();
    }
    r.status = reader->Finish();
    return r;
  }

  v1::Dsv4::Stub& stub() { return *stub_; }
  std::shared_ptr<grpc::Channel> channel() { return channel_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Dsv4::Stub> stub_;
};

GenerateRequest Ids(std::vector<int32_t> ids, int max_tokens) {
  GenerateRequest r;
  for (int32_t id : ids) r.mutable_token_ids()->add_ids(id);
  r.set_max_tokens(max_tokens);
  return r;
}

double Metric(int port, const std::string& name) {
  const std::string body = testing::HttpGet(port, "/metrics");
  const size_t at = body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::atof(body.c_str() + at + name.size() + 2);
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto node = ServingNode::Start(TestOptions());
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = node->release();
  }
  static void TearDownTestSuite() {
    delete node_;
    node_ = nullptr;
  }
  void WaitForIdleEngine() {
    for (int i = 0; i < 500 && node_->engine().stats().in_flight > 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  static ServingNode* node_;
};
ServingNode* ServerTest::node_ = nullptr;

TEST_F(ServerTest, StreamsTheReferenceGreedyTokens) {
  Client c(node_->grpc_port());
  // Prompt p0 of the fixture: its greedy continuation is known.
  const CallResult r = c.Generate(Ids({263, 1015, 148, 447, 146}, 24));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  if (ExactTokens()) {
    EXPECT_EQ(r.tokens,
              (std::vector<int32_t>{37,  324, 305, 373, 625, 667, 259, 969, 947, 558, 554, 607,
                                    607, 607, 607, 607, 435, 191, 803, 855, 18,  708, 974, 278}));
  }
  ASSERT_NE(r.finished(), nullptr);
  EXPECT_EQ(r.finished()->finish_reason(), v1::LENGTH);
  EXPECT_EQ(r.finished()->phase_at_finish(), v1::PHASE_CONTENT);
  EXPECT_EQ(r.finished()->usage().prompt_tokens(), 5);
  EXPECT_EQ(r.finished()->usage().completion_tokens(), 24);
  EXPECT_GT(r.finished()->timings().e2e_seconds(), 0);
  // 24 chunks then one finished; the text is the streamed decode of the tokens.
  EXPECT_EQ(r.responses.size(), 25u);
  EXPECT_EQ(r.text, node_->runtime().tokenizer->Decode(r.tokens, /*skip_special_tokens=*/true));
  for (const auto& resp : r.responses) EXPECT_FALSE(resp.request_id().empty());
}

TEST_F(ServerTest, SixtyFourConcurrentStreamsEqualSequentialOnes) {
  Client c(node_->grpc_port());
  std::mt19937 rng(7);
  std::vector<GenerateRequest> reqs;
  for (int i = 0; i < 64; ++i) {
    std::vector<int32_t> ids(5 + rng() % 60);
    for (auto& id : ids) id = 9 + static_cast<int32_t>(rng() % 1000);
    reqs.push_back(Ids(ids, 12 + static_cast<int>(rng() % 8)));
    reqs.back().set_ignore_eos(true);
  }
  std::vector<std::vector<int32_t>> sequential;
  for (const auto& r : reqs) {
    const CallResult res = c.Generate(r);
    ASSERT_TRUE(res.status.ok());
    sequential.push_back(res.tokens);
  }
  std::vector<std::vector<int32_t>> concurrent(reqs.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < reqs.size(); ++i) {
    threads.emplace_back([&, i] {
      Client own(node_->grpc_port());
      concurrent[i] = own.Generate(reqs[i]).tokens;
    });
  }
  for (auto& t : threads) t.join();
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(concurrent[i].size(), static_cast<size_t>(reqs[i].max_tokens())) << "request " << i;
    if (ExactTokens()) EXPECT_EQ(concurrent[i], sequential[i]) << "request " << i;
  }
}

TEST_F(ServerTest, SeededSamplingIgnoresTheRestOfTheBatch) {
  Client c(node_->grpc_port());
  GenerateRequest r = Ids({933, 230, 309, 204}, 16);
  r.mutable_sampling()->set_temperature(1.0f);
  r.mutable_sampling()->set_seed(1234);
  r.set_ignore_eos(true);
  const auto alone = c.Generate(r).tokens;
  std::vector<std::thread> noise;
  std::atomic<bool> go{true};
  for (int i = 0; i < 6; ++i) {
    noise.emplace_back([&, i] {
      Client own(node_->grpc_port());
      GenerateRequest n = Ids({100 + i, 200, 300}, 40);
      n.mutable_sampling()->set_temperature(0.7f);
      n.set_ignore_eos(true);
      own.Generate(n);
    });
  }
  const auto busy = c.Generate(r).tokens;
  for (auto& t : noise) t.join();
  ASSERT_EQ(busy.size(), 16u);
  if (ExactTokens()) EXPECT_EQ(busy, alone);
}

TEST_F(ServerTest, CancelMidStreamFreesKv) {
  WaitForIdleEngine();
  const EngineStats before = node_->engine().stats();
  Client c(node_->grpc_port());
  GenerateRequest r = Ids({5, 6, 7, 8, 9, 10, 11, 12}, 900);
  r.set_ignore_eos(true);
  const CallResult res = c.Generate(r, 60, [](int n) { return n == 5; });
  EXPECT_EQ(res.status.error_code(), grpc::StatusCode::CANCELLED);
  WaitForIdleEngine();
  const EngineStats after = node_->engine().stats();
  EXPECT_EQ(after.in_flight, 0);
  EXPECT_EQ(after.running, 0);
  EXPECT_EQ(after.free_blocks, before.free_blocks);
  EXPECT_EQ(after.free_blocks, after.total_blocks);
}

TEST_F(ServerTest, AbortByRequestId) {
  Client c(node_->grpc_port());
  GenerateRequest r = Ids({5, 6, 7}, 900);
  r.set_ignore_eos(true);
  r.set_request_id("abort-me");
  std::atomic<bool> aborted{false};
  const CallResult res = c.Generate(r, 60, [&](int n) {
    if (n == 3 && !aborted.exchange(true)) {
      grpc::ClientContext ctx;
      v1::AbortRequest a;
      a.set_request_id("abort-me");
      v1::AbortResponse resp;
      EXPECT_TRUE(c.stub().Abort(&ctx, a, &resp).ok());
      EXPECT_TRUE(resp.found());
    }
    return false;
  });
  ASSERT_TRUE(res.status.ok()) << res.status.error_message();
  ASSERT_NE(res.finished(), nullptr);
  EXPECT_EQ(res.finished()->finish_reason(), v1::CANCELLED);
  EXPECT_LT(res.finished()->usage().completion_tokens(), 900);
  // Unknown ids are not an error.
  grpc::ClientContext ctx;
  v1::AbortRequest a;
  a.set_request_id("nobody");
  v1::AbortResponse resp;
  EXPECT_TRUE(c.stub().Abort(&ctx, a, &resp).ok());
  EXPECT_FALSE(resp.found());
}

TEST_F(ServerTest, DeadlineExceeded) {
  Client c(node_->grpc_port());
  GenerateRequest r = Ids({5, 6, 7}, 900);
  r.set_ignore_eos(true);
  const CallResult res = c.Generate(r, 0.05);
  EXPECT_EQ(res.status.error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  WaitForIdleEngine();
  EXPECT_EQ(node_->engine().stats().in_flight, 0);
  EXPECT_EQ(node_->engine().stats().free_blocks, node_->engine().stats().total_blocks);
}

struct Bad {
  std::string name;
  std::function<void(GenerateRequest&)> edit;
  grpc::StatusCode code;
  std::string field;
};

TEST_F(ServerTest, EveryInvalidInputGetsItsCodeAndTheNodeKeepsServing) {
  const std::vector<Bad> cases = {
      {"no_input", [](GenerateRequest& r) { r.clear_token_ids(); }, grpc::INVALID_ARGUMENT, "input"},
      {"empty_ids", [](GenerateRequest& r) { r.mutable_token_ids()->clear_ids(); },
       grpc::INVALID_ARGUMENT, "input.token_ids.ids"},
      {"id_out_of_vocab", [](GenerateRequest& r) { r.mutable_token_ids()->add_ids(1024); },
       grpc::INVALID_ARGUMENT, "input.token_ids.ids[3]"},
      {"negative_id", [](GenerateRequest& r) { r.mutable_token_ids()->set_ids(0, -1); },
       grpc::INVALID_ARGUMENT, "input.token_ids.ids[0]"},
      {"empty_text", [](GenerateRequest& r) { r.set_text(""); }, grpc::INVALID_ARGUMENT,
       "input.text"},
      {"empty_chat", [](GenerateRequest& r) { r.mutable_chat(); }, grpc::INVALID_ARGUMENT,
       "input.chat.messages"},
      {"bad_role",
       [](GenerateRequest& r) {
         auto* m = r.mutable_chat()->add_messages();
         m->set_role("robot");
         m->set_content("hi");
       },
       grpc::INVALID_ARGUMENT, "input.chat.messages[0].role"},
      {"too_long",
       [](GenerateRequest& r) {
         r.clear_token_ids();
         for (int i = 0; i < 1000; ++i) r.mutable_token_ids()->add_ids(10);
         r.set_max_tokens(100);
       },
       grpc::OUT_OF_RANGE, "max_tokens"},
      {"prompt_fills_model",
       [](GenerateRequest& r) {
         r.clear_token_ids();
         for (int i = 0; i < 1024; ++i) r.mutable_token_ids()->add_ids(10);
       },
       grpc::OUT_OF_RANGE, "input"},
      {"max_tokens_zero", [](GenerateRequest& r) { r.set_max_tokens(0); }, grpc::INVALID_ARGUMENT,
       "max_tokens"},
      {"min_tokens", [](GenerateRequest& r) { r.set_min_tokens(99); }, grpc::INVALID_ARGUMENT,
       "min_tokens"},
      {"temperature", [](GenerateRequest& r) { r.mutable_sampling()->set_temperature(-0.5f); },
       grpc::INVALID_ARGUMENT, "sampling.temperature"},
      {"temperature_nan", [](GenerateRequest& r) { r.mutable_sampling()->set_temperature(NAN); },
       grpc::INVALID_ARGUMENT, "sampling.temperature"},
      {"top_p_zero", [](GenerateRequest& r) { r.mutable_sampling()->set_top_p(0); },
       grpc::INVALID_ARGUMENT, "sampling.top_p"},
      {"top_p_big", [](GenerateRequest& r) { r.mutable_sampling()->set_top_p(1.5f); },
       grpc::INVALID_ARGUMENT, "sampling.top_p"},
      {"top_k", [](GenerateRequest& r) { r.mutable_sampling()->set_top_k(-1); },
       grpc::INVALID_ARGUMENT, "sampling.top_k"},
      {"min_p", [](GenerateRequest& r) { r.mutable_sampling()->set_min_p(2); },
       grpc::INVALID_ARGUMENT, "sampling.min_p"},
      {"repetition_penalty",
       [](GenerateRequest& r) { r.mutable_sampling()->set_repetition_penalty(0); },
       grpc::INVALID_ARGUMENT, "sampling.repetition_penalty"},
      {"presence", [](GenerateRequest& r) { r.mutable_sampling()->set_presence_penalty(3); },
       grpc::INVALID_ARGUMENT, "sampling.presence_penalty"},
      {"frequency", [](GenerateRequest& r) { r.mutable_sampling()->set_frequency_penalty(-3); },
       grpc::INVALID_ARGUMENT, "sampling.frequency_penalty"},
      {"too_many_stops",
       [](GenerateRequest& r) {
         for (int i = 0; i < 17; ++i) r.add_stop("s" + std::to_string(i));
       },
       grpc::INVALID_ARGUMENT, "stop"},
      {"empty_stop", [](GenerateRequest& r) { r.add_stop(""); }, grpc::INVALID_ARGUMENT, "stop[0]"},
      {"long_stop", [](GenerateRequest& r) { r.add_stop(std::string(300, 'x')); },
       grpc::INVALID_ARGUMENT, "stop[0]"},
      {"stop_token", [](GenerateRequest& r) { r.add_stop_token_ids(5000); },
       grpc::INVALID_ARGUMENT, "stop_token_ids[0]"},
      {"logprobs", [](GenerateRequest& r) { r.set_logprobs(21); }, grpc::INVALID_ARGUMENT,
       "logprobs"},
      {"request_id", [](GenerateRequest& r) { r.set_request_id("has space"); },
       grpc::INVALID_ARGUMENT, "request_id"},
      {"repetition_action",
       [](GenerateRequest& r) { r.set_repetition_action(static_cast<v1::RepetitionAction>(9)); },
       grpc::INVALID_ARGUMENT, "repetition_action"},
  };
  Client c(node_->grpc_port());
  for (const Bad& b : cases) {
    GenerateRequest r = Ids({10, 11, 12}, 8);
    b.edit(r);
    const CallResult res = c.Generate(r);
    EXPECT_EQ(res.status.error_code(), b.code) << b.name << ": " << res.status.error_message();
    EXPECT_EQ(res.status.error_message().rfind(b.field, 0), 0u)
        << b.name << ": " << res.status.error_message();
    EXPECT_TRUE(res.responses.empty()) << b.name;
  }
  const CallResult ok = c.Generate(Ids({10, 11, 12}, 4));
  EXPECT_TRUE(ok.status.ok());
  EXPECT_EQ(ok.tokens.size(), 4u);
}

TEST_F(ServerTest, DuplicateRequestIdInFlight) {
  Client c(node_->grpc_port());
  GenerateRequest r = Ids({5, 6, 7}, 900);
  r.set_ignore_eos(true);
  r.set_request_id("dup");
  std::atomic<bool> checked{false};
  c.Generate(r, 60, [&](int n) {
    if (n == 2 && !checked.exchange(true)) {
      Client other(node_->grpc_port());
      GenerateRequest d = Ids({5}, 2);
      d.set_request_id("dup");
      EXPECT_EQ(other.Generate(d).status.error_code(), grpc::StatusCode::ALREADY_EXISTS);
      return true;
    }
    return false;
  });
  EXPECT_TRUE(checked);
}

TEST_F(ServerTest, TextChatStopsAndLogprobs) {
  Client c(node_->grpc_port());
  // Chat with thinking: the answer starts in the reasoning channel.
  GenerateRequest chat;
  auto* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Hello, world!");
  chat.mutable_chat()->set_thinking(true);
  chat.set_max_tokens(6);
  chat.set_logprobs(3);
  CallResult r = c.Generate(chat);
  ASSERT_TRUE(r.status.ok());
  ASSERT_FALSE(r.responses.empty());
  EXPECT_EQ(r.responses.front().chunk().channel(), v1::CHANNEL_REASONING);
  ASSERT_EQ(r.responses.front().chunk().logprobs_size(), 1);
  const auto& lp = r.responses.front().chunk().logprobs(0);
  EXPECT_EQ(lp.top_size(), 3);
  EXPECT_LE(lp.logprob(), 0.0f);
  EXPECT_GE(lp.top(0).logprob(), lp.top(1).logprob());
  // Greedy: the chosen token is the most likely one.
  EXPECT_EQ(lp.token_id(), lp.top(0).token_id());
  // Text input, stop token.
  GenerateRequest text;
  text.set_text("The quick brown fox");
  text.set_max_tokens(24);
  r = c.Generate(text);
  ASSERT_TRUE(r.status.ok());
  ASSERT_GE(r.tokens.size(), 3u);
  GenerateRequest stopped = text;
  stopped.add_stop_token_ids(r.tokens[2]);
  const CallResult s = c.Generate(stopped);
  ASSERT_NE(s.finished(), nullptr);
  EXPECT_EQ(s.finished()->finish_reason(), v1::STOP);
  EXPECT_EQ(s.finished()->stop_match().stop_token_id(), r.tokens[2]);
  EXPECT_EQ(s.tokens.size(), 3u);
  // A stop string cut from the full text.
  if (r.text.size() > 6) {
    GenerateRequest ss = text;
    const std::string needle = r.text.substr(3, 3);
    ss.add_stop(needle);
    const CallResult t = c.Generate(ss);
    ASSERT_NE(t.finished(), nullptr);
    EXPECT_EQ(t.finished()->finish_reason(), v1::STOP);
    EXPECT_EQ(t.finished()->stop_match().stop_string(), needle);
    EXPECT_EQ(t.text, r.text.substr(0, r.text.find(needle)));
  }
}

TEST_F(ServerTest, RepetitionStopsWhenAsked) {
  if (!ExactTokens()) GTEST_SKIP() << "needs the fixture's exact greedy stream (see ExactTokens)";
  Client c(node_->grpc_port());
  // p0's greedy continuation repeats token 607 five times (node: min_count 3, min_tokens 4).
  GenerateRequest r = Ids({263, 1015, 148, 447, 146}, 24);
  r.set_repetition_action(v1::REPETITION_ACTION_STOP);
  const CallResult res = c.Generate(r);
  ASSERT_NE(res.finished(), nullptr);
  EXPECT_EQ(res.finished()->finish_reason(), v1::REPETITION);
  EXPECT_TRUE(res.finished()->repetition_detected());
  EXPECT_EQ(res.tokens.size(), 15u);  // 11 tokens + four 607s
  r.set_repetition_action(v1::REPETITION_ACTION_OBSERVE);
  const CallResult observe = c.Generate(r);
  ASSERT_NE(observe.finished(), nullptr);
  EXPECT_EQ(observe.finished()->finish_reason(), v1::LENGTH);
  EXPECT_TRUE(observe.finished()->repetition_detected());
}

TEST_F(ServerTest, HealthAndModelInfo) {
  Client c(node_->grpc_port());
  auto health = grpc::health::v1::Health::NewStub(c.channel());
  for (const char* service : {"", "dsv4.v1.Dsv4"}) {
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckRequest req;
    req.set_service(service);
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, req, &resp).ok()) << service;
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::SERVING);
  }
  grpc::ClientContext ctx;
  v1::GetModelInfoRequest req;
  v1::ModelInfo info;
  ASSERT_TRUE(c.stub().GetModelInfo(&ctx, req, &info).ok());
  EXPECT_EQ(info.vocab_size(), 1024);
  EXPECT_EQ(info.max_model_len(), 1024);
  EXPECT_EQ(info.num_layers(), 6);
  EXPECT_EQ(info.think_end_token_id(), 6);
  EXPECT_EQ(info.layer_types_size(), 6);
}

TEST_F(ServerTest, MetricsMoveAndPassPromtool) {
  const int port = node_->metrics_port();
  const double runaways = Metric(port, "dsv4_length_cap_runaways_total");
  const std::string finished_reasoning =
      "dsv4_requests_finished_total{finish_reason=\"length\",phase_at_finish=\"reasoning\"}";
  const double length_reasoning = Metric(port, finished_reasoning);
  const double generated = Metric(port, "dsv4_generation_tokens_total");
  const double overlapped = Metric(port, "dsv4_overlapped_steps_total");
  ASSERT_GE(runaways, 0);
  // A forced runaway: thinking on, a tiny max_tokens.
  Client c(node_->grpc_port());
  GenerateRequest chat;
  auto* m = chat.mutable_chat()->add_messages();
  m->set_role("user");
  m->set_content("Think hard about this.");
  chat.mutable_chat()->set_thinking(true);
  chat.set_max_tokens(4);
  const CallResult r = c.Generate(chat);
  ASSERT_NE(r.finished(), nullptr);
  EXPECT_EQ(r.finished()->finish_reason(), v1::LENGTH);
  EXPECT_EQ(r.finished()->phase_at_finish(), v1::PHASE_REASONING);
  EXPECT_EQ(r.finished()->usage().reasoning_tokens(), 4);
  EXPECT_EQ(Metric(port, "dsv4_length_cap_runaways_total"), runaways + 1);
  EXPECT_EQ(Metric(port, finished_reasoning), length_reasoning + 1);
  EXPECT_EQ(Metric(port, "dsv4_generation_tokens_total"), generated + 4);
  // With overlap, tokens 2..4 each come from a step launched ahead (the 4th is the last: none
  // after it).
  if (node_->engine().overlap()) {
    EXPECT_GE(Metric(port, "dsv4_overlapped_steps_total"), overlapped + 3);
  } else {
    EXPECT_EQ(Metric(port, "dsv4_overlapped_steps_total"), overlapped);
  }
  EXPECT_EQ(Metric(port, "dsv4_node_ready"), 1);
  // The exposition is valid for Prometheus.
  const std::string body = testing::HttpGet(port, "/metrics");
  for (const char* family : {"dsv4_requests_finished_total",
                             "dsv4_length_cap_runaways_total",
                             "dsv4_repetition_detected_total",
                             "dsv4_time_to_first_token_seconds_bucket",
                             "dsv4_inter_token_latency_seconds_bucket",
                             "dsv4_e2e_request_latency_seconds_bucket",
                             "dsv4_request_queue_time_seconds_bucket",
                             "dsv4_prompt_tokens_total",
                             "dsv4_generation_tokens_total",
                             "dsv4_reasoning_tokens_total",
                             "dsv4_request_reasoning_tokens_bucket",
                             "dsv4_request_content_tokens_bucket",
                             "dsv4_num_requests_running",
                             "dsv4_num_requests_waiting",
                             "dsv4_kv_cache_usage_ratio",
                             "dsv4_preemptions_total",
                             "dsv4_step_duration_seconds_bucket",
                             "dsv4_step_batch_tokens_bucket",
                             "dsv4_worker_up",
                             "dsv4_requests_rejected_total",
                             "dsv4_overlapped_steps_total"}) {
    EXPECT_NE(body.find(family), std::string::npos) << family;
  }
  std::string out;
  if (testing::RunCommand("command -v promtool", &out) != 0) {
    GTEST_SKIP() << "promtool not installed (scripts/setup.sh installs it)";
  }
  const std::string file = testing::TempDir("metrics") + "/metrics.txt";
  testing::WriteFile(file, body);
  out.clear();
  EXPECT_EQ(testing::RunCommand("promtool check metrics < " + file, &out), 0) << out;
}

// Polls `done` for up to `limit`; false on timeout (a test never hangs on a missed event).
bool WaitFor(const std::function<bool()>& done, std::chrono::seconds limit = std::chrono::seconds(60)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

TEST(ServerLifecycle, QueueFullAndDrain) {
  NodeOptions o = TestOptions();
  o.max_num_seqs = 1;
  o.max_waiting = 2;
  o.max_model_len = 4096;
  // One client fills the node here (the default per-client cap would refuse it first).
  o.admission.max_requests_per_client = 16;
  auto node = ServingNode::Start(o);
  ASSERT_TRUE(node.ok()) << node.status();
  const int port = (*node)->grpc_port();
  // One running + two waiting fill the node; the next call is refused. The running one is as long
  // as the model allows (seconds); the two short ones are submitted together on channels that
  // are already connected as soon as it runs, so they queue behind it (submitting them one by one
  // on fresh channels once lost that race on the GPU host). It is cancelled once the node is
  // full, and the two short ones finish during the drain.
  GenerateRequest slow = Ids({5, 6, 7}, 4000);
  slow.set_ignore_eos(true);
  slow.set_request_id("slow");
  GenerateRequest queued = Ids({5, 6, 7}, 50);
  queued.set_ignore_eos(true);
  std::vector<std::thread> calls;
  std::vector<CallResult> results(3);
  std::vector<std::unique_ptr<Client>> clients;
  for (int i = 0; i < 3; ++i) {
    clients.push_back(std::make_unique<Client>(port));
    ASSERT_TRUE(clients.back()->channel()->WaitForConnected(std::chrono::system_clock::now() +
                                                            std::chrono::seconds(30)));
  }
  calls.emplace_back([&] { results[0] = clients[0]->Generate(slow, 300); });
  // Running, not only submitted: a request the engine has not scheduled yet counts as waiting.
  ASSERT_TRUE(WaitFor([&] { return (*node)->engine().stats().running >= 1; }));
  for (int i = 1; i < 3; ++i) {
    calls.emplace_back([&, i] { results[i] = clients[i]->Generate(queued, 300); });
  }
  const bool queued_up = WaitFor([&] { return (*node)->engine().stats().in_flight >= 3; });
  if (!queued_up) {
    const EngineStats st = (*node)->engine().stats();
    ADD_FAILURE() << "the short requests did not queue while the long one ran: in_flight "
                  << st.in_flight << " running " << st.running << " waiting " << st.waiting;
    for (auto& t : calls) t.join();
    for (const auto& r : results) ADD_FAILURE() << r.status.error_code() << " " << r.status.error_message();
    return;
  }
  const CallResult refused = Client(port).Generate(Ids({5}, 2));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << refused.status.error_message();
  {
    // Abort reaches the caller's own requests: the connection that started "slow".
    grpc::ClientContext ctx;
    v1::AbortRequest a;
    a.set_request_id("slow");
    v1::AbortResponse resp;
    ASSERT_TRUE(clients[0]->stub().Abort(&ctx, a, &resp).ok());
    ASSERT_TRUE(resp.found());
  }
  // Drain with room to finish: everything in flight completes normally; new calls are refused.
  std::thread drainer([&] { EXPECT_TRUE((*node)->Drain(std::chrono::seconds(120))); });
  ASSERT_TRUE(WaitFor([&] { return (*node)->engine().draining(); }));
  const CallResult during = Client(port).Generate(Ids({5}, 2));
  EXPECT_EQ(during.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  {
    auto health = grpc::health::v1::Health::NewStub(Client(port).channel());
    grpc::ClientContext ctx;
    grpc::health::v1::HealthCheckResponse resp;
    ASSERT_TRUE(health->Check(&ctx, grpc::health::v1::HealthCheckRequest(), &resp).ok());
    EXPECT_EQ(resp.status(), grpc::health::v1::HealthCheckResponse::NOT_SERVING);
  }
  drainer.join();
  for (auto& t : calls) t.join();
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_NE(results[i].finished(), nullptr) << i;
    EXPECT_EQ(results[i].finished()->finish_reason(), i == 0 ? v1::CANCELLED : v1::LENGTH) << i;
  }
  (*node)->Shutdown();
}

TEST(ServerLifecycle, DrainTimeoutCancelsTheRest) {
  NodeOptions o = TestOptions();
  o.max_model_len = 4096;
  auto node = ServingNode::Start(o);
  ASSERT_TRUE(node.ok()) << node.status();
  GenerateRequest endless = Ids({5, 6, 7}, 4000);
  endless.set_ignore_eos(true);
  CallResult result;
  std::thread call([&] { result = Client((*node)->grpc_port()).Generate(endless, 120); });
  ASSERT_TRUE(WaitFor([&] { return (*node)->engine().stats().in_flight >= 1; }));
  EXPECT_FALSE((*node)->Drain(std::chrono::milliseconds(100)));
  call.join();
  ASSERT_NE(result.finished(), nullptr);
  EXPECT_EQ(result.finished()->finish_reason(), v1::CANCELLED);
  EXPECT_EQ((*node)->engine().stats().in_flight, 0);
  (*node)->Shutdown();
}

}  // namespace
}  // namespace dsv4
