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
#include "worker/cuda_plugin.h"
#include "worker/lifecycle.h"
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
  const CudaGraphStats& stats() const { return stats_; }
  // Drops every captured graph (the next graph step of each size captures again).
  void ClearGraphs();

 private:
  struct FullGraph {
    CudaGraphExec exec;
    cudaGraphNode_t copy_node = nullptr;  // the results' copy to the host (set per launch)
    std::vector<uintptr_t> baked;
    DeviceBuffer io;  // SampleOut[rows]: the step's results
    int32_t rows = 0;
    bool captured = false;
    bool failed = false;  // capture failed once: this size runs eagerly
  };
  struct PiecewiseEntry {
    PiecewiseGraph graph;
    std::vector<uintptr_t> baked;
  };

  // One of two staging sets, used by launches of alternating parity: the step in flight keeps its
  // sampling rows and its results' landing area while the next one is staged.
  struct Staging {
    PinnedBuffer host;
    DeviceBuffer dev;
    void* host_mapped = nullptr;  // the device's address of `host` (null: not mapped)
    CudaEvent done;               // after the results' copy back
    // DSV4_STEP_DEVICE_TIME=1: around the forward and sampling (begin, end), and around the whole
    // step's stream work (pre: before the metadata upload; post: after the results' copy back).
    CudaEvent begin, end, pre, post;
  };
  struct Flight {
    struct Row {
      uint64_t request_id = 0;
      int64_t out_row = 0;
      int32_t logprobs = 0;
    };
    uint64_t step_id = 0;
    std::vector<Row> rows;                  // the plan's sampled entries, in order
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
  absl::Status EnsureCounts();
  absl::Status RunFull(int32_t padded, int64_t rows, const cuda::SampleRow* dev_rows,
                       const int32_t* dev_mask, void* host_outs, GraphRun* run, const void** outs,
                       bool* copied);

  Lifecycle life_;
  int device_ = 0;
  WorkerInfo info_;  // the pools' shape and the overlap, from Load
  WorkerConfig config_;
  Precision precision_ = Precision::kBF16;
  LoadOptions load_;
  std::unique_ptr<Dsv4Model> model_;
  CudaBackend* backend_ = nullptr;  // owned by model_
  CudaGraphOptions options_;
  DeviceBuffer seen_, outputs_;     // [slots, vocab] int32, allocated on first penalty use
  DeviceBuffer slot_tokens_;        // [slots] int32: each slot's last sampled token
  std::array<Staging, 2> staging_;
  uint64_t launches_ = 0;
  std::deque<Flight> flights_;
  std::map<uint64_t, int32_t> last_slots_;  // request -> slot, sampled by the last launched step
  // DSV4_STEP_DEVICE_TIME=1: timing events around each step's device work (device_seconds),
  // and the host's phases of each step, whose medians the destructor prints (where the host
  // time around the device's goes).
  bool time_steps_ = false;
  std::vector<std::array<double, 8>> phases_;
  std::map<int32_t, FullGraph> full_;
  std::map<int32_t, PiecewiseEntry> piecewise_;
  CudaGraphStats stats_;
};

}  // namespace dsv4
