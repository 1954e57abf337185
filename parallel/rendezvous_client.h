// A rank's side of the coordinator's rendezvous store (rendezvous.proto): Set / Get / Wait as
// absl::Status calls over gRPC, with the group's token in the metadata. gloo_store.h adapts it to
// Gloo's rendezvous::Store.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "dsv4/internal/v1/rendezvous.grpc.pb.h"

namespace dsv4 {

// Where the store is and which group a rank joins (what the coordinator's Configure hands out).
struct RendezvousEndpoint {
  std::string address;  // host:port of the coordinator's rendezvous service
  std::string group;    // the communicator generation's group name
  std::string token;    // the group's secret
};

class RendezvousClient {
 public:
  // Checks the fields; does not connect yet (the first call does, waiting up to its timeout for
  // the store to come up).
  static absl::StatusOr<std::unique_ptr<RendezvousClient>> Create(const RendezvousEndpoint& endpoint,
                                                                 int rank, int world_size);

  absl::Status Set(const std::string& key, const std::string& value,
                   std::chrono::milliseconds timeout);
  absl::StatusOr<std::string> Get(const std::string& key, std::chrono::milliseconds timeout);
  absl::Status Wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout);

  const RendezvousEndpoint& endpoint() const { return endpoint_; }
  int rank() const { return rank_; }

 private:
  RendezvousClient() = default;
  void Prepare(grpc::ClientContext* context, std::chrono::milliseconds timeout) const;
  void FillCaller(dsv4::internal::v1::Caller* caller) const;

  RendezvousEndpoint endpoint_;
  int rank_ = 0;
  int world_size_ = 0;
  std::unique_ptr<dsv4::internal::v1::Rendezvous::Stub> stub_;
};

}  // namespace dsv4
