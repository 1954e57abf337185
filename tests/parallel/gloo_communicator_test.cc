// GlooCommunicator with its ranks as threads of this process (Gloo allows several ranks per
// process), formed through the rendezvous service over loopback: every collective and size at
// world sizes 2, 3 and 4, argument errors, a stalled peer, and the broken state after an error.
#include "parallel/gloo_communicator.h"

#include <functional>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "parallel/rendezvous_service.h"
#include "parallel/rendezvous_store.h"
#include "tests/parallel/collective_checks.h"

namespace dsv4 {
namespace {

class GlooThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = RendezvousServer::Start("127.0.0.1:0", &store_);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
  }

  // Forms a group of n ranks (threads) and returns their communicators, rank order.
  std::vector<std::unique_ptr<GlooCommunicator>> Form(int n, std::chrono::milliseconds op_timeout =
                                                                 std::chrono::seconds(5)) {
    const std::string group = absl::StrCat("g", next_group_++);
    const std::string token = *NewRendezvousToken();
    EXPECT_TRUE(store_.OpenGroup(group, n, token).ok());
    std::vector<std::unique_ptr<GlooCommunicator>> comms(n);
    std::vector<absl::Status> errors(n);
    std::vector<std::thread> threads;
    for (int r = 0; r < n; ++r) {
      threads.emplace_back([&, r] {
        GlooOptions o;
        o.rank = r;
        o.world_size = n;
        o.connect_timeout = std::chrono::seconds(5);
        o.op_timeout = op_timeout;
        auto c = GlooCommunicator::Connect(
            o, {absl::StrCat("127.0.0.1:", server_->port()), group, token});
        if (c.ok()) {
          comms[r] = std::move(*c);
        } else {
          errors[r] = c.status();
        }
      });
    }
    for (auto& t : threads) t.join();
    for (int r = 0; r < n; ++r) EXPECT_TRUE(errors[r].ok()) << "rank " << r << ": " << errors[r];
    return comms;
  }

  // Runs fn(rank's communicator) on one thread per rank and returns each rank's status.
  static std::vector<absl::Status> OnEveryRank(
      std::vector<std::unique_ptr<GlooCommunicator>>& comms,
      const std::function<absl::Status(Communicator&)>& fn) {
    std::vector<absl::Status> out(comms.size());
    std::vector<std::thread> threads;
    for (size_t r = 0; r < comms.size(); ++r) {
      threads.emplace_back([&, r] { out[r] = fn(*comms[r]); });
    }
    for (auto& t : threads) t.join();
    return out;
  }

  RendezvousStore store_;
  std::unique_ptr<RendezvousServer> server_;
  int next_group_ = 0;
};

TEST_F(GlooThreads, CollectivesAtWorldSizes2To4) {
  for (int n : {2, 3, 4}) {
    auto comms = Form(n);
    ASSERT_EQ(comms.size(), static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) {
      ASSERT_NE(comms[r], nullptr);
      EXPECT_EQ(comms[r]->rank(), r);
      EXPECT_EQ(comms[r]->world_size(), n);
      EXPECT_EQ(comms[r]->memory_space(), MemorySpace::kHost);
    }
    auto results = OnEveryRank(comms, [](Communicator& c) -> absl::Status {
      using namespace dsv4::testing;
      for (size_t count : CheckSizes()) {
        for (DType dtype : {DType::kF32, DType::kBF16}) {
          for (bool in_place : {false, true}) {
            RETURN_IF_ERROR(CheckAllReduce(c, count, dtype, in_place));
          }
        }
        RETURN_IF_ERROR(CheckAllGather(c, count, false));
        RETURN_IF_ERROR(CheckAllGather(c, count, true));
        for (int root = 0; root < c.world_size(); ++root) {
          RETURN_IF_ERROR(CheckBroadcast(c, count, root));
        }
      }
      RETURN_IF_ERROR(CheckAllReduceBf16Rounding(c, 777));
      return c.Barrier();
    });
    for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << results[r];
  }
}

TEST_F(GlooThreads, OneRankGroupIsTheIdentity) {
  auto comms = Form(1);
  ASSERT_NE(comms[0], nullptr);
  std::vector<float> a = {1.5f, -2.0f, 3.0f}, b(3);
  ASSERT_TRUE(comms[0]->AllReduceSum(a.data(), b.data(), 3, DType::kF32, nullptr).ok());
  EXPECT_EQ(b, a);
  ASSERT_TRUE(comms[0]->AllGather(a.data(), b.data(), 3, DType::kF32, nullptr).ok());
  EXPECT_EQ(b, a);
  EXPECT_TRUE(comms[0]->Barrier().ok());
}

