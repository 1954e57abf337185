// The Communicator of CPU ranks: Gloo (Debian's libgloo-dev, a 2022-05 snapshot) over its TCP
// transport. Host buffers, synchronous calls, no stream. The group forms through a rendezvous
// store: the coordinator's (Connect) or any gloo::rendezvous::Store (Create; tests use Gloo's
// HashStore for ranks that are threads of one process).
//
// Gloo's own TCP connections carry no authentication: the token guards the address exchange, so
// only ranks the coordinator registered learn where their peers listen. Keep the data plane on a
// private network (the LeaderWorkerSet pod network, or loopback).
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "parallel/communicator.h"
#include "parallel/rendezvous_client.h"

namespace gloo {
class Context;
namespace rendezvous {
class Store;
}
}  // namespace gloo

namespace dsv4 {

struct GlooOptions {
  int rank = 0;
  int world_size = 1;
  // Where this rank listens for its peers: a host name or address (`hostname`), else the address
  // of a network interface (`interface`, e.g. "eth0"). Loopback by default.
  std::string hostname = "127.0.0.1";
  std::string interface;
  // Bounds forming the group (every rank's keys and connections) and every collective: a dead or
  // stalled peer gives an error after at most this long.
  std::chrono::milliseconds connect_timeout{30000};
  std::chrono::milliseconds op_timeout{30000};
  // Key prefix in the store: several communicators (e.g. TP and a sub-group) can form through one
  // rendezvous group when their names differ.
  std::string name = "comm";
};

class GlooCommunicator final : public Communicator {
 public:
  // Forms the group through the coordinator's rendezvous service. Every rank calls it with the
  // same world_size and name. Errors of the store keep its code (UNAUTHENTICATED: wrong token;
  // FAILED_PRECONDITION: world size differs from the group's; DEADLINE_EXCEEDED: a rank did not
  // show up within connect_timeout).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      const GlooOptions& options, const RendezvousEndpoint& endpoint);
  // Forms the group through `store` (used only during the call).
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(const GlooOptions& options,
                                                                 gloo::rendezvous::Store& store);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }
  MemorySpace memory_space() const override { return MemorySpace::kHost; }
  std::string backend_name() const override { return "gloo"; }

  absl::Status AllReduceSum(const void* send, void* recv, size_t count, DType dtype,
                            void* stream) override;
  absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype,
                         void* stream) override;
  absl::Status Broadcast(void* buf, size_t count, DType dtype, int root, void* stream) override;
  absl::Status Barrier() override;

  absl::Status health() const override;
  void Abort(const absl::Status& reason) override;

 private:
  GlooCommunicator(std::shared_ptr<gloo::Context> context, const GlooOptions& options);
  // Checks what every collective checks; `what` names the op in errors.
  absl::Status Precheck(const std::string& what, void* stream) const;
  // Marks the communicator broken with `status` (the first error wins) and returns it.
  absl::Status Fail(absl::Status status);

  std::shared_ptr<gloo::Context> context_;
  const int rank_;
  const int world_size_;
  const std::chrono::milliseconds op_timeout_;
  std::mutex op_mu_;  // one collective at a time
  mutable std::mutex state_mu_;
  absl::Status broken_;
};

}  // namespace dsv4
