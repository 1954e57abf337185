// OpProfile: GPU time per backend op of eager steps, switched on with DSV4_PROFILE_OPS=1 (the
// H200 host has no working system profiler). While the host issues a step, its launches queue
// behind a gate kernel; the gate opens when the worker waits for the step, so the ops run back to
// back and each op's pair of events measures GPU time only, not launch gaps. The report (op and
// shape, calls per step, median time per call, time per step at the median, share) is printed
// when the backend is destroyed; medians keep one-time costs (lazy module loading, first-use
// heuristics) out of the figures. Graph steps
// are not profiled (the worker runs every step eagerly while profiling).
#pragma once

#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cuda/device_memory.h"

namespace dsv4 {

class OpProfile {
 public:
  static absl::StatusOr<std::unique_ptr<OpProfile>> Create();
  // Closes the gate on `stream` (a spinning kernel; it gives up after ~2 s so a forgotten
  // Release() cannot hang the process).
  absl::Status Open(cudaStream_t stream);
  void Begin(std::string key, cudaStream_t stream);
  void End(cudaStream_t stream);
  // Opens the gate. Idempotent.
  void Release();
  // After the stream has drained: adds this step's op times to the totals.
  absl::Status Collect();
  std::string Report() const;

 private:
  OpProfile() = default;
  cudaEvent_t Event();

  PinnedBuffer flag_;  // mapped host memory the gate kernel polls
  int* flag_dev_ = nullptr;
  std::vector<CudaEvent> events_;
  size_t used_ = 0;
  struct Span {
    std::string key;
    cudaEvent_t begin = nullptr, end = nullptr;
  };
  std::vector<Span> spans_, open_;
  std::map<std::string, std::vector<float>> samples_;  // ms per call
  int64_t steps_ = 0;
};

}  // namespace dsv4
