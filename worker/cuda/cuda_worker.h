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
// (kill switch DSV4_ENFORCE_EAGER=1, a failed FULL capture, more masked ids than the graph's
// buffer) runs eagerly and reports the fallback.
// Not thread-safe: one engine thread.
#pragma once

#include <array>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/device_memory.h"
#include "worker/cuda_plugin.h"
#include "worker/model/dsv4_model.h"
#include "worker/worker.h"

namespace dsv4 {

struct CudaGraphStats {
  int64_t full_captures = 0, piecewise_captures = 0;
  int64_t full_replays = 0, piecewise_replays = 0;  // steps run from captured graphs
  int64_t recaptures = 0;         // captures forced by a changed baked address
  int64_t fallbacks = 0;
};

class CudaWorker final : public Worker {
 public:
  // `model` must run on a CudaBackend. The environment's switches are OR'ed into `graphs`.
  static absl::StatusOr<std::unique_ptr<CudaWorker>> Create(std::unique_ptr<Dsv4Model> model,
                                                            CudaGraphOptions graphs = {});
  ~CudaWorker() override;
  WorkerInfo info() const override;
  absl::StatusOr<StepResult> Execute(const StepPlan& plan) override;

  Dsv4Model& model() { return *model_; }
  const CudaGraphStats& stats() const { return stats_; }
  // Drops every captured graph (the next graph step of each size captures again).
  void ClearGraphs();

 private:
  struct FullGraph {
    CudaGraphExec exec;
    std::vector<uintptr_t> baked;
    DeviceBuffer io;  // SampleRow[rows] | SampleOut[rows] | mask ids[kGraphMaskIds]
    int32_t rows = 0;
    bool captured = false;
    bool failed = false;  // capture failed once: this size runs eagerly
  };
  struct PiecewiseEntry {
    PiecewiseGraph graph;
    std::vector<uintptr_t> baked;
  };

  CudaWorker() = default;
  absl::Status EnsureCounts();
  absl::Status RunFull(int32_t padded, int64_t rows, const void* host_rows, const void* host_mask,
                       int64_t masked, GraphRun* run, const void** outs);

  std::unique_ptr<Dsv4Model> model_;
  CudaBackend* backend_ = nullptr;  // owned by model_
  CudaGraphOptions options_;
  DeviceBuffer seen_, outputs_;     // [slots, vocab] int32, allocated on first penalty use
  PinnedBuffer staging_;
  DeviceBuffer staging_dev_;
  // DSV4_STEP_DEVICE_TIME=1: timing events around each step's device work (device_seconds),
  // and the host's phases of each step, whose medians the destructor prints (where the host
  // time around the device's goes).
  CudaEvent step_begin_, step_end_;
  bool time_steps_ = false;
  std::vector<std::array<double, 6>> phases_;
  std::map<int32_t, FullGraph> full_;
  std::map<int32_t, PiecewiseEntry> piecewise_;
  CudaGraphStats stats_;
};

}  // namespace dsv4
