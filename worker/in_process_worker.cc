#include "worker/in_process_worker.h"

#include "common/status.h"
#include "worker/worker_factory.h"

namespace dsv4 {

absl::StatusOr<std::unique_ptr<Worker>> CreateInProcessWorker(const std::string& device) {
  ASSIGN_OR_RETURN(const DeviceChoice choice, ResolveDevice(device));
  return CreateEmptyWorker(choice);
}

}  // namespace dsv4
