// Worker: executes StepPlans. One per rank; the in-process CPU worker and the GPU worker
// (plugin) today, remote workers (control plane) later. Execute() is called from one thread.
// Model-free: the coordinator (node/) sees workers only through this header, and a worker's
// model code stays on the worker side (worker/model/, linked into the worker libraries only).
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/cache_config.h"
#include "common/model_config.h"
#include "common/step_plan.h"

namespace dsv4 {

struct WorkerInfo {
  std::string device;       // "cpu", "cuda:0", ...
  int32_t num_blocks = 0;   // context-pool blocks
  int32_t num_slots = 0;    // state slots (max concurrent sequences)
  int32_t block_size = 0;   // tokens per block
  int32_t max_model_len = 0;
  bool cuda_graphs = false;  // runs FULL / PIECEWISE plans (the CUDA worker); others run eager
  // Launch returns before the step ends, so the coordinator can plan and queue the next step
  // while this one runs (the CUDA worker); others run each step inside Launch.
  bool overlap = false;
  // Steps Launch accepts before a Collect (Worker::kMaxInFlight; 1 while the GPU worker profiles
  // ops, which it brackets one step at a time).
  int32_t max_in_flight = 2;
};

class Worker {
 public:
  virtual ~Worker() = default;
  virtual WorkerInfo info() const = 0;
  // Runs the plan's forward pass and samples. A failed step leaves the plan's sequences in an
  // unspecified state: the coordinator fails those requests.
  virtual absl::StatusOr<StepResult> Execute(const StepPlan& plan) = 0;

  // Overlapped execution: Launch queues a step and Collect returns the oldest queued step's result,
  // so that the coordinator plans step N+1 while step N runs. At most kMaxInFlight steps are
  // queued. A plan entry with `deferred_token` feeds the token the previously launched step
  // samples for the same request (InvalidArgument if that step did not sample it). A failed Launch
  // queues nothing; a failed Collect drops its step (the coordinator fails those requests, as for
  // Execute). This default runs the step inside Launch, resolving deferred tokens on the host.
  static constexpr int kMaxInFlight = 2;
  virtual absl::Status Launch(const StepPlan& plan);
  virtual absl::StatusOr<StepResult> Collect();
  virtual int in_flight() const { return static_cast<int>(queued_.size()); }

 private:
  std::deque<StepResult> queued_;
  std::map<uint64_t, int32_t> last_sampled_;  // request -> token, of the last launched step
};

// What a worker loads, model-free (paths, names, the parsed config and the cache layout): the
// coordinator fills it and a worker factory builds the worker from it.
struct WorkerConfig {
  std::string device = "auto";         // auto|cpu|cuda|cuda:N (in-process workers)
  std::string precision = "bf16";      // GPU matrices: bf16|fp32
  std::string weight_format = "auto";  // auto|bf16 (worker_factory.h WeightsSpec)
  int threads = 0;                     // CPU BLAS threads; 0 = the library's default
  std::string model_dir;               // checkpoint directory (config.json + safetensors)
  bool synthetic = false;              // or deterministic synthetic weights for `model`
  uint64_t synthetic_seed = 1;
  std::string source;                  // where `model` came from (logs)
  ModelConfig model;
  CacheConfig cache;
};

// Builds a loaded worker (the in-process one: worker/in_process_worker.h).
using WorkerFactory = std::function<absl::StatusOr<std::unique_ptr<Worker>>(const WorkerConfig&)>;

}  // namespace dsv4
