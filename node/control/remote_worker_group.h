// RemoteWorkerGroup: the Worker the engine drives when the model runs on N worker processes
// (architecture.md §1). Each step goes to every rank over the control plane (control_plane.h):
// the same plan, encoded once; every rank acknowledges with its timings and rank 0 returns the
// sampled tokens. Model-free: the coordinator links it, the ranks run `dsv4-node worker`.
//
// Either it spawns the ranks itself (`dsv4-node worker ... --secret-stdin`, one per rank, on
// this machine) or it waits for N external ones to register (the LeaderWorkerSet layout).
//
// A lost rank (its stream ended, it failed a step, or it did not answer within step_timeout)
// breaks the group: that step and every later one fail with UNAVAILABLE naming the rank, so the
// engine fails their requests instead of hanging.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/child_process.h"
#include "node/control/control_plane.h"
#include "worker/worker.h"

namespace dsv4 {

struct RemoteGroupOptions {
  int world_size = 1;                  // Start() needs at least 2
  std::string listen = "127.0.0.1:0";  // the control plane (and rendezvous) address
  std::string secret;                  // shared secret (spawned ranks get it on stdin)
  bool spawn = true;                   // false: --external-workers
  std::string device = "cpu";          // the spawned ranks' --device
  std::string worker_binary = "/proc/self/exe";  // what the spawned ranks run (tests: dsv4-node)
  std::string data_plane = "auto";     // auto|gloo|nccl (ChooseDataPlane)
  std::chrono::milliseconds register_timeout{60000};
  std::chrono::milliseconds step_timeout{120000};
  std::chrono::milliseconds load_timeout{3600000};
};

// The group's data plane from its ranks' registrations and the operator's choice (`wanted`):
// auto takes NCCL when every rank is on a GPU of its own (distinct host and device), else Gloo
// (GPU ranks sharing a GPU stage through host memory); nccl where that does not hold is an error
// naming the two ranks that share a GPU.
absl::StatusOr<std::string> ChooseDataPlane(const std::vector<cpb::Register>& ranks,
                                            const std::string& wanted);

class RemoteWorkerGroup final : public Worker {
 public:
  // Starts the control plane, spawns the ranks (unless external) and waits for all of them to
  // register.
  static absl::StatusOr<std::unique_ptr<RemoteWorkerGroup>> Start(const RemoteGroupOptions& options);
  ~RemoteWorkerGroup() override;

  WorkerInfo info() const override { return info_; }
  absl::Status Configure(const WorkerConfig& config) override;
  absl::Status Load(const LoadProgressFn& progress) override;
  absl::Status WarmUp() override;
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override;
  void Shutdown() override;
  bool broken() const override { return !broken_.ok(); }
  // Spawned ranks: all of them are started again; external ones: waits (up to register_timeout)
  // for every rank to register again. Then the saved configuration is replayed (Configure on a
  // new rendezvous group, Load, WarmUp).
  absl::Status Recover() override;
  std::vector<bool> ranks_up() const override;

  int control_port() const { return plane_->port(); }
  // The spawned ranks' process ids (rank order; empty for external workers).
  std::vector<pid_t> rank_pids();

 private:
  absl::Status SpawnRanks();
  absl::Status ConfigureRanks();

  RemoteGroupOptions options_;
  WorkerConfig config_;    // replayed by Recover()
  int generation_ = 0;     // rendezvous group "tp-<generation>"
  std::unique_ptr<ControlPlane> plane_;
  std::vector<ChildProcess> children_;
  std::vector<std::shared_ptr<RankLink>> links_;
  WorkerInfo info_;
  absl::Status broken_;
  std::set<uint64_t> announced_;  // requests whose sampling spec the ranks hold
  int stage_ = 0;  // 0 started, 1 configured, 2 loaded, 3 ready, 4 shut down

  // Sends `m` to every rank, then waits on each for a message of `want`; LoadProgress messages
  // (rank 0's) go to `progress`. A Failure or a lost rank breaks the group.
  absl::Status Broadcast(const cpb::CoordinatorMessage& m, cpb::WorkerMessage::KindCase want,
                         std::chrono::milliseconds timeout, const LoadProgressFn& progress,
                         std::vector<cpb::WorkerMessage>* replies);
  // Waits on each rank for a message of `want` (as Broadcast, without sending).
  absl::Status Collect(cpb::WorkerMessage::KindCase want, std::chrono::milliseconds timeout,
                       const LoadProgressFn& progress, std::vector<cpb::WorkerMessage>* replies);
  absl::Status Break(absl::Status why);
  absl::Status Stage(const char* call, int need) const;
};

}  // namespace dsv4
