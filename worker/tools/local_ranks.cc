#include "worker/tools/local_ranks.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "parallel/gloo_communicator.h"

extern char** environ;

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

// Starts `argv` with a pipe on its standard input; writes `line` to it and closes it.
absl::StatusOr<pid_t> SpawnWithStdin(const std::vector<std::string>& argv, const std::string& line) {
  int fds[2];
  if (::pipe(fds) != 0) return absl::InternalError("pipe() failed");
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[0], STDIN_FILENO);
  posix_spawn_file_actions_addclose(&actions, fds[1]);
  std::vector<char*> cargv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[0]);
  if (rc != 0) {
    ::close(fds[1]);
    return absl::InternalError(absl::StrCat("posix_spawn failed (errno ", rc, ")"));
  }
  const std::string data = line + "\n";
  const bool ok = ::write(fds[1], data.data(), data.size()) == static_cast<ssize_t>(data.size());
  ::close(fds[1]);
  if (!ok) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    return absl::InternalError("could not hand the rendezvous token to a rank");
  }
  return pid;
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
    auto pid = SpawnWithStdin(argv, token);
    if (!pid.ok()) {
      g->KillAll();
      return absl::Status(pid.status().code(), absl::StrCat("rank ", r, ": ", pid.status().message()));
    }
    g->children_.push_back(*pid);
  }
  RendezvousEndpoint endpoint{absl::StrCat("127.0.0.1:", g->server_->port()), kGroup, token};
  auto comm = GlooCommunicator::Connect(Options(0, world_size), endpoint);
  if (!comm.ok()) {
    g->KillAll();
    return comm.status();
  }
  g->comm_ = std::move(*comm);
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
    const int rank = static_cast<int>(i) + 1;
    int status = 0;
    pid_t done = 0;
    while ((done = ::waitpid(children_[i], &status, WNOHANG)) == 0 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (done == 0) {
      ::kill(children_[i], SIGKILL);
      ::waitpid(children_[i], &status, 0);
      children_[i] = -1;
      if (first.ok()) {
        first = absl::DeadlineExceededError(absl::StrCat("rank ", rank, " did not finish within ",
                                                         timeout_s, " s (killed)"));
      }
      continue;
    }
    children_[i] = -1;
    if (first.ok() && !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
      first = absl::InternalError(
          WIFEXITED(status) ? absl::StrCat("rank ", rank, " exited with status ", WEXITSTATUS(status))
                            : absl::StrCat("rank ", rank, " died of signal ", WTERMSIG(status)));
    }
  }
  return first;
}

void LocalRanks::KillAll() {
  for (pid_t& pid : children_) {
    if (pid <= 0) continue;
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    pid = -1;
  }
}

LocalRanks::~LocalRanks() { KillAll(); }

}  // namespace dsv4::cli
