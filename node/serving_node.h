// ServingNode: one coordinator process: its worker on its device (NodeOptions::worker_factory:
// the in-process CPU or CUDA worker today), metrics and gRPC listeners (health NOT_SERVING), then
// tokenizer and model config, the worker configured, loaded and warmed up, the engine, a warm-up
// request, and only then SERVING. Used by
// `dsv4-node serve` and by the end-to-end tests. Model-free: links no model code.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "node/engine.h"
#include "node/http/metrics_server.h"
#include "node/metrics.h"
#include "node/openai/openai_server.h"
#include "node/repetition.h"
#include "node/server/grpc_server.h"
#include "node/server/service.h"
#include "node/server/tls.h"

namespace dsv4 {

struct NodeOptions {
  std::string model_dir;            // config.json + safetensors
  std::string synthetic_config;     // or: a config.json run with synthetic weights
  uint64_t seed = 1;                // of the synthetic weights
  std::string device = "auto";      // auto|cpu|cuda|cuda:N
  std::string precision = "bf16";   // GPU: bf16|fp8|fp32 (ModelFlags)
  std::string weight_format = "auto";  // auto|bf16 (worker_factory.h WeightsSpec)
  // GPU kernels that never depend on the step's other rows (docs/cuda-backend.md): bit-exact
  // across batching, chunking and prefix-cache hits, at a cost in speed. The CPU worker always is.
  bool batch_invariant = false;
  // Creates the worker on `device`; the node then configures it (WorkerConfig from the fields
  // above), loads and warms it up (worker.h). The in-process one is
  // worker/in_process_worker.h CreateInProcessWorker. Required.
  WorkerFactory worker_factory;
  std::string tokenizer_path;       // "" = <model_dir>/tokenizer.json
  std::string listen = "0.0.0.0:50051";
  std::string metrics_listen = "0.0.0.0:9464";
  // The OpenAI-compatible HTTP API (node/openai): "" = off. Same TLS files as gRPC.
  std::string http_listen;
  std::string api_key;                  // "" = no key; else `Authorization: Bearer <key>`
  int32_t http_max_connections = 4096;  // 1024 from one client address
  uint64_t http_max_body_bytes = 8 << 20;
  std::string served_model_name;   // "" = the model directory's name
  // TLS on the gRPC API and, unless metrics_plaintext, on the metrics listener.
  TlsFiles tls;
  bool metrics_plaintext = false;
  AdmissionOptions admission;
  int32_t max_concurrent_streams = 256;  // per gRPC connection
  int32_t metrics_max_connections = 1024;  // 64 from one client address
  int64_t max_model_len = 0;        // 0 = min(max_position_embeddings, 8192)
  int32_t max_num_seqs = 64;
  int32_t max_batched_tokens = 2048;
  int32_t max_prefill_chunk = 0;
  int32_t kv_blocks = 0;            // 0 = max_num_seqs x max_model_len worth
  int32_t block_size = 0;           // 0 = the model's default
  // Prefix caching (docs/prefix-caching.md): blocks the cache may keep, each with a state
  // snapshot row on every worker (0 = min(kv_blocks, 4 x max_num_seqs)).
  bool enable_prefix_caching = true;
  int32_t prefix_cache_max_blocks = 0;
  int32_t max_waiting = 256;
  int32_t default_max_tokens = 1024;
  int threads = 0;                  // BLAS threads
  bool force_indexer_scoring = false;
  // CUDA graphs (GPU worker only; the CPU worker runs every step eagerly). Mode:
  // none|piecewise|full|full_decode_only|full_and_piecewise. Sizes: "1,2,4,8"; "" = the defaults
  // (1,2,4,8,16,...,512) capped at max_batched_tokens. enforce_eager: the kill switch (= none).
  std::string cudagraph_mode = "full_and_piecewise";
  std::string cudagraph_capture_sizes;
  bool enforce_eager = false;
  // Overlapped decode (engine.h OverlapMode): auto|on|off.
  std::string overlap = "auto";
  RepetitionMode repetition_mode = RepetitionMode::kObserve;
  RepetitionConfig repetition;
};

class ServingNode {
 public:
  static absl::StatusOr<std::unique_ptr<ServingNode>> Start(const NodeOptions& options);
  ~ServingNode();

  int grpc_port() const { return grpc_->port(); }
  int metrics_port() const { return metrics_server_->port(); }
  int http_port() const { return openai_ ? openai_->port() : 0; }
  http::ServerStats metrics_stats() const { return metrics_server_->stats(); }
  Engine& engine() { return *engine_; }
  NodeMetrics& metrics() { return *metrics_; }
  const ServingRuntime& runtime() const { return runtime_; }

  // Stops accepting (health NOT_SERVING, new calls UNAVAILABLE), waits up to `timeout` for
  // in-flight requests, then cancels the rest. Returns true when everything finished in time.
  bool Drain(std::chrono::milliseconds timeout);
  // Cancels every in-flight request now (a forced shutdown); thread-safe.
  void CancelAll(const std::string& reason) {
    if (engine_) engine_->CancelAll(reason);
  }
  // Closes the listeners and stops the engine.
  void Shutdown();

 private:
  ServingNode() = default;
  // The listeners (health NOT_SERVING) and the model's runtime limits, in Start's order.
  absl::Status StartListeners(const NodeOptions& o);
  absl::Status WarmUp(int64_t bos_token_id);
  // Health of every API (grpc.health.v1, GET /health, dsv4_ready).
  void SetServing(bool serving);
  void FillModelInfo(const NodeOptions& o, const ModelConfig& mc, const WorkerInfo& winfo,
                     const std::string& tokenizer_path);

  TlsCredentials tls_;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<NodeMetrics> metrics_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::unique_ptr<Dsv4Service> service_;
  std::unique_ptr<GrpcServer> grpc_;
  std::unique_ptr<openai::OpenAiServer> openai_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Engine> engine_;
  ServingRuntime runtime_;
};

}  // namespace dsv4
