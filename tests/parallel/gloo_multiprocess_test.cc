// Gloo ranks as real processes (dsv4_gloo_rank) over loopback, forming through a rendezvous
// service this test hosts as the coordinator would: collectives at world sizes 2 and 4, a rank
// that leaves early, a wrong token, a wrong world size.
#include <chrono>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "parallel/rendezvous_service.h"
#include "parallel/rendezvous_store.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/subprocess.h"

namespace dsv4 {
namespace {

using dsv4::testing::Subprocess;

constexpr auto kWait = std::chrono::seconds(20);

class GlooProcesses : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = RendezvousServer::Start("127.0.0.1:0", &store_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    auto token = NewRendezvousToken();
    ASSERT_TRUE(token.ok()) << token.status();
    token_ = *token;
  }

  std::string Address() const { return absl::StrCat("127.0.0.1:", server_->port()); }

  std::unique_ptr<Subprocess> StartRank(const std::string& group, int rank, int world_size,
                                        const std::string& scenario, const std::string& token,
                                        const std::string& dir = "", int timeout_ms = 5000) {
    std::vector<std::string> argv = {DSV4_GLOO_RANK_BINARY, "--store", Address(), "--group",
                                     group, "--token", token, "--rank", std::to_string(rank),
                                     "--world-size", std::to_string(world_size), "--scenario",
                                     scenario, "--timeout-ms", std::to_string(timeout_ms)};
    if (!dir.empty()) {
      argv.push_back("--dir");
      argv.push_back(dir);
    }
    return Subprocess::Start(argv);
  }

  RendezvousStore store_;
  std::unique_ptr<RendezvousServer> server_;
  std::string token_;
};

class GlooProcessesWorld : public GlooProcesses, public ::testing::WithParamInterface<int> {};

TEST_P(GlooProcessesWorld, CollectivesMatchExpectedSumsAndBarrierOrders) {
  const int n = GetParam();
  const std::string group = absl::StrCat("collectives-", n);
  ASSERT_TRUE(store_.OpenGroup(group, n, token_).ok());
  const std::string dir = dsv4::testing::TempDir(absl::StrCat("gloo-barrier-", n));
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < n; ++r) {
    ranks.push_back(StartRank(group, r, n, "collectives", token_, dir));
    ASSERT_NE(ranks.back(), nullptr);
  }
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(ranks[r]->Wait(kWait), 0) << "rank " << r << ":\n" << ranks[r]->Output();
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, GlooProcessesWorld, ::testing::Values(2, 4));

TEST_F(GlooProcesses, RankThatExitsEarlyGivesTheOthersAnErrorNotAHang) {
  const int n = 4;
  ASSERT_TRUE(store_.OpenGroup("exit-early", n, token_).ok());
  std::vector<std::unique_ptr<Subprocess>> ranks;
  for (int r = 0; r < n; ++r) {
    // 3 s per collective: a rank whose neighbours are alive learns of the loss by its timeout.
    ranks.push_back(StartRank("exit-early", r, n, "exit-early", token_, "", 3000));
    ASSERT_NE(ranks.back(), nullptr);
  }
  EXPECT_EQ(ranks[n - 1]->Wait(kWait), 0) << ranks[n - 1]->Output();
  for (int r = 0; r < n - 1; ++r) {
    const int code = ranks[r]->Wait(kWait);
    ASSERT_NE(code, -1) << "rank " << r << " hangs:\n" << ranks[r]->Output();
    EXPECT_EQ(code, 3) << "rank " << r << ":\n" << ranks[r]->Output();
    EXPECT_NE(ranks[r]->Output().find("gloo AllReduceSum"), std::string::npos)
        << ranks[r]->Output();
  }
}

TEST_F(GlooProcesses, WrongTokenIsRefused) {
  ASSERT_TRUE(store_.OpenGroup("secret", 2, token_).ok());
  auto good = StartRank("secret", 0, 2, "connect", token_, "", 2000);
  auto bad = StartRank("secret", 1, 2, "connect", std::string(64, 'f'), "", 2000);
  const int bad_code = bad->Wait(kWait);
  EXPECT_EQ(bad_code, 10 + static_cast<int>(absl::StatusCode::kUnauthenticated)) << bad->Output();
  EXPECT_NE(bad->Output().find("wrong rendezvous token for group 'secret'"), std::string::npos)
      << bad->Output();
  // The rank with the right token never meets a peer: it gives up at its timeout.
  const int good_code = good->Wait(kWait);
  EXPECT_EQ(good_code, 10 + static_cast<int>(absl::StatusCode::kDeadlineExceeded))
      << good->Output();
}

TEST_F(GlooProcesses, WrongWorldSizeIsRefused) {
  ASSERT_TRUE(store_.OpenGroup("size", 2, token_).ok());
  auto good = StartRank("size", 0, 2, "connect", token_, "", 2000);
  auto bad = StartRank("size", 1, 3, "connect", token_, "", 2000);
  EXPECT_EQ(bad->Wait(kWait), 10 + static_cast<int>(absl::StatusCode::kFailedPrecondition))
      << bad->Output();
  EXPECT_NE(bad->Output().find("world_size 3 does not match group 'size' (world size 2)"),
            std::string::npos)
      << bad->Output();
  EXPECT_EQ(good->Wait(kWait), 10 + static_cast<int>(absl::StatusCode::kDeadlineExceeded))
      << good->Output();
}

TEST_F(GlooProcesses, RightTokenAndSizeConnect) {
  // The control for the two refusals above: the same helpers with matching arguments connect.
  ASSERT_TRUE(store_.OpenGroup("control", 2, token_).ok());
  auto a = StartRank("control", 0, 2, "connect", token_, "", 5000);
  auto b = StartRank("control", 1, 2, "connect", token_, "", 5000);
  EXPECT_EQ(a->Wait(kWait), 0) << a->Output();
  EXPECT_EQ(b->Wait(kWait), 0) << b->Output();
}

}  // namespace
}  // namespace dsv4
