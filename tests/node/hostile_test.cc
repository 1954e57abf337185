// Hostile input against a real node on loopback (issue #18's findings and the cases that already
// held): any HTTP request to the metrics port, idle and slow connections, a port in use, echoed
// values, other clients' requests, floods of large inputs, malformed protobuf, NaN weights,
// unusable files, per-client limits, TLS. Each test states the finding it guards.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <chrono>
#include <cmath>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/model_config.h"
#include "dsv4/v1/dsv4.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "node/http/http_server.h"
#include "node/serving_node.h"
#include "worker/in_process_worker.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/http_get.h"
#include "worker/cpu_worker.h"

namespace dsv4 {
namespace {

using v1::GenerateRequest;
using v1::GenerateResponse;

NodeOptions HostileOptions() {
  NodeOptions o;
  o.worker_factory = CreateInProcessWorker;
  o.model_dir = testing::TestData("dsv4-tiny");
  o.tokenizer_path = testing::TestData("tok-tiny/tokenizer.json");
  o.listen = "127.0.0.1:0";
  o.metrics_listen = "127.0.0.1:0";
  o.device = "cpu";
  o.max_model_len = 1024;
  o.max_num_seqs = 16;
  o.max_batched_tokens = 256;
  o.default_max_tokens = 32;
  // Inputs over 64 bytes take the tokenizer queue (the default is 16 KiB), so that the suite
  // drives that path.
  o.admission.inline_input_bytes = 64;
  return o;
}

// A channel on its own TCP connection (gRPC shares one connection among identical channels).
std::shared_ptr<grpc::Channel> OwnConnection(int port, const std::string& who) {
  grpc::ChannelArguments args;
  args.SetString("dsv4.test.client", who);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

struct Call {
  grpc::Status status;
  std::vector<GenerateResponse> responses;
  std::vector<int32_t> tokens;
  const v1::Finished* finished() const {
    return !responses.empty() && responses.back().has_finished() ? &responses.back().finished()
                                                                 : nullptr;
  }
};

Call Generate(v1::Dsv4::Stub& stub, const GenerateRequest& req, double deadline_s = 60,
              std::function<void(const GenerateResponse&)> on_response = nullptr) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000)));
  Call c;
  auto reader = stub.Generate(&ctx, req);
  GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      for (int32_t t : resp.chunk().token_ids()) c.tokens.push_back(t);
    }
    if (on_response) on_response(resp);
    c.responses.push_back(resp);
  }
  c.status = reader->Finish();
  return c;
}

GenerateRequest Ids(std::vector<int32_t> ids, int max_tokens) {
  GenerateRequest r;
  for (int32_t id : ids) r.mutable_token_ids()->add_ids(id);
  if (max_tokens > 0) r.set_max_tokens(max_tokens);
  return r;
}

template <class F>
bool WaitFor(F pred, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto end = std::chrono::steady_clock::now() + timeout;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

class HostileTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto node = ServingNode::Start(HostileOptions());
    ASSERT_TRUE(node.ok()) << node.status();
    node_ = node->release();
  }
  static void TearDownTestSuite() {
    delete node_;
    node_ = nullptr;
  }
  static int grpc_port() { return node_->grpc_port(); }
  static int metrics_port() { return node_->metrics_port(); }
  static std::unique_ptr<v1::Dsv4::Stub> Stub(const std::string& who = "default") {
    return v1::Dsv4::NewStub(OwnConnection(grpc_port(), who));
  }
  // The node still answers both of its ports.
  static void ExpectHealthy() {
    int status = 0;
    const std::string body = testing::HttpGet(metrics_port(), "/metrics", &status);
    EXPECT_EQ(status, 200);
    EXPECT_NE(body.find("dsv4_node_ready 1"), std::string::npos);
    auto stub = Stub("health-check");
    const Call c = Generate(*stub, Ids({5, 6, 7}, 3));
    EXPECT_TRUE(c.status.ok()) << c.status.error_message();
    EXPECT_EQ(c.tokens.size(), 3u);
  }
  static ServingNode* node_;
};
ServingNode* HostileTest::node_ = nullptr;

