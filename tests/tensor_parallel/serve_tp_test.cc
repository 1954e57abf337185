// A TP2 CPU node as an operator runs it (`dsv4-node serve --tensor-parallel-size 2`, with spawned
// or external `dsv4-node worker` ranks): faults (a killed rank, a dead coordinator), the control
// plane's refusals (secret, build version, world size, duplicate rank, garbage) and recovery.
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "control/secret.h"
#include "node/control/remote_worker_group.h"
#include "dsv4/internal/v1/worker.grpc.pb.h"
#include "dsv4/v1/dsv4.grpc.pb.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/http_get.h"
#include "tests/testing/subprocess.h"

namespace dsv4 {
namespace {

using Clock = std::chrono::steady_clock;
using testing::Subprocess;

int FreePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

// Every thread's children (the coordinator respawns ranks from its engine thread).
std::vector<pid_t> Children(pid_t pid) {
  std::vector<pid_t> out;
  std::error_code ec;
  for (const auto& task : std::filesystem::directory_iterator(absl::StrCat("/proc/", pid, "/task"), ec)) {
    std::ifstream in(task.path() / "children");
    pid_t c;
    while (in >> c) out.push_back(c);
  }
  return out;
}

bool Gone(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  if (!in) return true;
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t paren = all.rfind(')');
  return paren != std::string::npos && paren + 2 < all.size() && all[paren + 2] == 'Z';
}

struct Node {
  std::unique_ptr<Subprocess> proc;
  int grpc = 0, metrics = 0;
};

Node StartServe(std::vector<std::string> extra, std::chrono::seconds wait = std::chrono::seconds(90)) {
  const std::string port_file = testing::TempDir("serve_tp") + "/ports-" + std::to_string(FreePort());
  std::vector<std::string> argv = {DSV4_NODE_BINARY, "serve", "--device", "cpu",
                                   "--model", testing::TestData("dsv4-tiny"),
                                   "--tokenizer", testing::TestData("tok-tiny/tokenizer.json"),
                                   "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                                   "--max-model-len", "1024", "--max-num-seqs", "8",
                                   "--threads", "1", "--port-file", port_file};
  argv.insert(argv.end(), extra.begin(), extra.end());
  Node n;
  n.proc = Subprocess::Start(argv);
  EXPECT_TRUE(testing::WaitForPortFile(port_file, n.proc.get(), &n.grpc, &n.metrics, wait))
      << n.proc->Output();
  return n;
}

struct Gen {
  grpc::Status status;
  std::vector<int32_t> tokens;
  int error_code = 0;
};

Gen Generate(int port, std::vector<int32_t> prompt, int max_tokens, double deadline_s,
             std::atomic<int>* progress = nullptr) {
  auto ch = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  auto stub = v1::Dsv4::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(deadline_s * 1000)));
  v1::GenerateRequest req;
  for (int32_t t : prompt) req.mutable_token_ids()->add_ids(t);
  req.set_max_tokens(max_tokens);
  req.set_ignore_eos(true);
  Gen g;
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      for (int32_t t : resp.chunk().token_ids()) g.tokens.push_back(t);
      if (progress) progress->store(static_cast<int>(g.tokens.size()));
    }
    if (resp.has_error()) g.error_code = resp.error().code();
  }
  g.status = reader->Finish();
  return g;
}

grpc::health::v1::HealthCheckResponse::ServingStatus Health(int port) {
  auto ch = grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials());
  auto stub = grpc::health::v1::Health::NewStub(ch);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
  grpc::health::v1::HealthCheckRequest req;
  grpc::health::v1::HealthCheckResponse resp;
  if (!stub->Check(&ctx, req, &resp).ok()) return grpc::health::v1::HealthCheckResponse::UNKNOWN;
  return resp.status();
}

const std::vector<int32_t> kPrompt = {3, 17, 29, 5, 11, 40, 2, 9};

internal::v1::Register Rank(int rank, const std::string& host, const std::string& device) {
  internal::v1::Register r;
  r.set_rank(rank);
  r.set_host(host);
  r.set_device(device);
  return r;
}

// The data plane is chosen once, from the registrations: NCCL only with a GPU of its own per rank.
TEST(DataPlane, NcclOnlyWhenEveryRankHasItsOwnGpu) {
  using V = std::vector<internal::v1::Register>;
  const V own = {Rank(0, "a", "cuda:0"), Rank(1, "a", "cuda:1"), Rank(2, "b", "cuda:0")};
  const V shared = {Rank(0, "a", "cuda:0"), Rank(1, "a", "cuda:0")};
  const V cpu = {Rank(0, "a", "cpu"), Rank(1, "b", "cpu")};
  EXPECT_EQ(*ChooseDataPlane(own, "auto"), "nccl");
  EXPECT_EQ(*ChooseDataPlane(own, "gloo"), "gloo");
  EXPECT_EQ(*ChooseDataPlane(shared, "auto"), "gloo");
  EXPECT_EQ(*ChooseDataPlane(cpu, "auto"), "gloo");
  auto forced = ChooseDataPlane(shared, "nccl");
  ASSERT_FALSE(forced.ok());
  EXPECT_NE(forced.status().message().find("ranks 0 and 1 share a/cuda:0"), std::string::npos)
      << forced.status();
  auto on_cpu = ChooseDataPlane(cpu, "nccl");
  ASSERT_FALSE(on_cpu.ok());
  EXPECT_NE(on_cpu.status().message().find("rank 0 runs on cpu"), std::string::npos);
  EXPECT_FALSE(ChooseDataPlane(own, "mpi").ok());
}

