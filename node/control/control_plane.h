// The coordinator's end of the control plane (proto/dsv4/internal/v1/worker.proto): a gRPC server
// that worker ranks dial, checks their registration (build version, world size, rank, the shared
// secret) and hands each accepted rank's stream to the coordinator as a RankLink. The rendezvous
// store of the data plane (parallel/rendezvous_service.h) is served on the same port, so a
// worker bootstraps Gloo through the address it already reached.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "dsv4/internal/v1/worker.grpc.pb.h"
#include "parallel/rendezvous_service.h"
#include "parallel/rendezvous_store.h"

namespace dsv4 {

namespace cpb = ::dsv4::internal::v1;

// One accepted rank's stream. Send and Receive may be called from any one thread each.
class RankLink {
 public:
  explicit RankLink(cpb::Register reg) : reg_(std::move(reg)) {}
  const cpb::Register& registration() const { return reg_; }
  int rank() const { return reg_.rank(); }

  // UNAVAILABLE once the stream is gone.
  absl::Status Send(const cpb::CoordinatorMessage& m);
  // The next message, waiting up to `timeout`: DEADLINE_EXCEEDED on timeout, UNAVAILABLE (with
  // why) once the stream has ended and nothing is left to read.
  absl::StatusOr<cpb::WorkerMessage> Receive(std::chrono::milliseconds timeout);
  // Ends the stream (the worker sees it close); later Sends fail.
  void Close(const std::string& why);
  bool alive() const;
  // Why the stream ended (OK while alive).
  absl::Status lost() const;

 private:
  friend class WorkerControlService;
  using Stream = grpc::ServerReaderWriter<cpb::CoordinatorMessage, cpb::WorkerMessage>;
  void Attach(grpc::ServerContext* ctx, Stream* stream);
  void Push(cpb::WorkerMessage m);
  void Detach(absl::Status why);

  const cpb::Register reg_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  grpc::ServerContext* ctx_ = nullptr;
  Stream* stream_ = nullptr;
  std::deque<cpb::WorkerMessage> inbox_;
  absl::Status lost_;
  bool attached_ = false;
};

struct ControlPlaneOptions {
  std::string listen = "127.0.0.1:0";
  int world_size = 1;
  std::string secret;  // empty: refuse every worker (a secret is required)
};

class ControlPlane {
 public:
  static absl::StatusOr<std::unique_ptr<ControlPlane>> Start(const ControlPlaneOptions& options);
  ~ControlPlane();  // Shutdown()

  int port() const { return port_; }
  RendezvousStore& rendezvous() { return store_; }
  // Waits until every rank 0..N-1 has a live link; the links in rank order. The error names the
  // ranks still missing.
  absl::StatusOr<std::vector<std::shared_ptr<RankLink>>> WaitForRanks(
      std::chrono::milliseconds timeout);
  // Registrations refused so far, as "rank R: reason" (tests and logs).
  std::vector<std::string> refusals() const;
  // Takes a rank's link out of the table now (its stream may still be closing), so that the rank
  // can register again.
  void Forget(const RankLink* link) { Remove(link); }
  void Shutdown();

 private:
  friend class WorkerControlService;
  ControlPlane() = default;
  // Checks a registration; OK admits it into the table.
  absl::Status Admit(const std::shared_ptr<RankLink>& link);
  void MarkReady(const RankLink* link);
  void Remove(const RankLink* link);

  ControlPlaneOptions options_;
  RendezvousStore store_;
  std::unique_ptr<RendezvousService> rendezvous_;
  std::unique_ptr<grpc::Service> control_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<int, std::shared_ptr<RankLink>> ranks_;  // admitted
  std::set<int> ready_;                             // admitted and told so
  std::vector<std::string> refusals_;
  bool shut_down_ = false;
};

}  // namespace dsv4
