// GraphRunner: how the GPU worker runs one step's forward (docs/cuda-graphs.md), one room of its
// step. Chooses the mode a step can run in (the plan's, or eager when it cannot), and owns the
// captured graphs: one FULL graph per padded size (forward, sampling and the results' copy,
// captured on first use and replayed after) and one piecewise graph per padded size (the layers
// as segments, the attention core eager between them). Before every replay it compares the
// addresses the graph baked in with the current ones and captures again on a mismatch. A size
// whose FULL capture failed runs eagerly from then on. Not thread-safe: one engine thread.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "absl/status/statusor.h"
#include "common/step_plan.h"
#include "kernels/cuda/sampling.h"
#include "worker/cuda/cuda_backend.h"
#include "worker/cuda/device_memory.h"
#include "worker/worker.h"

namespace dsv4 {

struct CudaGraphStats {
  int64_t full_captures = 0, piecewise_captures = 0;
  int64_t full_replays = 0, piecewise_replays = 0;  // steps run from captured graphs
  int64_t recaptures = 0;         // captures forced by a changed baked address
  int64_t fallbacks = 0;
};

class GraphRunner {
 public:
  // The forward, the sampling into `outs` and (when the step copies its results from inside the
  // graph) that copy, as issued eagerly or into a capture.
  using IssueFull = std::function<absl::Status(cuda::SampleOut* outs)>;
  using Forward = std::function<absl::StatusOr<Tensor>()>;

  GraphRunner() = default;
  explicit GraphRunner(CudaBackend* backend) : backend_(backend) {}

  // The mode `plan` runs in: its own, unless the step cannot use it (the kill switch, a batch
  // larger than the padded shape, a FULL size that failed to capture, op profiling): then eager,
  // counted in `run` as a fallback. `padded_seqs`: sequences of the padded shape.
  GraphMode Choose(const StepPlan& plan, int32_t padded_seqs, bool enforce_eager, GraphRun* run);

  // The staged FULL step of `padded` tokens and `rows` sampled rows: captures the graph when it
  // has none (or a baked address moved) and launches it. `baked` are the step's own addresses the
  // graph bakes in beyond the backend's (sampling rows, mask ids, count tables). Its results land
  // in the graph's own buffer (`*outs`) and, when `host_outs` (mapped pinned memory) is given,
  // the graph's last node copies them there (`*copied`): that node's destination is set before
  // each launch, as the launches alternate between two staging sets. A capture or update that
  // fails runs the step eagerly through `issue` (reported in `run`).
  absl::Status RunFull(int32_t padded, int64_t rows, std::vector<uintptr_t> baked,
                       void* host_outs, const IssueFull& issue, GraphRun* run, const void** outs,
                       bool* copied);

  // The forward of a PIECEWISE step of `padded` tokens (captured or replayed segments around the
  // eager attention core, whose extent `region` sets); returns the logits.
  absl::StatusOr<Tensor> RunPiecewise(int32_t padded, EagerRegion region, const Forward& forward,
                                      GraphRun* run);

  const CudaGraphStats& stats() const { return stats_; }
  // Drops every captured graph (the next graph step of each size captures again).
  void Clear();

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

  CudaBackend* backend_ = nullptr;
  std::map<int32_t, FullGraph> full_;
  std::map<int32_t, PiecewiseEntry> piecewise_;
  CudaGraphStats stats_;
};

}  // namespace dsv4
