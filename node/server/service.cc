#include "node/server/service.h"

#include <deque>
#include <mutex>

#include <grpcpp/support/proto_buffer_reader.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace dsv4 {

grpc::Status ToGrpc(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  constexpr size_t kMaxMessage = 1024;
  std::string message(status.message());
  if (message.size() > kMaxMessage) {
    message.resize(kMaxMessage);
    message += "... (cut)";
  }
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), message);
}

namespace {

// Parses a request from the wire; false for bytes that are not a valid `Message` (proto3 also
// rejects string fields that are not UTF-8).
template <class Message>
bool ParseRequest(const grpc::ByteBuffer* bytes, Message* out) {
  grpc::ByteBuffer copy(*bytes);  // slices are shared, not copied
  return grpc::SerializationTraits<Message>::Deserialize(&copy, out).ok();
}

grpc::Status Malformed(const char* type) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                      absl::StrCat("request: not a valid ", type,
                                   " (malformed protobuf, or a string field that is not UTF-8)"));
}

template <class Message>
grpc::Status Serialize(const Message& msg, grpc::ByteBuffer* out) {
  bool own = false;
  return grpc::SerializationTraits<Message>::Serialize(msg, out, &own);
}

// The caller of a call: its requests' owner and its quota key.
Dsv4Service::Caller Identify(const grpc::CallbackServerContext* ctx) {
  Dsv4Service::Caller c;
  auto auth = ctx->auth_context();
  if (auth != nullptr && auth->IsPeerAuthenticated()) {
    std::string id;
    for (const auto& v : auth->GetPeerIdentity()) {
      absl::StrAppend(&id, id.empty() ? "" : ",", absl::string_view(v.data(), v.size()));
    }
    c.owner = c.client = absl::StrCat("tls:", id);
    return c;
  }
  const std::string peer = ctx->peer();  // "ipv4:127.0.0.1:40404", "ipv6:[::1]:40404"
  c.owner = absl::StrCat("conn:", peer);
  const size_t colon = peer.rfind(':');
  c.client = colon == std::string::npos ? peer : peer.substr(0, colon);
  return c;
}

int64_t InputBytes(const v1::GenerateRequest& req) {
  switch (req.input_case()) {
    case v1::GenerateRequest::kText: return static_cast<int64_t>(req.text().size());
    case v1::GenerateRequest::kChat: {
      int64_t n = 0;
      for (const auto& m : req.chat().messages()) n += m.role().size() + m.content().size();
      return n;
    }
    default: return 0;
  }
}

}  // namespace

// One Generate call: the gRPC reactor and, shared with the engine, the stream of its responses.
// The StreamState outlives the reactor: after OnDone, emitted responses are dropped; the client's
// quota slot is given back when the engine emits the request's last response.
class Dsv4Service::GenerateCall final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  class StreamState final : public RequestSink {
   public:
    StreamState(GenerateCall* call, std::function<void()> release)
        : call_(call), release_(std::move(release)) {}
    void Emit(v1::GenerateResponse response, bool last) override;
    void OnWriteDone(bool ok);
    void Detach();
    void ReleaseQuota();

   private:
    void Pump(std::unique_lock<std::mutex>& lock);
    std::mutex mu_;
    GenerateCall* call_;
    std::function<void()> release_;
    std::deque<grpc::ByteBuffer> queue_;
    bool writing_ = false;
    bool last_queued_ = false;
    bool finished_ = false;
    bool broken_ = false;
  };

  GenerateCall(Engine* engine, std::function<void()> release)
      : engine_(engine), state_(std::make_shared<StreamState>(this, std::move(release))) {}
  std::shared_ptr<StreamState> state() { return state_; }
  // The call lives until gRPC is done with it (OnDone) and every holder let go: work queued on
  // the tokenizer thread holds it, because the engine may finish the request (and gRPC end the
  // call) before that thread returns from Submit.
  void Hold() { holds_.fetch_add(1); }
  void Release() {
    if (holds_.fetch_sub(1) == 1) delete this;
  }
  // The engine's name of the request. True when the client cancelled before it was known: the
  // caller aborts it (OnCancel could not).
  bool set_name(std::string owner, std::string name) {
    std::lock_guard<std::mutex> lock(mu_);
    owner_ = std::move(owner);
    name_ = std::move(name);
    return cancelled_;
  }
  bool cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }
  // Ends the call before the engine took the request (its quota slot is given back).
  void Refuse(const grpc::Status& status) {
    state_->ReleaseQuota();
    Finish(status);
  }

  void OnWriteDone(bool ok) override { state_->OnWriteDone(ok); }
  void OnCancel() override {
    std::string owner, name;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      owner = owner_;
      name = name_;
    }
    if (engine_ != nullptr && !name.empty()) {
      engine_->Abort(name, "client cancelled or deadline", owner);
    }
  }
  void OnDone() override {
    state_->Detach();
    Release();
  }

 private:
  Engine* engine_;
  std::shared_ptr<StreamState> state_;
  std::atomic<int> holds_{1};  // gRPC's, until OnDone
  std::mutex mu_;
  std::string owner_, name_;
  bool cancelled_ = false;
};