// Finding 1: any request other than GET /metrics crashed the node (a civetweb worker's stack
// overflowed into OpenBLAS's static TLS while it wrote the 404 page). This test binary links
// OpenBLAS, as the node does.
TEST_F(HostileTest, MetricsPortAnswersEveryRequest) {
  struct Case {
    std::string request;
    int status;
  };
  const std::string big_header(20 << 10, 'a');
  const std::vector<Case> cases = {
      {"GET / HTTP/1.1\r\nHost: x\r\n\r\n", 404},
      {"GET /foo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 404},
      {"GET /metrics/../etc/passwd HTTP/1.1\r\nHost: x\r\n\r\n", 404},
      {"HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", 200},
      {"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc", 405},
      {"PUT /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", 405},
      {"DELETE / HTTP/1.1\r\nHost: x\r\n\r\n", 404},
      {"OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", 404},
      {"GET /metrics HTTP/1.0\r\n\r\n", 200},
      {"GARBAGE\r\n\r\n", 400},
      {"GET /metrics HTTP/9.9\r\n\r\n", 400},
      {"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Big: " + big_header + "\r\n\r\n", 431},
      {"POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n", 413},
      {"POST /metrics HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", 400},
      {std::string("\x16\x03\x01\x00\xa5\x01\x00\x00\xa1\x03\x03", 11), 400},  // a TLS hello
  };
  for (const Case& c : cases) {
    const testing::RawReply r = testing::HttpRaw(metrics_port(), c.request);
    EXPECT_TRUE(r.connected);
    EXPECT_EQ(r.status, c.status) << c.request.substr(0, 60) << "\n" << r.head;
  }
  // HEAD gets the headers of GET and no body.
  const testing::RawReply head =
      testing::HttpRaw(metrics_port(), "HEAD /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  EXPECT_TRUE(head.body.empty());
  EXPECT_NE(head.head.find("Content-Length: "), std::string::npos);
  const testing::RawReply post =
      testing::HttpRaw(metrics_port(), "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
  EXPECT_NE(post.head.find("Allow: GET, HEAD"), std::string::npos) << post.head;
  // Random bytes, and random bytes after a valid request line: answered or closed, never a crash.
  std::mt19937 rng(18);
  for (int i = 0; i < 200; ++i) {
    std::string junk = i % 2 == 0 ? "" : "GET /metrics HTTP/1.1\r\n";
    const size_t n = 1 + rng() % 2048;
    for (size_t k = 0; k < n; ++k) junk.push_back(static_cast<char>(rng()));
    const testing::RawReply r = testing::HttpRaw(metrics_port(), junk, 3000, /*half_close=*/true);
    EXPECT_TRUE(r.status == 0 || r.status == 400 || r.status == 431) << r.head;
    EXPECT_FALSE(r.timed_out);
  }
  ExpectHealthy();
}

// Finding 6: two idle connections blacked out /metrics for 30 s (civetweb's two threads each
// held one). 100 idle connections, some with half a request, must not delay a scrape.
TEST_F(HostileTest, ScrapesWhileManyConnectionsIdle) {
  std::vector<int> fds;
  for (int i = 0; i < 100; ++i) {
    const int fd = testing::ConnectLoopback(metrics_port());
    ASSERT_GE(fd, 0);
    if (i % 2 == 1) {
      const std::string partial = "GET /metr";
      ASSERT_EQ(::send(fd, partial.data(), partial.size(), MSG_NOSIGNAL),
                static_cast<ssize_t>(partial.size()));
    }
    fds.push_back(fd);
  }
  // A short client timeout: the old exposer answered after ~30 s, the new one at once.
  const testing::RawReply r =
      testing::HttpRaw(metrics_port(), "GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
                       /*timeout_ms=*/5000);
  EXPECT_EQ(r.status, 200) << r.head;
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.body.find("dsv4_requests_finished_total"), std::string::npos);
  for (int fd : fds) ::close(fd);
}

// At its connection cap the metrics listener closes the oldest idle connection to let a new one
// in (a scraper is never locked out by idle or slow connections).
TEST(HostileLimits, MetricsConnectionCapEvictsIdle) {
  NodeOptions o = HostileOptions();
  o.metrics_max_connections = 4;
  auto node = ServingNode::Start(o);
  ASSERT_TRUE(node.ok()) << node.status();
  const int port = (*node)->metrics_port();
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) fds.push_back(testing::ConnectLoopback(port));
  ASSERT_TRUE(WaitFor([&] { return (*node)->metrics_stats().open_connections == 4; }));
  const testing::RawReply scrape = testing::HttpRaw(port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_EQ(scrape.status, 200);
  EXPECT_GE((*node)->metrics_stats().evicted, 1u);
  // The evicted connection was the oldest: the server closed it.
  char c;
  EXPECT_EQ(::recv(fds[0], &c, 1, 0), 0);
  for (int fd : fds) ::close(fd);
  ASSERT_TRUE(WaitFor([&] { return (*node)->metrics_stats().open_connections == 0; }));
}

// One client address holds at most its share of connections: at its cap its own oldest idle
// connection makes room, and another address is not affected.
TEST(HostileLimits, MetricsConnectionsPerClient) {
  http::Router router;
  router.Add("GET", "/x", [](const http::Request&, std::shared_ptr<http::Responder> r) {
    r->Respond(http::Response{200, "text/plain", "ok", {}});
  });
  http::ServerOptions o;
  o.max_connections_per_client = 2;
  auto server = http::Server::Start(o, std::move(router));
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  // From 127.0.0.2: two idle connections of another client.
  auto connect_from = [&](uint32_t ip) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in local{};
    local.sin_family = AF_INET;
    local.sin_addr.s_addr = htonl(ip);
    EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)), 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
    return fd;
  };
  const int other1 = connect_from(0x7f000002), other2 = connect_from(0x7f000002);
  const int a = testing::ConnectLoopback(port), b = testing::ConnectLoopback(port);
  ASSERT_TRUE(WaitFor([&] { return (*server)->stats().open_connections == 4; }));
  // A third from 127.0.0.1 evicts 127.0.0.1's oldest, not 127.0.0.2's.
  EXPECT_EQ(testing::HttpRaw(port, "GET /x HTTP/1.0\r\n\r\n").status, 200);
  char c;
  EXPECT_EQ(::recv(a, &c, 1, 0), 0);  // closed by the server
  timeval tv{0, 200000};
  ::setsockopt(other1, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  EXPECT_EQ(::recv(other1, &c, 1, 0), -1);  // still open (timed out waiting)
  for (int fd : {a, b, other1, other2}) ::close(fd);
}

