#include "common/child_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <thread>

#include "absl/strings/str_cat.h"

extern char** environ;

namespace dsv4 {

absl::StatusOr<ChildProcess> ChildProcess::SpawnSelf(const std::vector<std::string>& argv,
                                                     const std::string& stdin_line,
                                                     const std::string& binary) {
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
  const int rc = posix_spawn(&pid, binary.c_str(), &actions, nullptr, cargv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[0]);
  if (rc != 0) {
    ::close(fds[1]);
    return absl::InternalError(absl::StrCat("posix_spawn failed (errno ", rc, ")"));
  }
  ChildProcess child;
  child.pid_ = pid;
  const std::string data = stdin_line + "\n";
  const bool ok = ::write(fds[1], data.data(), data.size()) == static_cast<ssize_t>(data.size());
  ::close(fds[1]);
  if (!ok) return absl::InternalError("could not write to the child's standard input");
  return child;
}

ChildProcess& ChildProcess::operator=(ChildProcess&& o) noexcept {
  if (this != &o) {
    Kill();
    pid_ = o.pid_;
    status_ = o.status_;
    o.pid_ = -1;
  }
  return *this;
}

bool ChildProcess::running() {
  if (pid_ <= 0) return false;
  int status = 0;
  if (::waitpid(pid_, &status, WNOHANG) == pid_) {
    status_ = status;
    pid_ = -1;
    return false;
  }
  return true;
}

absl::Status ChildProcess::Wait(std::chrono::milliseconds timeout, const std::string& what) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  if (pid_ > 0) {
    while (running() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    if (pid_ > 0) {
      Kill();
      return absl::DeadlineExceededError(absl::StrCat(what, " did not exit within ",
                                                      timeout.count(), " ms (killed)"));
    }
  }
  if (WIFEXITED(status_) && WEXITSTATUS(status_) == 0) return absl::OkStatus();
  return absl::InternalError(WIFEXITED(status_)
                                 ? absl::StrCat(what, " exited with status ", WEXITSTATUS(status_))
                                 : absl::StrCat(what, " died of signal ", WTERMSIG(status_)));
}

void ChildProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  ::waitpid(pid_, &status_, 0);
  pid_ = -1;
}

ChildProcess::~ChildProcess() { Kill(); }

}  // namespace dsv4
