// Prefix caching end to end on the CPU worker (tests/data/dsv4-tiny: compress ratios 4 and 16,
// window 16, blocks of 64): a node with the cache gives the greedy tokens and logprobs a node
// without it gives, bit for bit, for identical prompts, a shared prefix of every length from 1 to
// 300, a prompt that extends a finished conversation, many concurrent requests on one prefix and
// a pool small enough to evict while hits are in flight; Usage.cached_prompt_tokens and the
// metrics report the hits. DSV4_TEST_DEVICE=cuda DSV4_TEST_PRECISION=fp32 runs it on the GPU, and
// DSV4_TEST_BATCH_INVARIANT=1 there with --batch-invariant (bit for bit again); DSV4_TEST_TP=2 on a
// node split over two worker processes (CTest prefix_cache.tp2).
#include <chrono>
#include <cstdlib>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "gtest/gtest.h"
#include "node/engine.h"
#include "node/request_validation.h"
#include "node/serving_node.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/http_get.h"
#include "tests/testing/test_node.h"

namespace dsv4 {
namespace {

constexpr int kBlock = 64;

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // the chosen token's, then its top alternatives', per token
  int32_t cached = -1;
  bool ok = false;
  bool operator==(const Output& o) const { return tokens == o.tokens && logprobs == o.logprobs; }
};

class CollectSink final : public RequestSink {
 public:
  void Emit(v1::GenerateResponse r, bool last) override {
    if (r.has_chunk()) {
      for (int32_t t : r.chunk().token_ids()) out_.tokens.push_back(t);
      for (const v1::TokenLogprob& lp : r.chunk().logprobs()) {
        out_.logprobs.push_back(lp.logprob());
        for (const v1::TopLogprob& top : lp.top()) out_.logprobs.push_back(top.logprob());
      }
    }
    if (r.has_finished()) {
      out_.cached = r.finished().usage().cached_prompt_tokens();
      out_.ok = true;
    }
    if (last) done_.set_value(out_);
  }
  std::future<Output> future() { return done_.get_future(); }

 private:
  Output out_;
  std::promise<Output> done_;
};

NodeOptions Options(bool cache, int32_t kv_blocks = 0, int32_t cache_blocks = 0) {
  NodeOptions o;
  testing::UseTestWorker(o, "fp32");
  o.model_dir = testing::TestData("dsv4-tiny");
  o.tokenizer_path = testing::TestData("tok-tiny/tokenizer.json");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  o.overlap = "on";  // the CPU worker resolves overlapped steps' deferred tokens on the host
  o.max_model_len = 1024;
  o.max_num_seqs = 16;
  o.max_batched_tokens = 256;
  o.kv_blocks = kv_blocks;
  o.enable_prefix_caching = cache;
  o.prefix_cache_max_blocks = cache_blocks;
  return o;
}

double Metric(int port, const std::string& name) {
  const std::string body = testing::HttpGet(port, "/metrics");
  const size_t at = body.find("\n" + name + " ");
  if (at == std::string::npos) return -1;
  return std::atof(body.c_str() + at + name.size() + 2);
}

// Runs `prompts` at once on `node` (greedy, logprobs with 2 alternatives, `max_tokens`
// each, end of sequence ignored) and waits for all.
std::vector<Output> Generate(ServingNode* node, const std::vector<std::vector<int32_t>>& prompts,
                               int max_tokens) {
  std::vector<std::future<Output>> futures;
  for (const auto& p : prompts) {
    v1::GenerateRequest req;
    for (int32_t t : p) req.mutable_token_ids()->add_ids(t);
    req.set_max_tokens(max_tokens);
    req.set_ignore_eos(true);
    req.set_logprobs(2);
    auto v = ValidateRequest(req, *node->runtime().tokenizer, node->runtime().limits, 1);
    EXPECT_TRUE(v.ok()) << v.status();
    if (!v.ok()) return {};
    auto sink = std::make_shared<CollectSink>();
    futures.push_back(sink->future());
    const auto id = node->engine().Submit(*std::move(v), sink);
    EXPECT_TRUE(id.ok()) << id.status();
  }
  std::vector<Output> out;
  for (auto& f : futures) {
    EXPECT_EQ(f.wait_for(std::chrono::seconds(300)), std::future_status::ready);
    out.push_back(f.get());
    EXPECT_TRUE(out.back().ok);
  }
  return out;
}

std::vector<int32_t> Random(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  // Ordinary tokens of the tiny vocabulary (below its special tokens).
  for (auto& t : p) t = 10 + static_cast<int32_t>(rng() % 200);
  return p;
}

// Bit for bit on the CPU worker and on the GPU with --batch-invariant. On the GPU's default mode
// (fp32) the same tokens, and logprobs within fp32 rounding: its kernels are picked by batch
// shape, so a hit's shorter prefill rounds differently (the count of bit-exact outputs is printed).
void ExpectEqual(const std::vector<Output>& on, const std::vector<Output>& off,
               const std::string& what) {
  ASSERT_EQ(on.size(), off.size());
  const NodeOptions o = Options(true);
  const bool gpu = o.device != "cpu";
  const bool exact_only = !gpu || o.batch_invariant;
  int exact = 0;
  for (size_t i = 0; i < on.size(); ++i) {
    EXPECT_EQ(off[i].cached, 0);
    exact += on[i] == off[i] ? 1 : 0;
    if (exact_only) {
      EXPECT_TRUE(on[i] == off[i]) << what << " #" << i << ": the cache changed the output";
      continue;
    }
    EXPECT_EQ(on[i].tokens, off[i].tokens) << what << " #" << i;
    ASSERT_EQ(on[i].logprobs.size(), off[i].logprobs.size());
    for (size_t k = 0; k < on[i].logprobs.size(); ++k) {
      EXPECT_NEAR(on[i].logprobs[k], off[i].logprobs[k], 1e-3) << what << " #" << i;
    }
  }
  if (gpu) std::printf("    %s: %d of %zu outputs bit-exact on the GPU\n", what.c_str(), exact, on.size());
}

class PrefixCacheNode : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (bool cache : {true, false}) {
      auto node = ServingNode::Start(Options(cache));
      ASSERT_TRUE(node.ok()) << node.status();
      (cache ? on_ : off_) = node->release();
    }
  }
  static void TearDownTestSuite() {
    delete on_;
    delete off_;
    on_ = off_ = nullptr;
  }

  static ServingNode* on_;
  static ServingNode* off_;
};
ServingNode* PrefixCacheNode::on_ = nullptr;
ServingNode* PrefixCacheNode::off_ = nullptr;

