// The Prometheus endpoint: GET (and HEAD) /metrics on its own listener, the registry rendered
// by prometheus-cpp's text serializer at each scrape. Runs on the node's HTTP server
// (http_server.h), not on prometheus-cpp's civetweb exposer: any other path is 404, another
// method 405, and idle or slow connections never block a scrape.
#pragma once

#include <memory>

#include <prometheus/registry.h>

#include "absl/status/statusor.h"
#include "node/http/http_server.h"

namespace dsv4 {

class MetricsServer {
 public:
  // `options` gives the address, limits and TLS; its name is set to "metrics".
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(
      http::ServerOptions options, std::shared_ptr<prometheus::Registry> registry);
  int port() const { return server_->port(); }
  http::ServerStats stats() const { return server_->stats(); }

 private:
  MetricsServer() = default;
  std::unique_ptr<http::Server> server_;
};

}  // namespace dsv4
