#include "node/control/remote_worker_group.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"
#include "common/json_util.h"
#include "common/log.h"
#include "common/status.h"
#include "control/plan_codec.h"

namespace dsv4 {

absl::StatusOr<std::string> ChooseDataPlane(const std::vector<cpb::Register>& ranks,
                                            const std::string& wanted) {
  if (wanted != "auto" && wanted != "gloo" && wanted != "nccl") {
    return absl::InvalidArgumentError(absl::StrCat("--data-plane '", wanted, "': auto, gloo or nccl"));
  }
  if (wanted == "gloo") return std::string("gloo");
  std::map<std::string, int> gpus;  // "host/cuda:N" -> rank
  for (const cpb::Register& r : ranks) {
    if (r.device().rfind("cuda:", 0) != 0) {
      if (wanted == "nccl") {
        return absl::InvalidArgumentError(absl::StrCat("--data-plane nccl: rank ", r.rank(),
                                                       " runs on ", r.device(), ", not a GPU"));
      }
      return std::string("gloo");
    }
    const std::string key = absl::StrCat(r.host(), "/", r.device());
    if (auto [it, fresh] = gpus.emplace(key, r.rank()); !fresh) {
      if (wanted == "nccl") {
        return absl::InvalidArgumentError(absl::StrCat(
            "--data-plane nccl: ranks ", it->second, " and ", r.rank(), " share ", key,
            " (NCCL puts one rank on a GPU)"));
      }
      return std::string("gloo");
    }
  }
  return std::string("nccl");
}

absl::StatusOr<std::unique_ptr<RemoteWorkerGroup>> RemoteWorkerGroup::Start(
    const RemoteGroupOptions& o) {
  if (o.world_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat("--tensor-parallel-size ", o.world_size,
                                                   ": a worker group needs at least 2 ranks"));
  }
  std::unique_ptr<RemoteWorkerGroup> g(new RemoteWorkerGroup());
  g->options_ = o;
  ControlPlaneOptions cp;
  cp.listen = o.listen;
  cp.world_size = o.world_size;
  cp.secret = o.secret;
  ASSIGN_OR_RETURN(g->plane_, ControlPlane::Start(cp));
  LogInfo("control_plane_listening", {{"port", g->plane_->port()},
                                      {"world_size", o.world_size},
                                      {"workers", o.spawn ? "spawned" : "external"}});
  if (o.spawn) RETURN_IF_ERROR(g->SpawnRanks());
  ASSIGN_OR_RETURN(g->links_, g->plane_->WaitForRanks(o.register_timeout));
  g->info_.device = absl::StrCat(g->links_[0]->registration().device(), " x", o.world_size);
  g->info_.cuda_graphs = false;
  g->info_.overlap = false;
  g->info_.max_in_flight = 1;
  return g;
}

RemoteWorkerGroup::~RemoteWorkerGroup() { Shutdown(); }

absl::Status RemoteWorkerGroup::SpawnRanks() {
  const std::string coordinator = absl::StrCat("127.0.0.1:", plane_->port());
  children_.clear();  // kills any left
  for (int r = 0; r < options_.world_size; ++r) {
    ASSIGN_OR_RETURN(ChildProcess child,
                     ChildProcess::SpawnSelf({"dsv4-node", "worker", "--coordinator", coordinator,
                                              "--rank", absl::StrCat(r), "--world-size",
                                              absl::StrCat(options_.world_size), "--device",
                                              options_.device, "--secret-stdin"},
                                             options_.secret, options_.worker_binary));
    children_.push_back(std::move(child));
  }
  return absl::OkStatus();
}

std::vector<bool> RemoteWorkerGroup::ranks_up() const {
  std::vector<bool> up;
  for (const auto& link : links_) up.push_back(broken_.ok() && link->alive());
  return up;
}

absl::Status RemoteWorkerGroup::Recover() {
  if (broken_.ok()) return absl::OkStatus();
  if (stage_ < 3) return broken_;  // it never served: nothing to come back to
  for (auto& link : links_) {
    link->Close("the group is re-forming");
    plane_->Forget(link.get());
  }
  if (options_.spawn) {
    // The survivors exit when their streams close; whoever is left is killed.
    for (size_t r = 0; r < children_.size(); ++r) {
      (void)children_[r].Wait(std::chrono::seconds(5), absl::StrCat("worker rank ", r));
    }
    RETURN_IF_ERROR(SpawnRanks());
  }
  // External ranks come back when their pods are recreated: a short wait per attempt keeps the
  // engine answering meanwhile (the engine asks again every second).
  ASSIGN_OR_RETURN(links_, plane_->WaitForRanks(options_.spawn ? options_.register_timeout
                                                              : std::chrono::milliseconds(200)));
  broken_ = absl::OkStatus();
  announced_.clear();
  stage_ = 0;
  RETURN_IF_ERROR(Configure(config_));
  RETURN_IF_ERROR(Load({}));
  RETURN_IF_ERROR(WarmUp());
  LogInfo("worker_group_recovered", {{"generation", generation_}});
  return absl::OkStatus();
}

