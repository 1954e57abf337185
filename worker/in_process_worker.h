// The in-process worker seen from the coordinator: a CPU worker, or the GPU worker of the CUDA
// plugin, in this process. Model-free header (the coordinator's side of the seam); the
// implementation links the model code (dsv4_worker).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "worker/worker.h"

namespace dsv4 {

// The in-process WorkerFactory: resolves `device` (auto|cpu|cuda|cuda:N; an explicit GPU that is
// not there is an error saying why) and creates the worker there, not yet configured.
absl::StatusOr<std::unique_ptr<Worker>> CreateInProcessWorker(const std::string& device);

}  // namespace dsv4
