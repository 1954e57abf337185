#include "node/control/control_plane.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "control/secret.h"

namespace dsv4 {

absl::Status RankLink::Send(const cpb::CoordinatorMessage& m) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stream_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("rank ", rank(), " is gone: ",
                                               lost_.ok() ? "not attached" : lost_.message()));
  }
  if (!stream_->Write(m)) {
    return absl::UnavailableError(absl::StrCat("rank ", rank(), ": its stream broke on write"));
  }
  return absl::OkStatus();
}

absl::StatusOr<cpb::WorkerMessage> RankLink::Receive(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = cv_.wait_for(lock, timeout, [&] { return !inbox_.empty() || !lost_.ok(); });
  if (!inbox_.empty()) {
    cpb::WorkerMessage m = std::move(inbox_.front());
    inbox_.pop_front();
    return m;
  }
  if (!lost_.ok()) return lost_;
  (void)ready;
  return absl::DeadlineExceededError(absl::StrCat("rank ", rank(), " sent nothing within ",
                                                  timeout.count(), " ms"));
}

void RankLink::Close(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lost_.ok()) lost_ = absl::UnavailableError(absl::StrCat("rank ", rank(), ": ", why));
  if (ctx_ != nullptr) ctx_->TryCancel();
  cv_.notify_all();
}

bool RankLink::alive() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stream_ != nullptr && lost_.ok();
}

absl::Status RankLink::lost() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lost_;
}

void RankLink::Attach(grpc::ServerContext* ctx, Stream* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_ = ctx;
  stream_ = stream;
  attached_ = true;
}

void RankLink::Push(cpb::WorkerMessage m) {
  std::lock_guard<std::mutex> lock(mu_);
  inbox_.push_back(std::move(m));
  cv_.notify_all();
}

void RankLink::Detach(absl::Status why) {
  std::lock_guard<std::mutex> lock(mu_);
  ctx_ = nullptr;
  stream_ = nullptr;
  if (lost_.ok()) lost_ = std::move(why);
  cv_.notify_all();
}

// The WorkerControl service: one handler thread per worker stream for as long as it lives.
class WorkerControlService final : public cpb::WorkerControl::Service {
 public:
  explicit WorkerControlService(ControlPlane* plane) : plane_(plane) {}

  grpc::Status Connect(grpc::ServerContext* ctx, RankLink::Stream* stream) override {
    cpb::WorkerMessage first;
    if (!stream->Read(&first)) return grpc::Status(grpc::StatusCode::CANCELLED, "no Register");
    if (first.kind_case() != cpb::WorkerMessage::kRegister) {
      return Refuse(stream, -1, absl::InvalidArgumentError(absl::StrCat(
                                    "the first message must be Register, got kind ",
                                    static_cast<int>(first.kind_case()))));
    }
    auto link = std::make_shared<RankLink>(first.register_());
    if (absl::Status s = plane_->Admit(link); !s.ok()) return Refuse(stream, link->rank(), s);
    link->Attach(ctx, stream);
    cpb::CoordinatorMessage ok;
    ok.mutable_accepted()->set_coordinator_version(control::BuildVersion());
    (void)link->Send(ok);
    plane_->MarkReady(link.get());  // only now may the coordinator write to it
    LogInfo("worker_registered", {{"rank", link->rank()},
                                  {"device", link->registration().device()},
                                  {"pid", link->registration().pid()},
                                  {"peer", ctx->peer()}});
    cpb::WorkerMessage m;
    while (stream->Read(&m)) link->Push(std::move(m));
    const absl::Status why = absl::UnavailableError(
        absl::StrCat("rank ", link->rank(), " (pid ", link->registration().pid(),
                     ") closed its control stream"));
    link->Detach(why);
    plane_->Remove(link.get());
    LogWarning("worker_lost", {{"rank", link->rank()}, {"detail", std::string(why.message())}});
    return grpc::Status::OK;
  }

 private:
  grpc::Status Refuse(RankLink::Stream* stream, int rank, const absl::Status& why) {
    cpb::CoordinatorMessage m;
    m.mutable_refused()->set_reason(std::string(why.message()));
    stream->Write(m);
    {
      std::lock_guard<std::mutex> lock(plane_->mu_);
      plane_->refusals_.push_back(absl::StrCat("rank ", rank, ": ", why.message()));
    }
    LogWarning("worker_refused", {{"rank", rank}, {"detail", std::string(why.message())}});
    return grpc::Status(static_cast<grpc::StatusCode>(why.code()), std::string(why.message()));
  }
  ControlPlane* plane_;
};

