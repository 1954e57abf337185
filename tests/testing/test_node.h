// How the node suites pick their worker from the environment, in one place:
//   DSV4_TEST_TP=N               the model split over N `dsv4-node worker` processes (spawned by the
//                                coordinator; node/control/remote_worker_group.h), else in-process;
//   DSV4_TEST_DEVICE=cpu|cuda    the worker's device (default cpu);
//   DSV4_TEST_PRECISION=bf16|fp32  its precision (default: the suite's);
//   DSV4_TEST_BATCH_INVARIANT=1  --batch-invariant.
// Needs DSV4_NODE_BINARY (the suite's compile definition).
#pragma once

#include <cstdlib>
#include <memory>
#include <string>

#include "common/status.h"
#include "node/control/remote_worker_group.h"
#include "node/serving_node.h"
#include "worker/in_process_worker.h"

namespace dsv4::testing {

inline int TestTensorParallel() {
  const char* tp = std::getenv("DSV4_TEST_TP");
  return tp != nullptr && std::atoi(tp) > 1 ? std::atoi(tp) : 1;
}

// Fills the worker factory, device, precision and batch-invariant switch of `o`.
inline void UseTestWorker(NodeOptions& o, const std::string& default_precision) {
  o.worker_factory = CreateInProcessWorker;
  if (const int n = TestTensorParallel(); n > 1) {
    o.worker_factory = [n](const std::string& device) -> absl::StatusOr<std::unique_ptr<Worker>> {
      RemoteGroupOptions g;
      g.world_size = n;
      g.device = device;
      g.secret = "test-secret";
      g.worker_binary = DSV4_NODE_BINARY;
      ASSIGN_OR_RETURN(auto w, RemoteWorkerGroup::Start(g));
      return std::unique_ptr<Worker>(std::move(w));
    };
  }
  const char* device = std::getenv("DSV4_TEST_DEVICE");
  const char* precision = std::getenv("DSV4_TEST_PRECISION");
  const char* invariant = std::getenv("DSV4_TEST_BATCH_INVARIANT");
  o.device = device != nullptr ? device : "cpu";
  o.precision = precision != nullptr ? precision : default_precision;
  o.batch_invariant = invariant != nullptr && std::string(invariant) == "1";
}

}  // namespace dsv4::testing
