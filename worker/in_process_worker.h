// The in-process worker seen from the coordinator: a CPU worker, or the GPU worker of the CUDA
// plugin, in this process. Model-free header (the coordinator's side of the seam); the
// implementation links the model code (dsv4_worker).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/worker.h"

namespace dsv4 {

// Resolves `config.device` (auto|cpu|cuda|cuda:N), parses its precision and weight format (an
// error names the field), and loads the model on that device. Logs `model_loading` first.
absl::StatusOr<std::unique_ptr<Worker>> CreateInProcessWorker(const WorkerConfig& config);

}  // namespace dsv4
