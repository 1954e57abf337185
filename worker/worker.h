// Worker: executes StepPlans. One per rank; the in-process CPU worker today, the GPU worker
// (plugin) and remote workers (control plane) later. Execute() is called from one thread.
#pragma once

#include <string>

#include <vector>

#include "absl/status/statusor.h"
#include "common/step_plan.h"
#include "worker/model/dsv4_model.h"

namespace dsv4 {

struct WorkerInfo {
  std::string device;       // "cpu", "cuda:0", ...
  int32_t num_blocks = 0;   // context-pool blocks
  int32_t num_slots = 0;    // state slots (max concurrent sequences)
  int32_t block_size = 0;   // tokens per block
  int32_t max_model_len = 0;
  bool cuda_graphs = false;  // runs FULL / PIECEWISE plans (the CUDA worker); others run eager
};

class Worker {
 public:
  virtual ~Worker() = default;
  virtual WorkerInfo info() const = 0;
  // Runs the plan's forward pass and samples. A failed step leaves the plan's sequences in an
  // unspecified state: the coordinator fails those requests.
  virtual absl::StatusOr<StepResult> Execute(const StepPlan& plan) = 0;
};

// The model steps of a plan (views into it): a sampled sequence returns its last logits. A
// sampled entry without a sampling spec is InvalidArgument.
absl::StatusOr<std::vector<SequenceStep>> ModelSteps(const StepPlan& plan);

}  // namespace dsv4
