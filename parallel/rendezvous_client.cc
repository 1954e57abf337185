#include "parallel/rendezvous_client.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "parallel/rendezvous_service.h"
#include "parallel/rendezvous_store.h"

namespace dsv4 {
namespace {

namespace pb = dsv4::internal::v1;

// What the RPC may take beyond the server-side wait: connection set-up and transfer.
constexpr auto kRpcSlack = std::chrono::seconds(1);

absl::Status FromGrpc(const grpc::Status& s, std::string_view what) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("rendezvous ", AV(what), ": ", s.error_message()));
}

uint32_t TimeoutMs(std::chrono::milliseconds timeout) {
  const auto max = RendezvousLimits{}.max_timeout.count();
  return static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 0, max));
}

}  // namespace

absl::StatusOr<std::unique_ptr<RendezvousClient>> RendezvousClient::Create(
    const RendezvousEndpoint& endpoint, int rank, int world_size) {
  if (endpoint.address.empty()) {
    return absl::InvalidArgumentError("rendezvous address: empty (want host:port)");
  }
  RETURN_IF_ERROR(ValidateRendezvousGroupName(endpoint.group, "rendezvous group"));
  if (endpoint.token.empty()) return absl::InvalidArgumentError("rendezvous token: empty");
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " / world_size ", world_size, ": want 0 <= rank < world_size"));
  }
  std::unique_ptr<RendezvousClient> c(new RendezvousClient());
  c->endpoint_ = endpoint;
  c->rank_ = rank;
  c->world_size_ = world_size;
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(RendezvousLimits{}.max_value_bytes + (64 << 10));
  // A short reconnect back-off: ranks start before or after the coordinator's port is up.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  auto channel =
      grpc::CreateCustomChannel(endpoint.address, grpc::InsecureChannelCredentials(), args);
  c->stub_ = pb::Rendezvous::NewStub(channel);
  return c;
}

void RendezvousClient::Prepare(grpc::ClientContext* context,
                               std::chrono::milliseconds timeout) const {
  context->AddMetadata(kRendezvousTokenMetadata, endpoint_.token);
  context->set_deadline(std::chrono::system_clock::now() + timeout + kRpcSlack);
  context->set_wait_for_ready(true);
}

void RendezvousClient::FillCaller(pb::Caller* caller) const {
  caller->set_group(endpoint_.group);
  caller->set_rank(rank_);
  caller->set_world_size(world_size_);
}

absl::Status RendezvousClient::Set(const std::string& key, const std::string& value,
                                   std::chrono::milliseconds timeout) {
  pb::SetRequest request;
  FillCaller(request.mutable_caller());
  request.set_key(key);
  request.set_value(value);
  pb::SetResponse response;
  grpc::ClientContext context;
  Prepare(&context, timeout);
  return FromGrpc(stub_->Set(&context, request, &response), absl::StrCat("set '", key, "'"));
}

absl::StatusOr<std::string> RendezvousClient::Get(const std::string& key,
                                                  std::chrono::milliseconds timeout) {
  pb::GetRequest request;
  FillCaller(request.mutable_caller());
  request.set_key(key);
  request.set_timeout_ms(TimeoutMs(timeout));
  pb::GetResponse response;
  grpc::ClientContext context;
  Prepare(&context, timeout);
  RETURN_IF_ERROR(
      FromGrpc(stub_->Get(&context, request, &response), absl::StrCat("get '", key, "'")));
  return std::move(*response.mutable_value());
}

absl::Status RendezvousClient::Wait(const std::vector<std::string>& keys,
                                    std::chrono::milliseconds timeout) {
  pb::WaitRequest request;
  FillCaller(request.mutable_caller());
  for (const auto& k : keys) request.add_keys(k);
  request.set_timeout_ms(TimeoutMs(timeout));
  pb::WaitResponse response;
  grpc::ClientContext context;
  Prepare(&context, timeout);
  return FromGrpc(stub_->Wait(&context, request, &response),
                  absl::StrCat("wait for ", keys.size(), " key(s)"));
}

}  // namespace dsv4
