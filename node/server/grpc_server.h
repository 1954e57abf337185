// The public gRPC server: dsv4.v1.Dsv4 with grpc.health.v1 and reflection on one port, plain or
// TLS (mutual TLS with a client CA). The port is bound exclusively (no SO_REUSEPORT), so a second
// node on the same address fails at start instead of sharing the connections.
//
// Connection limits gRPC C++ 1.51 offers (it has no cap on the number of connections,
// grpc/grpc#12472): streams per connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; further calls
// wait on the client), idle connections closed after max_connection_idle, handshakes cut off after
// handshake_timeout, request messages and metadata bounded. What one client may have in flight is
// bounded by the service (admission.h), whatever the number of its connections.
#pragma once

#include <chrono>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "node/server/listen_address.h"
#include "node/server/tls.h"

namespace dsv4 {

struct GrpcServerOptions {
  ListenAddress listen;
  const TlsCredentials* tls = nullptr;  // null: plaintext
  int max_concurrent_streams = 256;     // per connection
  int max_connection_idle_ms = 300000;
  int handshake_timeout_ms = 10000;
  int max_receive_message_bytes = 16 << 20;
  int max_metadata_bytes = 16 << 10;
};

class GrpcServer {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const GrpcServerOptions& options,
                                                          grpc::Service* service);
  ~GrpcServer();
  int port() const { return port_; }
  // Health status of the server ("") and of dsv4.v1.Dsv4.
  void SetServing(bool serving);
  void Shutdown(std::chrono::milliseconds grace);

 private:
  GrpcServer() = default;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace dsv4
