// dsv4-node worker --coordinator HOST:PORT --rank R --world-size N [--device D]
//   (--worker-secret-file F | --secret-stdin): one rank of a distributed node (worker_agent.h).
// Exit status: 0 after the coordinator's Shutdown; 1 when refused, lost or failed.
#include <iostream>

#include "common/cli_command.h"
#include "common/log.h"
#include "control/secret.h"
#include "worker/remote/worker_agent.h"
#include "worker/cuda_plugin.h"
#include "worker/tools/model_tools.h"
#include "absl/strings/str_cat.h"

namespace dsv4::cli {
namespace {

class WorkerCommand final : public Command {
 public:
  explicit WorkerCommand(CLI::App& app) {
    app.add_option("--coordinator", o_.coordinator, "HOST:PORT of the coordinator's control plane")
        ->required();
    app.add_option("--rank", o_.rank, "this worker's rank")->required()->check(CLI::Range(0, 4095));
    app.add_option("--world-size", o_.world_size, "ranks in the group (--tensor-parallel-size)")
        ->required()
        ->check(CLI::Range(1, 4096));
    app.add_option("--device", o_.device,
                   "auto|cpu|cuda|cuda:N (auto and cuda: GPU rank % GPUs seen; auto falls back to cpu)");
    app.add_option("--worker-secret-file", secret_file_,
                   "file holding the shared secret (a mounted Kubernetes Secret)");
    app.add_flag("--secret-stdin", secret_stdin_, "read the secret from standard input (spawned ranks)");
    app.add_option("--data-plane-host", o_.data_plane_host,
                   "address this rank's Gloo transport listens on (its pod IP across hosts)");
    app.add_option("--connect-timeout", connect_timeout_s_, "seconds to wait for the coordinator")
        ->check(CLI::Range(1, 3600));
    // Tests: register as another build (to be refused).
    app.add_option("--advertise-build-version", o_.build_version)->group("");
  }

  int Run() override {
    if (secret_stdin_ == !secret_file_.empty()) {
      return Fail(absl::InvalidArgumentError("give exactly one of --worker-secret-file and --secret-stdin"));
    }
    if (secret_stdin_) {
      if (!std::getline(std::cin, o_.secret) || o_.secret.empty()) {
        return Fail(absl::InvalidArgumentError("--secret-stdin: no secret on standard input"));
      }
    } else {
      auto s = control::ReadSecretFile(secret_file_, "--worker-secret-file");
      if (!s.ok()) return Fail(s.status());
      o_.secret = *s;
    }
    if (o_.rank >= o_.world_size) {
      return Fail(absl::InvalidArgumentError("--rank must be below --world-size"));
    }
    o_.connect_timeout = std::chrono::milliseconds(connect_timeout_s_ * 1000);
    // auto: GPU rank % (GPUs this process sees) when there are GPUs (one per rank on a machine
    // with several; the pod's one under a LeaderWorkerSet), else the CPU. cuda: the same, but a
    // GPU is required.
    if (o_.device == "auto" || o_.device == "cuda") {
      auto n = CudaDeviceCount();
      if (n.ok() && *n > 0) {
        o_.device = absl::StrCat("cuda:", o_.rank % *n);
      } else if (o_.device == "cuda") {
        return Fail(absl::FailedPreconditionError(absl::StrCat(
            "--device cuda: no GPU (", n.ok() ? "none found" : n.status().message(), ")")));
      } else {
        o_.device = "cpu";
      }
    }
    absl::Status s = RunWorkerAgent(o_);
    if (!s.ok()) return Fail(s);
    LogInfo("worker_stopped", {{"rank", o_.rank}});
    return 0;
  }

 private:
  WorkerAgentOptions o_;
  std::string secret_file_;
  bool secret_stdin_ = false;
  int connect_timeout_s_ = 30;
};

}  // namespace

std::unique_ptr<Command> AddWorker(CLI::App& app) { return std::make_unique<WorkerCommand>(app); }

}  // namespace dsv4::cli
