// The coordinator's per-step CUDA-graph choice: every rule of ChooseGraph, the flag parsers and
// the default capture sizes.
#include "node/scheduler/graph_policy.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace dsv4 {
namespace {

// A plan with one sequence per entry of `lens`, feeding that many tokens.
StepPlan Plan(const std::vector<int>& lens) {
  StepPlan p;
  uint64_t id = 1;
  for (int n : lens) {
    ScheduledSeq s;
    s.request_id = id++;
    s.tokens.assign(n, 7);
    p.seqs.push_back(std::move(s));
  }
  return p;
}

GraphConfig Config(CudaGraphMode mode, std::vector<int32_t> sizes = {1, 2, 4, 8, 16}) {
  GraphConfig c;
  c.mode = mode;
  c.capture_sizes = std::move(sizes);
  return c;
}

void ExpectChoice(const GraphChoice& c, GraphMode mode, int32_t padded, bool fallback) {
  EXPECT_EQ(c.mode, mode) << GraphModeName(c.mode);
  EXPECT_EQ(c.padded_tokens, padded);
  EXPECT_EQ(c.fallback, fallback);
}

TEST(GraphPolicy, ModeNamesRoundTrip) {
  for (CudaGraphMode m : {CudaGraphMode::kNone, CudaGraphMode::kPiecewise, CudaGraphMode::kFull,
                          CudaGraphMode::kFullDecodeOnly, CudaGraphMode::kFullAndPiecewise}) {
    auto parsed = ParseCudaGraphMode(CudaGraphModeName(m));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_EQ(*parsed, m);
  }
  EXPECT_STREQ(CudaGraphModeName(CudaGraphMode::kFullAndPiecewise), "full_and_piecewise");
  EXPECT_STREQ(CudaGraphModeName(CudaGraphMode::kFullDecodeOnly), "full_decode_only");
}

TEST(GraphPolicy, BadModeNamesTheValue) {
  for (const char* bad : {"bogus", "", "FULL", "full-decode-only", " full"}) {
    auto parsed = ParseCudaGraphMode(bad);
    ASSERT_FALSE(parsed.ok()) << bad;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    const std::string msg(parsed.status().message());
    EXPECT_NE(msg.find(std::string("'") + bad + "'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("full_and_piecewise"), std::string::npos) << msg;
  }
}

TEST(GraphPolicy, DefaultCaptureSizes) {
  const std::vector<int32_t> d = DefaultCaptureSizes(512);
  ASSERT_GE(d.size(), 8u);
  EXPECT_EQ(std::vector<int32_t>(d.begin(), d.begin() + 6),
            (std::vector<int32_t>{1, 2, 4, 8, 16, 24}));
  // 1, 2, 4; 8..256 step 8 (32 sizes); 272..512 step 16 (16 sizes).
  EXPECT_EQ(d.size(), 3u + 32u + 16u);
  EXPECT_EQ(d.back(), 512);
  for (size_t i = 1; i < d.size(); ++i) {
    EXPECT_LT(d[i - 1], d[i]);
    if (d[i] > 8 && d[i] <= 256) {
      EXPECT_EQ(d[i] - d[i - 1], 8) << d[i];
    }
    if (d[i] > 256) {
      EXPECT_EQ(d[i] - d[i - 1], 16) << d[i];
    }
  }
  // Capped at max_size, which is added when it falls between two sizes.
  EXPECT_EQ(DefaultCaptureSizes(256).back(), 256);
  EXPECT_EQ(DefaultCaptureSizes(256).size(), 3u + 32u);
  EXPECT_EQ(DefaultCaptureSizes(20), (std::vector<int32_t>{1, 2, 4, 8, 16, 20}));
  EXPECT_EQ(DefaultCaptureSizes(3), (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(DefaultCaptureSizes(1), (std::vector<int32_t>{1}));
  EXPECT_EQ(DefaultCaptureSizes(300).back(), 300);
  EXPECT_EQ(DefaultCaptureSizes(300)[DefaultCaptureSizes(300).size() - 2], 288);
  // Never above 512, whatever the budget.
  EXPECT_EQ(DefaultCaptureSizes(8192), d);
  EXPECT_TRUE(DefaultCaptureSizes(0).empty());
  EXPECT_TRUE(DefaultCaptureSizes(-5).empty());
}

TEST(GraphPolicy, ParseCaptureSizesSortsAndDeduplicates) {
  auto s = ParseCaptureSizes("8,1, 4 ,2,8");
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(*s, (std::vector<int32_t>{1, 2, 4, 8}));
  EXPECT_EQ(CaptureSizesString(*s), "1,2,4,8");
  s = ParseCaptureSizes("512");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, (std::vector<int32_t>{512}));
}

TEST(GraphPolicy, ParseCaptureSizesRejectsJunk) {
  struct Case {
    const char* text;
    const char* expect;  // in the message
  };
  for (const Case& c : std::vector<Case>{{"", "no capture sizes"},
                                         {"  ", "no capture sizes"},
                                         {"1,x,4", "'x'"},
                                         {"1,0,4", "'0'"},
                                         {"1,-8", "'-8'"},
                                         {"1,,4", "''"},
                                         {"1,2,", "''"},
                                         {"4.5", "'4.5'"},
                                         {"8k", "'8k'"},
                                         {"99999999999", "'99999999999'"}}) {
    auto s = ParseCaptureSizes(c.text);
    ASSERT_FALSE(s.ok()) << c.text;
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(std::string(s.status().message()).find(c.expect), std::string::npos)
        << c.text << ": " << s.status();
  }
}

TEST(GraphPolicy, ConfigFromFlags) {
  auto c = GraphConfigFromFlags("full_and_piecewise", "", false, 2048);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->mode, CudaGraphMode::kFullAndPiecewise);
  EXPECT_EQ(c->capture_sizes, DefaultCaptureSizes(512));
  c = GraphConfigFromFlags("piecewise", "", false, 100);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->capture_sizes.back(), 100);
  c = GraphConfigFromFlags("full", "16,4", false, 2048);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->mode, CudaGraphMode::kFull);
  EXPECT_EQ(c->capture_sizes, (std::vector<int32_t>{4, 16}));
  // The kill switch forces none.
  c = GraphConfigFromFlags("full", "", true, 2048);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->mode, CudaGraphMode::kNone);
  // Errors name the flag and the value.
  c = GraphConfigFromFlags("bogus", "", false, 2048);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("--cudagraph-mode"), std::string::npos);
  EXPECT_NE(std::string(c.status().message()).find("bogus"), std::string::npos);
  c = GraphConfigFromFlags("bogus", "", true, 2048);  // the kill switch does not hide a typo
  EXPECT_FALSE(c.ok());
  c = GraphConfigFromFlags("full", "1,zero", false, 2048);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(std::string(c.status().message()).find("--cudagraph-capture-sizes"), std::string::npos);
  EXPECT_NE(std::string(c.status().message()).find("zero"), std::string::npos);
}