std::vector<pid_t> RemoteWorkerGroup::rank_pids() {
  std::vector<pid_t> pids;
  for (ChildProcess& c : children_) pids.push_back(c.pid());
  return pids;
}

absl::Status RemoteWorkerGroup::Stage(const char* call, int need) const {
  if (!broken_.ok()) return broken_;
  if (stage_ == need) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(call, " on a worker group in stage ", stage_,
                                                    " (it needs stage ", need, ")"));
}

absl::Status RemoteWorkerGroup::Break(absl::Status why) {
  if (broken_.ok()) {
    broken_ = absl::UnavailableError(absl::StrCat("worker group broken: ", why.message()));
    LogWarning("worker_group_broken", {{"detail", std::string(why.message())}});
    for (auto& link : links_) link->Close("the group broke");
  }
  return broken_;
}

absl::Status RemoteWorkerGroup::Broadcast(const cpb::CoordinatorMessage& m,
                                          cpb::WorkerMessage::KindCase want,
                                          std::chrono::milliseconds timeout,
                                          const LoadProgressFn& progress,
                                          std::vector<cpb::WorkerMessage>* replies) {
  for (auto& link : links_) {
    if (absl::Status s = link->Send(m); !s.ok()) return Break(s);
  }
  return Collect(want, timeout, progress, replies);
}

absl::Status RemoteWorkerGroup::Collect(cpb::WorkerMessage::KindCase want,
                                        std::chrono::milliseconds timeout,
                                        const LoadProgressFn& progress,
                                        std::vector<cpb::WorkerMessage>* replies) {
  replies->assign(links_.size(), {});
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (size_t r = 0; r < links_.size(); ++r) {
    for (;;) {
      const auto left = std::max(std::chrono::milliseconds(1),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     deadline - std::chrono::steady_clock::now()));
      auto msg = links_[r]->Receive(left);
      if (!msg.ok()) return Break(msg.status());
      if (msg->kind_case() == want) {
        (*replies)[r] = std::move(*msg);
        break;
      }
      if (msg->kind_case() == cpb::WorkerMessage::kLoadProgress) {
        if (r == 0 && progress) {
          progress(LoadProgress{msg->load_progress().phase(), msg->load_progress().done(),
                                msg->load_progress().total()});
        }
        continue;
      }
      if (msg->kind_case() == cpb::WorkerMessage::kFailure) {
        return Break(absl::Status(static_cast<absl::StatusCode>(msg->failure().code()),
                                  absl::StrCat("rank ", r, ": ", msg->failure().message())));
      }
      return Break(absl::InternalError(absl::StrCat("rank ", r, " sent message kind ",
                                                    static_cast<int>(msg->kind_case()),
                                                    " out of order (expected ",
                                                    static_cast<int>(want), ")")));
    }
  }
  return absl::OkStatus();
}

absl::Status RemoteWorkerGroup::Configure(const WorkerConfig& wc) {
  RETURN_IF_ERROR(Stage("Configure", 0));
  config_ = wc;
  const std::string config_path = wc.synthetic ? wc.source : wc.model_dir + "/config.json";
  ASSIGN_OR_RETURN(std::string config_json, ReadFileToString(config_path, 16 << 20));
  ASSIGN_OR_RETURN(std::string token, NewRendezvousToken());
  const std::string group = absl::StrCat("tp-", ++generation_);
  std::vector<cpb::Register> regs;
  for (const auto& link : links_) regs.push_back(link->registration());
  ASSIGN_OR_RETURN(const std::string data_plane, ChooseDataPlane(regs, options_.data_plane));
  LogInfo("data_plane", {{"choice", data_plane}, {"asked", options_.data_plane}});
  RETURN_IF_ERROR(plane_->rendezvous().OpenGroup(group, options_.world_size, token));
  for (int r = 0; r < options_.world_size; ++r) {
    cpb::CoordinatorMessage m;
    cpb::Configure* c = m.mutable_configure();
    control::ToProto(wc, config_json, c);
    c->set_rank(r);
    c->set_world_size(options_.world_size);
    c->mutable_rendezvous()->set_group(group);  // the address: the one the worker dialed
    c->mutable_rendezvous()->set_token(token);
    c->set_data_plane(data_plane);
    if (absl::Status s = links_[r]->Send(m); !s.ok()) return Break(s);
  }
  std::vector<cpb::WorkerMessage> replies;
  // Forming the Gloo group happens here: every rank must be there.
  RETURN_IF_ERROR(Collect(cpb::WorkerMessage::kConfigured, options_.register_timeout, {}, &replies));
  stage_ = 1;
  return absl::OkStatus();
}

