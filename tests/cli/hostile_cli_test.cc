// `dsv4-node serve` run as an operator runs it, with the hostile cases of issue #18 that need a
// process of their own: signals during the drain, bad command lines, files that are not files.
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "dsv4/v1/dsv4.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/testing/checkpoint_writer.h"
#include "tests/testing/subprocess.h"

namespace dsv4 {
namespace {

using testing::Subprocess;

std::vector<std::string> ServeArgs(const std::string& port_file) {
  return {DSV4_NODE_BINARY, "serve",        "--listen",     "127.0.0.1:0", "--metrics-listen",
          "127.0.0.1:0",    "--port-file",  port_file,      "--max-model-len", "2048",
          "--log-level",    "info",         "--drain-timeout", "60"};
}

struct Stream {
  grpc::Status status;
  int chunks = 0;
  bool finished = false;
  v1::FinishReason reason = v1::FINISH_REASON_UNSPECIFIED;
  std::string message;
};

// Streams a long generation; `started` turns true after the first chunk.
Stream LongStream(int port, std::atomic<bool>* started) {
  auto stub = v1::Dsv4::NewStub(
      grpc::CreateChannel(absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
  v1::GenerateRequest req;
  for (int id : {5, 6, 7}) req.mutable_token_ids()->add_ids(id);
  req.set_max_tokens(1500);
  req.set_ignore_eos(true);
  auto reader = stub->Generate(&ctx, req);
  v1::GenerateResponse resp;
  Stream s;
  while (reader->Read(&resp)) {
    if (resp.has_chunk()) {
      ++s.chunks;
      started->store(true);
    }
    if (resp.has_finished()) {
      s.finished = true;
      s.reason = resp.finished().finish_reason();
      s.message = resp.finished().message();
    }
  }
  s.status = reader->Finish();
  return s;
}

bool WaitUntil(const std::atomic<bool>& flag) {
  for (int i = 0; i < 3000 && !flag.load(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return flag.load();
}

// Finding 3: a second SIGTERM during the drain killed the process (exit 143) and dropped every
// stream. Repeated SIGTERMs are now ignored: the drain finishes the stream, the exit code is 0.
TEST(HostileSignals, RepeatedSigtermKeepsDraining) {
  const std::string port_file = testing::TempDir("sigterm") + "/ports.json";
  ::unlink(port_file.c_str());
  auto node = Subprocess::Start(ServeArgs(port_file));
  ASSERT_NE(node, nullptr);
  int grpc_port = 0, metrics_port = 0;
  ASSERT_TRUE(testing::WaitForPortFile(port_file, node.get(), &grpc_port, &metrics_port))
      << node->Output();
  std::atomic<bool> started{false};
  Stream stream;
  std::thread client([&] { stream = LongStream(grpc_port, &started); });
  ASSERT_TRUE(WaitUntil(started));
  node->Signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  node->Signal(SIGTERM);
  node->Signal(SIGTERM);
  client.join();
  EXPECT_TRUE(stream.status.ok()) << stream.status.error_message();
  EXPECT_TRUE(stream.finished);
  EXPECT_EQ(stream.reason, v1::LENGTH);
  EXPECT_EQ(stream.chunks, 1500);
  EXPECT_EQ(node->Wait(std::chrono::seconds(60)), 0) << node->Output();
  EXPECT_NE(node->Output().find("signal_during_drain_ignored"), std::string::npos);
}

// A SIGINT during the drain forces the shutdown: the stream ends with CANCELLED and a message
// (not a dropped connection), the exit code is 130.
TEST(HostileSignals, SigintDuringDrainForcesAClearEnd) {
  const std::string port_file = testing::TempDir("sigint") + "/ports.json";
  ::unlink(port_file.c_str());
  auto node = Subprocess::Start(ServeArgs(port_file));
  ASSERT_NE(node, nullptr);
  int grpc_port = 0, metrics_port = 0;
  ASSERT_TRUE(testing::WaitForPortFile(port_file, node.get(), &grpc_port, &metrics_port))
      << node->Output();
  std::atomic<bool> started{false};
  Stream stream;
  std::thread client([&] { stream = LongStream(grpc_port, &started); });
  ASSERT_TRUE(WaitUntil(started));
  node->Signal(SIGTERM);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  node->Signal(SIGINT);
  client.join();
  EXPECT_TRUE(stream.status.ok()) << stream.status.error_message();
  EXPECT_TRUE(stream.finished);
  EXPECT_EQ(stream.reason, v1::CANCELLED);
  EXPECT_NE(stream.message.find("forced shutdown"), std::string::npos) << stream.message;
  EXPECT_LT(stream.chunks, 1500);
  EXPECT_EQ(node->Wait(std::chrono::seconds(60)), 130) << node->Output();
}

struct ServeRun {
  int code = -1;
  std::string output;
};

ServeRun ServeWith(std::vector<std::string> extra, int timeout_s = 30) {
  std::vector<std::string> args = {DSV4_NODE_BINARY, "serve", "--listen", "127.0.0.1:0",
                                   "--metrics-listen", "127.0.0.1:0"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto p = Subprocess::Start(args);
  ServeRun r;
  if (p == nullptr) return r;
  r.code = p->Wait(std::chrono::seconds(timeout_s));
  r.output = p->Output();
  return r;
}

// Finding 9: bad command lines fail at start with the flag named.
TEST(HostileCommandLine, BadValuesFailNamingTheFlag) {
  struct Case {
    std::vector<std::string> args;
    std::string names;
  };
  const std::vector<Case> cases = {
      {{"--listen", "127.0.0.1:99999"}, "--listen"},
      {{"--metrics-listen", "999.1.1.1:9464"}, "--metrics-listen"},
      {{"--drain-timeout", "nan"}, "--drain-timeout"},
      {{"--drain-timeout", "inf"}, "--drain-timeout"},
      {{"--port-file", "/nonexistent-dir/ports.json"}, "--port-file"},
      {{"--tls-cert", "/nonexistent/cert.pem", "--tls-key", "/nonexistent/key.pem"}, "--tls-cert"},
      {{"--tls-key", "/nonexistent/key.pem"}, "--tls-cert"},
      {{"--max-requests-per-client", "-1"}, "--max-requests-per-client"},
  };
  for (const Case& c : cases) {
    const ServeRun r = ServeWith(c.args);
    EXPECT_NE(r.code, 0) << c.args[0];
    EXPECT_NE(r.code, -1) << c.args[0] << ": still running";
    EXPECT_NE(r.output.find(c.names), std::string::npos) << r.output;
  }
}

// Finding 9: a FIFO config.json hung the load (with the listeners open); now it is refused at
// once.
TEST(HostileCommandLine, FifoConfigIsRefusedNotWaitedOn) {
  const std::string dir = testing::TempDir("cli-fifo");
  ::unlink((dir + "/config.json").c_str());
  ASSERT_EQ(::mkfifo((dir + "/config.json").c_str(), 0644), 0);
  const ServeRun r = ServeWith({"--model", dir, "--tokenizer", testing::TestData("tok-tiny/tokenizer.json")},
                          /*timeout_s=*/20);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("not a regular file"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace dsv4
