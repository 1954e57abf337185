// `dsv4-node check-golden DIR --tensor-parallel-size N`: the fixture through N rank processes
// (worker/tools/local_ranks.h), with the single-process pass criteria.
#include <cstdio>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include <unistd.h>

namespace dsv4 {
namespace {

struct Result {
  int code = -1;
  std::string output;
};

Result RunNode(const std::string& args) {
  const std::string cmd = absl::StrCat("timeout 300 ", DSV4_NODE_BINARY, " ", args, " 2>&1");
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

class CheckGoldenTp : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(CheckGoldenTp, PassesOnTheFixture) {
  const auto& [fixture, n] = GetParam();
  const Result r = RunNode(absl::StrCat("check-golden ", testing::TestData(fixture),
                                        " --threads 1 --tensor-parallel-size ", n));
  EXPECT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find(absl::StrCat("PASS: ")), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(absl::StrCat("tensor_parallel_size=", n)), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("FAIL"), std::string::npos) << r.output;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CheckGoldenTp,
                         ::testing::Combine(::testing::Values("dsv4-tiny", "dsv4-tiny-fp8"),
                                            ::testing::Values(2, 4)),
                         [](const auto& info) {
                           std::string f = std::get<0>(info.param);
                           for (char& ch : f) ch = ch == '-' ? '_' : ch;
                           return absl::StrCat(f, "_TP", std::get<1>(info.param));
                         });

// The same pass criteria: a wrong reference fails at TP2 as it does on one process.
TEST(CheckGoldenTpCriteria, WrongReferenceFails) {
  const std::string dir = testing::TempDir("tp_wrong");
  auto golden = *ParseJson(*ReadFileToString(testing::TestData("dsv4-tiny/golden.json"), 1 << 24), "g");
  golden["prompts"][0]["greedy_ids"][3] = 7;
  testing::WriteFile(dir + "/golden.json", golden.dump());
  for (const char* f : {"config.json", "golden.safetensors", "model.safetensors"}) {
    ASSERT_EQ(::symlink((testing::TestData("dsv4-tiny/") + f).c_str(), (dir + "/" + f).c_str()), 0);
  }
  const Result r = RunNode(absl::StrCat("check-golden ", dir, " --threads 1 --tensor-parallel-size 2"));
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("FAIL"), std::string::npos) << r.output;
}

TEST(CheckGoldenTpCriteria, SizesThatDoNotSplitAreRefusedBeforeStarting) {
  const Result r = RunNode(absl::StrCat("check-golden ", testing::TestData("dsv4-tiny"),
                                        " --tensor-parallel-size 3"));
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("num_attention_heads (4)"), std::string::npos) << r.output;
  const Result j = RunNode(absl::StrCat("check-golden ", testing::TestData("dsv4-tiny"),
                                        " --tensor-parallel-size 2 --tp-join nonsense --tp-rank 1 "
                                        "< /dev/null"));
  EXPECT_NE(j.code, 0) << j.output;
  EXPECT_NE(j.output.find("--tp-join"), std::string::npos) << j.output;
}

}  // namespace
}  // namespace dsv4
