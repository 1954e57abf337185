// CpuWorker: the in-process worker on the CPU reference engine. Executes StepPlans on a
// Dsv4Model and samples on the host (penalties, min-tokens masking, temperature/top-k/top-p/
// min-p with a per-request counter-based random stream, log-probabilities).
// Keeps, per request, the token counts the penalties need; a plan entry with start_pos 0 resets
// them (new request or recompute after preemption). Not thread-safe: one engine thread.
// Lifecycle (worker.h): built empty it is configured, loads its model (fp32, on a CpuBackend)
// and warms up; built over a loaded model it is ready at once.
#pragma once

#include <memory>
#include <string>
#include <unordered_map>

#include "worker/lifecycle.h"
#include "worker/model/dsv4_model.h"
#include "worker/worker.h"

namespace dsv4 {

class CpuWorker final : public Worker {
 public:
  CpuWorker();
  explicit CpuWorker(std::unique_ptr<Dsv4Model> model, std::string device = "cpu");
  WorkerInfo info() const override { return info_; }
  absl::Status Configure(const WorkerConfig& config) override;
  absl::Status Load(const LoadProgressFn& progress) override;
  absl::Status WarmUp() override;
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override;
  void Shutdown() override;

  // The model (loaded and not shut down).
  const Dsv4Model& model() const { return *model_; }
  size_t tracked_requests() const { return history_.size(); }

 private:
  struct History {
    std::unordered_map<int32_t, int32_t> seen;     // prompt + output
    std::unordered_map<int32_t, int32_t> outputs;  // output only
  };
  void DescribeModel();  // info_ from model_

  Lifecycle life_;
  WorkerConfig config_;
  LoadOptions load_;
  std::unique_ptr<Dsv4Model> model_;
  WorkerInfo info_;
  std::unordered_map<uint64_t, History> history_;
};

// Samples one token from `logits` (modified in place by penalties and masks).
SampledToken SampleToken(std::span<float> logits, const SamplingSpec& spec, int32_t output_index,
                         const std::unordered_map<int32_t, int32_t>& seen,
                         const std::unordered_map<int32_t, int32_t>& outputs);

}  // namespace dsv4
