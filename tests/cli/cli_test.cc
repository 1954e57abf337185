// The dsv4-node executable, run as a user would run it.
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"

namespace dsv4 {
namespace {

struct Result {
  int code = -1;
  std::string output;  // stdout + stderr
};

// `timeout_s` > 0 kills the command after that long (for commands that serve until signalled).
Result RunNode(const std::string& args, int timeout_s = 0) {
  const std::string cmd =
      absl::StrCat(timeout_s > 0 ? absl::StrCat("timeout ", timeout_s, " ") : "", DSV4_NODE_BINARY,
                   " ", args, " 2>&1");
  Result r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(Cli, CheckGoldenPassesOnTheFixture) {
  const Result r = RunNode("check-golden " + testing::TestData("dsv4-tiny"));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("PASS: 20 items"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("p5.decode_logits"), std::string::npos);
}

TEST(Cli, CheckGoldenFailsOnWrongReference) {
  // Same model, but the reference says a different greedy token: exit 1 and FAIL.
  const std::string dir = testing::TempDir("wrong");
  auto golden = *ParseJson(*ReadFileToString(testing::TestData("dsv4-tiny/golden.json"), 1 << 24), "g");
  golden["prompts"][0]["greedy_ids"][3] = 7;
  testing::WriteFile(dir + "/golden.json", golden.dump());
  for (const char* f : {"config.json", "golden.safetensors", "model.safetensors"}) {
    testing::WriteFile(absl::StrCat(dir, "/", f),
                       *ReadFileToString(testing::TestData(absl::StrCat("dsv4-tiny/", f)), 1 << 26));
  }
  const Result r = RunNode("check-golden " + dir);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("FAIL"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("greedy id 3"), std::string::npos) << r.output;
}

TEST(Cli, CheckGoldenReportsBrokenFixtures) {
  const std::string dir = testing::TempDir("broken");
  testing::WriteFile(dir + "/config.json", std::string("{\"vocab_size\": \"many\"}"));
  Result r = RunNode("check-golden " + dir);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("vocab_size"), std::string::npos) << r.output;
  r = RunNode("check-golden /nonexistent/dir");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("error:"), std::string::npos) << r.output;
}

TEST(Cli, GenerateMatchesTheReferenceGreedyIds) {
  const Result r = RunNode("generate --prompt-ids 263,1015,148,447,146 --max-tokens 24 --log-level error");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_EQ(r.output,
            "37 324 305 373 625 667 259 969 947 558 554 607 607 607 607 607 435 191 803 855 18 "
            "708 974 278\n");
}

TEST(Cli, GenerateSamplingIsSeeded) {
  const std::string args =
      "generate --prompt-ids '933 230 309' --max-tokens 8 --temperature 1.0 --top-p 0.9 "
      "--log-level error --seed ";
  const Result a = RunNode(args + "5"), b = RunNode(args + "5"), c = RunNode(args + "6");
  EXPECT_EQ(a.code, 0) << a.output;
  EXPECT_EQ(a.output, b.output);
  EXPECT_NE(a.output, c.output);
}

TEST(Cli, BadCommandLinesFailClearly) {
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"generate --prompt-ids 1,x,3", "--prompt-ids"},
      {"generate --prompt-ids 1,5000", "token id 5000"},
      {"generate --prompt-ids 1 --max-tokens 0", "max-tokens"},
      {"generate --prompt-ids 1 --max-tokens 5000", "exceeds"},
      {"generate --prompt-ids 1 --top-p 2", "top-p"},
      {"generate --prompt-ids 1 --model /nonexistent", "nonexistent"},
      {"generate", "prompt-ids"},
      {"frobnicate", "frobnicate"},
      {"bench --batches 0", "batches"},
      {"bench --cudagraph-mode bogus", "--cudagraph-mode"},
      {"bench --cudagraph-capture-sizes 1,-2", "--cudagraph-capture-sizes"},
      {"check-golden", "dir"},
  };
  for (const auto& c : cases) {
    const Result r = RunNode(c.args);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(Cli, ServeRejectsBadGraphFlagsBeforeLoading) {
  struct Case {
    std::string args, expect;
  };
  const std::vector<Case> cases = {
      {"--cudagraph-mode bogus", "--cudagraph-mode"},
      {"--cudagraph-mode bogus --enforce-eager", "'bogus'"},
      {"--cudagraph-capture-sizes 1,2,zero", "--cudagraph-capture-sizes"},
      {"--cudagraph-capture-sizes 0", "'0'"},
  };
  for (const auto& c : cases) {
    // A node that accepted the flags would serve until killed: the timeout (exit 124) catches it.
    const Result r = RunNode(
        "serve --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --log-level error " + c.args, 60);
    EXPECT_NE(r.code, 0) << c.args;
    EXPECT_NE(r.code, 124) << c.args << ": the node started";
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << c.args << "\n" << r.output;
  }
}

TEST(Cli, BenchPrintsMeasuredFigures) {
  const Result r =
      RunNode("bench --batches 1,2 --prompt-len 8 --decode-steps 2 --repeats 1 --log-level error");
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("prefill_tok/s"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\n     2 "), std::string::npos) << r.output;
  // The graph mode that ran: eager on the CPU worker, whatever the (default) mode.
  EXPECT_NE(r.output.find("cudagraph_mode=full_and_piecewise"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("worker_graphs=no"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("decode_graph  device_ms execute_ms\n"), std::string::npos) << r.output;
  // No device time from the CPU worker ("-"), then the worker's Execute time per step.
  EXPECT_NE(r.output.find("eager        eager          - "), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dsv4
