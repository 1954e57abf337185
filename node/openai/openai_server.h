// The OpenAI-compatible HTTP API (docs/openai-api.md) on its own listener (--http-listen):
//   POST /v1/chat/completions, POST /v1/completions   streamed (SSE) or not
//   GET  /v1/models, GET /health                       /health is 200 only while serving
// on the node's HTTP server (node/http, Boost.Beast: asynchronous, so an open stream or an idle
// keep-alive connection costs memory, not a thread). Requests go through the same validation,
// engine, metrics and drain as gRPC ones: a body is parsed (request.h) into a GenerateRequest and
// ValidateRequest; bodies are parsed and tokenized on a bounded queue of the API's own threads,
// never on the I/O threads. What one client may have in flight is capped like on gRPC (429 over
// it); a client that closes its connection aborts its request (its KV is freed at the next step).
// With an API key, every /v1 request needs `Authorization: Bearer <key>` (401 otherwise).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "node/http/http_server.h"
#include "node/metrics.h"
#include "node/openai/request.h"
#include "node/server/admission.h"
#include "node/server/service.h"

namespace dsv4::openai {

struct OpenAiOptions {
  http::ServerOptions http;  // address, threads, connection limits, TLS; name "http"
  std::string api_key;       // "" = no key needed
  int32_t max_requests_per_client = 64;
  int threads = 2;           // parsing and tokenizing
  int32_t queue = 256;       // bodies waiting for those threads
  ParseLimits parse;
};

// Lifetime: requests in flight hold this server's quota and metrics until their final event, so
// the engine must be stopped (every request finished) before the server is destroyed, as
// ServingNode::Shutdown does.
class OpenAiServer {
 public:
  static absl::StatusOr<std::unique_ptr<OpenAiServer>> Start(OpenAiOptions options,
                                                            NodeMetrics* metrics);
  ~OpenAiServer();
  // Makes the model visible (until then /v1 answers 503); it must outlive the server.
  void Attach(const ServingRuntime* runtime) { runtime_.store(runtime); }
  // Follows the node's health: while not serving, /health is 503 and new requests get 503.
  void SetServing(bool serving) { serving_.store(serving); }
  int port() const { return server_->port(); }
  http::ServerStats stats() const { return server_->stats(); }
  // Refuses what waits for the parser threads, joins them, and closes the listener and every
  // connection. Call before the engine goes away. Idempotent.
  void Shutdown();

 private:
  struct Call;
  OpenAiServer(OpenAiOptions options, NodeMetrics* metrics);
  http::Router Routes();
  void Generate(Endpoint endpoint, const http::Request& request,
                std::shared_ptr<http::Responder> responder);
  void Admit(Endpoint endpoint, const ServingRuntime* rt, const std::shared_ptr<Call>& call);
  bool Authorized(const http::Request& request) const;
  void Answer(const std::shared_ptr<http::Responder>& responder, const char* endpoint,
              http::Response response);

  OpenAiOptions options_;
  NodeMetrics* metrics_;
  ClientQuota quota_;
  std::atomic<const ServingRuntime*> runtime_{nullptr};
  std::atomic<bool> serving_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> seed_counter_{0x0a1e5eed};
  WorkQueue work_;
  std::unique_ptr<http::Server> server_;  // last: stopped first
};

}  // namespace dsv4::openai
