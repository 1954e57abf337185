// Engine: the coordinator's step loop. One thread owns the scheduler, the worker and every
// request's output processing; other threads only submit, abort and read stats.
//
//   submit ─▶ inbox ─┐                     ┌─▶ OutputProcessor ─▶ RequestSink (gRPC reactor)
//   abort  ─▶ aborts ┴▶ Scheduler ─▶ StepPlan ─▶ Worker ─▶ StepResult
//
// The worker comes ready (worker.h: configured, loaded, warmed up); the engine drives its steps,
// drains it and shuts it down at Stop.
// A request gets exactly one final event (finished or error) through its sink. Aborted requests
// leave the scheduler (and free their KV) at the start of the next step. Thread-safe API.
#pragma once

#include <chrono>
#include <functional>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "dsv4/v1/dsv4.pb.h"
#include "node/metrics.h"
#include "node/output_processor.h"
#include "node/request_validation.h"
#include "node/scheduler/graph_policy.h"
#include "node/scheduler/scheduler.h"
#include "node/tokenizer/tokenizer.h"
#include "worker/worker.h"

namespace dsv4 {

// Receives one request's responses, on the engine thread. `last` marks the final one.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void Emit(v1::GenerateResponse response, bool last) = 0;
};

// A sink that keeps only the final response, as a future (the warm-up request, tests).
class PromiseSink final : public RequestSink {
 public:
  void Emit(v1::GenerateResponse response, bool last) override {
    if (last) done_.set_value(std::move(response));
  }
  std::future<v1::GenerateResponse> future() { return done_.get_future(); }

 private:
  std::promise<v1::GenerateResponse> done_;
};

// Overlapped decode: plan and queue step N+1 while step N runs on the worker (Worker::Launch), its
// inputs being the tokens N samples (deferred, resolved by the worker). kAuto: when the worker
// supports it (WorkerInfo::overlap, the GPU worker). Only steady decode overlaps: a step that
// admits, prefills or must preempt waits for the previous results (Scheduler::ScheduleAhead).
// Penalty counts take the deferred token on the worker too.
enum class OverlapMode { kAuto, kOn, kOff };
absl::StatusOr<OverlapMode> ParseOverlapMode(std::string_view s);
// Whether steps overlap under `mode` on a worker described by `info` (`on` needs a worker that
// takes two steps at a time).
bool OverlapActive(OverlapMode mode, const WorkerInfo& info);

struct EngineConfig {
  SchedulerConfig scheduler;
  int32_t max_waiting = 256;           // queued (not yet running) requests; more = RESOURCE_EXHAUSTED
  bool force_indexer_scoring = false;  // passed to every step
  // CUDA graphs: each step's mode and padding (graph_policy.h), only when the worker runs graphs.
  GraphConfig graphs;
  OverlapMode overlap = OverlapMode::kAuto;
  // Prefix caching, over the workers' snapshot rows (WorkerInfo::num_state_snapshots; none: off).
  // The salt names the model and everything else that changes the state (cache keys start
  // from it).
  bool enable_prefix_caching = true;
  uint64_t prefix_cache_salt = 0;
  // Called on the engine's thread when the worker breaks (a rank lost: false) and once Recover()
  // brought it back (true): the node's health follows it.
  std::function<void(bool healthy, const absl::Status& why)> on_worker_health;
  // How often a broken worker is asked to Recover() while the engine has nothing to run.
  std::chrono::milliseconds recover_interval{1000};
};

struct EngineStats {
  int32_t running = 0;
  int32_t waiting = 0;
  int32_t in_flight = 0;  // submitted and not finished
  int32_t free_blocks = 0;
  int32_t total_blocks = 0;
  int32_t free_slots = 0;
  double kv_usage = 0;
  uint64_t steps = 0;
  uint64_t preemptions = 0;
  uint64_t overlapped_steps = 0;  // launched while the previous step was still running
  int32_t prefix_cache_blocks = 0;
  uint64_t prefix_cache_query_tokens = 0, prefix_cache_hit_tokens = 0;
  uint64_t prefix_cache_evictions = 0;
};

class Engine {
 public:
  Engine(EngineConfig config, std::unique_ptr<Worker> worker, const Tokenizer* tokenizer,
         NodeMetrics* metrics);
  ~Engine();

