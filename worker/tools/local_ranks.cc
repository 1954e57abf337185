#include "worker/tools/local_ranks.h"

#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "common/child_process.h"
#include "parallel/gloo_communicator.h"

namespace dsv4::cli {
namespace {

constexpr char kGroup[] = "tp";

GlooOptions Options(int rank, int world) {
  GlooOptions o;
  o.rank = rank;
  o.world_size = world;
  o.name = "tp";
  return o;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LocalRanks>> LocalRanks::Start(int world_size,
                                                              const std::vector<std::string>& args) {
  if (world_size < 2) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel_size ", world_size,
                                                   ": a group needs at least 2 ranks"));
  }
  std::unique_ptr<LocalRanks> g(new LocalRanks());
  ASSIGN_OR_RETURN(g->server_, RendezvousServer::Start("127.0.0.1:0", &g->store_));
  ASSIGN_OR_RETURN(std::string token, NewRendezvousToken());
  RETURN_IF_ERROR(g->store_.OpenGroup(kGroup, world_size, token));
  const std::string join = absl::StrCat("127.0.0.1:", g->server_->port(), "/", kGroup);
  for (int r = 1; r < world_size; ++r) {
    std::vector<std::string> argv = args;
    argv.insert(argv.end(), {"--tp-join", join, "--tp-rank", absl::StrCat(r)});
    auto child = ChildProcess::SpawnSelf(argv, token);
    if (!child.ok()) {
      return absl::Status(child.status().code(), absl::StrCat("rank ", r, ": ", child.status().message()));
    }
    g->children_.push_back(std::move(*child));
  }
  RendezvousEndpoint endpoint{absl::StrCat("127.0.0.1:", g->server_->port()), kGroup, token};
  ASSIGN_OR_RETURN(g->comm_, GlooCommunicator::Connect(Options(0, world_size), endpoint));
  return g;
}

absl::StatusOr<std::unique_ptr<Communicator>> LocalRanks::Join(const std::string& join, int rank,
                                                               int world_size) {
  const size_t slash = join.rfind('/');
  if (slash == std::string::npos || slash == 0 || slash + 1 == join.size()) {
    return absl::InvalidArgumentError(absl::StrCat("--tp-join '", join, "' is not HOST:PORT/GROUP"));
  }
  if (rank < 1 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrCat("--tp-rank ", rank, " is outside [1, ",
                                                   world_size, ")"));
  }
  std::string token;
  if (!std::getline(std::cin, token) || token.empty()) {
    return absl::InvalidArgumentError("--tp-join: no rendezvous token on standard input");
  }
  RendezvousEndpoint endpoint{join.substr(0, slash), join.substr(slash + 1), token};
  ASSIGN_OR_RETURN(auto comm, GlooCommunicator::Connect(Options(rank, world_size), endpoint));
  return std::unique_ptr<Communicator>(std::move(comm));
}

absl::Status LocalRanks::Wait(int timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  absl::Status first;
  for (size_t i = 0; i < children_.size(); ++i) {
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::duration_cast<std::chrono::milliseconds>(
                                   deadline - std::chrono::steady_clock::now()));
    absl::Status s = children_[i].Wait(left, absl::StrCat("rank ", i + 1));
    if (first.ok()) first = s;
  }
  return first;
}

}  // namespace dsv4::cli
