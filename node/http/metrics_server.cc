#include "node/http/metrics_server.h"

#include <prometheus/text_serializer.h>

namespace dsv4 {

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    http::ServerOptions options, std::shared_ptr<prometheus::Registry> registry) {
  options.name = "metrics";
  http::Router router;
  router.Add("GET", "/metrics",
             [registry](const http::Request&, std::shared_ptr<http::Responder> responder) {
               http::Response r;
               r.content_type = "text/plain; version=0.0.4; charset=utf-8";
               r.body = prometheus::TextSerializer().Serialize(registry->Collect());
               responder->Respond(std::move(r));
             });
  std::unique_ptr<MetricsServer> s(new MetricsServer());
  auto server = http::Server::Start(std::move(options), std::move(router));
  if (!server.ok()) return server.status();
  s->server_ = std::move(*server);
  return s;
}

}  // namespace dsv4
