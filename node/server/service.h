// The public gRPC service (dsv4.v1.Dsv4) on the callback API, plus grpc.health.v1 and server
// reflection. One reactor per Generate call keeps at most one write outstanding; the engine pushes
// responses into the call's StreamState from its thread. Closing the stream, a deadline or Abort
// cancels the request in the engine. absl::Status becomes grpc::Status in one place (ToGrpc).
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "dsv4/v1/dsv4.grpc.pb.h"
#include "node/engine.h"
#include "node/request_validation.h"

namespace dsv4 {

grpc::Status ToGrpc(const absl::Status& status);

// What the service needs once the model is up. Until Attach(), Generate answers UNAVAILABLE.
struct ServingRuntime {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  NodeLimits limits;
  v1::ModelInfo model_info;
};

class Dsv4Service final : public v1::Dsv4::CallbackService {
 public:
  explicit Dsv4Service(NodeMetrics* metrics) : metrics_(metrics) {}
  // Makes the runtime visible to new calls (it must outlive the server).
  void Attach(const ServingRuntime* runtime) { runtime_.store(runtime); }

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                          const v1::GenerateRequest* req) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const v1::AbortRequest* req,
                                  v1::AbortResponse* resp) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const v1::GetModelInfoRequest* req,
                                         v1::ModelInfo* resp) override;

 private:
  NodeMetrics* metrics_;
  std::atomic<const ServingRuntime*> runtime_{nullptr};
  std::atomic<uint64_t> seed_counter_{0x5eed};
};

// A running gRPC server on `listen` ("HOST:PORT", port 0 = pick one).
class GrpcServer {
 public:
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(const std::string& listen,
                                                          Dsv4Service* service);
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
