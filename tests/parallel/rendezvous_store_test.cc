// The rendezvous store (groups, tokens, write-once keys, bounded waits) directly and through its
// gRPC service on loopback.
#include "parallel/rendezvous_store.h"

#include <thread>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "parallel/rendezvous_client.h"
#include "parallel/rendezvous_service.h"

namespace dsv4 {
namespace {

using std::chrono::milliseconds;

const std::string kToken = "0123456789abcdef0123456789abcdef";

RendezvousCaller Caller(int rank, int world = 2, std::string group = "g") {
  return RendezvousCaller{std::move(group), rank, world};
}

TEST(RendezvousStore, SetThenGetAndWaitAcrossRanks) {
  RendezvousStore store;
  ASSERT_TRUE(store.OpenGroup("g", 2, kToken).ok());
  ASSERT_TRUE(store.Set(Caller(0), kToken, "rank_0", "host-a").ok());
  auto v = store.Get(Caller(1), kToken, "rank_0", milliseconds(0), {});
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, "host-a");
  // A waiter sees a key another rank sets later.
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_TRUE(store.Set(Caller(1), kToken, "1", std::string("\0\1\2", 3)).ok());
  });
  EXPECT_TRUE(store.Wait(Caller(0), kToken, {"rank_0", "1"}, milliseconds(5000), {}).ok());
  setter.join();
  auto bin = store.Get(Caller(0), kToken, "1", milliseconds(0), {});
  ASSERT_TRUE(bin.ok());
  EXPECT_EQ(*bin, std::string("\0\1\2", 3));
}

