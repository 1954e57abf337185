// Tensor + expert parallelism on the GPU: two (four) CUDA ranks sharing one device, their
// all-reduces host-staged over Gloo (NCCL cannot put two ranks on one GPU), in fp32 against the
// same model on one CUDA rank and on the CPU reference. At TP2 a dsv4-tiny rank holds 2 of the 4
// heads and at TP4 one: the attention kernel's 2- and 1-head blocks.
#include <algorithm>
#include <cmath>

#include "tests/gpu/backend_pair.h"
#include "tests/tensor_parallel/tp_harness.h"

namespace dsv4 {
namespace {

using testing::RunRank;
using testing::Source;

testing::BackendMaker CudaBackends() {
  return [](Communicator* comm) -> absl::StatusOr<std::unique_ptr<Backend>> {
    ASSIGN_OR_RETURN(std::unique_ptr<Backend> be, CreateCudaBackend(0, Precision::kFP32));
    if (comm != nullptr) RETURN_IF_ERROR(be->AttachCommunicator(comm));
    return be;
  };
}

double MaxAbs(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

class CudaTensorParallel : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  testing::TpGroup group_;
};

TEST_P(CudaTensorParallel, RanksSharingOneGpuEqualOneRankInFp32) {
  DSV4_REQUIRE_GPU();
  const auto& [fixture, n] = GetParam();
  const Source src{testing::TestData(fixture)};
  auto one = RunRank(src, {0, 1}, nullptr, CudaBackends());
  ASSERT_TRUE(one.ok()) << one.status();
  auto cpu = RunRank(src, {0, 1}, nullptr);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  auto ranks = group_.RunGroup(src, n, CudaBackends());
  ASSERT_EQ(ranks.size(), static_cast<size_t>(n));
  ASSERT_EQ(ranks[0].size(), one->size());
  const double vs_one = MaxAbs(ranks[0], *one), vs_cpu = MaxAbs(ranks[0], *cpu);
  std::printf("TP%d on one GPU, %s: max |TP%d - TP1 cuda| = %.3e, max |TP%d - cpu| = %.3e\n", n,
              fixture.c_str(), n, vs_one, n, vs_cpu);
  EXPECT_LT(vs_one, 1e-4);
  EXPECT_LT(vs_cpu, 2e-3);  // the fixture's tolerance
  for (int r = 1; r < n; ++r) EXPECT_EQ(ranks[r], ranks[0]) << "rank " << r << " differs";
  const int64_t V = 1024;
  for (size_t row = 0; row * V < one->size(); ++row) {
    auto a = one->begin() + row * V, b = ranks[0].begin() + row * V;
    EXPECT_EQ(std::max_element(a, a + V) - a, std::max_element(b, b + V) - b) << "row " << row;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaTensorParallel,
                         ::testing::Combine(::testing::Values("dsv4-tiny", "dsv4-tiny-fp8"),
                                            ::testing::Values(2, 4)),
                         [](const auto& info) {
                           std::string f = std::get<0>(info.param);
                           for (char& ch : f) ch = ch == '-' ? '_' : ch;
                           return absl::StrCat(f, "_TP", std::get<1>(info.param));
                         });

// A tensor-parallel layout needs the group's communicator.
TEST(CudaTensorParallelLimits, BackendWithoutCommunicatorRefusesTheLayout) {
  DSV4_REQUIRE_GPU();
  auto be = CreateCudaBackend(0, Precision::kFP32);
  ASSERT_TRUE(be.ok()) << be.status();
  const absl::Status s = (*be)->SupportsTensorParallel({0, 2});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("without a communicator"), std::string::npos) << s;
}

}  // namespace
}  // namespace dsv4