TEST(GraphPolicy, EagerWithoutFallbackWhenGraphsAreOff) {
  for (CudaGraphMode m : {CudaGraphMode::kPiecewise, CudaGraphMode::kFull,
                          CudaGraphMode::kFullDecodeOnly, CudaGraphMode::kFullAndPiecewise}) {
    // A worker without graphs (the CPU worker).
    ExpectChoice(ChooseGraph(Plan({1, 1}), Config(m), false), GraphMode::kEager, 0, false);
    ExpectChoice(ChooseGraph(Plan({100}), Config(m), false), GraphMode::kEager, 0, false);
    // A plan with no tokens (only releases).
    StepPlan empty;
    empty.released = {3};
    ExpectChoice(ChooseGraph(empty, Config(m), true), GraphMode::kEager, 0, false);
  }
  // Mode none (also what --enforce-eager sets), even for a batch beyond every size.
  ExpectChoice(ChooseGraph(Plan({1, 1}), Config(CudaGraphMode::kNone), true), GraphMode::kEager,
               0, false);
  ExpectChoice(ChooseGraph(Plan({100}), Config(CudaGraphMode::kNone), true), GraphMode::kEager, 0,
               false);
}

TEST(GraphPolicy, UniformDecode) {
  const StepPlan decode3 = Plan({1, 1, 1});
  for (CudaGraphMode m :
       {CudaGraphMode::kFull, CudaGraphMode::kFullDecodeOnly, CudaGraphMode::kFullAndPiecewise}) {
    ExpectChoice(ChooseGraph(decode3, Config(m), true), GraphMode::kFull, 4, false);
  }
  ExpectChoice(ChooseGraph(decode3, Config(CudaGraphMode::kPiecewise), true),
               GraphMode::kPiecewise, 4, false);
  // Exact sizes are not padded further.
  ExpectChoice(ChooseGraph(Plan({1}), Config(CudaGraphMode::kFullAndPiecewise), true),
               GraphMode::kFull, 1, false);
  ExpectChoice(ChooseGraph(Plan(std::vector<int>(16, 1)), Config(CudaGraphMode::kFullAndPiecewise),
                           true),
               GraphMode::kFull, 16, false);
}

