// CudaWorker: the GPU worker. Executes StepPlans on a Dsv4Model whose backend is a CudaBackend,
// and samples on the device (kernels/cuda/sampling.h): the logits never leave the GPU, only the
// sampled ids (and requested log-probabilities) come back. Penalty token counts live on the device
// per state slot and are kept only for requests that use penalties; a plan entry with start_pos 0
// resets its slot's counts (a new request, or a recompute after preemption).
//
// CUDA graphs (docs/cuda-graphs.md). The plan says how to run a step:
//   * kFull: the whole forward and the sampling of the step, padded to plan.padded_tokens, as one
//     graph per padded size, captured on first use and replayed after;
//   * kPiecewise: the layers padded to plan.padded_tokens as graph segments, with the indexer
//     scoring and the attention core eager between them (CudaBackend::BeginPiecewise); the head
//     and the sampling eager;
//   * kEager.
// Padding rows are inert (state slot -1). Before every replay the worker compares the addresses
// the graph baked in (metadata arrays, sampling buffers, count tables) with the current ones and
// captures again on a mismatch; `stats()` counts both. A step that cannot run its planned graph
// (kill switch DSV4_ENFORCE_EAGER=1, a failed FULL capture) runs eagerly and reports the fallback.
// Per step, one transfer carries the metadata with the sampling rows and min-tokens mask ids
// (CudaBackend::SetStepPayload), and a kernel writes the results into pinned host memory.
// A step goes through three rooms of its own: StepStaging (step_staging.h) lays out and fills the
// host metadata, GraphRunner (graph_runner.h) chooses the mode and owns the captured graphs,
// DeviceSampler (device_sampler.h) owns the penalty counts and the slot tokens and samples;
// LaunchStep only sequences them around the model's PrepareStep / RunForward.
// Not thread-safe: one engine thread.
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/cuda/sampling.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/device_memory.h"
#include "worker/cuda/device_sampler.h"
#include "worker/cuda/graph_runner.h"
#include "worker/cuda/step_staging.h"
#include "worker/cuda_plugin.h"
#include "worker/lifecycle.h"
#include "worker/model/dsv4_model.h"
#include "worker/worker.h"

namespace dsv4 {

class CudaWorker final : public Worker {
 public:
  // On device `device`, not yet configured (worker.h's lifecycle).
  explicit CudaWorker(int device);
  ~CudaWorker() override;
  WorkerInfo info() const override;
  // Checks the precision, the weight format and the graph switches; the environment's switches
  // are OR'ed into the config's.
  absl::Status Configure(const WorkerConfig& config) override;
  // The CudaBackend, the model on it (checkpoint or synthetic weights), the sampling buffers.
  absl::Status Load(const LoadProgressFn& progress) override;
  absl::Status WarmUp() override;
  // Waits for the stream, drops the graphs, the buffers and the model (the device memory), and
  // prints the step phase medians when DSV4_STEP_DEVICE_TIME=1 recorded them.
  void Shutdown() override;
  // Launch + Collect (nothing may be in flight).
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override;
  // Queues the step on the stream and returns (Worker::Launch): the next step's host work (plan,
  // metadata, uploads, graph launch) overlaps this one on the device. A deferred token is resolved
  // on the device: the sampling leaves each row's token in a per-slot table and the next step's
  // embedding reads it (cuda::DeferredTokens).
  absl::Status Launch(const StepPlan& plan) override;
  absl::StatusOr<StepResult> Collect() override;
  int in_flight() const override { return static_cast<int>(flights_.size()); }

  Dsv4Model& model() { return *model_; }
  const CudaGraphStats& stats() const { return graphs_.stats(); }
  // Drops every captured graph (the next graph step of each size captures again).
  void ClearGraphs();

 private:
  struct Flight {
    uint64_t step_id = 0;
    std::vector<SampledRow> rows;           // the plan's sampled entries, in order
    const cuda::SampleOut* outs = nullptr;  // in the staging's host buffer
    Staging* staging = nullptr;             // null: an empty plan
    GraphRun graph;
    std::chrono::steady_clock::time_point t0, t_prepare, t_prepared, t_launched;
    double launch_seconds = 0;
  };

  static_assert(kMaxInFlight <= 2, "the staging sets alternate by launch parity");

  // The per-step buffers and events, once the model is loaded.
  absl::Status Setup();
  absl::Status LaunchStep(const StepPlan& plan);
  // A deferred token must come from the previous launched step's sampling, into its slot.
  absl::Status CheckDeferred(const StepPlan& plan) const;
  absl::Status RunForwardAndSample(GraphMode mode, int32_t padded, int64_t rows,
                                   const StagedStep& staged, const cuda::SampleRow* dev_rows,
                                   const int32_t* dev_mask, GraphRun* run);

  Lifecycle life_;
  int device_ = 0;
  WorkerInfo info_;  // the pools' shape and the overlap, from Load
  WorkerConfig config_;
  Precision precision_ = Precision::kBF16;
  LoadOptions load_;
  std::unique_ptr<Dsv4Model> model_;
  CudaBackend* backend_ = nullptr;  // owned by model_
  CudaGraphOptions options_;
  // The rooms of a step: its metadata staging, its graphs, its sampling.
  StepStaging staging_;
  GraphRunner graphs_;
  DeviceSampler sampler_;
  uint64_t launches_ = 0;
  std::deque<Flight> flights_;
  std::map<uint64_t, int32_t> last_slots_;  // request -> slot, sampled by the last launched step
  // DSV4_STEP_DEVICE_TIME=1: timing events around each step's device work (device_seconds),
  // and the host's phases of each step, whose medians the destructor prints (where the host
  // time around the device's goes).
  bool time_steps_ = false;
  std::vector<std::array<double, 8>> phases_;
};

}  // namespace dsv4
