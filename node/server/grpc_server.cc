#include "node/server/grpc_server.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>

#include "absl/strings/str_cat.h"

namespace dsv4 {
namespace {

std::shared_ptr<grpc::ServerCredentials> Credentials(const TlsCredentials* tls) {
  if (tls == nullptr) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions ssl(
      tls->mutual() ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                    : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  ssl.pem_root_certs = tls->client_ca_pem;
  ssl.pem_key_cert_pairs.push_back({tls->private_key_pem, tls->cert_chain_pem});
  return grpc::SslServerCredentials(ssl);
}

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(const GrpcServerOptions& o,
                                                             grpc::Service* service) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  std::unique_ptr<GrpcServer> s(new GrpcServer());
  grpc::ServerBuilder builder;
  const std::string address = o.listen.ToString();
  builder.AddListeningPort(address, Credentials(o.tls), &s->port_);
  builder.RegisterService(service);
  builder.SetMaxReceiveMessageSize(o.max_receive_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, o.max_concurrent_streams);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONNECTION_IDLE_MS, o.max_connection_idle_ms);
  builder.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, o.handshake_timeout_ms);
  builder.AddChannelArgument(GRPC_ARG_MAX_METADATA_SIZE, o.max_metadata_bytes);
  s->server_ = builder.BuildAndStart();
  if (s->server_ == nullptr || s->port_ == 0) {
    return absl::UnavailableError(absl::StrCat(
        "--listen: cannot listen for gRPC on ", address,
        " (the address is in use by another process, or not an address of this host)"));
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