TEST(GraphPolicy, MixedAndPrefill) {
  const StepPlan mixed = Plan({1, 1, 5});   // 7 tokens: two decodes and a prefill chunk
  const StepPlan prefill = Plan({3});       // one prefill chunk of 3 tokens
  ExpectChoice(ChooseGraph(mixed, Config(CudaGraphMode::kFull), true), GraphMode::kFull, 8, false);
  ExpectChoice(ChooseGraph(prefill, Config(CudaGraphMode::kFull), true), GraphMode::kFull, 4,
               false);
  for (CudaGraphMode m : {CudaGraphMode::kPiecewise, CudaGraphMode::kFullAndPiecewise}) {
    ExpectChoice(ChooseGraph(mixed, Config(m), true), GraphMode::kPiecewise, 8, false);
    ExpectChoice(ChooseGraph(prefill, Config(m), true), GraphMode::kPiecewise, 4, false);
  }
  // full_decode_only: eager by configuration, not a fallback, even beyond every size.
  ExpectChoice(ChooseGraph(mixed, Config(CudaGraphMode::kFullDecodeOnly), true), GraphMode::kEager,
               0, false);
  ExpectChoice(ChooseGraph(Plan({100}), Config(CudaGraphMode::kFullDecodeOnly), true),
               GraphMode::kEager, 0, false);
}

TEST(GraphPolicy, BeyondTheLargestSizeFallsBackToEager) {
  const StepPlan decode17 = Plan(std::vector<int>(17, 1));
  const StepPlan prefill17 = Plan({17});
  for (CudaGraphMode m : {CudaGraphMode::kPiecewise, CudaGraphMode::kFull,
                          CudaGraphMode::kFullAndPiecewise}) {
    ExpectChoice(ChooseGraph(decode17, Config(m), true), GraphMode::kEager, 0, true);
    // A prefill or mixed step beyond every size runs eagerly by design, not as a fallback.
    ExpectChoice(ChooseGraph(prefill17, Config(m), true), GraphMode::kEager, 0, false);
  }
  ExpectChoice(ChooseGraph(decode17, Config(CudaGraphMode::kFullDecodeOnly), true),
               GraphMode::kEager, 0, true);
  // No capture sizes at all: every step is a fallback.
  ExpectChoice(ChooseGraph(Plan({1}), Config(CudaGraphMode::kFullAndPiecewise, {}), true),
               GraphMode::kEager, 0, true);
}

}  // namespace
// The memory plan's graph bound: the padded size of the largest step a mode may graph.
TEST(GraphPolicy, MaxGraphTokens) {
  GraphConfig g;
  g.capture_sizes = {1, 2, 4, 8, 16, 64, 512};
  g.mode = CudaGraphMode::kFullAndPiecewise;
  EXPECT_EQ(MaxGraphTokens(g, 2048, 64), 512);  // prefill chunks up to the largest size
  EXPECT_EQ(MaxGraphTokens(g, 100, 64), 512);   // a 100-token step pads to 512
  EXPECT_EQ(MaxGraphTokens(g, 60, 64), 64);
  g.mode = CudaGraphMode::kFullDecodeOnly;      // decode batches only: the slots
  EXPECT_EQ(MaxGraphTokens(g, 2048, 64), 64);
  EXPECT_EQ(MaxGraphTokens(g, 2048, 3), 4);
  g.mode = CudaGraphMode::kNone;
  EXPECT_EQ(MaxGraphTokens(g, 2048, 64), 0);
  g.mode = CudaGraphMode::kPiecewise;
  g.capture_sizes.clear();
  EXPECT_EQ(MaxGraphTokens(g, 2048, 64), 0);
}

}  // namespace dsv4