void Dsv4Service::GenerateCall::StreamState::ReleaseQuota() {
  std::function<void()> release;
  {
    std::lock_guard<std::mutex> lock(mu_);
    release.swap(release_);
  }
  if (release) release();
}

void Dsv4Service::GenerateCall::StreamState::Emit(v1::GenerateResponse response, bool last) {
  if (last) ReleaseQuota();
  std::unique_lock<std::mutex> lock(mu_);
  if (call_ == nullptr || finished_ || last_queued_) return;
  if (broken_) {
    if (last) {
      finished_ = true;
      GenerateCall* c = call_;
      lock.unlock();
      c->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    }
    return;
  }
  grpc::ByteBuffer bytes;
  if (!Serialize(response, &bytes).ok()) {
    LogError("response_serialization_failed", {{"request_id", response.request_id()}});
    return;
  }
  queue_.push_back(std::move(bytes));
  last_queued_ = last;
  Pump(lock);
}

void Dsv4Service::GenerateCall::StreamState::Pump(std::unique_lock<std::mutex>& lock) {
  if (writing_ || call_ == nullptr || finished_) return;
  if (!queue_.empty()) {
    writing_ = true;
    const grpc::ByteBuffer* msg = &queue_.front();  // stable until popped in OnWriteDone
    GenerateCall* c = call_;
    lock.unlock();
    c->StartWrite(msg);
    lock.lock();
    return;
  }
  if (last_queued_) {
    finished_ = true;
    GenerateCall* c = call_;
    lock.unlock();
    c->Finish(grpc::Status::OK);
    lock.lock();
  }
}

void Dsv4Service::GenerateCall::StreamState::OnWriteDone(bool ok) {
  std::unique_lock<std::mutex> lock(mu_);
  writing_ = false;
  if (!queue_.empty()) queue_.pop_front();
  if (!ok) {
    // The client went away: nothing more can be written.
    broken_ = true;
    queue_.clear();
    if (last_queued_ && !finished_) {
      finished_ = true;
      GenerateCall* c = call_;
      lock.unlock();
      c->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client went away"));
    }
    return;
  }
  Pump(lock);
}

void Dsv4Service::GenerateCall::StreamState::Detach() {
  std::lock_guard<std::mutex> lock(mu_);
  call_ = nullptr;
  queue_.clear();
}

Dsv4Service::Dsv4Service(NodeMetrics* metrics, AdmissionOptions admission)
    : metrics_(metrics),
      admission_(admission),
      quota_(admission.max_requests_per_client),
      queued_(std::max(1, admission.tokenizer_queue / 4)),
      tokenize_(admission.tokenizer_threads, admission.tokenizer_queue) {}