TEST_F(PrefixCacheNode, IdenticalPromptsAndASharedPrefixOfEveryLength) {
  const std::vector<int32_t> base = Random(320, 1);
  const double hits0 = Metric(on_->metrics_port(), "dsv4_prefix_cache_hits_total");
  // The base twice: the second is a hit of every whole block but the one holding the last token.
  const std::vector<Output> first = Generate(on_, {base}, 4);
  const std::vector<Output> again = Generate(on_, {base}, 4);
  ASSERT_EQ(first.size(), 1u);
  ASSERT_EQ(again.size(), 1u);
  EXPECT_EQ(first[0].cached, 0);
  EXPECT_EQ(again[0].cached, 256);
  ExpectEqual(again, Generate(off_, {base}, 4), "identical");
  EXPECT_TRUE(first[0] == again[0]);
  // Prefixes of 1..300 tokens of the base, each followed by its own tokens: hits of every whole
  // block of the prefix (at least length - 63 tokens), from the ring and compressor snapshots.
  std::vector<std::vector<int32_t>> prompts;
  double expected_hits = 256;
  for (int len = 1; len <= 300; ++len) {
    expected_hits += len / kBlock * kBlock;
    std::vector<int32_t> p(base.begin(), base.begin() + len);
    const std::vector<int32_t> tail = Random(6, 1000 + len);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  for (size_t at = 0; at < prompts.size(); at += 50) {
    const std::vector<std::vector<int32_t>> wave(prompts.begin() + at,
                                                 prompts.begin() + std::min(at + 50, prompts.size()));
    const std::vector<Output> on = Generate(on_, wave, 2);
    ExpectEqual(on, Generate(off_, wave, 2), "shared prefix");
    for (size_t i = 0; i < on.size(); ++i) {
      const int len = static_cast<int>(at + i) + 1;
      EXPECT_EQ(on[i].cached, len / kBlock * kBlock) << "prefix of " << len;
    }
  }
  EXPECT_EQ(Metric(on_->metrics_port(), "dsv4_prefix_cache_hits_total") - hits0, expected_hits);
  EXPECT_EQ(Metric(off_->metrics_port(), "dsv4_prefix_cache_hits_total"), 0);
}

TEST_F(PrefixCacheNode, APromptThatExtendsAFinishedConversation) {
  // Turn 1, then turn 2 = turn 1's prompt + its answer + new tokens: the answer's blocks, made by
  // decode steps, are hit too.
  const std::vector<int32_t> p1 = Random(200, 2);
  const std::vector<Output> t1 = Generate(on_, {p1}, 90);
  ASSERT_EQ(t1.size(), 1u);
  std::vector<int32_t> p2 = p1;
  p2.insert(p2.end(), t1[0].tokens.begin(), t1[0].tokens.end());
  const std::vector<int32_t> more = Random(30, 3);
  p2.insert(p2.end(), more.begin(), more.end());
  const std::vector<Output> on = Generate(on_, {p2}, 8);
  ExpectEqual(on, Generate(off_, {p2}, 8), "next turn");
  EXPECT_EQ(on[0].cached, 256);  // 290 tokens of turn 1: two whole blocks
}

TEST_F(PrefixCacheNode, ManyConcurrentRequestsOnOnePrefix) {
  const std::vector<int32_t> prefix = Random(300, 4);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 24; ++i) {
    std::vector<int32_t> p = prefix;
    const std::vector<int32_t> tail = Random(5 + i, 50 + i);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  const std::vector<Output> on = Generate(on_, prompts, 6);
  ExpectEqual(on, Generate(off_, prompts, 6), "concurrent");
  int hits = 0;
  for (const Output& o : on) hits += o.cached > 0 ? 1 : 0;
  // The first request of the step that admits it caches the prefix; later ones hit it.
  EXPECT_GT(hits, 0);
}

TEST(PrefixCacheEviction, EvictionUnderPressureWhileHitsAreInFlight) {
  // 12 blocks of KV and 4 cached blocks for 8 requests over 4 prefixes: blocks are evicted while
  // other requests hold and hit theirs.
  auto on = ServingNode::Start(Options(true, /*kv_blocks=*/12, /*cache_blocks=*/4));
  ASSERT_TRUE(on.ok()) << on.status();
  auto off = ServingNode::Start(Options(false, 12));
  ASSERT_TRUE(off.ok()) << off.status();
  auto prompts = [](int first_prefix) {
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < 8; ++i) {
      std::vector<int32_t> p = Random(140, 10 + first_prefix + i % 4);
      const std::vector<int32_t> tail = Random(3 + i, 90 + i);
      p.insert(p.end(), tail.begin(), tail.end());
      out.push_back(p);
    }
    return out;
  };
  // Prefixes 0-3 fill the cache; then 4-7 need its blocks while 0-3 come back for their hits.
  std::vector<std::vector<int32_t>> mixed = prompts(4);
  for (const auto& p : prompts(0)) mixed.push_back(p);
  for (const auto& wave : {prompts(0), mixed, mixed}) {
    const std::vector<Output> a = Generate(on->get(), wave, 8);
    const std::vector<Output> b = Generate(off->get(), wave, 8);
    ASSERT_EQ(a.size(), b.size());
    ExpectEqual(a, b, "under pressure");
  }
  EXPECT_GT(Metric((*on)->metrics_port(), "dsv4_prefix_cache_evictions_total"), 0);
  EXPECT_GT(Metric((*on)->metrics_port(), "dsv4_prefix_cache_hits_total"), 0);
  EXPECT_LE(Metric((*on)->metrics_port(), "dsv4_prefix_cache_blocks"), 4);
}

