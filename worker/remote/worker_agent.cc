#include "worker/remote/worker_agent.h"

#include <unistd.h>

#include <map>
#include <memory>

#include <grpcpp/grpcpp.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status.h"
#include "control/plan_codec.h"
#include "control/secret.h"
#include "dsv4/internal/v1/worker.grpc.pb.h"
#include "parallel/gloo_communicator.h"
#include "worker/in_process_worker.h"
#include "worker/cuda_plugin.h"
#include "parallel/rendezvous_client.h"
#include "absl/strings/numbers.h"

namespace dsv4 {
namespace {

namespace pb = ::dsv4::internal::v1;
using Stream = grpc::ClientReaderWriter<pb::WorkerMessage, pb::CoordinatorMessage>;

pb::WorkerMessage FailureMessage(const absl::Status& s) {
  pb::WorkerMessage m;
  m.mutable_failure()->set_code(static_cast<int32_t>(s.code()));
  m.mutable_failure()->set_message(std::string(s.message()));
  return m;
}

class Agent {
 public:
  Agent(const WorkerAgentOptions& o, Stream* stream) : o_(o), stream_(stream) {}

  // One coordinator message; Unavailable-free errors become a Failure reply and end the rank.
  absl::Status Handle(const pb::CoordinatorMessage& m, bool* done) {
    switch (m.kind_case()) {
      case pb::CoordinatorMessage::kConfigure: return Reply(Configure(m.configure()), Ack(&pb::WorkerMessage::mutable_configured));
      case pb::CoordinatorMessage::kLoad: return LoadModel();
      case pb::CoordinatorMessage::kWarmUp:
        return Reply(Ready() ? worker_->WarmUp() : NotConfigured("WarmUp"),
                     Ack(&pb::WorkerMessage::mutable_warmed_up));
      case pb::CoordinatorMessage::kStep: return RunStep(m.step());
      case pb::CoordinatorMessage::kShutdown:
        if (worker_) worker_->Shutdown();
        *done = true;
        return absl::OkStatus();
      default:
        return Reply(absl::InvalidArgumentError(absl::StrCat(
                         "unexpected control message kind ", static_cast<int>(m.kind_case()))),
                     {});
    }
  }

 private:
  template <typename F>
  static pb::WorkerMessage Ack(F mutable_field) {
    pb::WorkerMessage m;
    (m.*mutable_field)();
    return m;
  }
  bool Ready() const { return worker_ != nullptr; }
  static absl::Status NotConfigured(const char* what) {
    return absl::FailedPreconditionError(absl::StrCat(what, " before Configure"));
  }
  // Sends `ok` when `s` is OK, else a Failure; the error ends the rank.
  absl::Status Reply(const absl::Status& s, const pb::WorkerMessage& ok) {
    if (!stream_->Write(s.ok() ? ok : FailureMessage(s))) {
      return absl::UnavailableError("lost the coordinator while replying");
    }
    return s;
  }

  absl::Status Configure(const pb::Configure& c) {
    if (worker_ != nullptr) return absl::FailedPreconditionError("Configure twice");
    if (c.rank() != o_.rank || c.world_size() != o_.world_size) {
      return absl::InvalidArgumentError(absl::StrCat("Configure is for rank ", c.rank(), " of ",
                                                     c.world_size(), "; this is rank ", o_.rank,
                                                     " of ", o_.world_size));
    }
    ASSIGN_OR_RETURN(WorkerConfig wc, control::FromProto(c));
    if (c.world_size() > 1) {
      RETURN_IF_ERROR(CheckTensorParallel(wc.model, c.world_size()));
      ASSIGN_OR_RETURN(comm_, JoinGroup(c));
      wc.communicator = comm_.get();
    }
    ASSIGN_OR_RETURN(worker_, o_.factory ? o_.factory(o_.device) : CreateInProcessWorker(o_.device));
    RETURN_IF_ERROR(worker_->Configure(wc));
    LogInfo("worker_configured", {{"rank", o_.rank}, {"world_size", o_.world_size},
                                  {"model", wc.model.Summary()}});
    return absl::OkStatus();
  }

  // The group's communicator, on the data plane the coordinator chose, formed through its
  // rendezvous store (the address the rank dialed unless Configure names another). NCCL: rank 0
  // makes the unique id and publishes it there (the group's token guards it).
  absl::StatusOr<std::unique_ptr<Communicator>> JoinGroup(const pb::Configure& c) {
    const RendezvousEndpoint endpoint{
        c.rendezvous().address().empty() ? o_.coordinator : c.rendezvous().address(),
        c.rendezvous().group(), c.rendezvous().token()};
    if (c.data_plane() != "nccl") {
      GlooOptions g;
      g.rank = c.rank();
      g.world_size = c.world_size();
      g.hostname = o_.data_plane_host;
      g.name = "tp";
      ASSIGN_OR_RETURN(auto comm, GlooCommunicator::Connect(g, endpoint));
      return std::unique_ptr<Communicator>(std::move(comm));
    }
    int device = 0;
    if (o_.device.rfind("cuda:", 0) != 0 || !absl::SimpleAtoi(o_.device.substr(5), &device)) {
      return absl::InvalidArgumentError(absl::StrCat("Configure.data_plane nccl on device '",
                                                     o_.device, "': a cuda:N device is needed"));
    }
    ASSIGN_OR_RETURN(auto store, RendezvousClient::Create(endpoint, c.rank(), c.world_size()));
    std::string id;
    if (c.rank() == 0) {
      ASSIGN_OR_RETURN(id, NcclUniqueId());
      RETURN_IF_ERROR(store->Set("nccl-unique-id", id, std::chrono::seconds(30)));
    } else {
      ASSIGN_OR_RETURN(id, store->Get("nccl-unique-id", o_.connect_timeout * 2));
    }
    return CreateNcclCommunicator(c.rank(), c.world_size(), id, device);
  }