// Finding 2: a second node on the same --listen started and shared the connections
// (SO_REUSEPORT). It must fail, naming the address; the same for --metrics-listen.
TEST_F(HostileTest, PortInUseFailsAtStart) {
  NodeOptions o = HostileOptions();
  o.listen = absl::StrCat("127.0.0.1:", grpc_port());
  auto second = ServingNode::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().ToString().find(o.listen), std::string::npos) << second.status();
  EXPECT_NE(second.status().ToString().find("--listen"), std::string::npos) << second.status();
  o = HostileOptions();
  o.metrics_listen = absl::StrCat("127.0.0.1:", metrics_port());
  second = ServingNode::Start(o);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().ToString().find("--metrics-listen"), std::string::npos) << second.status();
  EXPECT_NE(second.status().ToString().find("in use"), std::string::npos) << second.status();
}

// Finding 4: the chat role was echoed without a bound (16 KB broke grpcio, 64 KiB hung grpc-js and
// the whole connection) and did not count toward the input limit.
TEST_F(HostileTest, EchoedRoleIsBoundedAndCounted) {
  auto stub = Stub("role");
  for (size_t len : {size_t{100}, size_t{16} << 10, size_t{64} << 10, size_t{900} << 10}) {
    GenerateRequest r;
    auto* m = r.mutable_chat()->add_messages();
    m->set_role(std::string(len, 'r'));
    m->set_content("hi");
    const Call c = Generate(*stub, r);
    EXPECT_EQ(c.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << len;
    EXPECT_LT(c.status.error_message().size(), 256u) << len;
    EXPECT_NE(c.status.error_message().find("input.chat.messages[0].role"), std::string::npos)
        << c.status.error_message();
  }
  // Role bytes count toward the input limit: valid roles, the limit passed by the role field.
  GenerateRequest r;
  auto* sys = r.mutable_chat()->add_messages();
  sys->set_role("system");
  sys->set_content(std::string((1 << 20) - 10, 's'));
  for (int i = 0; i < 3; ++i) {
    auto* m = r.mutable_chat()->add_messages();
    m->set_role(i % 2 == 0 ? "user" : "assistant");
    m->set_content("x");
  }
  const Call c = Generate(*stub, r);
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::OUT_OF_RANGE) << c.status.error_message();
  EXPECT_NE(c.status.error_message().find("exceed the limit"), std::string::npos)
      << c.status.error_message();
  // The same connection still serves.
  const Call ok = Generate(*stub, Ids({5, 6}, 2));
  EXPECT_TRUE(ok.status.ok()) << ok.status.error_message();
}

