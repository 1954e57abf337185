// One Gloo rank as its own process, for gloo_multiprocess_test.cc: forms the group through the
// test's rendezvous service, runs a scenario and reports through its exit code and output.
//   dsv4_gloo_rank --store HOST:PORT --group G --token T --rank R --world-size N
//                  --scenario collectives|exit-early|connect [--dir DIR] [--timeout-ms MS]
// Exit codes: 0 the scenario held; 1 a check failed; 2 bad arguments; 10 + the absl status code
// when connecting failed (the connect scenario); 3 the expected collective error came (exit-early).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "parallel/gloo_communicator.h"
#include "tests/parallel/collective_checks.h"

namespace dsv4 {
namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "FAIL: %s\n", s.ToString().c_str());
  return 1;
}

// Every rank writes its marker, then the barrier; after it every marker must be there.
absl::Status CheckBarrierOrdering(Communicator& comm, const std::string& dir) {
  for (int round = 0; round < 3; ++round) {
    const std::string mine = absl::StrCat(dir, "/r", round, "-", comm.rank());
    std::ofstream(mine) << "x";
    // Rank 0 is slow to arrive: the others must wait for it.
    if (comm.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    absl::Status s = comm.Barrier();
    if (!s.ok()) return s;
    for (int r = 0; r < comm.world_size(); ++r) {
      const std::string theirs = absl::StrCat(dir, "/r", round, "-", r);
      if (!std::filesystem::exists(theirs)) {
        return absl::InternalError(absl::StrCat("after barrier ", round, " on rank ", comm.rank(),
                                                ": rank ", r, " had not reached it"));
      }
    }
  }
  return absl::OkStatus();
}

int Collectives(Communicator& comm, const std::string& dir) {
  using namespace dsv4::testing;
  for (size_t count : CheckSizes()) {
    for (DType dtype : {DType::kF32, DType::kBF16}) {
      for (bool in_place : {false, true}) {
        absl::Status s = CheckAllReduce(comm, count, dtype, in_place);
        if (!s.ok()) return Fail(s);
      }
    }
    for (bool in_place : {false, true}) {
      absl::Status s = CheckAllGather(comm, count, in_place);
      if (!s.ok()) return Fail(s);
    }
    for (int root = 0; root < comm.world_size(); ++root) {
      absl::Status s = CheckBroadcast(comm, count, root);
      if (!s.ok()) return Fail(s);
    }
  }
  absl::Status s = CheckAllReduceBf16Rounding(comm, 1001);
  if (!s.ok()) return Fail(s);
  if (!dir.empty()) {
    s = CheckBarrierOrdering(comm, dir);
    if (!s.ok()) return Fail(s);
  }
  s = comm.Barrier();
  if (!s.ok()) return Fail(s);
  std::printf("OK rank %d of %d\n", comm.rank(), comm.world_size());
  return 0;
}

// The last rank leaves right after the group formed; the others keep all-reducing and must get an
// error (the peer closed its sockets), never hang.
int ExitEarly(Communicator& comm) {
  if (comm.rank() == comm.world_size() - 1) {
    std::printf("rank %d leaving\n", comm.rank());
    std::fflush(stdout);
    std::_Exit(0);
  }
  std::vector<float> buf(4096, 1.0f);
  for (int i = 0; i < 1000; ++i) {
    absl::Status s = comm.AllReduceSum(buf.data(), buf.data(), buf.size(), DType::kF32, nullptr);
    if (!s.ok()) {
      std::printf("collective error: %s\n", s.ToString().c_str());
      absl::Status again = comm.Barrier();
      std::printf("after: %s\n", again.ToString().c_str());
      const bool expected = (s.code() == absl::StatusCode::kUnavailable ||
                             s.code() == absl::StatusCode::kDeadlineExceeded) &&
                            again.code() == absl::StatusCode::kFailedPrecondition;
      return expected ? 3 : 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::fprintf(stderr, "FAIL: 1000 all-reduces succeeded without the last rank\n");
  return 1;
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> args;
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  for (const char* required : {"--store", "--group", "--token", "--rank", "--world-size",
                               "--scenario"}) {
    if (args.count(required) == 0) {
      std::fprintf(stderr, "missing %s\n", required);
      return 2;
    }
  }
  GlooOptions options;
  options.rank = std::atoi(args["--rank"].c_str());
  options.world_size = std::atoi(args["--world-size"].c_str());
  const int timeout_ms = args.count("--timeout-ms") ? std::atoi(args["--timeout-ms"].c_str()) : 5000;
  options.connect_timeout = std::chrono::milliseconds(timeout_ms);
  options.op_timeout = std::chrono::milliseconds(timeout_ms);
  const RendezvousEndpoint endpoint{args["--store"], args["--group"], args["--token"]};
  auto comm = GlooCommunicator::Connect(options, endpoint);
  const std::string& scenario = args["--scenario"];
  if (!comm.ok()) {
    std::printf("connect error: %s\n", comm.status().ToString().c_str());
    return scenario == "connect" ? 10 + static_cast<int>(comm.status().code()) : 1;
  }
  if (scenario == "connect") {
    std::printf("connected rank %d\n", options.rank);
    absl::Status s = (*comm)->Barrier();
    return s.ok() ? 0 : Fail(s);
  }
  if (scenario == "collectives") return Collectives(**comm, args["--dir"]);
  if (scenario == "exit-early") return ExitEarly(**comm);
  std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
  return 2;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) { return dsv4::Main(argc, argv); }
