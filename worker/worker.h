// Worker: executes StepPlans. One per rank; the in-process CPU worker and the GPU worker
// (plugin) today, remote workers (control plane) later. Model-free: the coordinator (node/) sees workers only through this header, and a worker's
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
#include "common/tensor_parallel.h"

namespace dsv4 {

class Communicator;  // parallel/communicator.h

struct WorkerInfo {
  std::string device;       // "cpu", "cuda:0", ...
  std::string precision;    // "fp32" (the CPU worker), "bf16", "fp8" or "fp32" (GPU)
  int32_t num_blocks = 0;   // context-pool blocks (0 until loaded)
  int32_t num_slots = 0;    // state slots (max concurrent sequences)
  int32_t num_state_snapshots = 0;  // prefix-cache state rows past the slots
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

// Graph switches of the GPU worker (docs/cuda-graphs.md); the environment can turn each on too:
// DSV4_ENFORCE_EAGER=0|1, DSV4_PIECEWISE_EAGER_REGION=narrow|wide,
// DSV4_DEBUG_INDEXER_SHORTCUT_IN_CAPTURE=0|1 (any other value: Configure fails, naming it).
// Other workers ignore them.
struct CudaGraphOptions {
  bool enforce_eager = false;        // kill switch: every step eager, whatever the plan says
  bool wide_eager_region = false;    // piecewise: each layer's whole attention block eager
  bool shortcut_in_capture = false;  // debug only: reproduces vLLM #52448 (regression self-check)
};

// What a worker loads, model-free (paths, names, the parsed config, the cache layout and the
// knobs every rank must share): the coordinator fills it, Worker::Configure takes it. The device
// is not in it: a worker has its own, from its creation (WorkerFactory).
struct WorkerConfig {
  std::string precision = "bf16";      // GPU: bf16|fp8|fp32 (the CPU computes in fp32)
  std::string weight_format = "auto";  // auto|bf16 (worker_factory.h WeightsSpec)
  bool batch_invariant = false;        // GPU: rows independent of the batch (CudaBackendOptions)
  int threads = 0;                     // CPU BLAS threads; 0 = the library's default
  std::string model_dir;               // checkpoint directory (config.json + safetensors)
  bool synthetic = false;              // or deterministic synthetic weights for `model`
  uint64_t synthetic_seed = 1;
  std::string source;                  // where `model` came from (logs)
  ModelConfig model;
  CacheConfig cache;
  CudaGraphOptions graphs;
  // This worker's rank in its tensor-parallel group and the group's communicator (not owned; it
  // must outlive the worker). Size 1 needs none.
  ParallelLayout parallel;
  Communicator* communicator = nullptr;
};

// Where Load is: "weights" once per layer (done of total layers), then "pools" once the state
// pools are allocated (done = total = 1).
struct LoadProgress {
  std::string phase;
  int64_t done = 0;
  int64_t total = 0;
};
using LoadProgressFn = std::function<void(const LoadProgress&)>;

// A worker: in-process (the CPU worker, the GPU worker of the plugin) or, later, a group of
// remote ranks behind the control plane. Its life, each call once and in this order:
//
//   Configure(config)   checks the config against this worker (precision, weight format, cache
//                       layout, graph switches) and allocates nothing; an error names the field.
//   Load(progress)      reads the weights and allocates the pools, reporting along the way
//                       (`progress` runs on the calling thread; may be empty). info() describes
//                       the pools from here on.
//   WarmUp()            whatever must precede the first step (graphs are captured at the first
//                       step of each size today, so nothing yet). Steps need it done.
//   Launch / Collect    the steps (or Execute: both at once).
//   Drain()             finishes every launched step and drops its result; in_flight() is 0
//                       after. The worker still takes steps.
//   Shutdown()          releases the model and its memory; steps fail after it, info() still
//                       answers. Idempotent; the destructor does it.
//
// A call out of order is FailedPrecondition. A worker built ready (over a loaded model, a test's
// fake) takes steps at once: its Configure, Load and WarmUp are the defaults, which accept.
// Not thread-safe: one thread (the engine's) drives a worker.
class Worker {
 public:
  virtual ~Worker() = default;
  virtual WorkerInfo info() const = 0;

  virtual absl::Status Configure(const WorkerConfig& config) { return absl::OkStatus(); }
  virtual absl::Status Load(const LoadProgressFn& progress) { return absl::OkStatus(); }
  virtual absl::Status WarmUp() { return absl::OkStatus(); }

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

  // Collects every launched step, dropping the results; the first failure is returned (the
  // others are dropped with their steps).
  virtual absl::Status Drain();
  virtual void Shutdown() {}

  // A worker of several ranks can break (a rank lost): every step fails until Recover() brings
  // it back (respawned or re-registered ranks, the model loaded again). In-process workers never
  // break this way.
  virtual bool broken() const { return false; }
  virtual absl::Status Recover() {
    return absl::UnimplementedError("this worker cannot recover from a lost rank");
  }
  // Liveness of each rank, rank order (one entry for an in-process worker).
  virtual std::vector<bool> ranks_up() const { return {!broken()}; }

 private:
  std::deque<StepResult> queued_;
  std::map<uint64_t, int32_t> last_sampled_;  // request -> token, of the last launched step
};

// Creates a worker on `device` (what it means is the factory's: the in-process one takes
// auto|cpu|cuda|cuda:N, worker/in_process_worker.h), not yet configured. Fast: a bad device fails
// here, before anything loads.
using WorkerFactory = std::function<absl::StatusOr<std::unique_ptr<Worker>>(const std::string& device)>;

// The lifecycle between creation and the first step: Configure, Load (reporting to `progress`),
// WarmUp; the first error is returned, annotated with the stage that failed.
absl::Status BringUp(Worker& worker, const WorkerConfig& config, const LoadProgressFn& progress = {});

}  // namespace dsv4