TEST(RendezvousStore, RefusesWrongTokenWorldSizeRankAndGroup) {
  RendezvousStore store;
  ASSERT_TRUE(store.OpenGroup("g", 2, kToken).ok());
  absl::Status s = store.Set(Caller(0), "not-the-token-at-all-xxxxxxxxxxx", "k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_NE(s.message().find("wrong rendezvous token for group 'g'"), absl::string_view::npos);
  s = store.Set(Caller(0), "", "k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated);
  s = store.Set(Caller(0, 4), kToken, "k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("caller.world_size 4 does not match group 'g' (world size 2)"),
            absl::string_view::npos)
      << s;
  s = store.Set(Caller(2), kToken, "k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("caller.rank 2 is out of range [0, 2)"), absl::string_view::npos);
  s = store.Set(Caller(0, 2, "other"), kToken, "k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  s = store.Set(Caller(0, 2, "bad group!"), kToken, "k", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("caller.group"), absl::string_view::npos);
  // Nothing of the refused calls was stored.
  EXPECT_EQ(store.Get(Caller(1), kToken, "k", milliseconds(0), {}).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST(RendezvousStore, ValidatesKeysValuesAndTimeouts) {
  RendezvousLimits limits;
  limits.max_value_bytes = 16;
  limits.max_keys_per_group = 2;
  RendezvousStore store(limits);
  ASSERT_TRUE(store.OpenGroup("g", 2, kToken).ok());
  absl::Status s = store.Set(Caller(0), kToken, "", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("key must have 1..256 characters"), absl::string_view::npos) << s;
  s = store.Set(Caller(0), kToken, "a b", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = store.Set(Caller(0), kToken, std::string(257, 'k'), "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = store.Set(Caller(0), kToken, "k", std::string(17, 'v'));
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("value: 17 bytes exceed the limit of 16"), absl::string_view::npos);
  EXPECT_TRUE(store.Set(Caller(0), kToken, "prefix/rank_0", "v").ok());
  s = store.Set(Caller(1), kToken, "prefix/rank_0", "w");
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_NE(s.message().find("duplicate rank"), absl::string_view::npos);
  EXPECT_TRUE(store.Set(Caller(1), kToken, "k2", "v").ok());
  s = store.Set(Caller(1), kToken, "k3", "v");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  s = store.Wait(Caller(0), kToken, {}, milliseconds(10), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  s = store.Wait(Caller(0), kToken, {"k2", "bad key"}, milliseconds(10), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("keys[1]"), absl::string_view::npos) << s;
  s = store.Wait(Caller(0), kToken, {"k2"}, milliseconds(600001), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("timeout_ms"), absl::string_view::npos);
}

TEST(RendezvousStore, OpenGroupChecksItsArguments) {
  RendezvousStore store;
  EXPECT_EQ(store.OpenGroup("g", 0, kToken).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.OpenGroup("g", 2, "short").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.OpenGroup("", 2, kToken).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(store.OpenGroup("g", 2, kToken).ok());
  EXPECT_EQ(store.OpenGroup("g", 2, kToken).code(), absl::StatusCode::kAlreadyExists);
  store.CloseGroup("g");
  EXPECT_TRUE(store.OpenGroup("g", 3, kToken).ok());
}

TEST(RendezvousStore, WaitEndsAtItsTimeoutNamingTheMissingKey) {
  RendezvousStore store;
  ASSERT_TRUE(store.OpenGroup("g", 2, kToken).ok());
  ASSERT_TRUE(store.Set(Caller(0), kToken, "rank_0", "x").ok());
  absl::Status s = store.Wait(Caller(0), kToken, {"rank_0", "rank_1"}, milliseconds(100), {});
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(s.message().find("'rank_1'"), absl::string_view::npos) << s;
}

TEST(RendezvousStore, CloseGroupAndShutdownWakeWaiters) {
  RendezvousStore store;
  ASSERT_TRUE(store.OpenGroup("g", 2, kToken).ok());
  absl::Status closed;
  std::thread waiter([&] { closed = store.Wait(Caller(0), kToken, {"never"}, milliseconds(20000), {}); });
  std::this_thread::sleep_for(milliseconds(50));
  store.CloseGroup("g");
  waiter.join();
  EXPECT_EQ(closed.code(), absl::StatusCode::kUnavailable) << closed;

  ASSERT_TRUE(store.OpenGroup("h", 2, kToken).ok());
  absl::Status down;
  std::thread waiter2([&] {
    down = store.Get(Caller(1, 2, "h"), kToken, "never", milliseconds(20000), {}).status();
  });
  std::this_thread::sleep_for(milliseconds(50));
  store.Shutdown();
  waiter2.join();
  EXPECT_EQ(down.code(), absl::StatusCode::kUnavailable) << down;
  EXPECT_EQ(store.OpenGroup("i", 2, kToken).code(), absl::StatusCode::kUnavailable);
}

TEST(RendezvousStore, CancelledWaitEnds) {
  RendezvousStore store;
  ASSERT_TRUE(store.OpenGroup("g", 2, kToken).ok());
  int polls = 0;
  absl::Status s = store.Wait(Caller(0), kToken, {"never"}, milliseconds(20000),
                              [&] { return ++polls > 2; });
  EXPECT_EQ(s.code(), absl::StatusCode::kCancelled) << s;
}

TEST(RendezvousStore, TokensAreRandomHex) {
  auto a = NewRendezvousToken();
  auto b = NewRendezvousToken();
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ(a->size(), 64u);
  EXPECT_NE(*a, *b);
  EXPECT_EQ(a->find_first_not_of("0123456789abcdef"), std::string::npos);
}

TEST(RendezvousService, ClientsReachTheStoreOverGrpcWithTheirToken) {
  RendezvousStore store;
  auto server = RendezvousServer::Start("127.0.0.1:0", &store);
  ASSERT_TRUE(server.ok()) << server.status();
  ASSERT_TRUE(store.OpenGroup("g", 2, kToken).ok());
  const std::string address = absl::StrCat("127.0.0.1:", (*server)->port());
  auto c0 = RendezvousClient::Create({address, "g", kToken}, 0, 2);
  auto c1 = RendezvousClient::Create({address, "g", kToken}, 1, 2);
  ASSERT_TRUE(c0.ok() && c1.ok());
  std::thread setter([&] {
    std::this_thread::sleep_for(milliseconds(50));
    EXPECT_TRUE((*c0)->Set("addr/0", std::string(300, '\xff'), milliseconds(2000)).ok());
  });
  auto v = (*c1)->Get("addr/0", milliseconds(5000));
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status();
  EXPECT_EQ(*v, std::string(300, '\xff'));
  EXPECT_TRUE((*c1)->Wait({"addr/0"}, milliseconds(100)).ok());

  auto wrong = RendezvousClient::Create({address, "g", "wrong-token-wrong-token"}, 1, 2);
  ASSERT_TRUE(wrong.ok());
  absl::Status s = (*wrong)->Set("addr/1", "x", milliseconds(2000));
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_NE(s.message().find("rendezvous set 'addr/1': wrong rendezvous token"),
            absl::string_view::npos)
      << s;
  auto timeout = (*c0)->Get("addr/1", milliseconds(100));
  EXPECT_EQ(timeout.status().code(), absl::StatusCode::kDeadlineExceeded) << timeout.status();
}

TEST(RendezvousService, ClientChecksItsEndpoint) {
  EXPECT_EQ(RendezvousClient::Create({"", "g", kToken}, 0, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RendezvousClient::Create({"127.0.0.1:1", "g g", kToken}, 0, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RendezvousClient::Create({"127.0.0.1:1", "g", ""}, 0, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(RendezvousClient::Create({"127.0.0.1:1", "g", kToken}, 2, 2).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dsv4
