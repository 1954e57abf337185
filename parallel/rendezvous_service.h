// The coordinator's rendezvous service (proto/dsv4/internal/v1/rendezvous.proto) over a
// RendezvousStore, and a small server that owns a port for it (tests, benchmarks, or a coordinator
// that serves the store apart from its control plane). The control plane's server can register
// RendezvousService next to its own services instead.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "dsv4/internal/v1/rendezvous.grpc.pb.h"
#include "parallel/rendezvous_store.h"

namespace dsv4 {

// The metadata key that carries a group's token.
inline constexpr char kRendezvousTokenMetadata[] = "x-dsv4-rendezvous-token";

class RendezvousService final : public dsv4::internal::v1::Rendezvous::Service {
 public:
  explicit RendezvousService(RendezvousStore* store) : store_(store) {}

  grpc::Status Set(grpc::ServerContext* context, const dsv4::internal::v1::SetRequest* request,
                   dsv4::internal::v1::SetResponse* response) override;
  grpc::Status Get(grpc::ServerContext* context, const dsv4::internal::v1::GetRequest* request,
                   dsv4::internal::v1::GetResponse* response) override;
  grpc::Status Wait(grpc::ServerContext* context, const dsv4::internal::v1::WaitRequest* request,
                    dsv4::internal::v1::WaitResponse* response) override;

 private:
  RendezvousStore* store_;
};

class RendezvousServer {
 public:
  // Listens on `address` ("127.0.0.1:0" picks a free port) and serves `store` (not owned; it
  // must outlive the server).
  static absl::StatusOr<std::unique_ptr<RendezvousServer>> Start(const std::string& address,
                                                                RendezvousStore* store);
  ~RendezvousServer();  // shuts the store down (waiters end), then the server
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int port() const { return port_; }

 private:
  RendezvousServer() = default;
  RendezvousStore* store_ = nullptr;
  std::unique_ptr<RendezvousService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace dsv4