absl::Status RemoteWorkerGroup::Load(const LoadProgressFn& progress) {
  RETURN_IF_ERROR(Stage("Load", 1));
  cpb::CoordinatorMessage m;
  m.mutable_load();
  std::vector<cpb::WorkerMessage> replies;
  RETURN_IF_ERROR(Broadcast(m, cpb::WorkerMessage::kLoaded, options_.load_timeout, progress, &replies));
  const cpb::Loaded& l0 = replies[0].loaded();
  for (size_t r = 1; r < replies.size(); ++r) {
    const cpb::Loaded& l = replies[r].loaded();
    if (l.num_blocks() != l0.num_blocks() || l.num_slots() != l0.num_slots() ||
        l.block_size() != l0.block_size() || l.max_model_len() != l0.max_model_len() ||
        l.num_state_snapshots() != l0.num_state_snapshots()) {
      return Break(absl::FailedPreconditionError(absl::StrCat(
          "rank ", r, " allocated ", l.num_blocks(), " blocks / ", l.num_slots(),
          " slots; rank 0 has ", l0.num_blocks(), " / ", l0.num_slots())));
    }
  }
  info_.precision = l0.precision();
  info_.num_blocks = l0.num_blocks();
  info_.num_slots = l0.num_slots();
  info_.block_size = l0.block_size();
  info_.max_model_len = l0.max_model_len();
  info_.num_state_snapshots = l0.num_state_snapshots();
  stage_ = 2;
  return absl::OkStatus();
}

absl::Status RemoteWorkerGroup::WarmUp() {
  RETURN_IF_ERROR(Stage("WarmUp", 2));
  cpb::CoordinatorMessage m;
  m.mutable_warm_up();
  std::vector<cpb::WorkerMessage> replies;
  RETURN_IF_ERROR(Broadcast(m, cpb::WorkerMessage::kWarmedUp, options_.load_timeout, {}, &replies));
  stage_ = 3;
  return absl::OkStatus();
}

absl::StatusOr<StepResult> RemoteWorkerGroup::Execute(const StepPlan& plan) {
  RETURN_IF_ERROR(Stage("Execute", 3));
  const auto t0 = std::chrono::steady_clock::now();
  cpb::CoordinatorMessage m;
  cpb::Step* step = m.mutable_step();
  control::ToProto(plan, step);
  for (const ScheduledSeq& s : plan.seqs) {
    if (!s.sample || s.sampling == nullptr || announced_.count(s.request_id)) continue;
    cpb::RequestSpec* r = step->add_requests();
    r->set_request_id(s.request_id);
    control::ToProto(*s.sampling, r->mutable_sampling());
    announced_.insert(s.request_id);
  }
  for (uint64_t id : plan.released) announced_.erase(id);
  std::vector<cpb::WorkerMessage> replies;
  RETURN_IF_ERROR(Broadcast(m, cpb::WorkerMessage::kStepDone, options_.step_timeout, {}, &replies));
  auto decoded = control::FromProto(replies[0].step_done());
  if (!decoded.ok()) {
    return Break(absl::Status(decoded.status().code(),
                              absl::StrCat("rank 0: ", decoded.status().message())));
  }
  StepResult result = std::move(*decoded);
  double slowest = 0;
  for (const auto& r : replies) {
    if (r.step_done().step_id() != plan.step_id) {
      return Break(absl::InternalError(absl::StrCat("a rank acknowledged step ",
                                                    r.step_done().step_id(), " for step ",
                                                    plan.step_id)));
    }
    result.rank_seconds.push_back(r.step_done().execute_seconds());
    result.rank_collective_seconds.push_back(r.step_done().collective_seconds());
    slowest = std::max(slowest, r.step_done().execute_seconds());
  }
  const double wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  result.execute_seconds = wall;
  result.control_seconds = std::max(0.0, wall - slowest);
  return result;
}

void RemoteWorkerGroup::Shutdown() {
  if (stage_ == 4) return;
  stage_ = 4;
  cpb::CoordinatorMessage m;
  m.mutable_shutdown();
  for (auto& link : links_) (void)link->Send(m);
  for (size_t r = 0; r < children_.size(); ++r) {
    absl::Status s = children_[r].Wait(std::chrono::seconds(10), absl::StrCat("worker rank ", r));
    if (!s.ok() && broken_.ok()) LogWarning("worker_exit", {{"detail", std::string(s.message())}});
  }
  if (plane_) plane_->Shutdown();
}

}  // namespace dsv4
