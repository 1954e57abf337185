#include "node/output_processor.h"

#include <memory>
#include <string>

#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"

namespace dsv4 {
namespace {

class OutputTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tok_ = Tokenizer::Load(testing::TestData("tok-tiny/tokenizer.json"))->release();
  }
  static void TearDownTestSuite() { delete tok_; }
  OutputOptions Options() {
    OutputOptions o;
    o.eos_token_ids = {1};
    o.max_tokens = 1000;
    o.think_start_id = 5;
    o.think_end_id = 6;
    return o;
  }
  std::vector<int32_t> Ids(const std::string& text) { return *tok_->Encode(text); }
  // Feeds ids; returns the concatenated text per channel and the last outcome.
  struct Run {
    std::string reasoning, content;
    TokenOutcome last;
    int tokens = 0;
  };
  Run Feed(OutputProcessor& p, const std::vector<int32_t>& ids) {
    Run r;
    for (int32_t id : ids) {
      r.last = p.OnToken(id);
      ++r.tokens;
      (r.last.channel == Phase::kReasoning ? r.reasoning : r.content) += r.last.text;
      if (r.last.finished) break;
    }
    return r;
  }
  static Tokenizer* tok_;
};
Tokenizer* OutputTest::tok_ = nullptr;

TEST_F(OutputTest, ReasoningThenContent) {
  OutputOptions o = Options();
  o.initial_phase = Phase::kReasoning;
  OutputProcessor p(tok_, o);
  std::vector<int32_t> ids = Ids("step one");
  ids.push_back(6);
  for (int32_t id : Ids("The answer is 42.")) ids.push_back(id);
  ids.push_back(1);
  const Run r = Feed(p, ids);
  EXPECT_EQ(r.reasoning, "step one");
  EXPECT_EQ(r.content, "The answer is 42.");
  EXPECT_TRUE(r.last.finished);
  EXPECT_EQ(r.last.reason, FinishReason::kStop);
  EXPECT_EQ(r.last.stop.kind, StopInfo::Kind::kEos);
  EXPECT_EQ(p.phase(), Phase::kContent);
  EXPECT_EQ(p.reasoning_tokens(), static_cast<int32_t>(Ids("step one").size()) + 1);
  EXPECT_EQ(p.completion_tokens(), static_cast<int32_t>(ids.size()));
}

TEST_F(OutputTest, LengthCapWhileReasoningIsVisible) {
  OutputOptions o = Options();
  o.initial_phase = Phase::kReasoning;
  o.max_tokens = 5;
  OutputProcessor p(tok_, o);
  const Run r = Feed(p, Ids("a long chain of thought that never ends"));
  EXPECT_EQ(r.tokens, 5);
  EXPECT_EQ(r.last.reason, FinishReason::kLength);
  EXPECT_EQ(p.phase(), Phase::kReasoning);
  EXPECT_EQ(p.content_text_bytes(), 0);
}

TEST_F(OutputTest, StopStringsAreHeldBackAndCut) {
  OutputOptions o = Options();
  o.stop_strings = {"world", "xyz"};
  OutputProcessor p(tok_, o);
  std::string streamed;
  TokenOutcome last;
  for (int32_t id : Ids("Hello, world! How are you?")) {
    last = p.OnToken(id);
    streamed += last.text;
    // Nothing that could start "world" is ever streamed before the match is decided.
    EXPECT_EQ(streamed.find("w"), std::string::npos) << streamed;
    if (last.finished) break;
  }
  EXPECT_TRUE(last.finished);
  EXPECT_EQ(last.stop.kind, StopInfo::Kind::kStopString);
  EXPECT_EQ(last.stop.text, "world");
  EXPECT_EQ(streamed, "Hello, ");
}

TEST_F(OutputTest, HeldTextThatIsNotAStopIsReleased) {
  OutputOptions o = Options();
  o.stop_strings = {"Hello!"};
  OutputProcessor p(tok_, o);
  std::string streamed;
  for (int32_t id : Ids("Hello, world")) streamed += p.OnToken(id).text;
  EXPECT_EQ(streamed, "Hello, world");
  // "Hel" is held until the request ends, then flushed.
  OutputProcessor q(tok_, o);
  streamed.clear();
  for (int32_t id : Ids("Hel")) streamed += q.OnToken(id).text;
  EXPECT_EQ(streamed, "");
  EXPECT_EQ(q.Flush(), "Hel");
}

