// The control plane's cost per step (proto/dsv4/internal/v1/worker.proto): the coordinator's
// RemoteWorkerGroup encodes a decode plan of S running requests, sends it to every rank over
// loopback gRPC and waits for each acknowledgement (rank 0's with S sampled tokens). The ranks
// are real worker agents (worker/remote/worker_agent.h) in threads of this process, over a worker
// that answers at once: what is measured is the control plane alone.
//
//   dsv4_control_plane_bench [--world-size 2] [--seqs 1,64,256] [--steps 2000] [--context 1024]
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "control/plan_codec.h"
#include "node/control/remote_worker_group.h"
#include "worker/remote/worker_agent.h"

namespace dsv4 {
namespace {

// Samples token 7 for every sampling row, in no time.
class InstantWorker final : public Worker {
 public:
  WorkerInfo info() const override {
    WorkerInfo i;
    i.device = "instant";
    i.num_blocks = 1 << 16;
    i.num_slots = 1024;
    i.block_size = 64;
    i.max_model_len = 1 << 20;
    return i;
  }
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override {
    StepResult r;
    r.step_id = plan.step_id;
    for (const ScheduledSeq& s : plan.seqs) {
      if (s.sample) r.sampled.push_back(SampledToken{s.request_id, 7, -0.5f, {}, false});
    }
    return r;
  }
};

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

double Percentile(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * (v.size() - 1))];
}

int Run(int argc, char** argv) {
  int world = 2, steps = 2000, context = 1024;
  std::vector<int> seqs = {1, 64, 256};
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--world-size") world = std::atoi(v.c_str());
    else if (k == "--steps") steps = std::atoi(v.c_str());
    else if (k == "--context") context = std::atoi(v.c_str());
    else if (k == "--seqs") {
      seqs.clear();
      for (auto part : absl::StrSplit(v, ',')) seqs.push_back(std::atoi(std::string(part).c_str()));
    } else {
      std::fprintf(stderr, "unknown flag %s\n", k.c_str());
      return 2;
    }
  }
  const int port = FreePort();
  RemoteGroupOptions g;
  g.world_size = world;
  g.spawn = false;
  g.secret = "bench";
  g.listen = "127.0.0.1:" + std::to_string(port);
  // The ranks first (they wait for the coordinator to listen), then the group.
  std::vector<std::thread> ranks;
  std::vector<absl::Status> rank_status(world);
  for (int r = 0; r < world; ++r) {
    ranks.emplace_back([&, r] {
      WorkerAgentOptions o;
      o.coordinator = g.listen;
      o.rank = r;
      o.world_size = world;
      o.secret = g.secret;
      o.factory = [](const std::string&) -> absl::StatusOr<std::unique_ptr<Worker>> {
        return std::unique_ptr<Worker>(std::make_unique<InstantWorker>());
      };
      rank_status[r] = RunWorkerAgent(o);
    });
  }
  auto started = RemoteWorkerGroup::Start(g);
  if (!started.ok()) {
    std::fprintf(stderr, "error: %s\n", started.status().ToString().c_str());
    std::_Exit(1);
  }
  std::unique_ptr<RemoteWorkerGroup> group = std::move(*started);
  WorkerConfig wc;
  wc.synthetic = true;
  wc.source = std::string(DSV4_SOURCE_DIR) + "/models/dsv4-tiny/config.json";
  if (absl::Status s = BringUp(*group, wc); !s.ok()) {
    std::fprintf(stderr, "error: %s\n", s.ToString().c_str());
    std::_Exit(1);
  }
  std::printf("control plane per step, TP%d over loopback gRPC, decode steps (1 token a request, "
              "%d-token context: %d-entry block tables), %d steps each\n",
              world, context, context / 64, steps);
  std::printf("%8s %10s %10s %10s %12s %12s\n", "requests", "p50_us", "p90_us", "p99_us",
              "step_bytes", "result_bytes");
  auto spec = std::make_shared<const SamplingSpec>();
  uint64_t step_id = 0;
  for (int S : seqs) {
    StepPlan plan;
    for (int i = 0; i < S; ++i) {
      ScheduledSeq q;
      q.request_id = 1000000 + static_cast<uint64_t>(S) * 1000 + i;
      q.tokens = {42};
      q.start_pos = context - 1;
      q.state_slot = i;
      for (int b = 0; b < context / 64; ++b) q.block_table.push_back(i * (context / 64) + b);
      q.sample = true;
      q.prompt_len = context / 2;
      q.output_index = context / 2 - 1;
      q.sampling = spec;
      plan.seqs.push_back(q);
    }
    std::vector<double> us;
    for (int k = 0; k < steps + 50; ++k) {
      plan.step_id = ++step_id;
      auto r = group->Execute(plan);
      if (!r.ok() || static_cast<int>(r->sampled.size()) != S) {
        std::fprintf(stderr, "error: step failed: %s\n", r.status().ToString().c_str());
        std::_Exit(1);
      }
      if (k >= 50) us.push_back(r->control_seconds * 1e6);  // 50 warm-up steps
    }
    control::pb::Step wire;
    control::ToProto(plan, &wire);
    control::pb::StepDone done;
    StepResult res;
    for (const auto& q : plan.seqs) res.sampled.push_back(SampledToken{q.request_id, 7, -0.5f, {}, false});
    control::ToProto(res, true, &done);
    std::printf("%8d %10.1f %10.1f %10.1f %12zu %12zu\n", S, Percentile(us, 0.5),
                Percentile(us, 0.9), Percentile(us, 0.99), wire.ByteSizeLong(), done.ByteSizeLong());
  }
  group->Shutdown();
  for (auto& t : ranks) t.join();
  return 0;
}

}  // namespace
}  // namespace dsv4

int main(int argc, char** argv) { return dsv4::Run(argc, argv); }
