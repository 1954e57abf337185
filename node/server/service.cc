#include "node/server/service.h"

#include <deque>
#include <mutex>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dsv4 {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

namespace {

class GenerateReactor;

// Shared between the reactor (gRPC threads) and the engine (its thread). Outlives the reactor:
// after OnDone, emitted responses are dropped.
class StreamState final : public RequestSink {
 public:
  explicit StreamState(GenerateReactor* reactor) : reactor_(reactor) {}
  void Emit(v1::GenerateResponse response, bool last) override;
  // From the reactor.
  void OnWriteDone(bool ok);
  void Detach();

 private:
  void Pump(std::unique_lock<std::mutex>& lock);
  std::mutex mu_;
  GenerateReactor* reactor_;
  std::deque<v1::GenerateResponse> queue_;
  bool writing_ = false;
  bool last_queued_ = false;
  bool finished_ = false;
  bool broken_ = false;
};

class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(Engine* engine) : engine_(engine), state_(std::make_shared<StreamState>(this)) {}
  std::shared_ptr<StreamState> state() { return state_; }
  void set_name(std::string name) {
    std::lock_guard<std::mutex> lock(mu_);
    name_ = std::move(name);
  }

  void OnWriteDone(bool ok) override { state_->OnWriteDone(ok); }
  void OnCancel() override {
    std::string name;
    {
      std::lock_guard<std::mutex> lock(mu_);
      name = name_;
    }
    if (engine_ != nullptr && !name.empty()) engine_->Abort(name, "client cancelled or deadline");
  }
  void OnDone() override {
    state_->Detach();
    delete this;
  }

 private:
  Engine* engine_;
  std::shared_ptr<StreamState> state_;
  std::mutex mu_;
  std::string name_;
};

void StreamState::Emit(v1::GenerateResponse response, bool last) {
  std::unique_lock<std::mutex> lock(mu_);
  if (reactor_ == nullptr || finished_ || last_queued_) return;
  if (broken_) {
    if (last) {
      finished_ = true;
      GenerateReactor* r = reactor_;
      lock.unlock();
      r->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    }
    return;
  }
  queue_.push_back(std::move(response));
  last_queued_ = last;
  Pump(lock);
}

void StreamState::Pump(std::unique_lock<std::mutex>& lock) {
  if (writing_ || reactor_ == nullptr || finished_) return;
  if (!queue_.empty()) {
    writing_ = true;
    const v1::GenerateResponse* msg = &queue_.front();  // stable until popped in OnWriteDone
    GenerateReactor* r = reactor_;
    lock.unlock();
    r->StartWrite(msg);
    lock.lock();
    return;
  }
  if (last_queued_) {
    finished_ = true;
    GenerateReactor* r = reactor_;
    lock.unlock();
    r->Finish(grpc::Status::OK);
    lock.lock();
  }
}

void StreamState::OnWriteDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  writing_ = false;
  if (!queue_.empty()) queue_.pop_front();
  if (!ok) {
    // The client went away: nothing more can be written.
    broken_ = true;
    queue_.clear();
    if (last_queued_ && !finished_) {
      finished_ = true;
      GenerateReactor* r = reactor_;
      lock.unlock();
      r->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    }
    return;
  }
  Pump(lock);
}

void StreamState::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  reactor_ = nullptr;
  queue_.clear();
}

}  // namespace

grpc::ServerWriteReactor<v1::GenerateResponse>* Dsv4Service::Generate(
    grpc::CallbackServerContext* ctx, const v1::GenerateRequest* req) {
  const ServingRuntime* rt = runtime_.load();
  auto* reactor = new GenerateReactor(rt != nullptr ? rt->engine : nullptr);
  if (rt == nullptr) {
    if (metrics_) metrics_->Rejected("not_ready").Increment();
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading"));
    return reactor;
  }
  const uint64_t seed = seed_counter_.fetch_add(0x9e3779b97f4a7c15ull);
  auto validated = ValidateRequest(*req, *rt->tokenizer, rt->limits, seed);
  if (!validated.ok()) {
    if (metrics_) metrics_->Rejected("invalid_argument").Increment();
    LogDebug("request_rejected", {{"error", std::string(validated.status().message())}});
    reactor->Finish(ToGrpc(validated.status()));
    return reactor;
  }
  auto name = rt->engine->Submit(std::move(*validated), reactor->state());
  if (!name.ok()) {
    reactor->Finish(ToGrpc(name.status()));
    return reactor;
  }
  reactor->set_name(*name);
  // A call cancelled before set_name() could not abort; catch that case here.
  if (ctx->IsCancelled()) rt->engine->Abort(*name, "client cancelled");
  return reactor;
}

grpc::ServerUnaryReactor* Dsv4Service::Abort(grpc::CallbackServerContext* ctx,
                                             const v1::AbortRequest* req, v1::AbortResponse* resp) {
  auto* reactor = ctx->DefaultReactor();
  const ServingRuntime* rt = runtime_.load();
  if (req->request_id().empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id: must not be empty"));
    return reactor;
  }
  resp->set_found(rt != nullptr && rt->engine->Abort(req->request_id(), "aborted by Abort"));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* Dsv4Service::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                    const v1::GetModelInfoRequest*,
                                                    v1::ModelInfo* resp) {
  auto* reactor = ctx->DefaultReactor();
  const ServingRuntime* rt = runtime_.load();
  if (rt == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading"));
    return reactor;
  }
  *resp = rt->model_info;
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const std::string& listen,
                                                             Dsv4Service* service) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::unique_ptr<GrpcServer> s(new GrpcServer());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(16 << 20);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen for gRPC on ", listen));
  }
  s->SetServing(false);
  // Liveness: SERVING for as long as the process answers, also while loading and draining
  // (the Kubernetes liveness probe asks for service "liveness"; readiness asks for "").
  if (auto* health = s->server_->GetHealthCheckService()) health->SetServingStatus("liveness", true);
  return s;
}

GrpcServer::~GrpcServer() { Shutdown(std::chrono::milliseconds(0)); }

void GrpcServer::SetServing(bool serving) {
  if (server_ == nullptr) return;
  auto* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  health->SetServingStatus("", serving);
  health->SetServingStatus("dsv4.v1.Dsv4", serving);
}

void GrpcServer::Shutdown(std::chrono::milliseconds grace) {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() + grace);
  server_->Wait();
  server_.reset();
}

}  // namespace dsv4