// Finding 5: node-assigned ids were sequential (req-N) and any client could abort any request.
TEST_F(HostileTest, AbortReachesOnlyTheCallersRequests) {
  auto owner = Stub("owner");
  auto other = Stub("other");
  GenerateRequest r = Ids({5, 6, 7}, 400);
  r.set_ignore_eos(true);
  r.set_request_id("shared-id");
  std::atomic<int> chunks{0};
  std::string assigned;
  std::thread running([&] {
    const Call c = Generate(*owner, r, 120, [&](const GenerateResponse&) { ++chunks; });
    ASSERT_TRUE(c.status.ok()) << c.status.error_message();
    ASSERT_NE(c.finished(), nullptr);
    // Nobody but its owner could cancel it.
    EXPECT_EQ(c.finished()->finish_reason(), v1::LENGTH);
  });
  ASSERT_TRUE(WaitFor([&] { return chunks.load() >= 2; }));
  grpc::ClientContext ctx;
  v1::AbortRequest a;
  a.set_request_id("shared-id");
  v1::AbortResponse resp;
  ASSERT_TRUE(other->Abort(&ctx, a, &resp).ok());
  EXPECT_FALSE(resp.found());
  // The id lives in its owner's namespace: another client may use it at the same time.
  GenerateRequest mine = Ids({8, 9}, 3);
  mine.set_request_id("shared-id");
  const Call c = Generate(*other, mine);
  EXPECT_TRUE(c.status.ok()) << c.status.error_message();
  running.join();
  // Assigned ids: 128 random bits, never sequential.
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    const Call x = Generate(*other, Ids({5}, 1));
    ASSERT_FALSE(x.responses.empty());
    ids.push_back(x.responses.front().request_id());
    EXPECT_TRUE(std::regex_match(ids.back(), std::regex("req-[0-9a-f]{32}"))) << ids.back();
  }
  EXPECT_NE(ids[0], ids[1]);
  EXPECT_NE(ids[1], ids[2]);
}

// Finding 7: a 1 MiB text was tokenized in full on a gRPC thread before the length check (~100
// ms each, health checks starved under 16 of them). It is now bounded before and during
// tokenization, and large inputs wait on their own queue.
TEST_F(HostileTest, OversizedTextsAreRejectedBeforeTokenizing) {
  std::vector<std::thread> flood;
  std::atomic<int> rejected{0};
  for (int i = 0; i < 16; ++i) {
    flood.emplace_back([&, i] {
      auto stub = Stub(absl::StrCat("flood-", i));
      GenerateRequest r;
      r.set_text(std::string(1 << 20, static_cast<char>('a' + i % 26)));
      const Call c = Generate(*stub, r);
      if (c.status.error_code() == grpc::StatusCode::OUT_OF_RANGE &&
          c.status.error_message().find("input.text") != std::string::npos) {
        ++rejected;
      } else {
        ADD_FAILURE() << c.status.error_code() << " " << c.status.error_message();
      }
    });
  }
  ExpectHealthy();  // during the flood
  for (auto& t : flood) t.join();
  EXPECT_EQ(rejected.load(), 16);
  // An input that fits is served through the tokenizer queue, as the flood's were refused there.
  auto stub = Stub("large-ok");
  GenerateRequest r;
  for (int i = 0; i < 20; ++i) r.mutable_text()->append("the quick brown fox ");
  r.set_max_tokens(2);
  const Call fits = Generate(*stub, r);
  EXPECT_TRUE(fits.status.ok()) << fits.status.error_message();
  EXPECT_EQ(fits.tokens.size(), 2u);
}