  void Start();
  // Queues a validated request. Returns its id: the client's, or an unguessable "req-<32 hex>"
  // (128 random bits). Ids live in the namespace of the request's owner (ValidatedRequest::owner).
  // RESOURCE_EXHAUSTED when the queue is full, UNAVAILABLE while draining or stopped,
  // ALREADY_EXISTS for an id the same owner has in flight.
  absl::StatusOr<std::string> Submit(ValidatedRequest request, std::shared_ptr<RequestSink> sink);
  // Cancels `owner`'s request (finish reason CANCELLED). False if that owner has no such id in
  // flight (another owner's requests are out of reach).
  bool Abort(const std::string& request_id, const std::string& reason = "aborted",
             const std::string& owner = "");
  // Stops accepting new requests (they get UNAVAILABLE); in-flight ones continue.
  void BeginDrain();
  bool draining() const;
  // Waits until nothing is in flight; false on timeout.
  bool WaitIdle(std::chrono::milliseconds timeout);
  // Cancels everything in flight.
  void CancelAll(const std::string& reason);
  // Stops the loop thread (in-flight requests are cancelled first, the worker drained) and shuts
  // the worker down (Worker::Shutdown). Idempotent.
  void Stop();

  EngineStats stats() const;
  const WorkerInfo& worker_info() const { return worker_info_; }
  bool overlap() const { return overlap_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Live {
    uint64_t id = 0;
    std::string name;
    std::string key;  // NameKey(owner, name)
    std::shared_ptr<RequestSink> sink;
    std::unique_ptr<OutputProcessor> processor;
    int32_t prompt_tokens = 0;
    int32_t logprobs = 0;
    Clock::time_point arrival, first_scheduled, first_token, last_token;
    bool scheduled = false;
    bool has_token = false;
    bool repetition = false;
    NodeMetrics* metrics = nullptr;  // null for internal requests
  };
  struct Pending {
    ValidatedRequest request;
    std::shared_ptr<RequestSink> sink;
    std::string name;
    std::string key;
    Clock::time_point arrival;
  };

  // A step launched on the worker and not yet collected.
  struct InFlight {
    StepPlan plan;
    GraphChoice graph;
    Clock::time_point t0;  // planning began
  };

  void Loop();
  void Admit(Pending p);
  // Returns false when nothing could be scheduled. With overlap, launches the next decode step
  // before collecting the one in flight.
  bool RunStep();
  // A failed Launch or Collect of `step`: logged and counted (worker_errors, worker_up 0).
  void WorkerFailed(uint64_t step, const absl::Status& status);
  // Launches a planned step; false when the worker refused it (its requests are failed).
  bool LaunchStep(StepPlan plan, Clock::time_point t0);
  // A broken worker: reports it once, then tries Recover() every recover_interval.
  void TendBrokenWorker();
  // dsv4_worker_up per rank: the worker's ranks_up(), or 0 for every rank after a failed step.
  void PublishRanksUp(bool failed);
  // Per-rank metrics of a collected step.
  void RecordRanks(const StepResult& result);
  // Collects the oldest launched step and streams its tokens.
  void CollectStep();
  // Drains the worker: every launched step is collected and its result dropped (stop, or after a
  // failed step).
  void DrainInFlight();
  // Graph metrics of one executed step: `planned` by ChooseGraph, `ran` as the worker reports it.
  void RecordGraphRun(const GraphChoice& planned, const GraphRun& ran);
  // Emits the final event and drops the request everywhere.
  void Finish(Live* r, FinishReason reason, const StopInfo& stop, const std::string& message,
              std::string tail_text, std::string discarded, Phase tail_channel);
  void FailAll(const std::vector<uint64_t>& ids, const absl::Status& status);
  void RefreshCounts();  // mu_ held
  void PublishStats();

  EngineConfig config_;
  std::unique_ptr<Worker> worker_;
  WorkerInfo worker_info_;
  const Tokenizer* tokenizer_;
  NodeMetrics* metrics_;
  KvBlockManager kv_;
  Scheduler scheduler_;

  // Engine-thread state.
  std::map<uint64_t, Live> live_;
  uint64_t preemptions_ = 0;
  bool overlap_ = false;
  std::deque<InFlight> in_flight_;
  Clock::time_point last_collect_;
  uint64_t overlapped_steps_ = 0;

  // Shared state.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::condition_variable idle_cv_;
  std::deque<Pending> inbox_;
  std::vector<std::pair<std::string, std::string>> aborts_;  // (name key, reason)
  // NameKey(owner, request id) -> internal id, for every request in flight.
  std::map<std::string, uint64_t> names_;
  uint64_t next_id_ = 1;
  bool draining_ = false;
  bool stop_ = false;
  EngineStats stats_;
  std::thread thread_;
  bool reported_broken_ = false;
  Clock::time_point next_recover_{};
  std::once_flag worker_shutdown_;
};

}  // namespace dsv4
