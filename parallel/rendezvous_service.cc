#include "parallel/rendezvous_service.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"

namespace dsv4 {
namespace {

namespace pb = dsv4::internal::v1;

grpc::Status ToGrpc(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

std::string TokenOf(const grpc::ServerContext& context) {
  const auto& md = context.client_metadata();
  auto it = md.find(kRendezvousTokenMetadata);
  if (it == md.end()) return "";
  return std::string(it->second.data(), it->second.size());
}

RendezvousCaller CallerOf(const pb::Caller& c) {
  return RendezvousCaller{c.group(), c.rank(), c.world_size()};
}

RendezvousStore::CancelledFn CancelledOf(grpc::ServerContext* context) {
  return [context] { return context->IsCancelled(); };
}

}  // namespace

grpc::Status RendezvousService::Set(grpc::ServerContext* context, const pb::SetRequest* request,
                                    pb::SetResponse* response) {
  return ToGrpc(
      store_->Set(CallerOf(request->caller()), TokenOf(*context), request->key(), request->value()));
}

grpc::Status RendezvousService::Get(grpc::ServerContext* context, const pb::GetRequest* request,
                                    pb::GetResponse* response) {
  auto value = store_->Get(CallerOf(request->caller()), TokenOf(*context), request->key(),
                           std::chrono::milliseconds(request->timeout_ms()), CancelledOf(context));
  if (!value.ok()) return ToGrpc(value.status());
  response->set_value(std::move(*value));
  return grpc::Status::OK;
}

grpc::Status RendezvousService::Wait(grpc::ServerContext* context, const pb::WaitRequest* request,
                                     pb::WaitResponse* response) {
  std::vector<std::string> keys(request->keys().begin(), request->keys().end());
  return ToGrpc(store_->Wait(CallerOf(request->caller()), TokenOf(*context), keys,
                             std::chrono::milliseconds(request->timeout_ms()),
                             CancelledOf(context)));
}

absl::StatusOr<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(
    const std::string& address, RendezvousStore* store) {
  std::unique_ptr<RendezvousServer> s(new RendezvousServer());
  s->store_ = store;
  s->service_ = std::make_unique<RendezvousService>(store);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &s->port_);
  builder.RegisterService(s->service_.get());
  // A value and its request's framing; metadata holds little more than the token.
  builder.SetMaxReceiveMessageSize(static_cast<int>(store->limits().max_value_bytes) + (64 << 10));
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, 16 << 10);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(
        absl::StrCat("rendezvous store: cannot listen on ", address,
                     " (in use, or not an address of this host)"));
  }
  return s;
}

RendezvousServer::~RendezvousServer() {
  if (store_ != nullptr) store_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(1));
    server_->Wait();
  }
}

}  // namespace dsv4