// Inputs that take the tokenizer queue and finish at once (one token), some cancelled at once:
// the call may end before the queue's thread returns from submitting it (a use-after-free found
// in review). Every call ends with a status, nothing hangs, the node serves after.
TEST_F(HostileTest, QueuedInputsThatFinishAtOnce) {
  std::vector<std::thread> threads;
  std::atomic<int> ended{0};
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      auto stub = Stub(absl::StrCat("burst-", t));
      for (int i = 0; i < 12; ++i) {
        GenerateRequest r;
        for (int k = 0; k < 12; ++k) r.mutable_text()->append("lorem ipsum ");
        r.set_max_tokens(1);
        r.set_request_id(absl::StrCat("b", i % 3));
        const Call c = Generate(*stub, r, (i % 4 == 3) ? 0.002 : 30);
        const auto code = c.status.error_code();
        EXPECT_TRUE(code == grpc::StatusCode::OK || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
                    code == grpc::StatusCode::CANCELLED ||
                    code == grpc::StatusCode::RESOURCE_EXHAUSTED ||
                    code == grpc::StatusCode::ALREADY_EXISTS)
            << code << " " << c.status.error_message();
        ++ended;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ended.load(), 96);
  ASSERT_TRUE(WaitFor([&] { return node_->engine().stats().in_flight == 0; }));
  ExpectHealthy();
}