void Dsv4Service::Shutdown() {
  stopping_.store(true);
  tokenize_.Stop();
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* Dsv4Service::Generate(grpc::CallbackServerContext* ctx,
                                                                  const grpc::ByteBuffer* bytes) {
  const ServingRuntime* rt = runtime_.load();
  if (rt == nullptr) {
    auto* call = new GenerateCall(nullptr, nullptr);
    if (metrics_) metrics_->Rejected("not_ready").Increment();
    call->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading"));
    return call;
  }
  auto request = std::make_shared<v1::GenerateRequest>();
  if (!ParseRequest(bytes, request.get())) {
    auto* call = new GenerateCall(nullptr, nullptr);
    if (metrics_) metrics_->Rejected("invalid_argument").Increment();
    call->Finish(Malformed("dsv4.v1.GenerateRequest"));
    return call;
  }
  const Caller caller = Identify(ctx);
  if (!quota_.Acquire(caller.client)) {
    auto* call = new GenerateCall(nullptr, nullptr);
    if (metrics_) metrics_->Rejected("client_limit").Increment();
    call->Finish(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("this client has ", quota_.limit(),
                     " requests in flight, the limit (--max-requests-per-client)")));
    return call;
  }
  auto* call = new GenerateCall(rt->engine, [this, client = caller.client] { quota_.Release(client); });
  if (InputBytes(*request) <= admission_.inline_input_bytes) {
    Admit(rt, call, *request, caller);
    return call;
  }
  // Large inputs are tokenized off the gRPC threads, at most a quarter of the queue per client.
  if (stopping_.load()) {
    call->Refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the node is shutting down"));
    return call;
  }
  if (!queued_.Acquire(caller.client)) {
    if (metrics_) metrics_->Rejected("client_limit").Increment();
    call->Refuse(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("this client has ", queued_.limit(), " large inputs waiting for the tokenizer")));
    return call;
  }
  call->Hold();
  const bool queued = tokenize_.Post([this, rt, call, request, caller] {
    queued_.Release(caller.client);
    if (call->cancelled()) {
      call->Refuse(grpc::Status(grpc::StatusCode::CANCELLED, "client cancelled"));
    } else {
      Admit(rt, call, *request, caller);
    }
    call->Release();
  });
  if (!queued) {
    queued_.Release(caller.client);
    if (metrics_) metrics_->Rejected("queue_full").Increment();
    call->Refuse(grpc::Status(stopping_.load() ? grpc::StatusCode::UNAVAILABLE
                                               : grpc::StatusCode::RESOURCE_EXHAUSTED,
                              stopping_.load() ? std::string("the node is shutting down")
                                               : absl::StrCat("the tokenizer queue is full (",
                                                              tokenize_.capacity(),
                                                              " large inputs waiting)")));
    call->Release();
  }
  return call;
}

void Dsv4Service::Admit(const ServingRuntime* rt, GenerateCall* call,
                        const v1::GenerateRequest& request, const Caller& caller) {
  if (stopping_.load()) {
    call->Refuse(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the node is shutting down"));
    return;
  }
  const uint64_t seed = seed_counter_.fetch_add(0x9e3779b97f4a7c15ull);
  auto validated = ValidateRequest(request, *rt->tokenizer, rt->limits, seed);
  if (!validated.ok()) {
    if (metrics_) metrics_->Rejected("invalid_argument").Increment();
    LogDebug("request_rejected", {{"error", std::string(validated.status().message())}});
    call->Refuse(ToGrpc(validated.status()));
    return;
  }
  validated->owner = caller.owner;
  auto name = rt->engine->Submit(std::move(*validated), call->state());
  if (!name.ok()) {
    call->Refuse(ToGrpc(name.status()));
    return;
  }
  // The call may already be finished (the engine ran the request); the caller's hold keeps it.
  // Whichever of set_name and OnCancel comes second aborts a cancelled request.
  if (call->set_name(caller.owner, *name)) {
    rt->engine->Abort(*name, "client cancelled", caller.owner);
  }
}

grpc::ServerUnaryReactor* Dsv4Service::Abort(grpc::CallbackServerContext* ctx,
                                             const grpc::ByteBuffer* bytes,
                                             grpc::ByteBuffer* out) {
  auto* reactor = ctx->DefaultReactor();
  v1::AbortRequest req;
  if (!ParseRequest(bytes, &req)) {
    reactor->Finish(Malformed("dsv4.v1.AbortRequest"));
    return reactor;
  }
  if (req.request_id().empty()) {
    reactor->Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "request_id: must not be empty"));
    return reactor;
  }
  const ServingRuntime* rt = runtime_.load();
  v1::AbortResponse resp;
  resp.set_found(rt != nullptr &&
                 rt->engine->Abort(req.request_id(), "aborted by Abort", Identify(ctx).owner));
  reactor->Finish(Serialize(resp, out));
  return reactor;
}

grpc::ServerUnaryReactor* Dsv4Service::GetModelInfo(grpc::CallbackServerContext* ctx,
                                                    const grpc::ByteBuffer* bytes,
                                                    grpc::ByteBuffer* out) {
  auto* reactor = ctx->DefaultReactor();
  v1::GetModelInfoRequest req;
  if (!ParseRequest(bytes, &req)) {
    reactor->Finish(Malformed("dsv4.v1.GetModelInfoRequest"));
    return reactor;
  }
  const ServingRuntime* rt = runtime_.load();
  if (rt == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the model is still loading"));
    return reactor;
  }
  reactor->Finish(Serialize(rt->model_info, out));
  return reactor;
}

}  // namespace dsv4
