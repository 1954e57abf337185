// CudaWorker: the GPU worker. Executes StepPlans on a Dsv4Model whose backend is a CudaBackend,
// and samples on the device (kernels/cuda/sampling.h): the logits never leave the GPU, only the
// sampled ids (and requested log-probabilities) come back. Penalty token counts live on the device
// per state slot and are kept only for requests that use penalties; a plan entry with start_pos 0
// resets its slot's counts (a new request, or a recompute after preemption).
// Not thread-safe: one engine thread.
#pragma once

#include <memory>
#include <string>

#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/device_memory.h"
#include "worker/model/dsv4_model.h"
#include "worker/worker.h"

namespace dsv4 {

class CudaWorker final : public Worker {
 public:
  // `model` must run on a CudaBackend.
  static absl::StatusOr<std::unique_ptr<CudaWorker>> Create(std::unique_ptr<Dsv4Model> model);
  WorkerInfo info() const override;
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override;

  Dsv4Model& model() { return *model_; }

 private:
  CudaWorker() = default;
  absl::Status EnsureCounts();

  std::unique_ptr<Dsv4Model> model_;
  CudaBackend* backend_ = nullptr;  // owned by model_
  DeviceBuffer seen_, outputs_;     // [slots, vocab] int32, allocated on first penalty use
  PinnedBuffer staging_;
  DeviceBuffer staging_dev_;
};

}  // namespace dsv4
