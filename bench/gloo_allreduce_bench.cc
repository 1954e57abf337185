// All-reduce latency and bandwidth of the Gloo communicator over loopback, ranks as processes
// formed through the rendezvous service as a coordinator would serve it.
//   dsv4_gloo_allreduce_bench [--world-sizes 2,4] [--hidden 4096] [--rows 1,4,16,64,256,1024,4096]
//                             [--dtype f32|bf16] [--host 127.0.0.1]
// Rank 0 prints one line per size: rows x hidden, bytes, iterations, median and p90 latency,
// algorithm bandwidth (bytes / time) and bus bandwidth (2 (n-1)/n bytes / time, as nccl-tests).
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "parallel/gloo_communicator.h"
#include "parallel/rendezvous_service.h"
#include "parallel/rendezvous_store.h"

extern char** environ;

namespace dsv4 {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> ParseList(const std::string& s) {
  std::vector<int> out;
  for (absl::string_view part : absl::StrSplit(s, ',')) {
    int v = 0;
    if (absl::SimpleAtoi(part, &v) && v > 0) out.push_back(v);
  }
  return out;
}

int RunRank(std::map<std::string, std::string>& args) {
  GlooOptions o;
  o.rank = std::atoi(args["--rank"].c_str());
  o.world_size = std::atoi(args["--world-size"].c_str());
  o.hostname = args["--host"];
  o.op_timeout = std::chrono::seconds(60);
  auto comm = GlooCommunicator::Connect(o, {args["--store"], args["--group"], args["--token"]});
  if (!comm.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", o.rank, comm.status().ToString().c_str());
    return 1;
  }
  Communicator& c = **comm;
  const DType dtype = args["--dtype"] == "bf16" ? DType::kBF16 : DType::kF32;
  const size_t esize = static_cast<size_t>(DTypeSize(dtype));
  const int hidden = std::atoi(args["--hidden"].c_str());
  const int n = o.world_size;
  if (o.rank == 0) {
    std::printf("TP%d %s, hidden %d, loopback\n", n, dtype == DType::kBF16 ? "bf16" : "fp32",
                hidden);
    std::printf("%10s %12s %6s %12s %12s %12s %12s\n", "rows", "bytes", "iters", "median_us",
                "p90_us", "algbw_GB/s", "busbw_GB/s");
  }
  for (int rows : ParseList(args["--rows"])) {
    const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(hidden);
    const size_t bytes = count * esize;
    std::vector<uint8_t> buf(bytes, 0);
    // About a second per size: fewer iterations for the large buffers.
    const int iters = static_cast<int>(std::clamp<size_t>((size_t{512} << 20) / bytes, 5, 500));
    std::vector<double> us;
    absl::Status s = c.Barrier();
    for (int i = 0; i < 3 && s.ok(); ++i) s = c.AllReduceSum(buf.data(), buf.data(), count, dtype, nullptr);
    for (int i = 0; i < iters && s.ok(); ++i) {
      const auto t0 = Clock::now();
      s = c.AllReduceSum(buf.data(), buf.data(), count, dtype, nullptr);
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    }
    if (!s.ok()) {
      std::fprintf(stderr, "rank %d: %s\n", o.rank, s.ToString().c_str());
      return 1;
    }
    std::sort(us.begin(), us.end());
    const double med = us[us.size() / 2];
    const double p90 = us[std::min(us.size() - 1, us.size() * 9 / 10)];
    const double algbw = static_cast<double>(bytes) / (med * 1e3);
    if (o.rank == 0) {
      std::printf("%10d %12zu %6d %12.1f %12.1f %12.3f %12.3f\n", rows, bytes, iters, med, p90,
                  algbw, algbw * 2.0 * (n - 1) / n);
      std::fflush(stdout);
    }
  }
  return c.Barrier().ok() ? 0 : 1;
}

int RunWorld(std::map<std::string, std::string>& args, RendezvousStore& store, int port, int n) {
  const std::string group = absl::StrCat("bench-", n);
  auto token = NewRendezvousToken();
  if (!token.ok() || !store.OpenGroup(group, n, *token).ok()) return 1;
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> argv = {"/proc/self/exe", "--rank", std::to_string(r),
                                     "--world-size", std::to_string(n), "--store",
                                     absl::StrCat("127.0.0.1:", port), "--group", group,
                                     "--token", *token};
    for (const char* k : {"--dtype", "--hidden", "--rows", "--host"}) {
      argv.push_back(k);
      argv.push_back(args[k]);
    }
    std::vector<char*> cargv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", nullptr, nullptr, cargv.data(), environ) != 0) {
      std::fprintf(stderr, "cannot start rank %d\n", r);
      return 1;
    }
    pids.push_back(pid);
  }
  int failed = 0;
  for (pid_t pid : pids) {
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failed;
  }
  store.CloseGroup(group);
  return failed == 0 ? 0 : 1;
}

int Main(int argc, char** argv) {
  std::map<std::string, std::string> args = {{"--world-sizes", "2,4"},
                                             {"--hidden", "4096"},
                                             {"--rows", "1,4,16,64,256,1024,4096"},
                                             {"--dtype", "f32"},
                                             {"--host", "127.0.0.1"}};
  for (int i = 1; i + 1 < argc; i += 2) args[argv[i]] = argv[i + 1];
  if (args.count("--rank")) return RunRank(args);
  RendezvousStore store;
  auto server = RendezvousServer::Start("127.0.0.1:0", &store);
  if (!server.ok()) {
    std::fprintf(stderr, "%s\n", server.status().ToString().c_str());
    return 1;
  }
  int rc = 0;
  for (int n : ParseList(args["--world-sizes"])) {
    std::fflush(stdout);
    rc |= RunWorld(args, store, (*server)->port(), n);
    std::printf("\n");
  }
  return rc;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) { return dsv4::Main(argc, argv); }
