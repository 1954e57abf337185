// A worker rank's end of the control plane (proto/dsv4/internal/v1/worker.proto): dials the
// coordinator, registers, and then does what it is told, in order: Configure (parse the model's
// config, form the Gloo group through the coordinator's rendezvous store, configure the
// in-process worker), Load, WarmUp, Steps, Shutdown. Everything that must be equal on all ranks
// arrives in Configure; nothing is read from this process's environment.
#pragma once

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "worker/worker.h"

namespace dsv4 {

struct WorkerAgentOptions {
  std::string coordinator;   // HOST:PORT of the coordinator's control plane
  int rank = 0;
  int world_size = 1;
  std::string device = "cpu";
  std::string secret;
  // Where this rank's Gloo transport listens for its peers (loopback unless the ranks are on
  // several hosts: the pod's address).
  std::string data_plane_host = "127.0.0.1";
  std::chrono::milliseconds connect_timeout{30000};
  std::string build_version;  // empty: this build's (tests set another to be refused)
  WorkerFactory factory;      // empty: the in-process worker (CreateInProcessWorker)
};

// Runs the rank until the coordinator says Shutdown (OK) or the stream ends or is refused (an
// error saying why).
absl::Status RunWorkerAgent(const WorkerAgentOptions& options);

}  // namespace dsv4