// The golden fixtures through a node with the cache on: each prompt twice, the second a hit of
// every whole block before its last token, both equal to the fixture's greedy tokens (dsv4-tiny,
// whose greedy stream the CPU worker reproduces exactly), and to each other (bit for bit on the
// CPU; same tokens, logprobs within fp32 rounding on the GPU).
TEST(PrefixCacheGolden, GoldenPromptsTwiceWithTheCacheOn) {
  for (const char* model : {"dsv4-tiny", "dsv4-tiny-fp8"}) {
    NodeOptions o = Options(true);
    o.model_dir = testing::TestData(model);
    auto node = ServingNode::Start(o);
    ASSERT_TRUE(node.ok()) << node.status();
    auto text = ReadFileToString(testing::TestData(std::string(model) + "/golden.json"), 1 << 24);
    ASSERT_TRUE(text.ok()) << text.status();
    const Json golden = Json::parse(*text);
    for (const Json& p : golden["prompts"]) {
      const std::vector<int32_t> prompt = p["input_ids"].get<std::vector<int32_t>>();
      const std::vector<int32_t> greedy = p["greedy_ids"].get<std::vector<int32_t>>();
      const std::vector<Output> first = Generate(node->get(), {prompt}, static_cast<int>(greedy.size()));
      const std::vector<Output> second = Generate(node->get(), {prompt}, static_cast<int>(greedy.size()));
      ASSERT_EQ(first.size(), 1u);
      ASSERT_EQ(second.size(), 1u);
      // The fixture's greedy stream is fp32's: the CPU worker's, and the GPU's in fp32 (bf16 drifts
      // after a few tokens on the tiny model's near-tied logits).
      if (std::string(model) == "dsv4-tiny" && (o.device == "cpu" || o.precision == "fp32")) {
        EXPECT_EQ(first[0].tokens, greedy) << model;
      }
      ExpectEqual(second, first, absl::StrCat(model, " prompt of ", prompt.size(), " tokens"));
      EXPECT_EQ(second[0].cached, (static_cast<int>(prompt.size()) - 1) / kBlock * kBlock);
    }
  }
}

}  // namespace
}  // namespace dsv4
