#include "node/metrics.h"

#include "absl/strings/str_cat.h"

namespace dsv4 {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
          1.0,   2.5,    5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
}

Histogram::BucketBoundaries TokenBuckets() {
  Histogram::BucketBoundaries b;
  for (double decade = 1; decade <= 1e5; decade *= 10) {
    for (double m : {1.0, 2.0, 5.0}) b.push_back(m * decade);
  }
  return b;
}

}  // namespace

NodeMetrics::NodeMetrics(std::shared_ptr<prometheus::Registry> registry)
    : registry_(std::move(registry)) {
  auto& reg = *registry_;
  auto& finished = BuildCounter()
                       .Name("dsv4_requests_finished_total")
                       .Help("Finished requests by finish reason and the phase (reasoning or "
                             "content) they were in when they finished")
                       .Register(reg);
  for (int r = 0; r < 5; ++r) {
    for (int p = 0; p < 2; ++p) {
      finished_[r][p] = &finished.Add({{"finish_reason", FinishReasonName(static_cast<FinishReason>(r))},
                                       {"phase_at_finish", PhaseName(static_cast<Phase>(p))}});
    }
  }
  auto counter = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Register(reg).Add({});
  };
  auto gauge = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Register(reg).Add({});
  };
  auto histogram = [&](const char* name, const char* help, const Histogram::BucketBoundaries& b) {
    return &BuildHistogram().Name(name).Help(help).Register(reg).Add({}, b);
  };
  runaways = counter("dsv4_length_cap_runaways_total",
                     "Requests that hit max_tokens while still reasoning or with empty content "
                     "(the vLLM #52448 signature)");
  repetition_detected = counter("dsv4_repetition_detected_total",
                                "Requests whose output the repetition detector flagged");
  prompt_tokens = counter("dsv4_prompt_tokens_total", "Prompt tokens of admitted requests");
  generation_tokens = counter("dsv4_generation_tokens_total", "Generated tokens");
  reasoning_tokens = counter("dsv4_reasoning_tokens_total",
                             "Generated tokens in the reasoning phase");
  preemptions = counter("dsv4_preemptions_total",
                        "Requests preempted (KV dropped, recomputed later) for lack of KV blocks");
  worker_errors = counter("dsv4_worker_errors_total", "Worker steps that failed");
  ttft = histogram("dsv4_time_to_first_token_seconds",
                   "Time from arrival to the first generated token", LatencyBuckets());
  itl = histogram("dsv4_inter_token_latency_seconds", "Time between consecutive generated tokens",
                  LatencyBuckets());
  e2e = histogram("dsv4_e2e_request_latency_seconds", "Time from arrival to finish",
                  LatencyBuckets());
  queue_time = histogram("dsv4_request_queue_time_seconds",
                         "Time from arrival to the first scheduled step", LatencyBuckets());
  request_prompt_tokens = histogram("dsv4_request_prompt_tokens", "Prompt tokens per request",
                                    TokenBuckets());
  request_reasoning_tokens = histogram("dsv4_request_reasoning_tokens",
                                       "Reasoning-phase tokens per finished request",
                                       TokenBuckets());
  request_content_tokens = histogram("dsv4_request_content_tokens",
                                     "Content-phase tokens per finished request", TokenBuckets());
  step_batch_tokens = histogram("dsv4_step_batch_tokens", "Tokens per engine step",
                                TokenBuckets());
  running = gauge("dsv4_num_requests_running", "Requests being scheduled (holding KV)");
  waiting = gauge("dsv4_num_requests_waiting", "Requests queued for admission");
  kv_usage = gauge("dsv4_kv_cache_usage_ratio", "Fraction of KV context blocks in use");
  prefix_cache_queries = counter("dsv4_prefix_cache_queries_total",
                                 "Tokens of admitted requests looked up in the prefix cache");
  prefix_cache_hits = counter("dsv4_prefix_cache_hits_total",
                              "Tokens of admitted requests found in the prefix cache (not prefilled)");
  prefix_cache_evictions = counter("dsv4_prefix_cache_evictions_total",
                                   "Cached prefix blocks evicted to make room");
  prefix_cache_blocks = gauge("dsv4_prefix_cache_blocks",
                              "Blocks in the prefix cache (shared or idle)");
  ready = gauge("dsv4_node_ready", "1 once the model is loaded and warmed up and the node is not "
                                   "draining");
  worker_up_family_ = &BuildGauge()
                           .Name("dsv4_worker_up")
                           .Help("1 while the worker rank answers steps, 0 after a failure or "
                                 "once its process is lost")
                           .Register(reg);
  WorkerUp(0).Set(1);
  worker_step_family_ = &BuildHistogram()
                             .Name("dsv4_worker_step_seconds")
                             .Help("Step time as each worker rank measured it")
                             .Register(reg);
  worker_collective_family_ = &BuildHistogram()
                                   .Name("dsv4_worker_collective_seconds")
                                   .Help("Time a worker rank spent in the step's collectives "
                                         "(all-reduces; 0 at tensor-parallel size 1)")
                                   .Register(reg);
  control_round_trip = &BuildHistogram()
                            .Name("dsv4_control_plane_round_trip_seconds")
                            .Help("The coordinator's part of a step beyond the slowest worker "
                                  "rank: encoding, sending to every rank, acknowledgements")
                            .Register(reg)
                            .Add({}, Histogram::BucketBoundaries{1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4,
                                                                 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2,
                                                                 2.5e-2, 0.1});
  auto& replays = BuildCounter()
                      .Name("dsv4_cudagraph_replays_total")
                      .Help("CUDA graph replays by mode (full decode graphs, piecewise segments)")
                      .Register(reg);
  graph_replays_full = &replays.Add({{"mode", "full"}});
  graph_replays_piecewise = &replays.Add({{"mode", "piecewise"}});
  graph_eager_fallbacks = counter("dsv4_cudagraph_eager_fallbacks_total",
                                  "Steps that ran eagerly although graphs are on for them: no "
                                  "capture size fits the batch, or the worker could not run the "
                                  "planned graph (failed capture, worker kill switch)");
  graph_capture_failures = counter("dsv4_cudagraph_capture_failures_total",
                                   "CUDA graph captures that failed");
  graph_capture_seconds = histogram("dsv4_cudagraph_capture_seconds",
                                    "Time to capture one CUDA graph (a FULL graph or one "
                                    "piecewise segment set; a step's mean when it captures "
                                    "several)",
                                    {0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60});
  overlapped_steps = counter("dsv4_overlapped_steps_total",
                             "Decode steps launched while the previous step still ran, their "
                             "input tokens fed on the worker (--overlap-steps)");
  rejected_family_ = &BuildCounter()
                          .Name("dsv4_requests_rejected_total")
                          .Help("Requests refused before admission, by reason")
                          .Register(reg);
  for (const char* r : {"invalid_argument", "queue_full", "client_limit", "draining", "not_ready",
                        "unauthenticated"}) {
    Rejected(r);
  }
  http_family_ = &BuildCounter()
                      .Name("dsv4_http_responses_total")
                      .Help("Answers of the OpenAI-compatible HTTP API, by endpoint and HTTP status")
                      .Register(reg);
  step_family_ = &BuildHistogram()
                      .Name("dsv4_step_duration_seconds")
                      .Help("Duration of one engine step (schedule, execute, outputs) by the graph "
                            "mode that ran")
                      .Register(reg);
  const Histogram::BucketBoundaries step_buckets = {0.0005, 0.001, 0.002, 0.005, 0.01, 0.02,
                                                    0.05,   0.1,   0.2,   0.5,   1.0,  2.0, 5.0};
  step_duration_[0] = &step_family_->Add({{"graph_mode", "eager"}}, step_buckets);
  step_duration_[1] = &step_family_->Add({{"graph_mode", "piecewise"}}, step_buckets);
  step_duration_[2] = &step_family_->Add({{"graph_mode", "full"}}, step_buckets);
}

prometheus::Counter& NodeMetrics::Rejected(const std::string& reason) {
  return rejected_family_->Add({{"reason", reason}});
}

prometheus::Counter& NodeMetrics::HttpResponses(const std::string& endpoint, int status) {
  return http_family_->Add({{"endpoint", endpoint}, {"code", std::to_string(status)}});
}

prometheus::Histogram& NodeMetrics::StepDuration(const char* graph_mode) {
  const std::string m = graph_mode;
  return *step_duration_[m == "full" ? 2 : m == "piecewise" ? 1 : 0];
}

prometheus::Gauge& NodeMetrics::WorkerUp(int rank) {
  return worker_up_family_->Add({{"rank", absl::StrCat(rank)}});
}

prometheus::Histogram& NodeMetrics::WorkerStepSeconds(int rank) {
  return worker_step_family_->Add({{"rank", absl::StrCat(rank)}}, LatencyBuckets());
}

prometheus::Histogram& NodeMetrics::WorkerCollectiveSeconds(int rank) {
  return worker_collective_family_->Add({{"rank", absl::StrCat(rank)}}, LatencyBuckets());
}

}  // namespace dsv4