TEST_F(GlooThreads, BadArgumentsAreRefusedWithoutBreakingTheCommunicator) {
  auto comms = Form(2);
  ASSERT_NE(comms[0], nullptr);
  float x[4] = {};
  int stream_stand_in = 0;
  absl::Status s = comms[0]->AllReduceSum(x, x, 4, DType::kF32, &stream_stand_in);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("no stream"), absl::string_view::npos) << s;
  s = comms[0]->AllReduceSum(x, x, 4, DType::kI32, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("dtype must be F32 or BF16"), absl::string_view::npos) << s;
  s = comms[0]->Broadcast(x, 4, DType::kF32, 2, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("root 2 is out of range [0, 2)"), absl::string_view::npos) << s;
  s = comms[0]->AllReduceSum(nullptr, x, 4, DType::kF32, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  float gather[8] = {};
  s = comms[0]->AllGather(gather + 1, gather, 4, DType::kF32, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("overlaps"), absl::string_view::npos) << s;
  // None of these touched the wire: the group still works.
  EXPECT_TRUE(comms[0]->health().ok());
  auto results = OnEveryRank(comms, [](Communicator& c) {
    return dsv4::testing::CheckAllReduce(c, 5, DType::kF32, false);
  });
  EXPECT_TRUE(results[0].ok()) << results[0];
  EXPECT_TRUE(results[1].ok()) << results[1];
}

TEST_F(GlooThreads, StalledPeerTimesOutAndBreaksTheCommunicator) {
  auto comms = Form(2, std::chrono::milliseconds(800));
  ASSERT_NE(comms[0], nullptr);
  std::vector<float> x(1024, 1.0f);
  // Rank 1 never joins: rank 0 must come back with DEADLINE_EXCEEDED naming the op.
  absl::Status s = comms[0]->AllReduceSum(x.data(), x.data(), x.size(), DType::kF32, nullptr);
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("gloo AllReduceSum(count=1024, F32) on rank 0 of 2"),
            absl::string_view::npos)
      << s;
  EXPECT_FALSE(comms[0]->health().ok());
  absl::Status again = comms[0]->Barrier();
  EXPECT_EQ(again.code(), absl::StatusCode::kFailedPrecondition) << again;
  EXPECT_NE(again.message().find("broken by an earlier error"), absl::string_view::npos) << again;
}

TEST_F(GlooThreads, AbortBreaksTheCommunicator) {
  auto comms = Form(2);
  ASSERT_NE(comms[1], nullptr);
  comms[1]->Abort(absl::UnavailableError("rank 0 lost on the control plane"));
  absl::Status s = comms[1]->Barrier();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("rank 0 lost on the control plane"), absl::string_view::npos) << s;
}

TEST_F(GlooThreads, MissingRankTimesOutWhileForming) {
  const std::string token = *NewRendezvousToken();
  ASSERT_TRUE(store_.OpenGroup("lonely", 2, token).ok());
  GlooOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.connect_timeout = std::chrono::milliseconds(500);
  auto c = GlooCommunicator::Connect(o, {absl::StrCat("127.0.0.1:", server_->port()), "lonely",
                                         token});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kDeadlineExceeded) << c.status();
  // Rank 0 waits for rank 1's addresses, under the communicator's name.
  EXPECT_NE(c.status().message().find("'comm/1'"), absl::string_view::npos) << c.status();
}

TEST_F(GlooThreads, BadOptionsAreRefused) {
  GlooOptions o;
  o.rank = 2;
  o.world_size = 2;
  auto c = GlooCommunicator::Connect(o, {"127.0.0.1:1", "g", "t"});
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  o.rank = 0;
  o.hostname.clear();
  auto d = GlooCommunicator::Connect(o, {"127.0.0.1:1", "g", "t"});
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("hostname or interface"), absl::string_view::npos)
      << d.status();
}

TEST_F(GlooThreads, StoreGoneWhileFormingIsUnavailable) {
  GlooOptions o;
  o.rank = 0;
  o.world_size = 2;
  o.connect_timeout = std::chrono::milliseconds(500);
  // Nothing listens on this port (the store never came up, or the coordinator died).
  auto c = GlooCommunicator::Connect(o, {"127.0.0.1:1", "g", "some-token-of-16-bytes"});
  ASSERT_FALSE(c.ok());
  EXPECT_TRUE(c.status().code() == absl::StatusCode::kUnavailable ||
              c.status().code() == absl::StatusCode::kDeadlineExceeded)
      << c.status();
  EXPECT_NE(c.status().message().find("rendezvous"), absl::string_view::npos) << c.status();
}

}  // namespace
}  // namespace dsv4