TEST(ServeTp, KilledRankEndsItsRequestsUnavailableAndTheNodeServesAgain) {
  Node n = StartServe({"--tensor-parallel-size", "2"});
  ASSERT_GT(n.grpc, 0);
  const Gen before = Generate(n.grpc, kPrompt, 12, 60);
  ASSERT_TRUE(before.status.ok()) << before.status.error_message();
  ASSERT_EQ(before.tokens.size(), 12u);
  const std::vector<pid_t> ranks = Children(n.proc->pid());
  ASSERT_EQ(ranks.size(), 2u) << "the coordinator spawns one process per rank";

  std::atomic<int> progress{0};
  Gen during;
  std::thread t([&] { during = Generate(n.grpc, kPrompt, 900, 120, &progress); });
  while (progress.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const auto killed_at = Clock::now();
  ::kill(ranks[1], SIGKILL);
  bool saw_not_serving = false, saw_rank_down = false;
  while (Clock::now() - killed_at < std::chrono::seconds(10) && !(saw_not_serving && saw_rank_down)) {
    saw_not_serving |= Health(n.grpc) == grpc::health::v1::HealthCheckResponse::NOT_SERVING;
    saw_rank_down |= testing::HttpGet(n.metrics, "/metrics").find("dsv4_worker_up{rank=\"1\"} 0") !=
                     std::string::npos;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  t.join();
  const double ended_s = std::chrono::duration<double>(Clock::now() - killed_at).count();
  std::printf("the killed rank's request ended %.3f s after the kill (%zu tokens)\n", ended_s,
              during.tokens.size());
  EXPECT_FALSE(during.status.ok() && during.error_code == 0) << "the request outlived its rank";
  EXPECT_TRUE(during.status.error_code() == grpc::StatusCode::UNAVAILABLE ||
              during.error_code == static_cast<int>(grpc::StatusCode::UNAVAILABLE))
      << during.status.error_code() << " / " << during.error_code << ": "
      << during.status.error_message();
  EXPECT_LT(ended_s, 10.0);
  EXPECT_LT(during.tokens.size(), 900u);
  EXPECT_TRUE(saw_not_serving) << "grpc.health.v1 never reported NOT_SERVING";
  EXPECT_TRUE(saw_rank_down) << "dsv4_worker_up{rank=\"1\"} never dropped to 0";

  // The spawned ranks are started again and the node serves the same greedy tokens.
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  while (Health(n.grpc) != grpc::health::v1::HealthCheckResponse::SERVING && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ASSERT_EQ(Health(n.grpc), grpc::health::v1::HealthCheckResponse::SERVING) << n.proc->Output();
  const Gen after = Generate(n.grpc, kPrompt, 12, 60);
  ASSERT_TRUE(after.status.ok()) << after.status.error_message();
  EXPECT_EQ(after.tokens, before.tokens);
  const std::vector<pid_t> now = Children(n.proc->pid());
  EXPECT_EQ(now.size(), 2u);
  for (pid_t p : now) EXPECT_NE(p, ranks[1]);
  EXPECT_NE(n.proc->Output().find("event=worker_group_recovered"), std::string::npos);
}

TEST(ServeTp, WorkersExitWhenTheCoordinatorDies) {
  Node n = StartServe({"--tensor-parallel-size", "2"});
  ASSERT_GT(n.grpc, 0);
  const std::vector<pid_t> ranks = Children(n.proc->pid());
  ASSERT_EQ(ranks.size(), 2u);
  n.proc->Signal(SIGKILL);
  n.proc->Wait(std::chrono::seconds(5));
  const auto t0 = Clock::now();
  while ((!Gone(ranks[0]) || !Gone(ranks[1])) && Clock::now() - t0 < std::chrono::seconds(10)) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(Gone(ranks[0]) && Gone(ranks[1])) << "worker ranks outlived their coordinator by 10 s";
  std::printf("the ranks exited %.3f s after their coordinator\n",
              std::chrono::duration<double>(Clock::now() - t0).count());
}

// A worker that does not belong is refused with an error that says why, and the node forms from
// the ones that do.
TEST(ServeTp, ExternalWorkersAreCheckedBeforeTheyGetAPlan) {
  const std::string dir = testing::TempDir("serve_tp_secret");
  testing::WriteFile(dir + "/secret", "s3cret-of-the-group\n");
  testing::WriteFile(dir + "/wrong", "not-the-secret\n");
  const int cp = FreePort();
  const std::string coordinator = absl::StrCat("127.0.0.1:", cp);
  const std::string port_file = dir + "/ports";
  auto serve = Subprocess::Start(
      {DSV4_NODE_BINARY, "serve", "--device", "cpu", "--model", testing::TestData("dsv4-tiny"),
       "--tokenizer", testing::TestData("tok-tiny/tokenizer.json"), "--listen", "127.0.0.1:0",
       "--metrics-listen", "127.0.0.1:0", "--max-model-len", "1024", "--max-num-seqs", "8",
       "--port-file", port_file, "--tensor-parallel-size", "2", "--external-workers",
       "--worker-listen", coordinator, "--worker-secret-file", dir + "/secret"});
  auto worker = [&](std::vector<std::string> extra) {
    std::vector<std::string> argv = {DSV4_NODE_BINARY, "worker", "--coordinator", coordinator,
                                     "--device", "cpu"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return Subprocess::Start(argv);
  };
  struct Bad {
    std::vector<std::string> args;
    std::string error;
  };
  const std::vector<Bad> bad = {
      {{"--rank", "0", "--world-size", "2", "--worker-secret-file", dir + "/wrong"}, "wrong worker secret"},
      {{"--rank", "0", "--world-size", "2", "--worker-secret-file", dir + "/secret",
        "--advertise-build-version", "control-v0 old"}, "differs from the coordinator's"},
      {{"--rank", "0", "--world-size", "3", "--worker-secret-file", dir + "/secret"},
       "world size 3 does not match the coordinator's 2"},
  };
  for (const Bad& b : bad) {
    auto w = worker(b.args);
    EXPECT_EQ(w->Wait(std::chrono::seconds(40)), 1) << w->Output();
    EXPECT_NE(w->Output().find(b.error), std::string::npos) << w->Output();
  }
  // Garbage on the control stream: a first message that is not Register.
  {
    auto ch = grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials());
    auto stub = internal::v1::WorkerControl::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto stream = stub->Connect(&ctx);
    internal::v1::WorkerMessage m;
    m.mutable_step_done()->set_step_id(7);
    stream->Write(m);
    internal::v1::CoordinatorMessage reply;
    ASSERT_TRUE(stream->Read(&reply));
    EXPECT_EQ(reply.kind_case(), internal::v1::CoordinatorMessage::kRefused);
    EXPECT_NE(reply.refused().reason().find("must be Register"), std::string::npos);
    stream->WritesDone();
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
  // A rank outside the group (the worker command checks this itself; a raw client does not).
  {
    auto ch = grpc::CreateChannel(coordinator, grpc::InsecureChannelCredentials());
    auto stub = internal::v1::WorkerControl::NewStub(ch);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    auto stream = stub->Connect(&ctx);
    internal::v1::WorkerMessage m;
    internal::v1::Register* r = m.mutable_register_();
    r->set_rank(5);
    r->set_world_size(2);
    r->set_secret("s3cret-of-the-group");
    r->set_build_version(control::BuildVersion());
    stream->Write(m);
    internal::v1::CoordinatorMessage reply;
    ASSERT_TRUE(stream->Read(&reply));
    ASSERT_EQ(reply.kind_case(), internal::v1::CoordinatorMessage::kRefused);
    EXPECT_NE(reply.refused().reason().find("rank 5 is outside [0, 2)"), std::string::npos)
        << reply.refused().reason();
  }
  auto rank0 = worker({"--rank", "0", "--world-size", "2", "--worker-secret-file", dir + "/secret"});
  // The same rank twice.
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  auto dup = worker({"--rank", "0", "--world-size", "2", "--worker-secret-file", dir + "/secret"});
  EXPECT_EQ(dup->Wait(std::chrono::seconds(40)), 1) << dup->Output();
  EXPECT_NE(dup->Output().find("already registered"), std::string::npos) << dup->Output();
  auto rank1 = worker({"--rank", "1", "--world-size", "2", "--worker-secret-file", dir + "/secret"});
  int grpc_port = 0, metrics_port = 0;
  ASSERT_TRUE(testing::WaitForPortFile(port_file, serve.get(), &grpc_port, &metrics_port,
                                       std::chrono::seconds(90)))
      << serve->Output() << rank0->Output() << rank1->Output();
  const Gen g = Generate(grpc_port, kPrompt, 6, 60);
  EXPECT_TRUE(g.status.ok()) << g.status.error_message();
  EXPECT_EQ(g.tokens.size(), 6u);
  // A drain shuts the ranks down cleanly.
  serve->Signal(SIGTERM);
  EXPECT_EQ(serve->Wait(std::chrono::seconds(30)), 0) << serve->Output();
  EXPECT_EQ(rank0->Wait(std::chrono::seconds(20)), 0) << rank0->Output();
  EXPECT_EQ(rank1->Wait(std::chrono::seconds(20)), 0) << rank1->Output();
}

}  // namespace
}  // namespace dsv4