// Finding 9 (malformed protobuf): gRPC answered UNIMPLEMENTED with an empty message. Raw bytes
// that are not a GenerateRequest, or a string field that is not UTF-8, get INVALID_ARGUMENT.
TEST_F(HostileTest, MalformedProtobufIsInvalidArgument) {
  auto channel = OwnConnection(grpc_port(), "raw");
  grpc::GenericStub stub(channel);
  auto call_raw = [&](const std::string& method, const std::string& bytes) {
    grpc::CompletionQueue cq;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    auto call = stub.PrepareCall(&ctx, method, &cq);
    void* tag;
    bool ok;
    call->StartCall(reinterpret_cast<void*>(1));
    cq.Next(&tag, &ok);
    grpc::Slice slice(bytes);
    grpc::ByteBuffer bb(&slice, 1);
    call->Write(bb, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
    call->WritesDone(reinterpret_cast<void*>(3));
    cq.Next(&tag, &ok);
    grpc::ByteBuffer resp;
    do {
      call->Read(&resp, reinterpret_cast<void*>(4));
      cq.Next(&tag, &ok);
    } while (ok);
    grpc::Status status;
    call->Finish(&status, reinterpret_cast<void*>(5));
    cq.Next(&tag, &ok);
    cq.Shutdown();
    while (cq.Next(&tag, &ok)) {
    }
    return status;
  };
  const std::string not_proto("\xff\xff\xff\xff\xff\x01", 6);
  const std::string bad_utf8_text("\x1a\x02\xff\xfe", 4);  // field 3 (text): 2 bytes, not UTF-8
  for (const std::string& bytes : {not_proto, bad_utf8_text}) {
    const grpc::Status s = call_raw("/dsv4.v1.Dsv4/Generate", bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("GenerateRequest"), std::string::npos) << s.error_message();
  }
  EXPECT_EQ(call_raw("/dsv4.v1.Dsv4/Abort", not_proto).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(call_raw("/dsv4.v1.Dsv4/GetModelInfo", not_proto).error_code(),
            grpc::StatusCode::INVALID_ARGUMENT);
  ExpectHealthy();
}

// GetModelInfo names the model, never a host path.
TEST_F(HostileTest, ModelInfoRevealsNoHostPath) {
  auto stub = Stub("info");
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(stub->GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.model_name(), "dsv4-tiny");
  EXPECT_EQ(info.tokenizer_name(), "tokenizer.json");
  const std::string all = info.DebugString();
  EXPECT_EQ(all.find(testing::TestData("")), std::string::npos) << all;
}

// Finding 8: an all-NaN head.weight loaded and streamed token 0 with log-probability NaN.
TEST(HostileCheckpoint, NonFiniteWeightsAreRefusedAtLoad) {
  const std::string dir = testing::TempDir("nan-weights");
  auto config = testing::TinyConfigJson();
  auto parsed = ParseModelConfig(config.dump());
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  auto tensors = testing::SyntheticCheckpoint(*parsed, 3, testing::Naming::kFixture);
  bool poisoned = false;
  for (auto& t : tensors) {
    if (t.name == "head.weight" || t.name == "model.head.weight") {
      const float nan = std::nanf("");
      std::memcpy(t.bytes.data() + 4 * 7, &nan, 4);
      poisoned = true;
    }
  }
  ASSERT_TRUE(poisoned);
  testing::WriteFile(dir + "/config.json", config.dump());
  testing::WriteFile(dir + "/model.safetensors", testing::SafetensorsBytes(tensors));
  NodeOptions o = HostileOptions();
  o.model_dir = dir;
  auto node = ServingNode::Start(o);
  ASSERT_FALSE(node.ok());
  EXPECT_NE(node.status().ToString().find("head.weight"), std::string::npos) << node.status();
  EXPECT_NE(node.status().ToString().find("non-finite"), std::string::npos) << node.status();
}

// Finding 8 at run time: logits that overflow to Inf/NaN (finite but huge weights pass the load
// check) fail the request with a clear error and count as a worker error, on the serving path.
TEST(HostileCheckpoint, NonFiniteLogitsFailTheRequest) {
  const std::string dir =
      testing::WriteOverflowingModel("overflow-serve", testing::TinyConfigJson(), 5);
  NodeOptions o = HostileOptions();
  o.model_dir = dir;
  // The warm-up request itself meets the broken logits: the node refuses to report ready.
  auto node = ServingNode::Start(o);
  ASSERT_FALSE(node.ok());
  EXPECT_NE(node.status().ToString().find("non-finite logits"), std::string::npos) << node.status();
}

// Finding 8 (at run time): the CPU sampler flags a row with NaN or Inf instead of drawing from it
// (the engine then fails the request: engine_overlap_test.cc).
TEST(HostileWorker, CpuSamplerFlagsNonFiniteLogits) {
  SamplingSpec greedy;
  SamplingSpec hot;
  hot.temperature = 1.0f;
  hot.logprobs = 2;
  for (const SamplingSpec* spec : {&greedy, &hot}) {
    for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
      std::vector<float> logits = {0.5f, 1.0f, bad, -2.0f};
      const SampledToken t = SampleToken(logits, *spec, 0, {}, {});
      EXPECT_TRUE(t.nonfinite);
      EXPECT_LT(t.token, 0);
    }
    std::vector<float> fine = {0.5f, 1.0f, 3.0f, -2.0f};
    const SampledToken t = SampleToken(fine, *spec, 0, {}, {});
    EXPECT_FALSE(t.nonfinite);
    EXPECT_GE(t.token, 0);
  }
}

// Finding 9: a FIFO config.json hung the load, a directory was "9223372036854775807 bytes", a
// config without hidden_size took Flash's value.
TEST(HostileCheckpoint, UnusableConfigFilesGiveClearErrors) {
  const std::string tok = testing::TestData("tok-tiny/tokenizer.json");
  auto start = [&](const std::string& dir) {
    NodeOptions o = HostileOptions();
    o.model_dir = dir;
    o.tokenizer_path = tok;
    return ServingNode::Start(o);
  };
  const std::string fifo_dir = testing::TempDir("fifo-config");
  ::unlink((fifo_dir + "/config.json").c_str());
  ASSERT_EQ(::mkfifo((fifo_dir + "/config.json").c_str(), 0644), 0);
  auto r = start(fifo_dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("not a regular file"), std::string::npos) << r.status();

  const std::string dir_dir = testing::TempDir("dir-config");
  ::mkdir((dir_dir + "/config.json").c_str(), 0755);
  r = start(dir_dir);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().ToString().find("is a directory"), std::string::npos) << r.status();

  for (const char* key : {"hidden_size", "vocab_size", "num_hidden_layers", "n_routed_experts"}) {
    const std::string dir = testing::TempDir(absl::StrCat("no-", key));
    auto config = testing::TinyConfigJson();
    config.erase(key);
    testing::WriteFile(dir + "/config.json", config.dump());
    r = start(dir);
    ASSERT_FALSE(r.ok()) << key;
    EXPECT_NE(r.status().ToString().find(absl::StrCat(key, " is required")), std::string::npos)
        << r.status();
  }
}

