// The public gRPC service (dsv4.v1.Dsv4) on the callback API. Requests arrive as raw bytes and
// are parsed here, so that a malformed message or a string that is not UTF-8 gets
// INVALID_ARGUMENT naming the message (gRPC's own parse failure is an empty UNIMPLEMENTED). One
// reactor per Generate call keeps at most one write outstanding; the engine pushes responses into
// the call's StreamState from its thread. Closing the stream, a deadline or Abort cancels the
// request in the engine. absl::Status becomes grpc::Status in one place (ToGrpc).
//
// Who may abort what: a request belongs to the connection that started it, or under mutual TLS
// to the client certificate's identity; Abort reaches only the caller's own requests (another
// client's ids are "not found"), and request ids live in that owner's namespace.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include <grpcpp/grpcpp.h>

#include "absl/status/statusor.h"
#include "dsv4/v1/dsv4.grpc.pb.h"
#include "node/engine.h"
#include "node/request_validation.h"
#include "node/server/admission.h"

namespace dsv4 {

// The status as gRPC sends it; the message is cut at 1 KiB (a status travels in HTTP/2 trailers,
// which clients cap at 8-16 KiB).
grpc::Status ToGrpc(const absl::Status& status);

// What the service needs once the model is up. Until Attach(), Generate answers UNAVAILABLE.
struct ServingRuntime {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  NodeLimits limits;
  v1::ModelInfo model_info;
};

struct AdmissionOptions {
  // In flight per client IP (or TLS identity); 0 = half of what the node holds
  // (max_num_seqs + max_waiting) and at least max_num_seqs, so that one client never fills it.
  int32_t max_requests_per_client = 0;
  int tokenizer_threads = 1;              // threads for inputs over inline_input_bytes
  int32_t tokenizer_queue = 64;           // such inputs waiting for them (a client: a quarter)
  int64_t inline_input_bytes = 16 << 10;  // smaller inputs are tokenized on the gRPC thread
};

using Dsv4RawService = v1::Dsv4::WithRawCallbackMethod_Generate<
    v1::Dsv4::WithRawCallbackMethod_Abort<v1::Dsv4::WithRawCallbackMethod_GetModelInfo<
        v1::Dsv4::Service>>>;

class Dsv4Service final : public Dsv4RawService {
 public:
  Dsv4Service(NodeMetrics* metrics, AdmissionOptions admission);
  // Makes the runtime visible to new calls (it must outlive the server).
  void Attach(const ServingRuntime* runtime) { runtime_.store(runtime); }
  // Refuses what waits for the tokenizer (UNAVAILABLE) and joins its threads: call before the
  // server shuts down and before the engine goes away.
  void Shutdown();

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* ctx,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Abort(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer* request,
                                  grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

  struct Caller {
    std::string owner;   // whose requests: "conn:<peer>" or "tls:<identity>"
    std::string client;  // whose quota: the peer's IP address, or "tls:<identity>"
  };

 private:
  class GenerateCall;
  // Validates and submits a parsed request (on a gRPC thread, or on the tokenizer queue).
  void Admit(const ServingRuntime* rt, GenerateCall* call, const v1::GenerateRequest& request,
             const Caller& caller);

  NodeMetrics* metrics_;
  AdmissionOptions admission_;
  ClientQuota quota_;
  ClientQuota queued_;  // large inputs waiting for the tokenizer, per client
  std::atomic<const ServingRuntime*> runtime_{nullptr};
  std::atomic<uint64_t> seed_counter_{0x5eed};
  std::atomic<bool> stopping_{false};
  WorkQueue tokenize_;  // last: its threads stop first, before the members they use
};

}  // namespace dsv4