TEST_F(OutputTest, IncludeStopStringAndStopTokens) {
  OutputOptions o = Options();
  o.stop_strings = {"world"};
  o.include_stop_str_in_output = true;
  OutputProcessor p(tok_, o);
  Run r = Feed(p, Ids("Hello, world! How"));
  EXPECT_EQ(r.content, "Hello, world");
  EXPECT_EQ(r.last.discarded_text, "");
  OutputOptions t = Options();
  t.stop_token_ids = {9};  // "!"
  OutputProcessor q(tok_, t);
  r = Feed(q, Ids("Hello!"));
  EXPECT_EQ(r.last.stop.kind, StopInfo::Kind::kStopToken);
  EXPECT_EQ(r.last.stop.token, 9);
}

TEST_F(OutputTest, IgnoreEos) {
  OutputOptions o = Options();
  o.ignore_eos = true;
  o.max_tokens = 3;
  OutputProcessor p(tok_, o);
  const Run r = Feed(p, {1, 1, 1, 1});
  EXPECT_EQ(r.tokens, 3);
  EXPECT_EQ(r.last.reason, FinishReason::kLength);
}

TEST_F(OutputTest, NeverSplitsACharacterAndFlushesAPartialOne) {
  OutputProcessor p(tok_, Options());
  const auto ids = Ids("😀");
  EXPECT_EQ(p.OnToken(ids[0]).text, "");
  EXPECT_EQ(p.OnToken(ids[1]).text, "");
  EXPECT_EQ(p.OnToken(ids[2]).text, "😀");
  OutputOptions o = Options();
  o.max_tokens = 1;
  OutputProcessor q(tok_, o);
  EXPECT_EQ(q.OnToken(ids[0]).text, "\xEF\xBF\xBD");  // finished mid-character
}

TEST_F(OutputTest, RepetitionObserveAndStop) {
  std::vector<int32_t> loop;
  for (int i = 0; i < 20; ++i) {
    for (int32_t id : {40, 41, 42}) loop.push_back(id);
  }
  for (RepetitionMode mode : {RepetitionMode::kObserve, RepetitionMode::kStop}) {
    OutputOptions o = Options();
    o.repetition_mode = mode;
    o.repetition = RepetitionConfig{8, 4, 12};
    OutputProcessor p(tok_, o);
    int detections = 0, when = -1, n = 0;
    TokenOutcome last;
    for (int32_t id : loop) {
      last = p.OnToken(id);
      ++n;
      if (last.repetition_detected_now) {
        ++detections;
        when = n;
      }
      if (last.finished) break;
    }
    EXPECT_EQ(detections, 1);
    EXPECT_EQ(when, 12);  // period 3 x 4 repeats
    if (mode == RepetitionMode::kStop) {
      EXPECT_EQ(last.reason, FinishReason::kRepetition);
      EXPECT_EQ(n, 12);
    } else {
      EXPECT_EQ(n, 60);
    }
  }
}

TEST(RepetitionDetector, PeriodsAndSpans) {
  RepetitionDetector d(RepetitionConfig{4, 3, 8});
  // Period 1 needs a span of 8 identical tokens (min_tokens), not just 3.
  int fired = 0;
  for (int i = 0; i < 7; ++i) fired += d.Push(7) > 0;
  EXPECT_EQ(fired, 0);
  EXPECT_EQ(d.Push(7), 1);
  RepetitionDetector e(RepetitionConfig{4, 3, 8});
  const std::vector<int32_t> seq = {1, 2, 3, 4, 1, 2, 3, 4, 1, 2, 3};
  for (int32_t t : seq) EXPECT_EQ(e.Push(t), 0);
  EXPECT_EQ(e.Push(4), 4);  // 3 repeats of a 4-token block = 12 >= 8
  RepetitionDetector f(RepetitionConfig{4, 3, 8});
  for (int32_t t : {1, 2, 3, 1, 2, 4, 1, 2, 3, 4, 5, 6}) EXPECT_EQ(f.Push(t), 0);
}

}  // namespace
}  // namespace dsv4