// Finding 9: with --kv-blocks 8 a request without max_tokens got OUT_OF_RANGE: the default was
// not clamped to the KV capacity.
TEST(HostileLimits, DefaultMaxTokensFitsTheKvPool) {
  NodeOptions o = HostileOptions();
  o.kv_blocks = 8;
  o.default_max_tokens = 1000;
  auto node = ServingNode::Start(o);
  ASSERT_TRUE(node.ok()) << node.status();
  auto stub = v1::Dsv4::NewStub(OwnConnection((*node)->grpc_port(), "kv"));
  GenerateRequest r = Ids({5, 6, 7}, 0);
  r.set_ignore_eos(true);
  const Call c = Generate(*stub, r);
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  ASSERT_NE(c.finished(), nullptr);
  EXPECT_EQ(c.finished()->finish_reason(), v1::LENGTH);
  const int64_t capacity = (*node)->runtime().limits.kv_capacity_tokens;
  EXPECT_EQ(c.finished()->usage().completion_tokens(), capacity - 3);
}

// Admission: one client may hold at most --max-requests-per-client requests, however many
// connections it opens; the rest get RESOURCE_EXHAUSTED naming the flag.
TEST(HostileLimits, PerClientRequestCap) {
  NodeOptions o = HostileOptions();
  o.admission.max_requests_per_client = 2;
  auto node = ServingNode::Start(o);
  ASSERT_TRUE(node.ok()) << node.status();
  const int port = (*node)->grpc_port();
  std::vector<std::thread> running;
  std::atomic<int> started{0};
  for (int i = 0; i < 2; ++i) {
    running.emplace_back([&, i] {
      auto stub = v1::Dsv4::NewStub(OwnConnection(port, absl::StrCat("cap-", i)));
      GenerateRequest r = Ids({5, 6, 7}, 300);
      r.set_ignore_eos(true);
      const Call c = Generate(*stub, r, 120, [&](const GenerateResponse&) { ++started; });
      EXPECT_TRUE(c.status.ok()) << c.status.error_message();
    });
  }
  ASSERT_TRUE(WaitFor([&] { return started.load() >= 2; }));
  auto third = v1::Dsv4::NewStub(OwnConnection(port, "cap-third"));
  const Call refused = Generate(*third, Ids({5}, 1));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.status.error_message().find("--max-requests-per-client"), std::string::npos)
      << refused.status.error_message();
  for (auto& t : running) t.join();
  const Call later = Generate(*third, Ids({5}, 1));
  EXPECT_TRUE(later.status.ok()) << later.status.error_message();
}

// Finding 9: listen addresses are validated (":99999" bound another port, "999.1.1.1" bound
// 231.1.1.1).
TEST(HostileFlags, ListenAddressesAreValidated) {
  for (const char* bad : {"127.0.0.1:99999", "999.1.1.1:9000", "1.2.3:80", "127.0.0.1:", ":80",
                          "host.example:80", "[::1:80", "127.0.0.1:8a", "127.0.0.01:80"}) {
    NodeOptions o = HostileOptions();
    o.listen = bad;
    auto r = ServingNode::Start(o);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().ToString().find("--listen"), std::string::npos) << r.status();
    o = HostileOptions();
    o.metrics_listen = bad;
    r = ServingNode::Start(o);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().ToString().find("--metrics-listen"), std::string::npos) << r.status();
  }
}

}  // namespace
}  // namespace dsv4
