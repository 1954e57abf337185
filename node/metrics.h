// NodeMetrics: every Prometheus family the coordinator exports (architecture.md §6), created once
// at start-up with help strings; components get resolved handles, so the hot path never looks a
// metric up by labels. Thread-safe (prometheus-cpp metrics are atomic).
#pragma once

#include <array>
#include <memory>
#include <string>

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "node/output_processor.h"

namespace dsv4 {

class NodeMetrics {
 public:
  explicit NodeMetrics(std::shared_ptr<prometheus::Registry> registry);
  const std::shared_ptr<prometheus::Registry>& registry() const { return registry_; }

  prometheus::Counter& Finished(FinishReason reason, Phase phase) {
    return *finished_[static_cast<int>(reason)][static_cast<int>(phase)];
  }
  prometheus::Counter& Rejected(const std::string& reason);
  // The HTTP API's answers (node/openai): endpoint "/v1/chat/completions", code "200".
  prometheus::Counter& HttpResponses(const std::string& endpoint, int status);
  prometheus::Histogram& StepDuration(const char* graph_mode);

  prometheus::Counter* runaways;            // LENGTH while reasoning or with empty content
  prometheus::Counter* repetition_detected;
  prometheus::Counter* prompt_tokens;
  prometheus::Counter* generation_tokens;
  prometheus::Counter* reasoning_tokens;
  prometheus::Counter* preemptions;
  prometheus::Counter* worker_errors;
  prometheus::Histogram* ttft;
  prometheus::Histogram* itl;
  prometheus::Histogram* e2e;
  prometheus::Histogram* queue_time;
  prometheus::Histogram* request_prompt_tokens;
  prometheus::Histogram* request_reasoning_tokens;
  prometheus::Histogram* request_content_tokens;
  prometheus::Histogram* step_batch_tokens;
  prometheus::Gauge* running;
  prometheus::Gauge* waiting;
  prometheus::Gauge* kv_usage;
  prometheus::Gauge* ready;
  // Per worker rank (one rank "0" for an in-process worker): up, step time, collective time.
  prometheus::Gauge& WorkerUp(int rank);
  prometheus::Histogram& WorkerStepSeconds(int rank);
  prometheus::Histogram& WorkerCollectiveSeconds(int rank);
  // Remote workers: the coordinator's part of a step beyond the slowest rank (encode, send,
  // acknowledgements).
  prometheus::Histogram* control_round_trip;
  // CUDA graphs (the GPU worker; zero on the CPU worker, which runs every step eagerly).
  prometheus::Counter* graph_replays_full;
  prometheus::Counter* graph_replays_piecewise;
  prometheus::Counter* graph_eager_fallbacks;
  prometheus::Counter* graph_capture_failures;
  prometheus::Histogram* graph_capture_seconds;
  // Overlapped decode (--overlap-steps): steps launched while the previous one still ran.
  prometheus::Counter* overlapped_steps;
  // Prefix cache (node/scheduler/kv_block_manager.h): tokens looked up and found at admission,
  // cached blocks evicted, cached blocks now.
  prometheus::Counter* prefix_cache_queries;
  prometheus::Counter* prefix_cache_hits;
  prometheus::Counter* prefix_cache_evictions;
  prometheus::Gauge* prefix_cache_blocks;

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::array<std::array<prometheus::Counter*, 2>, 5> finished_{};
  prometheus::Family<prometheus::Counter>* rejected_family_;
  prometheus::Family<prometheus::Counter>* http_family_;
  prometheus::Family<prometheus::Histogram>* step_family_;
  std::array<prometheus::Histogram*, 3> step_duration_{};
  prometheus::Family<prometheus::Gauge>* worker_up_family_;
  prometheus::Family<prometheus::Histogram>* worker_step_family_;
  prometheus::Family<prometheus::Histogram>* worker_collective_family_;
};

}  // namespace dsv4