  absl::Status LoadModel() {
    if (!Ready()) return Reply(NotConfigured("Load"), {});
    bool write_failed = false;
    absl::Status s = worker_->Load([&](const LoadProgress& p) {
      pb::WorkerMessage m;
      m.mutable_load_progress()->set_phase(p.phase);
      m.mutable_load_progress()->set_done(p.done);
      m.mutable_load_progress()->set_total(p.total);
      write_failed |= !stream_->Write(m);
    });
    if (write_failed) return absl::UnavailableError("lost the coordinator while loading");
    pb::WorkerMessage ok;
    const WorkerInfo info = worker_->info();
    pb::Loaded* l = ok.mutable_loaded();
    l->set_device(info.device);
    l->set_precision(info.precision);
    l->set_num_blocks(info.num_blocks);
    l->set_num_slots(info.num_slots);
    l->set_block_size(info.block_size);
    l->set_max_model_len(info.max_model_len);
    l->set_num_state_snapshots(info.num_state_snapshots);
    return Reply(s, ok);
  }

  absl::Status RunStep(const pb::Step& step) {
    if (!Ready()) return Reply(NotConfigured("Step"), {});
    auto plan = control::FromProto(step, &known_);
    if (!plan.ok()) return Reply(plan.status(), {});
    auto result = worker_->Execute(*plan);
    if (!result.ok()) return Reply(result.status(), {});
    pb::WorkerMessage m;
    control::ToProto(*result, /*with_tokens=*/o_.rank == 0, m.mutable_step_done());
    return Reply(absl::OkStatus(), m);
  }

  const WorkerAgentOptions& o_;
  Stream* stream_;
  std::unique_ptr<Communicator> comm_;  // outlives worker_ (declared first)
  std::unique_ptr<Worker> worker_;
  std::map<uint64_t, std::shared_ptr<const SamplingSpec>> known_;
};

}  // namespace

absl::Status RunWorkerAgent(const WorkerAgentOptions& o) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 2000);
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  args.SetMaxReceiveMessageSize(64 << 20);
  auto channel = grpc::CreateCustomChannel(o.coordinator, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + o.connect_timeout)) {
    return absl::UnavailableError(absl::StrCat("--coordinator ", o.coordinator,
                                               ": no answer within ",
                                               o.connect_timeout.count() / 1000, " s"));
  }
  auto stub = pb::WorkerControl::NewStub(channel);
  grpc::ClientContext ctx;
  std::unique_ptr<Stream> stream = stub->Connect(&ctx);
  pb::WorkerMessage reg;
  pb::Register* r = reg.mutable_register_();
  r->set_rank(o.rank);
  r->set_world_size(o.world_size);
  r->set_device(o.device);
  r->set_build_version(o.build_version.empty() ? control::BuildVersion() : o.build_version);
  r->set_secret(o.secret);
  r->set_pid(static_cast<int32_t>(::getpid()));
  char host[256] = {0};
  if (::gethostname(host, sizeof(host) - 1) == 0) r->set_host(host);
  r->set_memory_bytes(static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) *
                      static_cast<uint64_t>(::sysconf(_SC_PAGESIZE)));
  if (!stream->Write(reg)) return absl::UnavailableError("lost the coordinator while registering");
  pb::CoordinatorMessage m;
  if (!stream->Read(&m)) {
    const grpc::Status st = stream->Finish();
    return absl::UnavailableError(absl::StrCat("the coordinator closed the stream: ", st.error_message()));
  }
  if (m.kind_case() == pb::CoordinatorMessage::kRefused) {
    ctx.TryCancel();
    return absl::PermissionDeniedError(absl::StrCat("the coordinator refused rank ", o.rank, ": ",
                                                    m.refused().reason()));
  }
  if (m.kind_case() != pb::CoordinatorMessage::kAccepted) {
    return absl::InternalError("the coordinator's first message is neither Accepted nor Refused");
  }
  LogInfo("worker_accepted", {{"rank", o.rank}, {"coordinator", o.coordinator}});
  Agent agent(o, stream.get());
  bool done = false;
  while (!done && stream->Read(&m)) {
    if (absl::Status s = agent.Handle(m, &done); !s.ok()) {
      ctx.TryCancel();
      return absl::Status(s.code(), absl::StrCat("rank ", o.rank, ": ", s.message()));
    }
  }
  if (!done) {
    ctx.TryCancel();
    return absl::UnavailableError(absl::StrCat("rank ", o.rank, " lost the coordinator"));
  }
  stream->WritesDone();
  ctx.TryCancel();
  return absl::OkStatus();
}

}  // namespace dsv4