absl::StatusOr<std::unique_ptr<ControlPlane>> ControlPlane::Start(const ControlPlaneOptions& o) {
  if (o.world_size < 1) return absl::InvalidArgumentError("control plane: world_size < 1");
  if (o.secret.empty()) {
    return absl::InvalidArgumentError("control plane: a shared secret is required");
  }
  std::unique_ptr<ControlPlane> p(new ControlPlane());
  p->options_ = o;
  p->rendezvous_ = std::make_unique<RendezvousService>(&p->store_);
  p->control_ = std::make_unique<WorkerControlService>(p.get());
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, grpc::InsecureServerCredentials(), &p->port_);
  builder.RegisterService(p->rendezvous_.get());
  builder.RegisterService(p->control_.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Heartbeats: HTTP/2 pings every 2 s both ways; a peer that does not answer within 2 s is lost.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 1000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  p->server_ = builder.BuildAndStart();
  if (p->server_ == nullptr || p->port_ == 0) {
    return absl::UnavailableError(absl::StrCat("--worker-listen: cannot listen on ", o.listen,
                                               " (in use, or not an address of this host)"));
  }
  return p;
}

absl::Status ControlPlane::Admit(const std::shared_ptr<RankLink>& link) {
  const cpb::Register& r = link->registration();
  if (r.build_version() != control::BuildVersion()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker build '", r.build_version(), "' differs from the coordinator's '",
        control::BuildVersion(), "'"));
  }
  if (!control::SecretsEqual(r.secret(), options_.secret)) {
    return absl::UnauthenticatedError("wrong worker secret (--worker-secret-file)");
  }
  if (r.world_size() != options_.world_size) {
    return absl::FailedPreconditionError(absl::StrCat(
        "world size ", r.world_size(), " does not match the coordinator's ", options_.world_size));
  }
  if (r.rank() < 0 || r.rank() >= options_.world_size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", r.rank(), " is outside [0, ",
                                                   options_.world_size, ")"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (shut_down_) return absl::UnavailableError("the coordinator is shutting down");
  if (auto it = ranks_.find(r.rank()); it != ranks_.end()) {
    return absl::AlreadyExistsError(absl::StrCat(
        "rank ", r.rank(), " is already registered (pid ", it->second->registration().pid(),
        "): a duplicate rank?"));
  }
  ranks_[r.rank()] = link;
  cv_.notify_all();
  return absl::OkStatus();
}

void ControlPlane::MarkReady(const RankLink* link) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranks_.find(link->rank());
  if (it != ranks_.end() && it->second.get() == link) ready_.insert(link->rank());
  cv_.notify_all();
}

void ControlPlane::Remove(const RankLink* link) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = ranks_.find(link->rank());
  if (it != ranks_.end() && it->second.get() == link) {
    ranks_.erase(it);
    ready_.erase(link->rank());
  }
  cv_.notify_all();
}

absl::StatusOr<std::vector<std::shared_ptr<RankLink>>> ControlPlane::WaitForRanks(
    std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const int n = options_.world_size;
  cv_.wait_for(lock, timeout, [&] { return shut_down_ || static_cast<int>(ready_.size()) == n; });
  if (static_cast<int>(ready_.size()) != n) {
    std::vector<int> missing;
    for (int r = 0; r < n; ++r) {
      if (!ready_.count(r)) missing.push_back(r);
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "worker ranks ", absl::StrJoin(missing, ", "), " did not register within ",
        timeout.count() / 1000, " s", refusals_.empty() ? "" : "; refused: ",
        absl::StrJoin(refusals_, "; ")));
  }
  std::vector<std::shared_ptr<RankLink>> links;
  for (auto& [rank, link] : ranks_) links.push_back(link);
  return links;
}

std::vector<std::string> ControlPlane::refusals() const {
  std::lock_guard<std::mutex> lock(mu_);
  return refusals_;
}

void ControlPlane::Shutdown() {
  std::vector<std::shared_ptr<RankLink>> links;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (shut_down_) return;
    shut_down_ = true;
    for (auto& [rank, link] : ranks_) links.push_back(link);
    cv_.notify_all();
  }
  for (auto& link : links) link->Close("the coordinator shut down");
  store_.Shutdown();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

ControlPlane::~ControlPlane() { Shutdown(); }

}  // namespace dsv4
